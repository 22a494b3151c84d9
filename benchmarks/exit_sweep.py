"""Exit heads side by side: what each was trained on, what it reaches, what it costs, what it earns.

For each head file it reads the held-out evaluation stored in the file by ``eesd distill``
(teacher-forced top-1, acceptance by draft position in real decoding at k = 8), then measures on
this machine, in one process and interleaved across heads, the cost of a draft step and of
verification passes (``eesd_bench.trace.measure_costs``, the median of ``--repeats`` measurements).
The modelled speedup of a head is the best over k of E_k * plain_step / round_time(k), with
E_k = 1 + sum_{i<k} P(n > i) taken from its measured acceptance (not from an i.i.d. model). Usage::

    python benchmarks/exit_sweep.py HEAD.safetensors ... --threads 2 \\
        --out benchmarks/results/exit-heads.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from eesd_bench.trace import measure_costs
from eesd_early_exit.headfile import read_metadata
from eesd_early_exit.prompts import load_prompts
from transformers import AutoModelForCausalLM, AutoTokenizer

from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
from eesd_core.tools import encode_prompt


def head_facts(path: Path) -> dict[str, Any]:
    """What the head file says of itself: settings, data, times and held-out evaluation."""
    metadata = read_metadata(path)
    training = json.loads(metadata["training"])
    settings = training.get("settings", {})
    evaluation = training.get("eval", {})
    decoding = evaluation.get("decoding", {})
    return {
        "file": path.name,
        "exit_layer": int(metadata["exit_layer"]),
        "input": metadata.get("exit_input", "hidden"),
        "top_weight": settings.get("train", {}).get("top_weight", 0.0),
        "vocab_subset": int(metadata["vocab_subset"]),
        "train_positions": training.get("data", {}).get("train_positions"),
        "epochs": settings.get("train", {}).get("epochs"),
        "generate_seconds": training.get("generate_seconds"),
        "train_seconds": training.get("train_seconds"),
        "top1": evaluation.get("teacher_forced", {}).get("top1"),
        "acceptance": decoding.get("acceptance_by_position", []),
        "mean_accepted_tokens": decoding.get("mean_accepted_tokens"),
    }


def check_evaluated(heads: list[Path]) -> None:
    """Refuse, before minutes of measuring, a head file that holds no held-out evaluation."""
    facts = {h: head_facts(h) for h in heads}
    missing = [str(h) for h, f in facts.items() if f["top1"] is None or not f["acceptance"]]
    if missing:
        raise SystemExit(
            f"No held-out evaluation stored in {', '.join(missing)}: this script reads it from the file, "
            "as `eesd distill` writes it. Re-run the distillation, or pass heads it made."
        )


def speedup(acceptance: list[float], costs: Any, k: int) -> float:
    """Modelled speedup of k drafts every round over plain decoding, from measured acceptance."""
    plain = costs.propose_base + costs.verify[0]
    tokens = 1.0 + sum(acceptance[:k])
    return tokens * plain / (costs.propose_base + k * costs.draft_step + costs.verify[k])


def modelled(acceptance: list[float], costs: Any) -> tuple[int, float]:
    """Best k (0: plain) and its speedup over plain decoding, from measured acceptance."""
    best = (0, 1.0)
    for k in range(1, len(costs.verify)):
        speed = speedup(acceptance, costs, k)
        if speed > best[1]:
            best = (k, speed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", type=Path)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/exit-heads.md"))
    args = parser.parse_args()
    check_evaluated(args.heads)
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = encode_prompt(tokenizer, load_prompts("heldout")[0])
    decoders = {
        head: SpeculativeDecoder(
            model, drafter_options={"head": str(head)}, controller="fixed", max_draft_tokens=8
        )
        for head in args.heads
    }
    measured: dict[Path, list[Any]] = {head: [] for head in args.heads}
    for _ in range(args.repeats):  # interleaved, so drift in the machine's speed hits every head alike
        for head, decoder in decoders.items():
            measured[head].append(measure_costs(decoder, prompt, cycles=6))
    rows = []
    for head in args.heads:
        facts = head_facts(head)
        runs = measured[head]
        draft = statistics.median(c.draft_step for c in runs)
        base = statistics.median(c.propose_base for c in runs)
        verify = [statistics.median(c.verify[m] for c in runs) for m in range(len(runs[0].verify))]
        costs = argparse.Namespace(draft_step=draft, propose_base=base, verify=verify)
        best_k, best = modelled(facts["acceptance"], costs)
        plain = base + verify[0]
        rows.append(
            {
                **facts,
                "plain_step_ms": 1e3 * plain,
                "draft_step_ms": 1e3 * draft,
                "draft_share": draft / plain,
                "verify_ms": [1e3 * v for v in verify],
                "best_k": best_k,
                "modelled_speedup": best,
                "speedup_k1": speedup(facts["acceptance"], costs, 1),
                "speedup_k3": speedup(facts["acceptance"], costs, 3),
                "break_even_k1": (costs.draft_step + verify[1] - verify[0]) / plain,
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "model": args.model,
                "threads": args.threads,
                "heads": rows,
            },
            indent=1,
        )
    )
    args.out.write_text("\n".join(markdown(rows, args.threads)) + "\n")
    print("\n".join(markdown(rows, args.threads)))


def markdown(rows: list[dict[str, Any]], threads: int) -> list[str]:
    lines = [
        f"# Exit heads on SmolLM2-135M-Instruct ({threads} threads)",
        "",
        "Held-out evaluation from each file (40 prompts teacher-forced; 16 prompts decoded at k = 8);",
        "costs measured here, side by side. Modelled speedup: best k over plain decoding, from the",
        "measured acceptance by position and the measured costs.",
        "",
        "| head | N | input | top-1 | acceptance at draft 1..4 | tokens/pass (k=8) | draft step | "
        "share of plain step | modelled k=1 / k=3 | break-even at k=1 | best k: speedup | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance"][:4])
        kind = r["input"] + (f" (w={r['top_weight']:g})" if r["input"] != "hidden" else "")
        lines.append(
            f"| {r['file']} | {r['exit_layer']} | {kind} | {r['top1']:.3f} | {acc} | "
            f"{r['mean_accepted_tokens']:.2f} | {r['draft_step_ms']:.1f} ms | {r['draft_share']:.1%} | "
            f"{r['speedup_k1']:.3f} / {r['speedup_k3']:.3f} | {r['break_even_k1']:.2f} | "
            f"{r['best_k']}: {r['modelled_speedup']:.3f} | {r['train_seconds']} |"
        )
    plain = statistics.median(r["plain_step_ms"] for r in rows)
    lines += ["", f"Plain step (median over the heads' measurements): {plain:.1f} ms."]
    return lines


if __name__ == "__main__":
    main()
