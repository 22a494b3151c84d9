"""The ``eesd`` command: ``generate`` and ``plugins``; plug-ins add every other command (hook
``eesd_cli_commands``). Building the parser stays cheap: nothing imports torch until a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from eesd_core.errors import EESDError
from eesd_core.tools import add_decoder_arguments, encode_prompt, load_decoder

DEFAULTS = argparse.ArgumentDefaultsHelpFormatter
DESCRIPTION = "Lossless early-exiting speculative decoding for Hugging Face causal LMs."


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EESDError as exc:
        print(f"eesd: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("eesd: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    from eesd_core import __version__

    parser = argparse.ArgumentParser(prog="eesd", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"eesd {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")
    _add_generate(sub)
    _add_plugins(sub)
    try:
        from eesd_core.registry import get_manager

        get_manager().pm.hook.eesd_cli_commands(subparsers=sub)
    except EESDError as exc:
        print(f"eesd: warning: plug-in commands unavailable: {exc}", file=sys.stderr)
    return parser


def _add_generate(sub: Any) -> None:
    parser = sub.add_parser(
        "generate", help="generate a reply to a prompt, streaming it", formatter_class=DEFAULTS
    )
    parser.add_argument("prompt", nargs="?", help="the prompt (default: read standard input)")
    add_decoder_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sample from this much probability")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    parser.add_argument("--stats", action="store_true", help="print generation statistics to stderr")
    parser.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    dec = load_decoder(args)
    if dec.tokenizer is None:
        raise EESDError(f"{args.model!r} has no tokenizer: `eesd generate` needs one to read text.")
    ids = encode_prompt(dec.tokenizer, text, chat=not args.no_chat)
    from transformers import TextStreamer

    stream = TextStreamer(dec.tokenizer, skip_prompt=True, skip_special_tokens=True)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    result = dec.generate(ids, max_new_tokens=args.max_new_tokens, streamer=stream, **sampling)
    if args.stats:
        print(json.dumps(result.stats.to_dict(), indent=2), file=sys.stderr)
    return 0


def _add_plugins(sub: Any) -> None:
    parser = sub.add_parser(
        "plugins", help="list the loaded plug-ins and what they provide", formatter_class=DEFAULTS
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a plug-in failed to load")
    parser.set_defaults(func=_plugins)


def plugin_report() -> list[dict[str, Any]]:
    from eesd_core.registry import KINDS, get_manager

    manager = get_manager()
    provides: dict[str, dict[str, list[str]]] = {}
    for kind in KINDS:
        for entry in manager.registry(kind).entries():
            provides.setdefault(entry.plugin, {}).setdefault(kind, []).append(entry.name)
    for impl in manager.pm.hook.eesd_cli_commands.get_hookimpls():  # the commands each plug-in adds
        impl.function(subparsers=(commands := argparse.ArgumentParser().add_subparsers()))
        provides.setdefault(impl.plugin_name, {})["command"] = sorted(commands.choices)
    infos = sorted(manager.info.items())
    report = [asdict(info) | {"provides": provides.get(name, {})} for name, info in infos]
    return report + [{"name": name, "broken": why} for name, why in sorted(manager.broken.items())]


def _plugins(args: argparse.Namespace) -> int:
    report = plugin_report()
    if args.json:
        print(json.dumps(report, indent=2))
    for item in [] if args.json else report:
        said = [f"{kind}: {', '.join(names)}" for kind, names in item.get("provides", {}).items()]
        said = said or [f"hooks: {', '.join(item.get('hooks', ()))}"]
        where = f"BROKEN: {item['broken']}" if "broken" in item else f"{item['distribution'] or '?'}"
        print(f"{item['name']:<16} {where} {item.get('version') or ''}  {'; '.join(said)}")
    return 1 if args.strict and any("broken" in item for item in report) else 0


if __name__ == "__main__":
    raise SystemExit(main())
