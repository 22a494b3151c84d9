"""Write a question file that mixes Spec-Bench categories with our own held-out code prompts.

``eesd bench --questions`` takes one file in Spec-Bench's format. For a coder model the benchmark
wants code first: this script takes N questions of each chosen Spec-Bench category (the first N, or
a seeded sample) and adds our own held-out code prompts as the category ``own_code``. The own
prompts are the early-exit drafter's ``code-heldout`` set, which no exit head trains on.

    python benchmarks/mix_questions.py --out benchmarks/out/qwen-mix.jsonl \\
        --categories coding math qa --per-category 2 --own-code 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "drafters")]

from eesd_bench.prompts import DEFAULT_QUESTIONS, load_questions  # noqa: E402
from eesd_early_exit.prompts import load_prompts  # noqa: E402


def mix(
    questions: Path, categories: list[str], per_category: int, own_code: int, seed: int | None
) -> list[dict]:
    pool = load_questions(questions)
    known = sorted({q.category for q in pool})
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise SystemExit(f"unknown categories {unknown}; Spec-Bench has {', '.join(known)}")
    items = []
    for category in categories:
        members = [q for q in pool if q.category == category]
        if seed is not None:
            members = random.Random(f"{seed}:{category}").sample(members, min(per_category, len(members)))
        for q in members[:per_category]:
            items.append({"question_id": q.question_id, "category": category, "turns": [q.text]})
    own = load_prompts("code-heldout")
    if seed is not None:
        own = random.Random(f"{seed}:own_code").sample(own, len(own))
    for i, text in enumerate(own[:own_code]):
        items.append({"question_id": f"own-code-{i}", "category": "own_code", "turns": [text]})
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="Spec-Bench question.jsonl")
    parser.add_argument("--categories", nargs="*", default=["coding", "math"])
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--own-code", type=int, default=4, help="own held-out code prompts to add")
    parser.add_argument("--seed", type=int, default=None, help="sample instead of taking the first ones")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    items = mix(Path(args.questions), args.categories, args.per_category, args.own_code, args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(item) + "\n" for item in items)
    os.replace(tmp, out)
    print(f"{out}: {len(items)} questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
