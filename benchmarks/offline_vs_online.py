"""Does the offline leaderboard hold online? Modelled against measured speedups, side by side.

In one process, with the model loaded once, this script

1. measures a cost profile of this machine (``eesd_bench.profiles.measure_profile``: the
   drafter's rounds by k and a plain decoder's step, twice each, averaged), before the online
   runs and again after them, and writes their mean (the machine's speed drifts over the minutes
   the online runs take; the mean of the two ends charges the drift alike to both sides);
2. decodes the chosen prompts of a trace greedily, online, with plain decoding and with every
   controller (one decoder per controller serving the prompts in the trace's order, as the
   replay does; methods in rotating order within each prompt), checking every output against
   the trace's tokens;
3. replays every controller through the same prompts of the trace under the profile just
   measured (``eesd_bench.evaluate``), and sets the modelled speedup over plain decoding beside
   the measured one, with the relative error, rounds, drafts and acceptances of each.

Every decoder multiplies with ``--products`` (``standard`` by default, so that no pass size is timed
by the products plug-in in the middle of a timed generation). Times leave out the prefill and its
token on both sides: measured, ``total_time - prefill_time``
over the other new tokens; modelled, the replayed rounds after the prefill's token. Usage::

    python benchmarks/offline_vs_online.py --trace qwen2.5-coder-1.5b-instruct \\
        --prompts own-code-0 own-code-1 own-code-2 --threads 2 \\
        --profile-out plugins/eesd_bench/costs/amd-epyc-qwen2.5-coder-1.5b-instruct-float32.json \\
        --json benchmarks/results/offline-vs-online-qwen2.5-coder-1.5b-instruct-amd-epyc.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from eesd_bench.env import environment
from eesd_bench.evaluate import registered_controllers, under
from eesd_bench.profiles import CostProfile, machine_meta, measure_profile
from eesd_bench.prompts import DEFAULT_QUESTIONS, load_questions
from eesd_bench.trace import ReplayResult, Trace, build_controller, replay
from eesd_bench.tracefile import load_trace
from eesd_early_exit.prompts import load_prompts

from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
from eesd_core.tools import encode_prompt


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prompt_text(name: str) -> str:
    """The text of a trace's prompt from its name: ``own-code-I`` or a Spec-Bench question id."""
    if name.startswith("own-code-"):
        return load_prompts("code-heldout")[int(name.removeprefix("own-code-"))]
    return next(q.text for q in load_questions(DEFAULT_QUESTIONS) if str(q.question_id) == name)


def online(
    decoders: dict[str, Any], prompts: list[tuple[str, list[int]]], trace: Trace, tokens: int
) -> dict[str, dict[str, float]]:
    """Decode every prompt with every decoder (rotating order); totals per method."""
    totals = {m: {"seconds": 0.0, "tokens": 0, "rounds": 0, "drafted": 0, "accepted": 0} for m in decoders}
    expected = {p.name: list(p.tokens) for p in trace.prompts}
    methods = list(decoders)
    for i, (name, ids) in enumerate(prompts):
        for method in methods[i % len(methods) :] + methods[: i % len(methods)]:
            start = time.perf_counter()
            result = decoders[method].generate(ids, max_new_tokens=tokens)
            stats = result.stats
            got = result.sequences[0, len(ids) :].tolist()
            if got != expected[name][: len(got)] or len(got) != len(expected[name]):
                raise SystemExit(f"{method} on {name}: the output differs from the trace's tokens")
            total = totals[method]
            total["seconds"] += stats.total_time - stats.prefill_time
            total["tokens"] += stats.new_tokens - 1
            total["rounds"] += stats.rounds - 1
            total["drafted"] += stats.drafted
            total["accepted"] += stats.accepted
            say(f"{name} {method}: {stats.new_tokens} tokens in {time.perf_counter() - start:.1f} s")
    return totals


