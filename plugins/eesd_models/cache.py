"""Where the model cache lives, the lock that serialises writers, and the errors about both.

Reading the cache needs neither the lock nor write access, so a read-only cache serves what it
holds; only building or repairing a checkpoint opens the lock file, and a cache that cannot be
written fails there with a message that names the path and ``EESD_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from eesd_core.config import default_cache_dir
from eesd_core.errors import ModelFetchError
from eesd_models.checkpoint import Found


def models_dir(cache_dir: Path | str | None) -> Path:
    """The cache's ``models`` folder; an existing path that is not a folder is refused at once."""
    root = Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser()
    for path in (root, root / "models"):
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ModelFetchError(
                f"cannot use the model cache {path} ({origin(cache_dir)}): {exc.strerror}; "
                "point EESD_CACHE_DIR at a directory this user can read"
            ) from exc
        if not stat.S_ISDIR(mode):
            raise ModelFetchError(
                f"the model cache {path} ({origin(cache_dir)}) is not a directory; "
                "point EESD_CACHE_DIR at a directory, or pass another cache directory"
            )
    return root / "models"


def origin(cache_dir: Path | str | None) -> str:
    """Where the cache's location came from, for messages that must say what to change."""
    if cache_dir is not None:
        return "from the cache directory passed in"
    if os.environ.get("EESD_CACHE_DIR"):
        return f"from EESD_CACHE_DIR={os.environ['EESD_CACHE_DIR']}"
    return "from the default location, as EESD_CACHE_DIR is not set"


def damaged(name: str, dtype: str, cache_dir: Path | str | None, found: Found) -> ModelFetchError:
    """The error for a checkpoint that must not be loaded, with the command that rebuilds it."""
    command = ["eesd", "models", "fetch", name, "--force"]
    if dtype != "float32":
        command += ["--dtype", dtype]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    state = "damaged" if found.damaged else "not usable"
    return ModelFetchError(
        f"the cached checkpoint of {name} ({dtype}) is {state}: {found.problem}. It will not be "
        f"loaded; run `{shlex.join(command)}` to download and convert it again"
    )


def lock_file(folder: Path, name: str, where_from: str) -> TextIO:
    """Open the lock file of ``name``, making the cache's folders, or say why the cache is unusable.

    Only building and repairing write to the cache, so only they get here.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / f".{name}.lock", "a")  # noqa: SIM115 (closed by locked)
    except OSError as exc:
        raise ModelFetchError(
            f"cannot write the model cache at {folder} ({exc.strerror or exc}), and what was "
            f"asked for is not complete there. Point EESD_CACHE_DIR at a writable directory (this "
            f"cache comes {where_from}), or fetch the model once where this cache can be written"
        ) from exc


@contextlib.contextmanager
def locked(handle: TextIO, progress: bool, *, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on the open ``handle``: a second fetch waits, then reuses the first's work.

    Without ``wait``, a lock held elsewhere raises :class:`BlockingIOError` at once.
    """
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise
            if progress:
                where = Path(handle.name).parent
                print(f"eesd: waiting for another process that is fetching into {where}", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
