"""``eesd demo``: fetch a model, stream a reply with eesd, then time eesd fairly against plain
decoding and transformers.

After the streamed reply, each method generates greedily from a couple of short prompts: eesd as
the options configure it (by default the early-exit drafter), eesd plain (the same model, no
drafter) and transformers' ``generate()`` (``--no-transformers`` leaves it out). Every method makes
one untimed warm-up call; then each round runs every method on every prompt, the order of the
methods rotating by one place per round, each call timed from outside, prefill included. The table
gives each method's median tokens per second over the rounds, the lowest and highest round, and the
ratios of the medians; every output must equal the reference's token for token.

On a model as small as SmolLM2 (the default) a CPU decodes so fast that drafting rarely pays; the
demo then says so and names the command that shows a gain.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from eesd_bench.env import products_of
from eesd_bench.helptext import DefaultsFormatter, plain_text
from eesd_core.errors import InputError
from eesd_core.tools import add_decoder_arguments, encode_prompt, load_decoder

DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, and explain it briefly."
SECOND_PROMPT = "Explain in two sentences what a hash table is."
GAIN_MODEL = "qwen2.5-coder-1.5b-instruct"
PLAIN = "eesd plain"
HF = "transformers generate()"

Runner = Callable[[list[int]], list[int]]


def add_demo(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="stream a reply with eesd, then time it against plain decoding and transformers",
        description=plain_text(__doc__),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="the prompt streamed, and the first one timed"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=40, help="new tokens of the reply and of every timed call"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of every method on every prompt")
    parser.add_argument(
        "--no-transformers", action="store_true", help="leave transformers' generate() out of the timing"
    )
    add_decoder_arguments(parser)
    parser.set_defaults(func=run_demo)


def say(message: str) -> None:
    """A progress line, printed before a step that may take more than a moment."""
    print(f"eesd: {message}", file=sys.stderr, flush=True)


def run_demo(args: argparse.Namespace) -> int:
    _check(args)
    import torch
    from transformers.utils import logging

    from eesd_core import SpeculativeDecoder

    logging.set_verbosity_error()
    torch.manual_seed(0)
    say(f"loading {args.model} (fetched and converted first if it is not cached)")
    fast = load_decoder(args)
    products = {"products": args.products}
    plain = SpeculativeDecoder(fast.model, drafter=None, tokenizer=fast.tokenizer, adapter_options=products)
    prompts = [encode_prompt(fast.tokenizer, text) for text in (args.prompt, SECOND_PROMPT)]
    streamed, stats = _stream(fast, args.prompt, prompts[0], args.max_new_tokens)
    runners = {_label(args): _eesd(fast, args.max_new_tokens), PLAIN: _eesd(plain, args.max_new_tokens)}
    if not args.no_transformers:
        runners[HF] = lambda ids: _transformers(fast.model, ids, args.max_new_tokens)
    calls = [*measure(runners, prompts, args.repeats), Call(_label(args), -1, 0, streamed, float("nan"))]
    reference = HF if HF in runners else PLAIN
    agree = lambda c, tokens: _agree(fast.model, prompts[c.prompt], tokens, c.tokens)  # noqa: E731
    differences = differing(calls, reference, agree)
    print()
    print(report(rates(calls), list(runners), args.repeats, len(prompts), args.max_new_tokens))
    print(f"  greedy outputs: {equality(calls, reference, differences)}")
    if args.drafter != "none":
        print(f"  {verdict(rates(calls), _label(args), args.model)}")
    accepted = f"mean accepted tokens {stats.mean_accepted_tokens:.2f}"
    print(f"  streamed reply: {accepted}, acceptance rate {stats.acceptance_rate:.2f}")
    print(f"  drafter: {fast.drafter.describe() if fast.drafter is not None else 'none (plain decoding)'}")
    print(f"  linear products: {products_of(fast.adapter)}")
    return 1 if differences else 0


def _check(args: argparse.Namespace) -> None:
    for option in ("max_new_tokens", "repeats"):
        if getattr(args, option) < 1:
            flag = "--" + option.replace("_", "-")
            raise InputError(f"{flag} must be at least 1, not {getattr(args, option)}.")


def _label(args: argparse.Namespace) -> str:
    if (args.drafter, args.controller) == ("early_exit", "thompson"):
        return "eesd default"
    return f"eesd ({args.drafter}, {args.controller})"


def _stream(decoder: Any, text: str, ids: list[int], max_new_tokens: int) -> tuple[list[int], Any]:
    """Print the reply as it is generated; its tokens and the generation's statistics."""
    import torch
    from transformers import TextStreamer

    print(f"\n> {text}\n", flush=True)
    streamer = TextStreamer(decoder.tokenizer, skip_special_tokens=True)
    generation = decoder.stream(ids, max_new_tokens=max_new_tokens)
    tokens: list[int] = []
    for chunk in generation:
        streamer.put(torch.tensor(chunk))
        tokens.extend(chunk)
    streamer.end()
    return tokens, generation.stats


def _eesd(decoder: Any, max_new_tokens: int) -> Runner:
    return lambda ids: decoder.generate(ids, max_new_tokens=max_new_tokens).sequences[0, len(ids) :].tolist()


