"""Is eesd ever slower than plain decoding? Greedy speed of four methods on short chat prompts.

Loads SmolLM2-135M-Instruct once and, in one process, times greedy decoding with

* ``transformers``: the model's own ``generate()`` (``do_sample=False``, the model's EOS);
* ``plain``: ``SpeculativeDecoder(model, drafter=None)``, one target pass per token;
* ``default``: ``SpeculativeDecoder(model)`` with its defaults (early exit with the head shipped
  for this model, Thompson controller);
* ``always_no``: early exit with a controller that never drafts
  (``controller="fixed", controller_options={"k": 0}``): every round is a plain step taken
  through the drafter's path, so its ratio to ``plain`` is the price of that path;
* ``keep_all``: the default with ``controller_options={"withdraw": False}``: every draft made is
  verified, so ``default/keep_all`` is what taking doubtful drafts back (and looking) gains.

Methods are interleaved over prompts and repeats (the order rotates) so that drifts in machine
load fall on all of them; each method is warmed up once before timing. With ``--interleave
rounds`` the eesd methods of a prompt run in lockstep instead, one round each in turn (the order
rotating), each timed round by round: a drift of the machine then falls on all of them within the
time of a round, not of a whole generation (transformers' ``generate()`` still runs whole).
Every eesd output is checked token for token against transformers'. The table gives median
tokens per second per method and, per prompt, the median over repeats of speed ratios paired within
a repeat (the same prompt, back to back); the summary gives the medians over prompts of default/plain,
default/transformers and always_no/plain.

    python benchmarks/never_slower.py                      # 16 prompts, 3 repeats, 96 tokens
    python benchmarks/never_slower.py --prompts 6 --repeats 1 --max-new-tokens 64
    python benchmarks/never_slower.py --model path/to/qwen --prompts 15 --methods plain default
    python benchmarks/never_slower.py --json results/never_slower.json
    python benchmarks/never_slower.py --interleave rounds --prompts 20 --repeats 2

The prompts are written here; none comes from Spec-Bench. Exit status 1 if an output differs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from eesd_bench.env import products_of
from transformers import AutoModelForCausalLM, AutoTokenizer

from eesd_core import SpeculativeDecoder

PRODUCTS = ("auto", "standard", "transposed", "onednn")

PROMPTS: list[tuple[str, str]] = [
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("explain", "Explain in simple words how a refrigerator keeps food cold."),
    ("list", "List six ideas for a rainy Sunday afternoon at home."),
    ("rewrite", "Rewrite this more politely: 'Send me the files now, I have waited long enough.'"),
    ("math", "A train travels 180 km in 2 hours and 30 minutes. What is its average speed in km/h?"),
    ("code", "Write a JavaScript function that returns the largest number in an array."),
    ("explain", "What is the difference between weather and climate?"),
    ("list", "Give me a packing list for a three-day hiking trip."),
    (
        "rewrite",
        "Make this sentence shorter: 'Due to the fact that it was raining, we made the "
        "decision to stay inside for the rest of the day.'",
    ),
    ("math", "If a shirt costs $40 and is on sale for 25% off, how much do I pay? Show the steps."),
    ("code", "Show how to read a CSV file with pandas and print the first five rows."),
    ("explain", "Why do we have leap years?"),
    ("list", "Name five healthy snacks that are easy to prepare."),
    ("rewrite", "Turn this into a friendly email opening: 'Meeting moved to Thursday 3pm.'"),
    ("math", "What is the sum of all whole numbers from 1 to 50? Explain how you got it."),
    ("code", "Write a SQL query that counts orders per customer in a table named orders."),
    ("explain", "How does a vaccine help the body fight an infection?"),
    ("list", "What are the main steps to plant a tree?"),
    ("rewrite", "Rewrite in the passive voice: 'The committee approved the new budget on Monday.'"),
    ("math", "Solve for x: 3x + 7 = 25. Explain each step."),
]

METHODS = ("transformers", "plain", "default", "always_no", "keep_all")


def default_model_path() -> Path:
    """Where ``eesd models fetch`` puts SmolLM2-135M-Instruct."""
    if os.environ.get("EESD_CACHE_DIR"):
        root = Path(os.environ["EESD_CACHE_DIR"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "eesd"
    else:
        root = Path.home() / ".cache" / "eesd"
    return root / "models" / "smollm2-135m-instruct"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=default_model_path(), help="checkpoint directory")
    parser.add_argument("--prompts", type=int, default=16, help=f"how many prompts (1..{len(PROMPTS)})")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each method on each prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None, help="also write every run and the summary here")
    parser.add_argument(
        "--products",
        choices=PRODUCTS,
        default="auto",
        help="how the linear layers of every eesd decoder multiply (adapter option); 'standard' is "
        "F.linear everywhere, as on a machine where no other product wins (default: auto)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="the methods to time (transformers, plain and default always run; default: all)",
    )
    parser.add_argument(
        "--interleave",
        choices=("calls", "rounds"),
        default="calls",
        help="take turns call by call, or run the eesd methods of a prompt in lockstep, round by round "
        "(default: calls)",
    )
    args = parser.parse_args(argv)
    args.methods = tuple(m for m in METHODS if m in {"transformers", "plain", "default", *args.methods})
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be between 1 and {len(PROMPTS)}")
    if args.repeats < 1 or args.max_new_tokens < 1:
        parser.error("--repeats and --max-new-tokens must be at least 1")
    return args


def encode(tokenizer: Any, text: str) -> torch.Tensor:
    """The prompt as the chat template lays out one user turn, ready for the reply. # [1, T]"""
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return encoded["input_ids"]


