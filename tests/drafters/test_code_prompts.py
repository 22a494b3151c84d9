"""The code prompt set for coder models: shipped splits, their generator, and no Spec-Bench inside."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from eesd_bench.prompts import DEFAULT_QUESTIONS as SPEC_BENCH
from eesd_early_exit.prompts import PROMPT_DIR, SPLITS, load_prompts


def generator() -> ModuleType:
    """``prompts/make_code_prompts.py``, a script rather than a module of the package."""
    spec = importlib.util.spec_from_file_location("make_code_prompts", PROMPT_DIR / "make_code_prompts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_code_splits_load_with_their_sizes_and_no_duplicates() -> None:
    assert {"code-train", "code-heldout"} <= set(SPLITS)
    train, heldout = load_prompts("code-train"), load_prompts("code-heldout")
    assert (len(train), len(heldout)) == (896, 48)
    assert len(set(train)) == len(train) and len(set(heldout)) == len(heldout)
    assert not set(train) & set(heldout)
    assert all(isinstance(p, str) and len(p.split()) <= 120 for p in train + heldout)
    assert sum("```" in p for p in train) > len(train) // 3, "too few prompts embed a snippet"


def test_heldout_tasks_never_occur_in_training() -> None:
    """No task (a spec, name, signature or schema, in any language) and no snippet is in both sets."""
    make = generator()

    def tasks(split: dict[str, str]) -> set[str]:
        rows = [row for kind, table in split.items() if kind != "snippets" for row in make.rows(table)]
        found = {field for row in rows for field in row if not set(field.split()) <= set(make.LANG)}
        return found | {block.partition("\n")[2].strip() for block in split["snippets"].split("\n@@ ")[1:]}

    assert len(tasks(make.HELDOUT)) > 40 and not tasks(make.TRAIN) & tasks(make.HELDOUT)
    every = [
        {prompt for unit in make.units(split) for prompt in unit} for split in (make.TRAIN, make.HELDOUT)
    ]
    assert not every[0] & every[1]


def test_the_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    written = generator().write(tmp_path)
    assert [path.name for path in written] == ["code-train.json", "code-heldout.json"]
    for path in written:
        assert path.read_bytes() == (PROMPT_DIR / path.name).read_bytes(), f"regenerate {path.name}"


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason=f"Spec-Bench's questions are not at {SPEC_BENCH}")
def test_no_prompt_occurs_in_spec_bench() -> None:
    lines = SPEC_BENCH.read_text(encoding="utf-8").splitlines()
    turns = [turn for line in lines if line.strip() for turn in json.loads(line)["turns"]]
    assert len(turns) > 400
    found = [
        p[:80]
        for p in load_prompts("code-train") + load_prompts("code-heldout")
        if any(p in t for t in turns)
    ]
    assert not found, f"prompts taken from Spec-Bench: {found}"


def test_a_larger_training_split_keeps_the_smaller_one_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head distilled on the first N prompts continues on the rest (``--first-prompt N``)."""
    make = generator()
    train, heldout = load_prompts("code-train"), load_prompts("code-heldout")
    monkeypatch.setattr(make, "TRAIN_SIZE", 640)
    assert make.build() == (train[:640], heldout)