def _transformers(model: Any, ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate()``: its new tokens."""
    import torch

    prompt = torch.as_tensor(ids, dtype=torch.long, device=model.device).view(1, -1)
    with torch.inference_mode():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
        )
    return out[0, prompt.shape[1] :].tolist()


def _agree(model: Any, ids: list[int], reference: list[int], tokens: list[int]) -> bool:
    """Equal, or in half precision parted at a tie of the reference's top-2 logits."""
    if tokens == reference:
        return True
    from eesd_core.testing.agreement import compare_greedy, logits_after

    rows = lambda i: logits_after(model, ids + reference[:i])  # noqa: E731
    agreement = compare_greedy(reference, tokens, model.dtype, rows)
    if agreement.tie:
        print(f"  (half precision: {agreement.describe()})")
    return agreement.ok


# -- timing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One timed call: the method, its round (``-1``: the streamed reply), the prompt's index, the
    new tokens and the seconds of the whole call."""

    method: str
    round: int
    prompt: int
    tokens: list[int]
    seconds: float


def rotation(methods: Sequence[str], round: int) -> list[str]:
    """The order of the methods in ``round``: shifted by one place per round."""
    shift = round % len(methods)
    return [*methods[shift:], *methods[:shift]]


def measure(
    runners: dict[str, Runner],
    prompts: Sequence[list[int]],
    rounds: int,
    progress: Callable[[str], None] = say,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Call]:
    """A warm-up call of each method, then ``rounds`` rounds of every method on every prompt in
    rotating order, each call timed with ``clock``; a progress line precedes every step."""
    for name, run in runners.items():
        progress(f"warming up {name} (one untimed call)")
        run(prompts[0])
    calls = []
    for r in range(rounds):
        order = rotation(list(runners), r)
        progress(f"timing round {r + 1} of {rounds}: {', '.join(order)}, on {len(prompts)} prompts")
        for index, ids in enumerate(prompts):
            for name in order:
                started = clock()
                tokens = runners[name](ids)
                calls.append(Call(name, r, index, tokens, clock() - started))
    return calls


def rates(calls: Sequence[Call]) -> dict[str, list[float]]:
    """Each method's tokens per second in each round: its new tokens over its seconds, all prompts
    of the round together (the streamed reply is not timed with the rounds)."""
    totals: dict[str, dict[int, list[float]]] = {}
    for call in calls:
        if call.round >= 0:
            total = totals.setdefault(call.method, {}).setdefault(call.round, [0.0, 0.0])
            total[0] += len(call.tokens)
            total[1] += call.seconds
    return {
        method: [n / s if s > 0 else float("nan") for n, s in rounds.values()]
        for method, rounds in totals.items()
    }


def spread(values: Sequence[float]) -> str:
    """The lowest and the highest value."""
    return f"{min(values):.1f}-{max(values):.1f}"


def report(
    per_round: dict[str, list[float]], methods: list[str], rounds: int, prompts: int, tokens: int
) -> str:
    """The table of medians, spreads and ratios of medians, with a line saying how it was measured."""
    medians = {m: median(per_round[m]) for m in methods}
    columns = [("eesd plain", PLAIN), ("transformers", HF)]
    columns = [(title, m) for title, m in columns if m in medians]
    width = max(len(m) for m in methods) + 2
    head = f"  {'method':<{width}} {'tokens/s':>9} {'min-max':>13}" + "".join(
        f" {'x ' + t:>15}" for t, _ in columns
    )
    lines = [head]
    for m in methods:
        ratios = "".join(f" {_ratio(medians[m], medians[base]):>15}" for _, base in columns)
        lines.append(f"  {m:<{width}} {medians[m]:>9.1f} {spread(per_round[m]):>13}{ratios}")
    lines.append(
        f"\n  tokens/s: median over {rounds} rounds, and the lowest and highest round; each round runs every "
        f"method on {prompts} prompts\n  in rotating order, {tokens} new tokens a call, after a warm-up call "
        "each; a call is timed whole, prefill included"
    )
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "n/a"


def differing(calls: Sequence[Call], reference: str, agree: Callable[[Call, list[int]], bool]) -> list[Call]:
    """The calls whose tokens differ from the reference method's first call on the same prompt."""
    first = {}
    for call in calls:
        if call.method == reference and call.prompt not in first:
            first[call.prompt] = call.tokens
    return [c for c in calls if c.prompt in first and not agree(c, first[c.prompt])]


def equality(calls: Sequence[Call], reference: str, differences: Sequence[Call]) -> str:
    """One line on whether every greedy output equals the reference's."""
    if not differences:
        count = f"{len(calls)} calls"
        return f"identical: every method gave {reference}'s tokens on every prompt and round ({count})"
    where = "; ".join(
        f"{c.method} on prompt {c.prompt + 1}, "
        + ("streamed reply" if c.round < 0 else f"round {c.round + 1}")
        for c in differences
    )
    return f"NOT identical to {reference}'s: {where}"


def verdict(per_round: dict[str, list[float]], method: str, model: str) -> str:
    """Whether ``method`` beat eesd plain here, in plain words; where it did not, the command that
    shows a gain."""
    ratio = median(per_round[method]) / median(per_round[PLAIN])
    if ratio > 1 and min(per_round[method]) > max(per_round[PLAIN]):
        return f"{method} is {ratio:.2f}x as fast as plain decoding here, in every round."
    if ratio > 1:
        return (
            f"{method} is {ratio:.2f}x as fast as plain decoding by the medians, but some rounds overlap: "
            "run again with more --repeats to be sure."
        )
    said = f"{method} is not faster than plain decoding here ({ratio:.2f}x by the medians)"
    if model == GAIN_MODEL:
        return said + ": this machine's speed or load leaves drafting nothing to gain."
    return (
        f"{said}: a CPU decodes a model as small as {model} quickly on its own, which leaves drafting "
        f"little to save. To see a gain, run a larger model: eesd demo --model {GAIN_MODEL}"
    )
