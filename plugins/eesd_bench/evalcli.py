"""``eesd trace record``, ``eesd costs measure`` and ``eesd controllers evaluate``.

Record what a model's drafter would accept at every position of greedy replies (a trace), measure
what its passes cost on this machine (a cost profile), then replay any controllers through traces
under a profile in modelled time, in seconds and without the model (:mod:`eesd_bench.evaluate`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from eesd_bench.helptext import DefaultsFormatter, plain_text
from eesd_bench.kernels import add_sdpa_argument, attention_kernels
from eesd_bench.prompts import DEFAULT_QUESTIONS
from eesd_core.errors import InputError
from eesd_core.tools import add_decoder_arguments


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_trace(sub: Any) -> None:
    parser = sub.add_parser("trace", help="record traces for offline controller evaluation")
    verbs = parser.add_subparsers(dest="trace_command", metavar="VERB", required=True)
    record = verbs.add_parser(
        "record",
        help="record greedy traces of a model and its drafter on Spec-Bench and own code prompts",
        description=plain_text(record_help()),
        formatter_class=DefaultsFormatter,
    )
    add_decoder_arguments(record)
    record.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="Spec-Bench question.jsonl")
    record.add_argument("--per-category", type=int, default=1, help="questions of each Spec-Bench category")
    record.add_argument("--categories", nargs="*", default=None, help="only these categories (default: all)")
    record.add_argument(
        "--own-code", type=int, default=2, help="own held-out code prompts (category own_code)"
    )
    record.add_argument("--max-new-tokens", type=int, default=48)
    record.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    record.add_argument("--out", required=True, help="trace file to write (.json.gz compresses)")
    record.add_argument("--resume", action="store_true", help="keep prompts already recorded in --out")
    record.set_defaults(func=run_record, controller="fixed")


def record_help() -> str:
    return """Record a trace: greedy replies with up to --max-draft-tokens drafts at every position.

Each position keeps its drafts' confidences and how many the target accepted, so any controller can
be replayed over it later (`eesd controllers evaluate`). The file names the model, the exit head
(with its SHA-256: a changed head makes the trace stale) and the eesd version. It is saved after
every prompt; --resume continues an interrupted recording."""


def chosen_prompts(args: argparse.Namespace, tokenizer: Any) -> list[tuple[str, str, list[int]]]:
    """(category, name, ids) of the Spec-Bench questions and own code prompts asked for."""
    from eesd_bench.prompts import load_questions, select
    from eesd_core.tools import encode_prompt

    questions = select(load_questions(args.questions), args.per_category) if args.per_category else []
    if args.categories is not None:
        known = {q.category for q in questions}
        unknown = sorted(set(args.categories) - known)
        if unknown:
            raise InputError(f"Unknown categories {unknown}: choose among {sorted(known)}.")
        questions = [q for q in questions if q.category in args.categories]
    chosen = [(q.category, str(q.question_id), encode_prompt(tokenizer, q.text)) for q in questions]
    own = own_code_prompts()[: args.own_code]
    chosen += [("own_code", f"own-code-{i}", encode_prompt(tokenizer, text)) for i, text in enumerate(own)]
    if not chosen:
        raise InputError("No prompts chosen: raise --per-category or --own-code.")
    return chosen


def own_code_prompts() -> list[str]:
    """Our own held-out code prompts: the early-exit drafter's ``code-heldout`` set, which no
    shipped head trains on and which shares nothing with Spec-Bench."""
    import json

    from eesd_bench.tracefile import plugin_folder

    folder = plugin_folder("drafter", "early_exit")
    path = None if folder is None else folder / "prompts" / "code-heldout.json"
    if path is None or not path.is_file():
        raise InputError(
            "The own code prompts come with the early_exit drafter: install it, or pass --own-code 0."
        )
    return list(json.loads(path.read_text(encoding="utf-8")))


def run_record(args: argparse.Namespace) -> int:
    import torch

    from eesd_bench.tracefile import describe_recording, record_prompts
    from eesd_core.tools import load_decoder

    if args.drafter == "none":
        raise InputError("A trace records drafts: choose a drafter (--drafter), not 'none'.")
    if args.threads:
        torch.set_num_threads(args.threads)
    say(f"loading {args.model}")
    decoder = load_decoder(args)
    prompts = chosen_prompts(args, decoder.tokenizer)
    name = Path(args.model).name
    meta = describe_recording(decoder, name, args.max_new_tokens)
    say(f"recording {len(prompts)} prompts with {meta['drafter_described']}")
    trace = record_prompts(decoder, prompts, args.max_new_tokens, Path(args.out), meta, resume=args.resume)
    tokens = sum(len(p.tokens) for p in trace.prompts)
    print(f"wrote {args.out}: {len(trace.prompts)} prompts, {tokens} positions")
    return 0


def add_costs(sub: Any) -> None:
    parser = sub.add_parser("costs", help="measure cost profiles for offline controller evaluation")
    verbs = parser.add_subparsers(dest="costs_command", metavar="VERB", required=True)
    measure = verbs.add_parser(
        "measure",
        help="time a model's draft steps, verification passes and plain steps on this machine",
        description=plain_text(
            """Write a cost profile: a draft step, verification of 1 .. K + 1 positions and a plain
