"""Exit heads side by side: eesd plain and the default controller with each head file given.

Loads the target once and, in one process, decodes every question greedily with eesd plain and with
``SpeculativeDecoder(model, drafter_options={"head": HEAD})`` for each head. Each method keeps one
decoder for the whole run, as an application would, so the controller's estimates carry from one
prompt to the next; the order of the methods rotates from prompt to prompt. Per prompt it prints
each head's speed over plain (tokens per second, the same prompt back to back) and tokens per
round; at the end, per head, the median over the code prompts (Spec-Bench ``coding`` and
``own_code``) and over all, the ratio of total throughputs, tokens per round and acceptance by
draft position. Every output is checked token for token against plain decoding.

    python benchmarks/mix_questions.py --categories coding math writing --per-category 2 \\
        --own-code 6 --seed 47 --out mix47.jsonl
    python benchmarks/compare_heads.py --model qwen2.5-coder-1.5b-instruct --questions mix47.jsonl \\
        drafters/eesd_early_exit/heads/qwen2.5-coder-1.5b-instruct-n4-top.safetensors other.safetensors

Exit status 1 if an output differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from never_slower import encode  # noqa: E402

CODE = ("coding", "own_code")


def main(argv: list[str] | None = None) -> int:
    from eesd_bench.prompts import load_questions
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eesd_core import SpeculativeDecoder
    from eesd_core.registry import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", help="exit-head files to compare")
    parser.add_argument(
        "--model", default="qwen2.5-coder-1.5b-instruct", help="HF checkpoint dir or known name"
    )
    parser.add_argument("--questions", required=True, help="questions in Spec-Bench's format")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    questions = load_questions(args.questions)
    inputs = [encode(tokenizer, q.text) for q in questions]
    decoders = {"plain": SpeculativeDecoder(model, drafter=None)}
    for i, head in enumerate(args.heads):
        decoders[f"head{i}"] = SpeculativeDecoder(model, drafter_options={"head": head})
    methods = list(decoders)
    for i, head in enumerate(args.heads):
        print(f"head{i}: {head}")
    warm = encode(tokenizer, "Write a Python function that adds two numbers.")
    for decoder in decoders.values():
        decoder.generate(warm, max_new_tokens=16, temperature=0.0)

    totals = {
        m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "drafted": [0] * 4, "accepted": [0] * 4}
        for m in methods
    }
    rows = []
    for i, ids in enumerate(inputs):
        speed, tokens_per_round, outputs = {}, {}, {}
        for m in methods[i % len(methods) :] + methods[: i % len(methods)]:
            start = time.perf_counter()
            result = decoders[m].generate(ids, max_new_tokens=args.max_new_tokens, temperature=0.0)
            seconds = time.perf_counter() - start
            new, stats = result.sequences.shape[1] - ids.shape[1], result.stats
            speed[m], tokens_per_round[m] = new / seconds, new / max(stats.rounds, 1)
            outputs[m] = result.sequences[0].tolist()
            total = totals[m]
            total["tokens"] += new
            total["seconds"] += seconds
            total["rounds"] += stats.rounds
            for j, (d, a) in enumerate(
                zip(stats.drafted_by_position[:4], stats.accepted_by_position[:4], strict=True)
            ):
                total["drafted"][j] += d
                total["accepted"][j] += a
        equal = all(outputs[m] == outputs["plain"] for m in methods)
        ratios = {m: speed[m] / speed["plain"] for m in methods[1:]}
        rows.append((questions[i].category, ratios, equal))
        shown = " ".join(f"{m} {r:.3f} ({tokens_per_round[m]:.2f} t/r)" for m, r in ratios.items())
        print(f"{i:2d} {questions[i].category:8s} {shown} equal {equal}", flush=True)

    plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    for m in methods[1:]:
        total = totals[m]
        code = [r[m] for c, r, _ in rows if c in CODE]
        acceptance = [
            round(a / d, 2) if d else None for d, a in zip(total["drafted"], total["accepted"], strict=True)
        ]
        print(
            f"{m}: median over plain, code {statistics.median(code) if code else float('nan'):.3f}, "
            f"all {statistics.median(r[m] for _, r, _ in rows):.3f}; total throughput "
            f"{total['tokens'] / total['seconds'] / plain:.3f}; tokens per round "
            f"{total['tokens'] / total['rounds']:.2f}; acceptance by position {acceptance} "
            f"(drafted {total['drafted']})"
        )
    same = all(equal for *_, equal in rows)
    print("all outputs equal plain decoding" if same else "OUTPUTS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
