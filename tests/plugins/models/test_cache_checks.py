"""Tests of the model cache's checks: read-only caches, unusable cache paths, damaged checkpoints,
``eesd models verify``, and checkpoints converted by an older eesd.

Root may write anywhere, so a read-only cache is made three ways: a child process that drops to
the ``nobody`` user, a read-only bind mount (both only as root), and ``chmod`` (only when not root).
Each is skipped where it cannot work.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from eesd_models import checkpoint, fetch
from fakefetch import FAKE, FakePipeline

from eesd_core.cli import main
from eesd_core.errors import ModelFetchError

NOBODY = 65534
Outcome = tuple[str, str]  # ("ok", str(result)) or (name of the exception's class, its message)
ReadOnly = Callable[[Path, Callable[[Path], object]], tuple[Path, Outcome]]


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every user may read, unlike pytest's own temporary folders, with the usual umask."""
    folder = Path(tempfile.mkdtemp(prefix="eesd-cache-test-"))
    folder.chmod(0o755)
    umask = os.umask(0o022)
    yield folder
    os.umask(umask)
    shutil.rmtree(folder, ignore_errors=True)


def _outcome(call: Callable[[], object]) -> Outcome:
    try:
        return "ok", str(call())
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _as_nobody(cache: Path, call: Callable[[Path], object]) -> tuple[Path, Outcome]:
    """Run ``call(cache)`` in a forked child that has dropped root for the ``nobody`` user."""
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, json.dumps(_outcome(lambda: call(cache))).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        if not select.select([read], [], [], 60)[0]:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the child running as nobody did not answer")
        data = b""
        while chunk := os.read(read, 1 << 16):
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    kind, message = json.loads(data)
    return cache, (kind, message)


def _on_a_read_only_mount(cache: Path, call: Callable[[Path], object]) -> tuple[Path, Outcome]:
    """Run ``call`` on a read-only bind mount of ``cache``, in this process."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("bind mounts need root and mount(8)")
    mounted = cache.with_name(cache.name + "-ro")
    mounted.mkdir()
    done = subprocess.run(["mount", "--bind", str(cache), str(mounted)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"bind mounts are not allowed here: {done.stderr.strip()}")
    try:
        done = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(mounted)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"read-only remounts are not allowed here: {done.stderr.strip()}")
        return mounted, _outcome(lambda: call(mounted))
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def _with_chmod(cache: Path, call: Callable[[Path], object]) -> tuple[Path, Outcome]:
    """Run ``call`` with every folder of ``cache`` made read-only, which binds users other than root."""
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the other variants cover root")
    folders = [cache, *(p for p in cache.rglob("*") if p.is_dir())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        return cache, _outcome(lambda: call(cache))
    finally:
        for folder in folders:
            folder.chmod(0o755)


@pytest.fixture(params=[_as_nobody, _on_a_read_only_mount, _with_chmod], ids=["nobody", "ro-mount", "chmod"])
def read_only(request: pytest.FixtureRequest) -> ReadOnly:
    return request.param


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_a_read_only_cache_serves_a_complete_checkpoint(
    shared: Path, pipeline: FakePipeline, read_only: ReadOnly
) -> None:
    cache = shared / "cache"
    fetch.fetch_model(FAKE, cache, progress=False)
    before = _snapshot(cache)
    used, outcome = read_only(cache, lambda c: fetch.fetch_model(FAKE, c, progress=False))
    assert outcome == ("ok", str(used / "models" / FAKE))
    assert _snapshot(cache) == before
    assert pipeline.conversions == 1


def test_a_read_only_cache_checks_what_it_serves(
    shared: Path, pipeline: FakePipeline, read_only: ReadOnly
) -> None:
    cache = shared / "cache"
    weights = fetch.fetch_model(FAKE, cache, progress=False) / "model.safetensors"
    _damage_in_place(weights)
    used, (kind, message) = read_only(cache, lambda c: fetch.fetch_model(FAKE, c, progress=False))
    assert kind == "ModelFetchError"
    assert f"{used / 'models' / FAKE / 'model.safetensors'} has sha256" in message
    assert "--force" in message


def test_an_empty_read_only_cache_names_its_path_and_the_variable(
    shared: Path, pipeline: FakePipeline, read_only: ReadOnly, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = shared / "cache"
    cache.mkdir()

    def fetch_from(path: Path) -> Path:
        monkeypatch.setenv("EESD_CACHE_DIR", str(path))
        return fetch.fetch_model(FAKE, progress=False)

    used, (kind, message) = read_only(cache, fetch_from)
    assert kind == "ModelFetchError"
    assert f"cannot write the model cache at {used / 'models'}" in message
    assert f"from EESD_CACHE_DIR={used}" in message
    assert "writable directory" in message
    assert pipeline.downloads == 0


def test_a_cache_dir_that_is_a_file_is_refused(
    tmp_path: Path,
    pipeline: FakePipeline,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = tmp_path / "not-a-folder"
    file.write_text("")
    monkeypatch.setenv("EESD_CACHE_DIR", str(file))
    with pytest.raises(ModelFetchError) as caught:
        fetch.fetch_model(FAKE, progress=False)
    assert f"the model cache {file} (from EESD_CACHE_DIR={file}) is not a directory" in str(caught.value)
    for command in (["models", "fetch"], ["models", "verify"], ["models", "list"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"eesd: error: the model cache {file} (from EESD_CACHE_DIR={file})")
        assert "Traceback" not in err


def test_a_cache_dir_below_a_file_is_refused(tmp_path: Path, pipeline: FakePipeline) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ModelFetchError) as caught:
        fetch.fetch_model(FAKE, tmp_path / "file" / "cache", progress=False)
    assert f"cannot use the model cache {tmp_path / 'file' / 'cache'} " in str(caught.value)
    assert "Not a directory" in str(caught.value) and "EESD_CACHE_DIR" in str(caught.value)


def _damage_in_place(path: Path) -> None:
    """Flip one byte, then put the size and times back as they were."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def test_weights_damaged_in_place_with_size_and_mtime_kept_are_refused(
    cache: Path, pipeline: FakePipeline
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    recorded = json.loads((path / fetch.MARKER).read_text())["files"]["model.safetensors"]["sha256"]
    _damage_in_place(path / "model.safetensors")
    with pytest.raises(ModelFetchError) as caught:
        fetch.fetch_model(FAKE, cache, progress=False)
    message = str(caught.value)
    assert f"{path / 'model.safetensors'} has sha256 " in message
    assert f"expected {recorded}" in message
    assert f"eesd models fetch {FAKE} --force" in message
    assert pipeline.conversions == 1


