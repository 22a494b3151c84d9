"""What makes a cached checkpoint whole, and the checks that prove it before it is loaded.

A conversion ends with a marker file that names the model, dtype and pinned GGUF source and records
the size and sha256 of every file of the checkpoint. Before a cached checkpoint is served, each file
must have the recorded size, no other file may be present, and each file must hash to the recorded
sha256. Hashing gigabytes on every load would be slow, so a sidecar file remembers the files found
good: their size, mtime, ctime and inode when they were last hashed, and the marker they matched. A
file whose four values are unchanged is not hashed again; any change, including one that restores
the size and mtime with ``os.utime``, moves the ctime, which no user program can set, and brings the
full hash back. A cache this process cannot write keeps the sidecar it has, or hashes on every load.

Damage that changes no file metadata (bit rot beneath the file system) is found by the full check of
``eesd models verify``, which ignores the sidecar. Checkpoints converted by older versions of eesd
record the sha256 of their weights only; they are checked against it and upgraded when the cache is
writable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eesd_models.sources import ModelSource

MARKER = "eesd-complete.json"
MARKER_FORMAT = 2
VERIFIED = ".eesd-verified.json"
_OURS = ".eesd-"  # the sidecar, and files being written atomically
_LEGACY_FORMAT = 1
_CHUNK = 1 << 20

Stamp = list[int]  # size, mtime_ns, ctime_ns, inode


@dataclass(frozen=True)
class Found:
    """What a checkpoint directory holds: a marker of the wanted build, and what is wrong with it.

    ``marker`` is None when there is no finished checkpoint of that source and dtype (absent,
    interrupted or stale), which a fetch replaces; ``problem`` with a marker means damage.
    """

    marker: dict[str, Any] | None
    problem: str | None

    @property
    def whole(self) -> bool:
        return self.marker is not None and self.problem is None

    @property
    def damaged(self) -> bool:
        return self.marker is not None and self.problem is not None


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file, read in chunks so that large weights need little memory."""
    return _hash(Path(path))[0]


def examine(target: Path, source: ModelSource, dtype: str, *, full: bool = False) -> Found:
    """Check ``target`` against its marker; ``full`` hashes every file, ignoring the sidecar."""
    try:
        if not target.exists():
            return Found(None, f"nothing is cached at {target}")
        raw = (target / MARKER).read_bytes()
    except OSError:
        return Found(None, f"{target} holds no readable {MARKER}: it was never finished")
    marker = _parse(raw)
    if marker is None:
        return Found(None, f"{target / MARKER} is unreadable")
    if marker["source"].get("sha256") != source.sha256 or marker["dtype"] != dtype:
        return Found(None, f"{target} was converted from another source or in another dtype")
    try:
        return Found(marker, _problem(target, raw, marker, full))
    except OSError as exc:
        return Found(marker, f"cannot read {exc.filename or target} ({exc.strerror or exc})")


def write_marker(out: Path, name: str, source: ModelSource, dtype: str) -> None:
    """Record what the checkpoint in ``out`` is and hash its files; written last, it means complete."""
    head = {"model": name, "dtype": dtype, "source": asdict(source)}
    _record(out, head, sorted(f.name for f in out.iterdir() if f.is_file()))


def upgrade(target: Path, marker: dict[str, Any]) -> None:
    """Rewrite an older marker, already checked, with the sha256 of every file it lists.

    Files whose sha256 the check just matched, and that have not changed since, are not hashed again.
    """
    if marker["format"] == MARKER_FORMAT:
        return
    remembered = _remembered(target, (target / MARKER).read_bytes())
    known = {}
    for name, (_, digest) in _expected(marker).items():
        stamp = remembered.get(name)
        if digest is not None and stamp is not None and stamp == _stamp((target / name).stat()):
            known[name] = (digest, stamp)
    head = {k: v for k, v in marker.items() if k not in ("format", "files") and not k.startswith("model_")}
    _record(target, head, sorted(_expected(marker)), known)


