"""The ``eesd`` command: generate text and list plug-ins; plug-ins add every other command.

The parser is built from the core's two commands plus whatever the ``eesd_cli_commands`` hook adds
(``eesd bench``, ``eesd demo``, ``eesd models``, ``eesd distill`` come from plug-ins), so building
it must stay cheap: nothing here imports torch until a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from eesd_core.errors import EESDError

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


def add_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose a model and the plug-ins, shared by several commands."""
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="a local HF checkpoint directory, or a model name a plug-in knows (`eesd models list`)",
    )
    parser.add_argument(
        "--drafter", default="early_exit", help="drafter plug-in, or 'none' for plain decoding"
    )
    parser.add_argument("--drafter-options", type=json.loads, default={}, metavar="JSON")
    parser.add_argument("--controller", default="thompson")
    parser.add_argument("--controller-options", type=json.loads, default={}, metavar="JSON")
    parser.add_argument("--verifier", default="lossless")
    parser.add_argument("--max-draft-tokens", type=int, default=8)
    parser.add_argument("--cache-dir", default=None, help="where fetched models live (default: XDG cache)")
    add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser, dtype: str = "float32") -> None:
    """``--device`` and ``--dtype``: where the model runs and the precision of its weights."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument(
        "--dtype",
        default=dtype,
        choices=["float32", "bfloat16", "float16", "float64"],
        help=f"precision of the weights (default: {dtype}); p and q are still computed in float32",
    )


def load_decoder(args: argparse.Namespace, **overrides: Any) -> Any:
    """A decoder for the model and plug-ins ``args`` name (see :func:`add_decoder_arguments`)."""
    from eesd_core.engine import SpeculativeDecoder
    from eesd_core.registry import resolve_model

    path = resolve_model(args.model, cache_dir=args.cache_dir)
    options = dict(
        drafter=None if args.drafter == "none" else args.drafter,
        drafter_options=args.drafter_options,
        controller=args.controller,
        controller_options=args.controller_options,
        verifier=args.verifier,
        max_draft_tokens=args.max_draft_tokens,
    )
    options.update(overrides)
    return SpeculativeDecoder.from_pretrained(str(path), dtype=args.dtype, device=args.device, **options)


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids of ``text``, wrapped in the tokenizer's chat template when it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return list(ids)
    return tokenizer(text)["input_ids"]


def _add_generate(sub: Any) -> None:
    parser = sub.add_parser("generate", help="generate a reply to a prompt, streaming it")
    parser.add_argument("prompt", nargs="?", help="the prompt (default: read standard input)")
    add_decoder_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    parser.add_argument("--stats", action="store_true", help="print generation statistics to stderr")
    parser.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    dec = load_decoder(args)
    if dec.tokenizer is None:
        raise EESDError(f"{args.model!r} has no tokenizer: `eesd generate` needs one to read text.")
    ids = encode_prompt(dec.tokenizer, text, chat=not args.no_chat)
    stream = TextStreamer(dec.tokenizer)
    generation = dec.stream(
        ids,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    for chunk in generation:
        stream.push(chunk)
    stream.close()
    if args.stats:
        print(json.dumps(generation.stats.to_dict(), indent=2), file=sys.stderr)
    return 0


class TextStreamer:
    """Prints decoded text as tokens arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Any, out: Any = None) -> None:
        self.tokenizer = tokenizer
        self.out = out or sys.stdout
        self.tokens: list[int] = []
        self.printed = 0

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)

    def close(self) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        self.out.write(text[self.printed :] + "\n")
        self.out.flush()


def _add_plugins(sub: Any) -> None:
    parser = sub.add_parser("plugins", help="list the loaded plug-ins and what they provide")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_plugins)


def plugin_report() -> list[dict[str, Any]]:
    from eesd_core.registry import KINDS, get_manager

    manager = get_manager()
    provides: dict[str, dict[str, list[str]]] = {}
    for kind in KINDS:
        for entry in manager.registry(kind).entries():
            provides.setdefault(entry.plugin, {}).setdefault(kind, []).append(entry.name)
    return [
        {
            "name": info.name,
            "distribution": info.distribution,
            "version": info.version,
            "hooks": list(info.hooks),
            "provides": provides.get(info.name, {}),
        }
        for info in sorted(manager.info.values(), key=lambda i: i.name)
    ]


def _plugins(args: argparse.Namespace) -> int:
    report = plugin_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for item in report:
        provided = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in item["provides"].items())
        print(f"{item['name']:<16} {item['distribution'] or '?'} {item['version'] or ''}  {provided}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
