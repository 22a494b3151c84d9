"""``eesd models fetch|list``: get the known models onto this machine and see which are cached."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eesd_models import DEFAULT_MODEL, DTYPES


def add_models(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("models", help="fetch and list models")
    models = parser.add_subparsers(metavar="ACTION")
    fetch = models.add_parser("fetch", help="download, verify and convert a known model once")
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    fetch.add_argument("--cache-dir", default=None)
    fetch.add_argument("--dtype", choices=DTYPES, default="float32", help="of the saved checkpoint")
    fetch.add_argument("--force", action="store_true", help="redo even if a valid copy is cached")
    fetch.set_defaults(func=run_fetch)
    listing = models.add_parser("list", help="known models: licence, origin, size, where cached")
    listing.add_argument("--cache-dir", default=None)
    listing.set_defaults(func=run_list)


def run_fetch(args: argparse.Namespace) -> int:
    from eesd_models.fetch import fetch_model

    started = time.perf_counter()
    path = fetch_model(args.name, cache_dir=args.cache_dir, force=args.force, dtype=args.dtype)
    print(f"{path}  ({time.perf_counter() - started:.1f} s)")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from eesd_models.fetch import MARKER, default_cache_dir
    from eesd_models.sources import KNOWN_MODELS

    models_dir = (Path(args.cache_dir) if args.cache_dir else default_cache_dir()) / "models"
    for name, source in KNOWN_MODELS.items():
        print(name)
        print(f"    licence   {source.license}")
        print(f"    origin    {source.origin}")
        print(f"    source    {source.wheels}: GGUF of {source.size / 1e6:.1f} MB")
        for dtype in DTYPES:
            place = models_dir / (name if dtype == "float32" else f"{name}-{dtype}")
            print(f"    {dtype:<9} {_where(place, MARKER)}")
    return 0


def _where(place: Path, marker: str) -> str:
    if not (place / marker).is_file():
        return "not fetched"
    size = sum(f.stat().st_size for f in place.iterdir() if f.is_file())
    return f"cached at {place} ({size / 1e9:.2f} GB)"