class Runner:
    """One callable per method: input ids -> (all token ids, seconds, eesd stats or None)."""

    def __init__(self, model: Any, max_new_tokens: int, products: str = "auto") -> None:
        self.model = model
        self.max_new_tokens = max_new_tokens
        eos = model.generation_config.eos_token_id
        self.eos = eos
        pad = model.generation_config.pad_token_id
        self.pad = pad if pad is not None else (eos if isinstance(eos, int) else eos[0])
        chosen = {"adapter_options": {"products": products}}
        self.decoders = {
            "plain": SpeculativeDecoder(model, drafter=None, **chosen),
            "default": SpeculativeDecoder(model, **chosen),
            "always_no": SpeculativeDecoder(model, controller="fixed", controller_options={"k": 0}, **chosen),
            "keep_all": SpeculativeDecoder(model, controller_options={"withdraw": False}, **chosen),
        }

    def __call__(self, method: str, input_ids: torch.Tensor) -> tuple[list[int], float, Any]:
        if method == "transformers":
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    do_sample=False,
                    max_new_tokens=self.max_new_tokens,
                    eos_token_id=self.eos,
                    pad_token_id=self.pad,
                )
            return out[0].tolist(), time.perf_counter() - start, None
        decoder = self.decoders[method]
        start = time.perf_counter()
        result = decoder.generate(input_ids, max_new_tokens=self.max_new_tokens, temperature=0.0)
        return result.sequences[0].tolist(), time.perf_counter() - start, result.stats

    def lockstep(
        self, methods: list[str], input_ids: torch.Tensor
    ) -> dict[str, tuple[list[int], float, Any]]:
        """The eesd ``methods`` on one prompt, one round each in turn (the order rotating every
        turn), each one's seconds summed over its own rounds (and the making of its stream)."""
        seconds = dict.fromkeys(methods, 0.0)
        streams = {}
        for method in methods:
            start = time.perf_counter()
            streams[method] = self.decoders[method].stream(
                input_ids, max_new_tokens=self.max_new_tokens, temperature=0.0
            )
            seconds[method] += time.perf_counter() - start
        live, turn = list(methods), 0
        while live:
            order = live[turn % len(live) :] + live[: turn % len(live)]
            turn += 1
            for method in order:
                start = time.perf_counter()
                try:
                    next(streams[method])
                except StopIteration:
                    live.remove(method)
                seconds[method] += time.perf_counter() - start
        return {m: (list(streams[m].sequences[0]), seconds[m], streams[m].stats) for m in methods}