decoding step of this model on this machine, at each batch size asked (every row of a batch
drafting alike), with the machine, model shape, precision and date. `eesd controllers evaluate
--profiles FILE [--batch-size B]` prices replayed rounds with it."""
        ),
        formatter_class=DefaultsFormatter,
    )
    add_decoder_arguments(measure)
    measure.add_argument("--cycles", type=int, default=4, help="rounds of each k timed (after one warm-up)")
    measure.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    measure.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1], help="the batch sizes to time (rows of one prompt)"
    )
    measure.add_argument("--note", default="", help="a remark kept in the profile's source")
    add_sdpa_argument(measure)
    measure.add_argument("--out", required=True, help="profile file to write (.json)")
    measure.set_defaults(func=run_measure, controller="fixed")
    curves = verbs.add_parser(
        "from-curves",
        help="turn a benchmarks/cost_curves.py result (a GPU's, say) into a cost profile",
        formatter_class=DefaultsFormatter,
    )
    curves.add_argument("curves", help="the cost_curves.py JSON result")
    curves.add_argument("--exit-layer", type=int, required=True, help="the exit layer whose costs to take")
    curves.add_argument("--out", required=True, help="profile file to write (.json)")
    curves.set_defaults(func=run_from_curves)


def run_from_curves(args: argparse.Namespace) -> int:
    import json

    from eesd_bench.profiles import from_cost_curves

    path = Path(args.curves)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"Cannot read the cost curves {str(path)!r} ({exc}).") from None
    from_cost_curves(data, args.exit_layer, path.name).save(args.out)
    print(f"wrote {args.out}")
    return 0


def run_measure(args: argparse.Namespace) -> int:
    import torch

    from eesd_bench.profiles import machine_meta, measure_profile
    from eesd_core.engine import SpeculativeDecoder
    from eesd_core.tools import encode_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    say(f"loading {args.model}")
    decoder = load_decoder_for(args)
    plain = SpeculativeDecoder(
        decoder.model,
        drafter=None,
        tokenizer=decoder.tokenizer,
        adapter_options={"products": args.products},
    )
    prompt = encode_prompt(decoder.tokenizer, own_code_prompts()[0])
    meta = machine_meta(decoder, Path(args.model).name, args.note)
    if args.sdpa:
        meta["sdpa"] = args.sdpa
    with attention_kernels(args.sdpa):
        profile = measure_profile(decoder, plain, prompt, meta, args.cycles, say, args.batch_sizes)
    profile.save(args.out)
    print(f"wrote {args.out}")
    for size in sorted(profile.batches):
        costs = profile.at(size)
        print(
            f"  batch size {size}: plain step {1000 * profile.plain_step(size):.1f} ms, draft step "
            f"{1000 * costs.draft_step:.1f} ms, verify 1 .. {len(costs.verify)} positions "
            f"{1000 * costs.verify[0]:.1f} .. {1000 * costs.verify[-1]:.1f} ms"
        )
    return 0


def load_decoder_for(args: argparse.Namespace) -> Any:
    from eesd_core.tools import load_decoder

    if args.drafter == "none":
        raise InputError("Costs of drafting need a drafter (--drafter), not 'none'.")
    return load_decoder(args)


EVALUATE_HELP = """Replay controllers through traces under cost profiles: a leaderboard in modelled time.

