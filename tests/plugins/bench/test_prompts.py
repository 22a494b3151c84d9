"""Spec-Bench questions: first turns, stratified subsets, Spec-Bench's tasks."""

from __future__ import annotations

import json

import pytest
from eesd_bench.prompts import load_questions, select, task_of

from eesd_core.errors import InputError


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": i, "category": cat, "turns": [f"q{i}", "second turn"]}
        for i, cat in enumerate(["writing"] * 3 + ["qa"] * 4 + ["rag"] * 2)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return load_questions(path)


def test_first_turn_only(questions) -> None:
    assert [q.text for q in questions[:2]] == ["q0", "q1"]
    assert questions[0].task == "mt_bench" and questions[3].task == "qa"
    assert task_of("math") == "mt_bench" and task_of("math_reasoning") == "math_reasoning"


def test_first_n_per_category(questions) -> None:
    assert [q.question_id for q in select(questions, 2)] == [0, 1, 3, 4, 7, 8]
    assert select(questions, None) == questions


def test_seeded_subset_is_deterministic(questions) -> None:
    first = select(questions, 2, seed=5)
    assert first == select(questions, 2, seed=5)
    assert [q.category for q in first] == ["writing"] * 2 + ["qa"] * 2 + ["rag"] * 2


def test_bad_files(tmp_path) -> None:
    with pytest.raises(InputError, match="--questions"):
        load_questions(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "qa"}\n')
    with pytest.raises(InputError, match="bad.jsonl:1"):
        load_questions(bad)