def test_the_damage_error_names_the_dtype_to_repair(cache: Path, pipeline: FakePipeline) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False, dtype="bfloat16")
    _damage_in_place(path / "config.json")
    with pytest.raises(ModelFetchError, match=f"{path / 'config.json'} has sha256") as caught:
        fetch.fetch_model(FAKE, cache, progress=False, dtype="bfloat16")
    assert f"fetch {FAKE} --force --dtype bfloat16 --cache-dir {cache}`" in str(caught.value)


def test_models_verify_passes_a_good_cache_and_fails_a_damaged_one(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    assert main(["models", "verify", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out == f"ok: {path}\n"
    _damage_in_place(path / "model.safetensors")
    assert main(["models", "verify", FAKE, "--cache-dir", str(cache)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"eesd: error: the cached checkpoint of {FAKE} (float32) is damaged" in err
    assert f"{path / 'model.safetensors'} has sha256" in err
    assert main(["models", "fetch", FAKE, "--force", "--cache-dir", str(cache)]) == 0
    assert main(["models", "verify", FAKE, "--cache-dir", str(cache)]) == 0
    assert pipeline.conversions == 2


def test_models_verify_hashes_what_the_quick_check_trusts(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    """Damage that leaves every stamp as it was, as bit rot beneath the file system would."""
    path = fetch.fetch_model(FAKE, cache, progress=False)
    weights = path / "model.safetensors"
    _damage_in_place(weights)
    verified = json.loads((path / checkpoint.VERIFIED).read_text())
    verified["files"]["model.safetensors"] = checkpoint._stamp(weights.stat())
    (path / checkpoint.VERIFIED).write_text(json.dumps(verified))
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert main(["models", "verify", "--cache-dir", str(cache)]) == 1
    assert f"{weights} has sha256" in capsys.readouterr().err


def test_models_verify_of_what_is_not_cached(
    cache: Path, pipeline: FakePipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "verify", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out == f"no model is cached in {cache / 'models'}\n"
    assert main(["models", "verify", FAKE, "--cache-dir", str(cache)]) == 1
    assert f"{FAKE} is not cached in {cache / 'models'}" in capsys.readouterr().err
    (cache / "models" / FAKE).mkdir(parents=True)
    assert main(["models", "verify", FAKE, "--cache-dir", str(cache)]) == 1
    assert f"holds no readable {fetch.MARKER}" in capsys.readouterr().err
    assert main(["models", "verify", "no-such-model", "--cache-dir", str(cache)]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def _as_converted_by_an_older_eesd(path: Path) -> dict:
    """Rewrite the marker as the first format kept it: sizes, and the sha256 of the weights only."""
    marker = json.loads((path / fetch.MARKER).read_text())
    weights = path / "model.safetensors"
    older = {
        **{k: v for k, v in marker.items() if k != "files"},
        "format": 1,
        "files": {name: entry["size"] for name, entry in marker["files"].items()},
        "model_sha256": marker["files"]["model.safetensors"]["sha256"],
        "model_mtime_ns": weights.stat().st_mtime_ns,
    }
    (path / fetch.MARKER).write_text(json.dumps(older))
    (path / checkpoint.VERIFIED).unlink()
    return marker


def test_a_checkpoint_of_an_older_eesd_is_checked_and_upgraded(
    cache: Path, pipeline: FakePipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    marker = _as_converted_by_an_older_eesd(path)
    hashed: list[str] = []
    real = checkpoint._hash
    monkeypatch.setattr(checkpoint, "_hash", lambda p: hashed.append(p.name) or real(p))
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert json.loads((path / fetch.MARKER).read_text()) == marker
    assert sorted(hashed) == ["config.json", "model.safetensors", "tokenizer.json"]
    hashed.clear()
    assert fetch.fetch_model(FAKE, cache, progress=False) == path
    assert hashed == []
    assert pipeline.conversions == 1


def test_a_damaged_checkpoint_of_an_older_eesd_is_refused(cache: Path, pipeline: FakePipeline) -> None:
    path = fetch.fetch_model(FAKE, cache, progress=False)
    _as_converted_by_an_older_eesd(path)
    _damage_in_place(path / "model.safetensors")
    with pytest.raises(ModelFetchError, match=f"{path / 'model.safetensors'} has sha256"):
        fetch.fetch_model(FAKE, cache, progress=False)


def test_a_read_only_checkpoint_of_an_older_eesd_is_served_as_it_is(
    shared: Path, pipeline: FakePipeline, read_only: ReadOnly
) -> None:
    cache = shared / "cache"
    path = fetch.fetch_model(FAKE, cache, progress=False)
    _as_converted_by_an_older_eesd(path)
    before = _snapshot(cache)
    used, outcome = read_only(cache, lambda c: fetch.fetch_model(FAKE, c, progress=False))
    assert outcome == ("ok", str(used / "models" / FAKE))
    assert _snapshot(cache) == before