Every controller serves a trace's prompts in turn, as one decoder would, learning the profile's costs
as it goes. By category and over all prompts it prints the speedup over plain decoding beside the
per-round oracle and the best fixed k in hindsight, then each controller's time per token over the
best fixed k's. The replay is greedy and one sequence at a time: see "Evaluate your controller
offline" in the plug-in guide for what it models and what it does not."""


def add_controllers(sub: Any) -> None:
    parser = sub.add_parser("controllers", help="evaluate controllers offline on traces")
    verbs = parser.add_subparsers(dest="controllers_command", metavar="VERB", required=True)
    run = verbs.add_parser(
        "evaluate",
        help="replay controllers through traces under cost profiles and print a leaderboard",
        description=EVALUATE_HELP,
        formatter_class=DefaultsFormatter,
    )
    run.add_argument(
        "--controllers",
        nargs="+",
        default=None,
        metavar="SPEC",
        help="NAME, NAME='{\"k\": 2}' or package.module:factory (default: every registered controller)",
    )
    run.add_argument(
        "--traces", nargs="+", default=None, help="trace files or shipped names (default: all shipped)"
    )
    run.add_argument(
        "--profiles",
        nargs="+",
        default=None,
        help="cost profile files or shipped names (default: the shipped ones of each trace's model shape, "
        "else the costs the trace was recorded with)",
    )
    run.add_argument("--batch-size", type=int, default=1, help="the profile's batch size to price rounds at")
    run.add_argument("--allow-stale", action="store_true", help="use traces whose exit head has changed")
    run.add_argument("--out", default=None, help="directory for leaderboard.json and plots (default: none)")
    run.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    import json
    import time

    from eesd_bench.evaluate import (
        evaluate,
        format_board,
        matching_profiles,
        parse_controller,
        plot_summary,
        registered_controllers,
    )
    from eesd_bench.plot import plot_speedups
    from eesd_bench.profiles import CostProfile, load_profile, shipped_profiles
    from eesd_bench.tracefile import load_trace, shipped_traces

    start = time.perf_counter()
    specs = dict(parse_controller(c) for c in (args.controllers or registered_controllers()))
    traces = {
        Path(t).name.removesuffix(".json.gz"): load_trace(t, args.allow_stale)
        for t in args.traces or shipped_traces()
    }
    if not traces:
        raise InputError("No traces: record one with `eesd trace record` and pass it with --traces.")
    names = args.profiles or list(shipped_profiles())
    profiles = {Path(p).name.removesuffix(".json"): load_profile(p) for p in names}
    pairs = []
    for name, trace in traces.items():
        fitting = list(profiles) if args.profiles else matching_profiles(trace, profiles)
        if not fitting:
            own = f"{name} (recorded costs)"
            profiles[own] = CostProfile({1: trace.costs}, {}, {"source": "the trace's own costs"})
            fitting = [own]
        pairs += [(name, p) for p in fitting]
    say(f"replaying {len(specs)} controllers through {len(traces)} traces, {len(pairs)} trace/profile pairs")
    boards = evaluate(traces, profiles, specs, pairs, args.batch_size)
    for board in boards:
        print(format_board(board) + "\n")
    took = time.perf_counter() - start
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "leaderboard.json").write_text(json.dumps({"boards": boards, "seconds": took}, indent=1))
        for board in boards:
            png = out / f"leaderboard-{board['trace']}-{board['profile']}.png"
            why_not = plot_speedups(plot_summary(board), png)
            if why_not:
                say(why_not)
                break
        say(f"wrote {out}")
    say(f"evaluated in {took:.1f} s")
    return 0
