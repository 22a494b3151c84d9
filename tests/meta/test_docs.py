"""The front page stays a front page, the site lists every page, and the guide's example runs.

The plug-in guide's controller example is run here exactly as written: the fenced block right
after ``<!-- test: controller-example -->`` in ``docs/plugins.md`` is executed with ``model`` bound
to a tiny random model (the one name the example leaves to its reader).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tinymodels import make_tiny

from eesd_core import registry

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def marked_block(path: Path, label: str) -> str:
    """The fenced python block that follows ``<!-- test: label -->`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- test: {re.escape(label)} -->\s*```python\n(.*?)\n```", text, re.DOTALL)
    assert match, f"{path.name} has no python block marked <!-- test: {label} -->"
    return match.group(1)


def nav_pages(entries: list) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text


def test_readme_has_the_results_markers() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.index(START) < text.index(END)
    assert "benchmarks/results/RESULTS.md" in text


def test_readme_layout_names_every_top_level_folder() -> None:
    try:
        tracked = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    folders = {path.split("/")[0] for path in tracked if "/" in path and not path.startswith(".")}
    layout = README.read_text(encoding="utf-8").split("## Layout", 1)[-1]
    missing = sorted(f for f in folders if f"{f}/" not in layout)
    assert not missing, f"README's layout section does not name {missing}"


def test_site_lists_every_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = set(nav_pages(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert listed == pages, f"unlisted: {sorted(pages - listed)}, missing: {sorted(listed - pages)}"


@pytest.fixture
def fresh_plugins():
    """A manager of this test's own, so what the example registers leaves the process as it was."""
    previous = registry._manager
    registry.reset_manager()
    yield
    registry.reset_manager(previous)


def test_controller_example_runs_as_written(fresh_plugins: None) -> None:
    namespace = {"model": make_tiny("llama", 0)}
    exec(compile(marked_block(DOCS / "plugins.md", "controller-example"), "plugins.md", "exec"), namespace)
    dec, res = namespace["dec"], namespace["res"]
    assert type(dec.controller) is namespace["ConfidentStop"]
    assert res.stats.drafted > 0  # the example drafts, and its own assert checked it lossless
