"""``benchmarks/results/`` holds one current result per benchmark, model and machine, and
``RESULTS.md`` is exactly what ``benchmarks/make_results.py`` makes of them, so the page cannot drift
from the data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# A design limit: a handful of current results, not a log of every run.
MAX_FILES = 40


def make_results():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_results"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_results_page_is_what_the_script_makes() -> None:
    page = (RESULTS / "RESULTS.md").read_text(encoding="utf-8")
    assert page == make_results().render(RESULTS), "run: python benchmarks/make_results.py"


def test_every_result_is_on_the_page() -> None:
    page = (RESULTS / "RESULTS.md").read_text(encoding="utf-8")
    missing = [path.name for path in sorted(RESULTS.glob("*.json")) if f"({path.name})" not in page]
    assert not missing


def test_every_result_is_named_benchmark_model_machine() -> None:
    module = make_results()
    misnamed = [path.name for path in sorted(RESULTS.glob("*.json")) if module.parse(path) is None]
    assert not misnamed, "name results <benchmark>-<model>-<machine>.json"


def test_the_results_folder_stays_small() -> None:
    files = [path for path in RESULTS.rglob("*") if path.is_file()]
    assert len(files) < MAX_FILES


def test_the_readme_block_is_filled_between_the_markers_only(tmp_path: Path) -> None:
    module = make_results()
    readme = tmp_path / "README.md"
    block = module.headline_block(RESULTS, readme)
    text = f"intro\n{module.START}\nstale\n{module.END}\nafter\n"
    assert module.fill(text, block) == f"intro\n{module.START}\n{block}\n{module.END}\nafter\n"
    assert module.fill("no markers here\n", block) == "no markers here\n"


def test_the_readme_option_leaves_a_file_without_markers_alone(tmp_path: Path) -> None:
    module = make_results()
    folder = tmp_path / "results"
    folder.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("nothing to fill\n")
    assert module.main(["--results", str(folder), "--readme", str(readme)]) == 0
    assert readme.read_text() == "nothing to fill\n"
    assert module.main(["--results", str(folder), "--check"]) == 0


def test_a_file_named_outside_the_convention_is_still_listed(tmp_path: Path) -> None:
    (tmp_path / "some-study.json").write_text('{"summary": {"ratio": 1.5}}')
    page = make_results().render(tmp_path)
    assert "(some-study.json)" in page and "ratio 1.500" in page
