"""The layout the architecture promises: a minimal core that imports no plug-in, plug-ins that meet
only through the core, and every built-in plug-in registered like a third-party one.

Imports are read from the source (every ``import``, at any depth, plus ``importlib.import_module``
and ``__import__`` calls with a literal name), so a function-level import counts as much as one at
the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "eesd_core"
CATEGORIES = ("drafters", "controllers", "verifiers", "plugins")
# The runtime only (the test kit aside): 2,149 lines for one sequence, plus about 660 for batched
# decoding (eesd_core/batch.py and the batch input handling of the engine), plus about 40 to name
# devices and dtypes (eesd_core/devices.py), plus about 55 for oneDNN's product of short passes
# (eesd_core/models/products.py), plus about 100 for drafts taken back before verification
# (Controller.keep, Withdrawn, the measured peek), plus about 40 for taking drafts back in batches
# (a row's withdrawn draft judged by its own p, a last draft step whose input no row feeds), plus
# about 10 to run an exit head's copied layers and vocabulary rows through the planned product, plus
# about 55 to choose the product per matrix shape (a pass over two positions of Qwen2.5-1.5B fell
# from 1.3 to 1.1-1.2 passes over one), plus about 55 to keep the product's calibration on disk
# (a first call on Qwen2.5-1.5B spent 45 s timing passes in every new process), plus about 10 for
# eesd's cache folder, moved here from the model fetcher so that both name it the same way, plus
# about 90 to prefill a batch of ragged prompts group by group over each group's own slots (a
# batch of 64 Spec-Bench prompts is 81% left padding, which the prefill no longer runs) and to
# hand the drafter the prefill's top states in the buffer it keeps, instead of a copy, plus about
# 10 to cap a CPU prefill pass's tokens (larger passes' activations were faulted in afresh at
# every layer: 27% of the prefill at B = 64), plus about 10 to hand decoder layers their cache
# under the keyword the installed transformers takes (5.23 renamed it and warns at the old one),
# plus about 35 to skip the padding of a batched pass in its linear layers and its LM head (the
# slots of rows that drafted fewer tokens than the round's longest draft, rows that are done),
# plus about 35 for batch rounds that read the device once a round, not once a row (an optional
# BatchVerifier.verify_batch and its guard; a round's feeds, rollback and token writes over every
# row at once): a plain batched step ran about 73 host operations a row, now about 21, and on a
# GPU each row's verification had waited for the device, plus about 10 to skip that padding only
# on CPUs unless told (skip_padding="auto"): on an H200, SmolLM2's plain batched decoding in
# bfloat16 ran 1.20x faster at B = 16 and 1.56x at B = 64 computing the padding, plus 4 for
# row-major short-pass products and a version in the key of kept calibrations (on an AMD EPYC a
# SmolLM2 pass over two positions fell from 1.45 to 1.05-1.10 passes over one), plus 34 for
# wider passes (prefills, large batches) through oneDNN where it beats F.linear, decided by bucket
# of row counts, and no planned product under autograd (on an AMD EPYC the 1.5B's prefill of a
# 40-100 token prompt took 0.61-0.67 of its time), plus 2 for a prefill of ragged prompts in one
# pass where padding is computed (on an H100, SmolLM2's first token at B = 16 took 38 ms against
# 130 ms in groups of rows, each group a pass of kernel launches).
CORE_LINE_BUDGET = 3500


def plugin_packages() -> dict[str, Path]:
    """Every top-level package under the category folders (a package whose parent is not one),
    by import name: the built-ins and the template and example packages alike."""
    found = {}
    for category in CATEGORIES:
        for init in sorted((ROOT / category).rglob("__init__.py")):
            package = init.parent
            if not (package.parent / "__init__.py").exists() and "tests" not in package.parts:
                found[package.name] = package
    return found


def builtin_plugins() -> dict[str, Path]:
    """The plug-ins this distribution installs: those directly in a category folder."""
    return {name: path for name, path in plugin_packages().items() if path.parent.parent == ROOT}


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module name) of every absolute import in one source file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value.split(".")[0]


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def imports_of(package: Path, names: set[str]) -> list[str]:
    """``file:line imports name`` for every import of one of ``names`` under ``package``."""
    return [
        f"{source.relative_to(ROOT)}:{line} imports {name}"
        for source in sorted(package.rglob("*.py"))
        for line, name in imported_names(source)
        if name in names
    ]


def non_blank_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def test_the_layout_has_plugins_to_check() -> None:
    assert {"eesd_early_exit", "eesd_thompson", "eesd_lossless", "eesd_bench", "eesd_models"} <= set(
        builtin_plugins()
    )


def test_the_core_imports_no_plugin() -> None:
    offending = imports_of(CORE, set(plugin_packages()))
    assert not offending, "eesd_core must not import plug-ins:\n" + "\n".join(offending)


@pytest.mark.parametrize("name", sorted(plugin_packages()))
def test_a_plugin_imports_no_other_plugin(name: str) -> None:
    others = set(plugin_packages()) - {name}
    offending = imports_of(plugin_packages()[name], others)
    assert not offending, f"{name} must reach other plug-ins through the core:\n" + "\n".join(offending)


def test_every_builtin_plugin_is_an_entry_point() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = {value.split(":")[0].split(".")[0] for value in project["entry-points"]["eesd"].values()}
    missing = sorted(set(builtin_plugins()) - listed)
    assert not missing, f"add these to [project.entry-points.eesd] in pyproject.toml: {missing}"


def test_the_core_stays_small() -> None:
    sources = [p for p in sorted(CORE.rglob("*.py")) if "testing" not in p.relative_to(CORE).parts]
    counts = {str(p.relative_to(ROOT)): non_blank_lines(p) for p in sources}
    total = sum(counts.values())
    print(f"eesd_core outside eesd_core/testing: {total} non-blank lines in {len(counts)} files")
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= CORE_LINE_BUDGET, (
        f"eesd_core has {total} non-blank lines (budget {CORE_LINE_BUDGET}); largest: {largest}"
    )
