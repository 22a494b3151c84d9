"""Controllers compared per Spec-Bench category on recorded traces (modelled time per token).

For each category, the drafter's proposals are recorded once along the target's greedy output
(``eesd_bench.trace.record_trace``, K = 8 drafts at every position, costs measured on this machine),
then every controller is replayed against the trace, next to plain decoding, the best fixed k in
hindsight and the per-round oracle. Usage::

    python benchmarks/controllers_by_category.py --model smollm2-135m-instruct --per-category 2 \
        --max-new-tokens 48 --drafter early_exit --exit-layer 6 --out benchmarks/results/controllers.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from eesd_bench.prompts import load_questions, select
from eesd_bench.trace import compare_controllers, record_trace
from transformers import AutoModelForCausalLM, AutoTokenizer

from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
from eesd_core.tools import encode_prompt

CONTROLLERS = {
    "thompson (default)": ("thompson", {}),
    "thompson beta": ("thompson", {"variant": "beta"}),
    "thompson paper rule": ("thompson", {"variant": "beta", "stop_rule": "bernoulli", "scope": "request"}),
    "heuristic +2/-1": ("heuristic", {}),
    "confidence 0.4": ("confidence", {}),
    "ema": ("ema", {}),
    "ucb": ("ucb", {}),
}
QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "spec-bench" / "question.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--questions", default=str(QUESTIONS))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--drafter", default="early_exit")
    parser.add_argument("--exit-layer", type=int, default=6)
    parser.add_argument("--head", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/controllers-by-category.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    options = {"exit_layer": args.exit_layer, "head": None if args.head == "none" else args.head}
    decoder = SpeculativeDecoder(
        model,
        drafter=args.drafter,
        controller="fixed",
        max_draft_tokens=8,
        drafter_options=options if args.drafter == "early_exit" else {},
    )
    by_category: dict[str, list] = {}
    for question in select(load_questions(args.questions), args.per_category):
        by_category.setdefault(question.category, []).append(encode_prompt(tok, question.text))
    table: dict[str, dict[str, dict]] = {}
    for category, prompts in by_category.items():
        trace = record_trace(decoder, prompts, max_new_tokens=args.max_new_tokens)
        rows = compare_controllers(trace, CONTROLLERS)
        table[category] = {row["controller"].split(" k=")[0]: row for row in rows}
        print(category, {k: round(v["vs_oracle"], 3) for k, v in table[category].items()}, flush=True)
    write(args, table)


def write(args: argparse.Namespace, table: dict[str, dict[str, dict]]) -> None:
    names = list(next(iter(table.values())))
    lines = [
        f"# Controllers by category: drafter {args.drafter}"
        + (f" (N={args.exit_layer}, head={args.head})" if args.drafter == "early_exit" else ""),
        "",
        f"Modelled time per token over the per-round oracle's (1.000 is ideal; lower is better), "
        f"{args.per_category} Spec-Bench prompts per category, {args.max_new_tokens} greedy tokens each, "
        f"costs measured on this machine ({args.threads} thread).",
        "",
        "| category | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for category, rows in table.items():
        lines.append(f"| {category} | " + " | ".join(f"{rows[n]['vs_oracle']:.3f}" for n in names) + " |")
    mean = {n: statistics.mean(rows[n]["vs_oracle"] for rows in table.values()) for n in names}
    lines.append("| **mean** | " + " | ".join(f"**{mean[n]:.3f}**" for n in names) + " |")
    default = "thompson (default)"

    def worst_ratio(other: str) -> float:
        return max(rows[default]["time_per_token"] / rows[other]["time_per_token"] for rows in table.values())

    worst, vs_plain = worst_ratio("best fixed"), worst_ratio("plain")
    lines += [
        "",
        f"- default vs best fixed k in hindsight, worst category: {worst:.3f}x its time per token",
        f"- default vs plain decoding, worst category: {vs_plain:.3f}x its time per token",
        "- default vs heuristic +2/-1, mean over categories: "
        f"{mean[default]:.3f} vs {mean['heuristic +2/-1']:.3f}",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(table, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
