"""``eesd demo``: fetch the default model, stream an EESD reply, compare with plain decoding."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eesd_core.cli import TextStreamer, add_decoder_arguments, encode_prompt, load_decoder

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, and explain it briefly."


def add_demo(sub: Any) -> None:
    parser = sub.add_parser("demo", help="stream a reply with EESD, then compare with plain decoding")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    add_decoder_arguments(parser)
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    import torch

    torch.manual_seed(0)
    print(f"Loading {args.model} ...", file=sys.stderr)
    fast = load_decoder(args)
    plain = load_decoder(args, drafter=None)
    ids = encode_prompt(fast.tokenizer, args.prompt)
    print(f"\n> {args.prompt}\n")
    streamer = TextStreamer(fast.tokenizer)
    generation = fast.stream(ids, max_new_tokens=args.max_new_tokens)
    fast_tokens: list[int] = []
    for chunk in generation:
        streamer.push(chunk)
        fast_tokens.extend(chunk)
    streamer.close()
    plain_result = plain.generate(ids, max_new_tokens=args.max_new_tokens)
    plain_tokens = plain_result.sequences[0, len(ids) :].tolist()
    _report(args, generation.stats, plain_result.stats, fast_tokens == plain_tokens)
    print(f"  drafter: {fast.drafter.describe() if fast.drafter is not None else 'none (plain decoding)'}")
    print(f"  short passes: {fast.adapter.products.describe()}")
    return 0 if fast_tokens == plain_tokens else 1


def _report(args: argparse.Namespace, fast: Any, plain: Any, identical: bool) -> None:
    speedup = fast.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else float("nan")
    rows = [
        ("method", "tokens", "tokens/s", "mean accepted tokens"),
        (
            f"eesd ({args.drafter}, {args.controller})",
            str(fast.new_tokens),
            f"{fast.tokens_per_second:.1f}",
            f"{fast.mean_accepted_tokens:.2f}",
        ),
        ("plain decoding", str(plain.new_tokens), f"{plain.tokens_per_second:.1f}", "1.00"),
    ]
    print()
    for row in rows:
        print(f"  {row[0]:<36} {row[1]:>7} {row[2]:>9} {row[3]:>21}")
    print(
        f"\n  speedup {speedup:.2f}x; acceptance rate {fast.acceptance_rate:.2f}; "
        f"greedy texts identical: {'yes' if identical else 'NO'}"
    )