def _record(
    folder: Path,
    head: dict[str, Any],
    files: list[str],
    known: dict[str, tuple[str, Stamp]] | None = None,
) -> None:
    """Write the marker of ``files`` in ``folder`` with their sizes and sha256, and remember them.

    ``known`` gives the sha256 and stamp of files already hashed.
    """
    entries, good = {}, {}
    for name in files:
        digest, stamp = (known or {}).get(name) or _hash(folder / name)
        entries[name] = {"size": (folder / name).stat().st_size, "sha256": digest}
        if stamp is not None:
            good[name] = stamp
    marker = {"format": MARKER_FORMAT, **head, "files": entries}
    raw = (json.dumps(marker, indent=2) + "\n").encode()
    _write_atomically(folder / MARKER, raw)
    _remember(folder, raw, good)


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The marker in ``raw`` if it is one this version reads, else None."""
    try:
        marker = json.loads(raw)
        _expected(marker)
        if not isinstance(marker["source"], dict) or not isinstance(marker["dtype"], str):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def _expected(marker: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
    """Each file's recorded size and sha256; None where an older marker kept only the size."""
    files = marker["files"]
    if marker["format"] == _LEGACY_FORMAT:
        weights = str(marker["model_sha256"])
        return {f: (int(size), weights if f == "model.safetensors" else None) for f, size in files.items()}
    if marker["format"] != MARKER_FORMAT:
        raise ValueError(f"unknown marker format {marker['format']!r}")
    return {f: (int(entry["size"]), str(entry["sha256"])) for f, entry in files.items()}


def _problem(target: Path, raw: bytes, marker: dict[str, Any], full: bool) -> str | None:
    """Why the files of ``target`` are not those ``marker`` records, in words; None when they are."""
    expected = _expected(marker)
    problem = _layout_problem(target, expected) or _unexpected(target, expected)
    if problem:
        return problem
    remembered = {} if full else _remembered(target, raw)
    good: dict[str, Stamp] = {}
    for name, (_, digest) in expected.items():
        path = target / name
        if digest is None:
            continue
        stamp = _stamp(path.stat())
        if remembered.get(name) == stamp:
            good[name] = stamp
            continue
        actual, hashed = _hash(path)
        if actual != digest:
            return f"{path} has sha256 {actual}, expected {digest} as recorded when it was converted"
        if hashed is not None:
            good[name] = hashed
    if good != remembered:
        _remember(target, raw, good)
    return None


def _layout_problem(target: Path, expected: dict[str, tuple[int, str | None]]) -> str | None:
    for name, (size, _) in expected.items():
        path = target / name
        try:
            actual = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if not path.is_file():
            return f"{path} is not a regular file"
        if actual != size:
            return f"{path} has {actual} bytes, expected {size}"
    return None


def _unexpected(target: Path, expected: Iterable[str]) -> str | None:
    """A file that was not part of the conversion: transformers might read it, so it is refused."""
    known = {MARKER, *expected}
    for path in sorted(target.iterdir()):
        if path.name not in known and not path.name.startswith(_OURS):
            return f"{path} was not written by the conversion"
    return None


def _hash(path: Path) -> tuple[str, Stamp | None]:
    """The sha256 of ``path`` and its stamp, or None for the stamp if the file changed meanwhile."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        before = _stamp(os.fstat(handle.fileno()))
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        after = _stamp(os.fstat(handle.fileno()))
    return digest.hexdigest(), before if before == after else None


def _stamp(stat: os.stat_result) -> Stamp:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def _remembered(target: Path, raw: bytes) -> dict[str, Stamp]:
    """The stamps of the files last found good against this very marker; empty if none."""
    try:
        verified = json.loads((target / VERIFIED).read_text())
        if verified["marker_sha256"] != hashlib.sha256(raw).hexdigest():
            return {}
        return {str(name): [int(v) for v in stamp] for name, stamp in verified["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _remember(target: Path, raw: bytes, good: dict[str, Stamp]) -> None:
    """Keep the stamps of files just hashed, when the cache can be written; reading never needs it."""
    record = {"marker_sha256": hashlib.sha256(raw).hexdigest(), "files": good}
    with contextlib.suppress(OSError):
        _write_atomically(target / VERIFIED, (json.dumps(record) + "\n").encode())


def _write_atomically(path: Path, data: bytes) -> None:
    """Write through a temporary file beside ``path``, so that readers see the old or the new file."""
    partial = path.with_name(f"{_OURS}partial-{os.getpid()}-{threading.get_ident()}-{path.name}")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
