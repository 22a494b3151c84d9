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
# The runtime only (the test kit aside): a design limit, not a ratchet. Make room by simplifying.
CORE_LINE_BUDGET = 2500


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


def core_imports() -> dict[str, set[str]]:
    """Each module of the core (the test kit aside) and the core modules it imports, at any
    depth of its source (an import for type checkers counts too)."""
    modules = {}
    for path in sorted(CORE.rglob("*.py")):
        if "testing" in path.relative_to(CORE).parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                base = node.module
                targets |= {f"{base}.{alias.name}" for alias in node.names} | {base}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        found[name] = {t for t in targets if t in modules and t != name and t != "eesd_core"}
    return found


def test_the_core_has_no_import_circle() -> None:
    """No module of the core reaches itself through its imports (the engine, the round and the
    batch layout included), so each can be read, tested and replaced on its own."""
    graph = core_imports()

    def reaches(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [" -> ".join(found) for name in graph if (found := reaches(name))]
    assert not circles, "import circles in eesd_core:\n" + "\n".join(circles)


def test_plugins_reach_the_command_line_through_its_declared_module() -> None:
    """Plug-ins take the command line's shared pieces from ``eesd_core.tools``, never from the
    ``eesd`` command's own module."""
    offending = []
    for package in plugin_packages().values():
        for source in sorted(package.rglob("*.py")):
            tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "eesd_core.cli":
                    offending.append(f"{source.relative_to(ROOT)}:{node.lineno}")
    assert not offending, "import these from eesd_core.tools:\n" + "\n".join(offending)
