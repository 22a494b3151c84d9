"""``eesd models fetch|list``: get the known models onto this machine and see which are cached."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eesd_models import DEFAULT_MODEL


def add_models(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("models", help="fetch and list models")
    models = parser.add_subparsers(metavar="ACTION")
    fetch = models.add_parser("fetch", help="download, verify and convert a known model once")
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    fetch.add_argument("--cache-dir", default=None)
    fetch.add_argument("--force", action="store_true", help="redo even if a valid copy is cached")
    fetch.set_defaults(func=run_fetch)
    listing = models.add_parser("list", help="known models and where they are cached")
    listing.add_argument("--cache-dir", default=None)
    listing.set_defaults(func=run_list)


def run_fetch(args: argparse.Namespace) -> int:
    from eesd_models.fetch import fetch_model

    started = time.perf_counter()
    path = fetch_model(args.name, cache_dir=args.cache_dir, force=args.force)
    print(f"{path}  ({time.perf_counter() - started:.1f} s)")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from eesd_models.fetch import KNOWN_MODELS, default_cache_dir

    root = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    for name in KNOWN_MODELS:
        place = root / "models" / name
        print(f"{name:<28} {'cached at ' + str(place) if place.is_dir() else 'not fetched'}")
    return 0