def _paired(runs: list[dict[str, Any]], prompt: int, a: str, b: str, repeats: int) -> list[float]:
    """Speed of ``a`` over speed of ``b`` on ``prompt``, one ratio per repeat."""

    def speed(method: str, repeat: int) -> float:
        run = next(
            r for r in runs if r["method"] == method and r["prompt"] == prompt and r["repeat"] == repeat
        )
        return run["new_tokens"] / run["seconds"]

    return [speed(a, repeat) / speed(b, repeat) for repeat in range(repeats)]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    methods = args.methods
    prompts = PROMPTS[: args.prompts]
    inputs = [encode(tokenizer, text) for _, text in prompts]
    runner = Runner(model, args.max_new_tokens, args.products)
    print(
        f"model {args.model.name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.machine()}; {len(prompts)} prompts x {args.repeats} repeats, "
        f"max_new_tokens {args.max_new_tokens}, products {args.products}",
        flush=True,
    )

    warm = {}
    for method in methods:
        _, seconds, _ = runner(method, inputs[0])
        warm[method] = seconds
    print("warm-up (s): " + ", ".join(f"{m} {s:.2f}" for m, s in warm.items()), flush=True)
    print("linear products: " + products_of(runner.decoders["default"].adapter), flush=True)

    reference: dict[int, list[int]] = {}
    runs: list[dict[str, Any]] = []
    mismatches: list[str] = []
    turn = 0
    for repeat in range(args.repeats):
        for index, ids in enumerate(inputs):
            shift = turn % len(methods)
            turn += 1
            done: dict[str, tuple[list[int], float, Any]] = {}
            if args.interleave == "rounds":  # transformers' call first or last, by turns
                eesd = [m for m in methods if m != "transformers"]
                eesd = eesd[shift % len(eesd) :] + eesd[: shift % len(eesd)]
                if turn % 2:
                    done["transformers"] = runner("transformers", ids)
                done.update(runner.lockstep(eesd, ids))
                if not turn % 2:
                    done["transformers"] = runner("transformers", ids)
            else:
                done = {method: runner(method, ids) for method in methods[shift:] + methods[:shift]}
            for method, (tokens, seconds, stats) in done.items():
                if method == "transformers":
                    reference.setdefault(index, tokens)
                runs.append(
                    {
                        "method": method,
                        "prompt": index,
                        "repeat": repeat,
                        "tokens": tokens,
                        "new_tokens": len(tokens) - ids.shape[1],
                        "seconds": seconds,
                        "rounds": getattr(stats, "rounds", None),
                        "drafted": getattr(stats, "drafted", None),
                        "accepted": getattr(stats, "accepted", None),
                        "withdrawn": getattr(stats, "withdrawn", None),
                    }
                )
            progress = f"  repeat {repeat + 1}/{args.repeats}, prompt {index + 1}/{len(inputs)}"
            print(progress, file=sys.stderr, flush=True)

    for run in runs:
        expected = reference[run["prompt"]]
        run["equal"] = run["tokens"] == expected
        if not run["equal"]:
            mismatches.append(f"{run['method']} on prompt {run['prompt'] + 1} (repeat {run['repeat'] + 1})")

    # median speed of each method on each prompt
    speed: dict[str, list[float]] = {m: [] for m in methods}
    drafted: list[tuple[int, int, int, int]] = []
    for index in range(len(inputs)):
        for method in methods:
            mine = [r for r in runs if r["method"] == method and r["prompt"] == index]
            speed[method].append(median([r["new_tokens"] / r["seconds"] for r in mine]))
        last = [r for r in runs if r["method"] == "default" and r["prompt"] == index][-1]
        drafted.append(
            (last["rounds"] or 0, last["drafted"] or 0, last["accepted"] or 0, last["withdrawn"] or 0)
        )

    # ratios paired within a repeat (the same prompt, back to back), then the median over repeats
    pairs = {
        "default/plain": ("default", "plain"),
        "default/transformers": ("default", "transformers"),
        "always_no/plain": ("always_no", "plain"),
        "plain/transformers": ("plain", "transformers"),
        "default/keep_all": ("default", "keep_all"),
    }
    ratios = {
        name: [median(_paired(runs, index, a, b, args.repeats)) for index in range(len(inputs))]
        for name, (a, b) in pairs.items()
        if a in methods and b in methods
    }

    print()
    header = f"{'#':>2} {'kind':8} {'new':>4} " + " ".join(f"{m:>12}" for m in methods)
    header += " " + " ".join(f"{name:>20}" for name in ratios) + "  default rounds/drafted/accepted/withdrawn"
    print("tokens/s (median over repeats) and ratios")
    print(header)
    for index, (kind, _) in enumerate(prompts):
        new = [r["new_tokens"] for r in runs if r["prompt"] == index and r["method"] == "transformers"][0]
        line = f"{index + 1:>2} {kind:8} {new:>4} " + " ".join(f"{speed[m][index]:>12.2f}" for m in methods)
        line += " " + " ".join(f"{ratios[name][index]:>20.3f}" for name in ratios)
        line += "  {}/{}/{}/{}".format(*drafted[index])
        print(line)
    print(
        f"{'median':>16} "
        + " ".join(f"{median(speed[m]):>12.2f}" for m in methods)
        + " "
        + " ".join(f"{median(ratios[name]):>20.3f}" for name in ratios)
    )
    summary = {name: median(values) for name, values in ratios.items()}
    kinds = sorted({kind for kind, _ in prompts})
    by_kind = {
        kind: {
            name: median([v for (k, _), v in zip(prompts, values, strict=True) if k == kind])
            for name, values in ratios.items()
        }
        for kind in kinds
    }
    print()
    print("medians over prompts:")
    for name in ratios:
        print(
            f"  {name:22} {summary[name]:.3f}  by kind: "
            + ", ".join(f"{k} {by_kind[k][name]:.3f}" for k in kinds)
        )
    total = [sum(d[i] for d in drafted) for i in range(4)]
    drafts = (
        f"{total[1]} drafts, {total[2]} accepted ({total[2] / total[1]:.0%})" if total[1] else "no drafts"
    )
    drafts += f", {total[3]} taken back"
    print(f"default, last repeat: {total[0]} rounds, {drafts}")
    if mismatches:
        print(
            f"OUTPUT MISMATCH against transformers in {len(mismatches)} runs: " + "; ".join(mismatches[:10])
        )
    else:
        compared = len(runs) - sum(r["method"] == "transformers" for r in runs)
        print(f"all {compared} eesd outputs equal transformers' tokens")

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "config": {
                "model": str(args.model),
                "prompts": [text for _, text in prompts],
                "repeats": args.repeats,
                "max_new_tokens": args.max_new_tokens,
                "methods": list(methods),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "products_option": args.products,
                "products": products_of(runner.decoders["default"].adapter),
                "interleave": args.interleave,
            },
            "warmup_seconds": warm,
            "tokens_per_second": speed,
            "ratios": ratios,
            "summary": summary,
            "summary_by_kind": by_kind,
            "mismatches": mismatches,
            "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
        }
        partial = args.json.with_name(f".{args.json.name}.tmp")
        partial.write_text(json.dumps(payload, indent=1))
        partial.replace(args.json)
        print(f"wrote {args.json}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