def modelled(trace: Trace, profile: CostProfile, controllers: list[str]) -> dict[str, dict[str, float]]:
    """Replayed totals per controller after each prompt's prefill token, under ``profile``."""
    priced = under(trace, profile)
    first = priced.costs.round_time(0)
    out = {}
    for name in controllers:
        parts: list[ReplayResult] = []
        replay(priced, build_controller((name, {})), by_prompt=parts)
        out[name] = {
            "seconds": sum(p.time - first for p in parts),
            "tokens": sum(p.tokens - 1 for p in parts),
            "rounds": sum(p.rounds - 1 for p in parts),
            "drafted": sum(p.drafted for p in parts),
            "accepted": sum(p.accepted for p in parts),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="qwen2.5-coder-1.5b-instruct", help="shipped trace name or file")
    parser.add_argument("--model", default=None, help="checkpoint (default: the trace's model)")
    parser.add_argument("--prompts", nargs="+", default=["own-code-0", "own-code-1", "own-code-2"])
    parser.add_argument("--controllers", nargs="+", default=None, help="default: every registered one")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--products",
        default="standard",
        help="how every decoder's linear layers multiply; 'standard' (F.linear) keeps the products "
        "plug-in from timing pass sizes in the middle of a timed generation",
    )
    parser.add_argument("--profile-out", type=Path, default=None, help="write the measured profile here")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    trace = load_trace(args.trace)
    chosen = tuple(p for name in args.prompts for p in trace.prompts if p.name == name)
    if len(chosen) != len(args.prompts):
        raise SystemExit(f"the trace holds {[p.name for p in trace.prompts]}")
    trace = replace(trace, prompts=chosen)
    model_name = args.model or trace.meta["model"]
    say(f"loading {model_name}")
    adapter = {"adapter_options": {"products": args.products}}
    common = {"drafter": "early_exit", "max_draft_tokens": trace.max_k, **adapter}
    recorder = SpeculativeDecoder.from_pretrained(
        str(resolve_model(model_name)), controller="fixed", **common
    )
    model, tokenizer = recorder.model, recorder.tokenizer
    prompts = [(p.name, encode_prompt(tokenizer, prompt_text(p.name))) for p in chosen]
    for (name, ids), p in zip(prompts, chosen, strict=True):
        if len(ids) != p.prompt_length:
            raise SystemExit(f"{name}: {len(ids)} prompt tokens, the trace has {p.prompt_length}")
    plain = SpeculativeDecoder(model, drafter=None, **adapter)
    meta = machine_meta(recorder, model_name)
    before = measure_profile(recorder, plain, prompts[0][1], meta, say=say)
    controllers = args.controllers or registered_controllers()
    decoders = {"plain": plain} | {c: SpeculativeDecoder(model, controller=c, **common) for c in controllers}
    tokens = len(chosen[0].tokens)
    measured = online(decoders, prompts, trace, tokens)
    after = measure_profile(recorder, plain, prompts[0][1], meta, say=say)
    source = f"benchmarks/offline_vs_online.py, products {args.products}"
    profile = CostProfile.mean([before, after])
    profile = replace(profile, meta={**profile.meta, "source": source})
    if args.profile_out:
        profile.save(args.profile_out)
        say(f"wrote {args.profile_out}")
    model_side = modelled(trace, profile, controllers)
    plain_measured = measured["plain"]["seconds"] / measured["plain"]["tokens"]
    plain_modelled = profile.plain_step(1)
    rows = []
    print(
        f"{'controller':<12} {'modelled':>9} {'measured':>9} {'error':>7}  "
        "replayed/online rounds, drafts, accepted"
    )
    for c in controllers:
        on, off = measured[c], model_side[c]
        speed_on = plain_measured / (on["seconds"] / on["tokens"])
        speed_off = plain_modelled / (off["seconds"] / off["tokens"])
        error = speed_off / speed_on - 1
        rows.append(
            {
                "controller": c,
                "modelled": speed_off,
                "measured": speed_on,
                "error": error,
                "online": on,
                "replayed": off,
            }
        )
        counts = ", ".join(f"{off[key]}/{on[key]}" for key in ("rounds", "drafted", "accepted"))
        print(f"{c:<12} {speed_off:>9.3f} {speed_on:>9.3f} {100 * error:>6.1f}%  {counts}")
    if args.json:
        result = {
            "benchmark": "offline_vs_online",
            "environment": environment(model, model_name),
            "trace": args.trace,
            "trace_meta": trace.meta,
            "prompts": args.prompts,
            "max_new_tokens": tokens,
            "profile": profile.to_dict(),
            "plain": {"measured_time_per_token": plain_measured, "modelled_time_per_token": plain_modelled},
            "rows": rows,
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
