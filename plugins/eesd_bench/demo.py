"""``eesd demo``: fetch a model, stream an EESD reply, compare with plain decoding and transformers.

The comparison runs each method once, after the stream: eesd plain decoding, then transformers'
greedy ``generate()`` on the same prompt (``--no-transformers`` skips it). On SmolLM2 (the default)
it takes seconds; on ``qwen2.5-coder-1.5b-instruct`` each run of 128 tokens takes about a minute
on a 2-core CPU, which is where the exit head pays.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eesd_bench.env import products_of
from eesd_core.tools import add_decoder_arguments, encode_prompt, load_decoder

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, and explain it briefly."


def add_demo(sub: Any) -> None:
    parser = sub.add_parser("demo", help="stream a reply with EESD, then compare with plain decoding")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--no-transformers", action="store_true", help="skip the comparison with transformers' generate()"
    )
    add_decoder_arguments(parser)
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    import torch

    torch.manual_seed(0)
    print(f"Loading {args.model} ...", file=sys.stderr)
    from eesd_core import SpeculativeDecoder

    fast = load_decoder(args)
    plain = SpeculativeDecoder(fast.model, drafter=None, tokenizer=fast.tokenizer)  # the same weights
    ids = encode_prompt(fast.tokenizer, args.prompt)
    print(f"\n> {args.prompt}\n")
    from transformers import TextStreamer

    streamer = TextStreamer(fast.tokenizer, skip_special_tokens=True)
    generation = fast.stream(ids, max_new_tokens=args.max_new_tokens)
    fast_tokens: list[int] = []
    for chunk in generation:
        streamer.put(torch.tensor(chunk))
        fast_tokens.extend(chunk)
    streamer.end()
    plain_result = plain.generate(ids, max_new_tokens=args.max_new_tokens)
    plain_tokens = plain_result.sequences[0, len(ids) :].tolist()
    reference = None if args.no_transformers else _transformers(fast.model, ids, args.max_new_tokens)
    identical = _agree(fast.model, ids, plain_tokens, fast_tokens)
    if reference is not None:
        identical = identical and _agree(fast.model, ids, reference[0], fast_tokens)
    _report(args, generation.stats, plain_result.stats, identical, reference)
    print(f"  drafter: {fast.drafter.describe() if fast.drafter is not None else 'none (plain decoding)'}")
    print(f"  linear products: {products_of(fast.adapter)}")
    return 0 if identical else 1


def _agree(model: Any, ids: list[int], reference: list[int], tokens: list[int]) -> bool:
    """Equal, or in half precision parted at a tie of the reference's top-2 logits."""
    from eesd_core.testing.agreement import compare_greedy, logits_after

    rows = lambda i: logits_after(model, ids + reference[:i])  # noqa: E731
    agreement = compare_greedy(reference, tokens, model.dtype, rows)
    if agreement.tie:
        print(f"  (half precision: {agreement.describe()})")
    return agreement.ok


def _transformers(model: Any, ids: Any, max_new_tokens: int) -> tuple[list[int], float]:
    """transformers' greedy ``generate()``: its new tokens and tokens/s, timed like eesd's (the
    whole call, prefill included)."""
    import time

    import torch

    prompt = torch.as_tensor(ids, dtype=torch.long, device=model.device).view(1, -1)
    with torch.inference_mode():
        started = time.perf_counter()
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
        )
        seconds = time.perf_counter() - started
    tokens = out[0, prompt.shape[1] :].tolist()
    return tokens, len(tokens) / seconds if seconds > 0 else float("nan")


def _report(
    args: argparse.Namespace,
    fast: Any,
    plain: Any,
    identical: bool,
    reference: tuple[list[int], float] | None,
) -> None:
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
    if reference is not None:
        rows.append(("transformers generate()", str(len(reference[0])), f"{reference[1]:.1f}", "1.00"))
    print()
    for row in rows:
        print(f"  {row[0]:<36} {row[1]:>7} {row[2]:>9} {row[3]:>21}")
    versus = ""
    if reference is not None and reference[1] > 0:
        versus = f" ({fast.tokens_per_second / reference[1]:.2f}x transformers)"
    print(
        f"\n  speedup {speedup:.2f}x over plain decoding{versus}; "
        f"acceptance rate {fast.acceptance_rate:.2f}; greedy texts identical: {'yes' if identical else 'NO'}"
    )
