"""Spec-Bench questions: loading, a deterministic stratified subset, and the first turn as a prompt."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eesd_core.errors import InputError

#: Where the project keeps Spec-Bench's questions, beside the repository.
DEFAULT_QUESTIONS = (
    Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "spec-bench" / "question.jsonl"
)

MT_BENCH = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)


def task_of(category: str) -> str:
    """Spec-Bench's six reported tasks: the eight MT-bench categories form "mt_bench"."""
    return "mt_bench" if category in MT_BENCH else category


@dataclass(frozen=True)
class Question:
    question_id: Any
    category: str
    text: str

    @property
    def task(self) -> str:
        return task_of(self.category)


def load_questions(path: str | Path) -> list[Question]:
    """Every question of a Spec-Bench ``question.jsonl``; only the first turn is kept."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"No questions file at {str(path)!r}: pass --questions PATH to Spec-Bench's question.jsonl."
        )
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            questions.append(Question(item["question_id"], item["category"], item["turns"][0]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise InputError(f"{path}:{number} is not a Spec-Bench question ({exc!r}).") from None
    if not questions:
        raise InputError(f"{path} holds no questions.")
    return questions


def select(questions: list[Question], per_category: int | None, seed: int | None = None) -> list[Question]:
    """``per_category`` questions of each category, in file order: the first ones, or a seeded sample.

    ``None`` keeps them all. Categories keep the order of their first appearance.
    """
    if per_category is None:
        return list(questions)
    groups: dict[str, list[Question]] = {}
    for question in questions:
        groups.setdefault(question.category, []).append(question)
    chosen: list[Question] = []
    for members in groups.values():
        if seed is None:
            chosen.extend(members[:per_category])
        else:
            picked = set(
                random.Random(f"{seed}:{members[0].category}").sample(
                    range(len(members)), min(per_category, len(members))
                )
            )
            chosen.extend(m for i, m in enumerate(members) if i in picked)
    return chosen
