"""Weights load only through safetensors/GGUF readers; no remote code; only installed plug-ins."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("eesd_core", "drafters", "controllers", "verifiers") for p in (ROOT / d).rglob("*.py")]


def _calls(path: pathlib.Path):  # noqa: ANN202
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_and_no_remote_code(path: pathlib.Path) -> None:
    source = path.read_text()
    assert "import pickle" not in source and "from pickle" not in source
    for call in _calls(path):
        if _name(call.func).endswith("torch.load"):
            weights_only = {k.arg: k.value for k in call.keywords}.get("weights_only")
            assert isinstance(weights_only, ast.Constant) and weights_only.value is True, path
        for keyword in call.keywords:
            if keyword.arg == "trust_remote_code":
                assert isinstance(keyword.value, ast.Constant) and keyword.value.value is False, path


def test_sources_were_scanned() -> None:
    assert len(SOURCES) > 20
