"""``eesd models fetch|list|verify``: get the known models onto this machine, see which are cached,
and check the cached checkpoints against the sha256 of their files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eesd_models import DEFAULT_MODEL, DTYPES


class _Defaults(argparse.HelpFormatter):
    """Adds each option's default to its help, unless the help already speaks of it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".lstrip()


CACHE_HELP = "where fetched models live (default: eesd's cache)"


def add_models(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("models", help="fetch, list and verify models")
    models = parser.add_subparsers(metavar="ACTION")
    fetch = models.add_parser(
        "fetch", help="download, verify and convert a known model once", formatter_class=_Defaults
    )
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL, help="a known model (`eesd models list`)")
    fetch.add_argument("--cache-dir", default=None, help=CACHE_HELP)
    fetch.add_argument("--dtype", choices=DTYPES, default="float32", help="of the saved checkpoint")
    fetch.add_argument(
        "--force", action="store_true", help="download and convert again, even if cached; repairs damage"
    )
    fetch.set_defaults(func=run_fetch)
    listing = models.add_parser(
        "list", help="known models: licence, origin, size, where cached", formatter_class=_Defaults
    )
    listing.add_argument("--cache-dir", default=None, help=CACHE_HELP)
    listing.set_defaults(func=run_list)
    verify = models.add_parser(
        "verify", help="hash every file of the cached checkpoints again", formatter_class=_Defaults
    )
    verify.add_argument("name", nargs="?", default=None, help="one known model (default: every cached one)")
    verify.add_argument("--cache-dir", default=None, help=CACHE_HELP)
    verify.set_defaults(func=run_verify)


def run_fetch(args: argparse.Namespace) -> int:
    from eesd_models.fetch import fetch_model

    started = time.perf_counter()
    path = fetch_model(args.name, cache_dir=args.cache_dir, force=args.force, dtype=args.dtype)
    print(f"{path}  ({time.perf_counter() - started:.1f} s)")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Exit status 1 when any checkpoint checked is damaged, or when the one named is not cached."""
    from eesd_core.errors import InputError, ModelFetchError
    from eesd_models import cache
    from eesd_models.fetch import entry_name, verify_model
    from eesd_models.sources import KNOWN_MODELS

    if args.name and args.name not in KNOWN_MODELS:
        raise InputError(f"unknown model {args.name!r}; `eesd models list` shows the known ones")
    models_dir = cache.models_dir(args.cache_dir)
    names = [args.name] if args.name else list(KNOWN_MODELS)
    failed = checked = 0
    for name in names:
        for dtype in DTYPES:
            if not (models_dir / entry_name(name, dtype)).exists():
                continue
            checked += 1
            try:
                print(f"ok: {verify_model(name, args.cache_dir, dtype=dtype)}")
            except ModelFetchError as exc:
                failed += 1
                print(f"eesd: error: {exc}", file=sys.stderr)
    if args.name and not checked:
        raise ModelFetchError(f"{args.name} is not cached in {models_dir}: nothing to verify")
    if not checked:
        print(f"no model is cached in {models_dir}")
    return 1 if failed else 0


def run_list(args: argparse.Namespace) -> int:
    from eesd_models import cache
    from eesd_models.fetch import MARKER, entry_name
    from eesd_models.sources import KNOWN_MODELS

    models_dir = cache.models_dir(args.cache_dir)
    for name, source in KNOWN_MODELS.items():
        print(name)
        print(f"    licence   {source.license}")
        print(f"    origin    {source.origin}")
        print(f"    source    {source.wheels}: GGUF of {source.size / 1e6:.1f} MB")
        for dtype in DTYPES:
            place = models_dir / entry_name(name, dtype)
            print(f"    {dtype:<9} {_where(place, MARKER)}")
    return 0


def _where(place: Path, marker: str) -> str:
    if not (place / marker).is_file():
        return "not fetched"
    size = sum(f.stat().st_size for f in place.iterdir() if f.is_file())
    return f"cached at {place} ({size / 1e9:.2f} GB)"
