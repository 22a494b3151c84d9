"""vLLM (CPU build) with and without speculation, at several numbers of concurrent requests.

Methods: ``plain`` (no speculation), ``plain_sync`` (the same without async scheduling, which
vLLM turns off for custom proposers), ``ngram`` (vLLM's prompt lookup), ``draft`` (a separate draft
model, ``--draft-model``), ``eesd`` (the eesd proposer, head ``auto``). Each method runs in a
process of its own (two engines do not share a process), and the processes take turns:
``--rounds`` rounds of every method, the order rotating each round, so that slow drifts of the
machine fall on every method alike. Inside a process, each concurrency level c runs its prompts
after one untimed warm-up of c requests, in one of two schedules (``--schedule``):

- ``waves``: waves of c requests submitted together, each wave waiting for its last request (a
  client that sends c at a time). Latency is the wave's time.
- ``in-flight``: every prompt submitted at once, the scheduler running at most c and admitting the
  next as soon as one finishes (continuous batching at a fixed concurrency, as a server under c
  clients; what serving benchmarks call a concurrency of c). Latency is the mean time a request
  spends running, by Little's law: c x wall time / requests.

A speculative method's requests finish at different steps; in waves, the wave's last steps then run
one or two requests at nearly the cost of c, which in-flight serving fills with the next requests.
Throughput is new tokens over wall time. Greedy outputs of every method must equal plain vLLM's,
prompt by prompt.

    python benchmarks/vllm_serving.py --model smollm2-135m-instruct --methods plain ngram eesd \\
        --concurrency 1 4 16 --prompts 16 --max-tokens 64 --rounds 2 --schedule in-flight \\
        --out benchmarks/out/vllm.json

It needs vLLM's CPU build in the environment (``make test-vllm`` makes one in ``.venv-vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


def encode(model: str, count: int, seed: int, questions: str | None = None) -> tuple[str, list[list[int]]]:
    """Prompts through the model's chat template: Spec-Bench's (a seeded sample, categories in
    turn), or the first ``count`` of a questions file in Spec-Bench's format, in file order."""
    from eesd_bench.prompts import DEFAULT_QUESTIONS, load_questions, select
    from transformers import AutoTokenizer

    from eesd_core.registry import resolve_model
    from eesd_core.tools import encode_prompt

    path = str(resolve_model(model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if questions is not None:
        return path, [encode_prompt(tokenizer, q.text) for q in load_questions(questions)[:count]]
    chosen = select(load_questions(DEFAULT_QUESTIONS), max(1, -(-count // 13)), seed)
    by_category: dict[str, list] = {}
    for q in chosen:
        by_category.setdefault(q.category, []).append(q)
    order = [
        g[i]
        for i in range(max(len(g) for g in by_category.values()))
        for g in by_category.values()
        if i < len(g)
    ]
    return path, [encode_prompt(tokenizer, q.text) for q in order[:count]]


def worker(args: argparse.Namespace) -> None:
    """One method in this process: every concurrency level, in the schedule asked; JSON to
    ``--result``."""
    from eesd_vllm import engine

    prompts = json.loads(Path(args.prompt_file).read_text())
    options = json.loads(args.options)
    llm = engine.start(
        args.path,
        args.method,
        args.k,
        draft_model=args.draft_path,
        options=options,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        memory_fraction=args.memory_fraction,
    )
    proposer = engine.proposer_of(llm)
    engine.run(llm, prompts[:2], args.max_tokens)  # warm-up
    out = {"method": args.method, "levels": {}}
    in_flight = args.schedule == "in-flight"  # then one call a level: the scheduler keeps c running
    for c in args.concurrency:
        cap = c if in_flight else None
        waves = [prompts] if in_flight else [prompts[i : i + c] for i in range(0, len(prompts), c)]
        engine.run(llm, prompts[:c], args.max_tokens, in_flight=cap)  # warm-up
        before = dict(proposer.stats) if proposer is not None and hasattr(proposer, "stats") else None
        tokens, seconds = [], []
        for wave in waves:
            result = engine.run(llm, wave, args.max_tokens, in_flight=cap)
            tokens.extend(result["tokens"])
            seconds.append(result["seconds"])
        level = {
            "tokens": tokens,
            "new_tokens": sum(len(t) for t in tokens),
            "seconds": sum(seconds),
        }
        if in_flight:
            level["latency_seconds"] = c * sum(seconds) / len(prompts)
        else:
            level["wave_seconds"] = seconds
            level["latency_seconds"] = statistics.median(seconds)
        if before is not None:
            after = proposer.stats
            level["proposer"] = {k: after[k] - before[k] for k in after}
        if getattr(proposer, "gate", None) is not None:  # per batch size, after this level
            level["gate"] = {
                str(size): {k: (None if v == float("inf") else v) for k, v in g.items()}
                for size, g in proposer.gate.summary().items()
            }
        out["levels"][str(c)] = level
    if proposer is not None and hasattr(proposer, "memory_bytes"):
        out["proposer_bytes"] = proposer.memory_bytes()
        out["proposer"] = proposer.describe()
    Path(args.result).write_text(json.dumps(out))


def summarize(runs: list[dict], methods: list[str], levels: list[int]) -> dict:
    table: dict = {}
    reference: dict[str, list] = {}
    for run in runs:
        if run["method"] == "plain":
            for c, level in run["levels"].items():
                reference.setdefault(c, level["tokens"])
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        for c in map(str, levels):
            tps = [r["levels"][c]["new_tokens"] / r["levels"][c]["seconds"] for r in mine]
            latency = [r["levels"][c]["latency_seconds"] for r in mine]
            row = {"tokens_per_second": statistics.median(tps), "latency_seconds": statistics.median(latency)}
            row["greedy_equal"] = all(r["levels"][c]["tokens"] == reference.get(c) for r in mine)
            stats = [r["levels"][c].get("proposer") for r in mine if r["levels"][c].get("proposer")]
            if stats:
                drafted = sum(s["drafted"] for s in stats)
                row["acceptance_rate"] = sum(s["accepted"] for s in stats) / drafted if drafted else None
                row["drafts_per_request_step"] = drafted / max(1, sum(s["rows"] for s in stats))
                row["withdrawn_per_request_step"] = sum(s.get("withdrawn", 0) for s in stats) / max(
                    1, sum(s["rows"] for s in stats)
                )
                row["proposer_share"] = sum(s["seconds"] for s in stats) / sum(
                    r["levels"][c]["seconds"] for r in mine
                )
            table.setdefault(method, {})[c] = row
    for method in methods:
        for c in map(str, levels):
            base = table["plain"][c]["tokens_per_second"] if "plain" in table else None
            row = table[method][c]
            row["vs_plain"] = row["tokens_per_second"] / base if base else None
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--methods", nargs="+", default=["plain", "ngram", "eesd"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument(
        "--questions", default=None, help="a questions file (Spec-Bench's format) instead of Spec-Bench's"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--schedule",
        choices=("waves", "in-flight"),
        default="waves",
        help="c requests at a time, each wave waiting for its last; or c always in flight",
    )
    parser.add_argument("--options", default="{}", help="eesd proposer options (JSON)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-fraction", type=float, default=None, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--out", default=None)
    # the worker's own arguments
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--draft-path", help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    path, prompts = encode(args.model, args.prompts, args.seed, args.questions)
    draft_path = None
    if "draft" in args.methods:
        from eesd_core.registry import resolve_model

        draft_path = str(resolve_model(args.draft_model))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompts.json"
        prompt_file.write_text(json.dumps(prompts))
        for round_ in range(args.rounds):
            shift = round_ % len(args.methods)
            for method in args.methods[shift:] + args.methods[:shift]:
                result = Path(tmp) / f"{method}-{round_}.json"
                command = [
                    sys.executable, __file__, "--worker", "--method", method, "--path", path,
                    "--prompt-file", str(prompt_file), "--result", str(result),
                    "--max-tokens", str(args.max_tokens), "--k", str(args.k), "--options", args.options,
                    "--max-model-len", str(args.max_model_len), "--dtype", args.dtype,
                    "--concurrency", *map(str, args.concurrency), "--schedule", args.schedule,
                ]  # fmt: skip
                if args.memory_fraction is not None:
                    command += ["--memory-fraction", str(args.memory_fraction)]
                if draft_path:
                    command += ["--draft-path", draft_path]
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                    return 1
                runs.append(json.loads(result.read_text()))
                print(
                    f"round {round_ + 1}: {method} done in {time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                )
    table = summarize(runs, args.methods, args.concurrency)
    columns = ("method", "c", "tok/s", "vs plain", "latency", "accept", "drafts/step", "back/step", "equal")
    print("{:<8} {:>3} {:>8} {:>9} {:>8} {:>7} {:>11} {:>9} {:>6}".format(*columns))
    for method, rows in table.items():
        for c, row in rows.items():
            accept = row.get("acceptance_rate")
            per, back = row.get("drafts_per_request_step"), row.get("withdrawn_per_request_step")
            print(
                f"{method:<8} {c:>3} {row['tokens_per_second']:>8.1f} {row['vs_plain'] or 0:>8.3f}x "
                f"{row['latency_seconds']:>8.2f} {'' if accept is None else f'{accept:.2f}':>7} "
                f"{'' if per is None else f'{per:.2f}':>11} {'' if back is None else f'{back:.2f}':>9} "
                f"{'yes' if row['greedy_equal'] else 'NO':>6}"
            )
    if args.out:
        record = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "settings": vars(args) | {"path": path},
            "table": table,
            "proposer": next((r.get("proposer") for r in runs if r.get("proposer")), None),
            "proposer_bytes": next((r.get("proposer_bytes") for r in runs if r.get("proposer_bytes")), None),
            "runs": runs,
        }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(".tmp")
        tmp_out.write_text(json.dumps(record, indent=1))
        os.replace(tmp_out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
