"""Tune the Thompson controller's defaults on traces of prompts that are not Spec-Bench's.

Traces are recorded once per drafter on the early-exit drafter's held-out prompt set
(``drafters/eesd_early_exit/prompts/heldout.json``, written for this project; never used for
training or for the reported benchmarks) and cached as JSON. The prompts are split into groups of
``--group`` prompts, and every candidate setting is replayed on each group with a fresh controller,
so that the cold start is included.
For each setting it prints, per drafter, the mean and the worst ratio of its modelled time per
token to the best fixed k in hindsight of the same group. Usage::

    python benchmarks/tune_thompson.py --prompts 18 --max-new-tokens 64 --threads 2 \\
        --cache benchmarks/out/tuning-traces

With ``--mixed PROFILE`` it asks instead what one decoder serving mixed users meets: the held-out
prose prompts with a held-out code prompt after every second one (``code-heldout.json``), the
early-exit drafter with its shipped head, one controller carrying what it learns from prompt to
prompt, priced with a cost profile (``eesd costs measure``). Each setting is replayed with several
controller seeds; it prints the median over prompts of each kind, and the worst prompt, of the
speedup over rounds that never draft (which run at eesd plain's speed)::

    python benchmarks/tune_thompson.py --model qwen2.5-coder-1.5b-instruct --prompts 36 \\
        --max-new-tokens 40 --max-draft-tokens 6 --mixed amd-epyc-qwen2.5-coder-1.5b-instruct-float32
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch
from eesd_bench.evaluate import under
from eesd_bench.profiles import load_profile
from eesd_bench.trace import Trace, best_fixed, build_controller, record_trace, replay
from eesd_bench.tracefile import check_fresh, describe_recording, record_prompts
from transformers import AutoModelForCausalLM, AutoTokenizer

from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
from eesd_core.tools import encode_prompt

HELDOUT = Path(__file__).resolve().parents[1] / "drafters" / "eesd_early_exit" / "prompts" / "heldout.json"
CODE_HELDOUT = HELDOUT.with_name("code-heldout.json")
DRAFTERS = {
    "early_exit (shipped head)": ("early_exit", {"exit_layer": 6, "head": "auto"}),
    "early_exit (untrained, N=6)": ("early_exit", {"exit_layer": 6, "head": None}),
    "prompt_lookup": ("prompt_lookup", {}),
}
GRID = {
    "carry": [4.0, 8.0, 16.0, 32.0],
    "explore": [0.1, 0.3],
    "alpha0": [1.0],
    "beta0": [1.0, 2.0],
}


def grid() -> list[dict[str, float]]:
    """Every setting of ``GRID``, one dict of options each."""
    return [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]


def traces(args: argparse.Namespace) -> dict[str, list[Trace]]:
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    path = resolve_model(args.model)
    model = tok = None
    prompts_text = json.loads(HELDOUT.read_text())[: args.prompts]
    out: dict[str, list[Trace]] = {}
    for label, (drafter, options) in DRAFTERS.items():
        groups = []
        for g in range(0, len(prompts_text), args.group):
            file = cache / f"{drafter}-{options.get('head', 'x')}-{g}-{args.max_new_tokens}.json"
            if not file.exists():
                if model is None:
                    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
                    tok = AutoTokenizer.from_pretrained(path)
                decoder = SpeculativeDecoder(
                    model, drafter=drafter, drafter_options=options, controller="fixed", max_draft_tokens=8
                )
                prompts = [encode_prompt(tok, text) for text in prompts_text[g : g + args.group]]
                record_trace(decoder, prompts, max_new_tokens=args.max_new_tokens).save(file)
                print("recorded", file.name, flush=True)
            groups.append(Trace.load(file))
        out[label] = groups
    return out


def mixed_prompts(count: int) -> list[tuple[str, str]]:
    """(kind, text): two held-out prose prompts, then a held-out code prompt, and again."""
    prose, code = json.loads(HELDOUT.read_text()), json.loads(CODE_HELDOUT.read_text())
    out: list[tuple[str, str]] = []
    while len(out) < count:
        turn = len(out) // 3
        out += [("prose", prose[2 * turn]), ("prose", prose[2 * turn + 1]), ("code", code[turn])]
    return out[:count]


def mixed_trace(args: argparse.Namespace) -> Trace:
    """The mixed prompts' trace (recorded once into the cache, resumed when more prompts are
    asked), priced with the profile ``args.mixed``."""
    out = Path(args.cache) / f"mixed-{args.model}-{args.max_new_tokens}-{args.max_draft_tokens}.json"
    wanted = [(kind, f"{i:02d}-{kind}", text) for i, (kind, text) in enumerate(mixed_prompts(args.prompts))]
    names = {name for _, name, _ in wanted}
    trace = Trace.load(out) if out.is_file() else None
    if trace is None or not names <= {p.name for p in trace.prompts}:
        out.parent.mkdir(parents=True, exist_ok=True)
        path = resolve_model(args.model)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(path)
        decoder = SpeculativeDecoder(model, controller="fixed", max_draft_tokens=args.max_draft_tokens)
        prompts = [(kind, name, encode_prompt(tok, text)) for kind, name, text in wanted]
        meta = describe_recording(decoder, args.model, args.max_new_tokens)
        trace = record_prompts(decoder, prompts, args.max_new_tokens, out, meta, resume=True)
    check_fresh(trace, str(out))
    trace = replace(trace, prompts=tuple(p for p in trace.prompts if p.name in names))
    return under(trace, load_profile(args.mixed))


def mixed(args: argparse.Namespace) -> None:
    """Every setting of the grid over the mixed trace, one controller per seed over all prompts."""
    trace = mixed_trace(args)
    never: list = []
    replay(trace, build_controller(("fixed", {"k": 0})), by_prompt=never)
    kinds = [prompt.category for prompt in trace.prompts]
    for options in [{}, *grid()]:
        speedups = []
        for seed in range(args.seeds):
            parts: list = []
            replay(trace, build_controller(("thompson", {**options, "seed": seed})), by_prompt=parts)
            speedups.append([n.time / p.time for n, p in zip(never, parts, strict=True)])
        per_prompt = [statistics.fmean(s) for s in zip(*speedups, strict=True)]
        by_kind = {
            kind: statistics.median(v for v, k in zip(per_prompt, kinds, strict=True) if k == kind)
            for kind in sorted(set(kinds))
        }
        print(
            f"{json.dumps(options) if options else 'defaults':58} "
            + " ".join(f"{kind} {value:.3f}" for kind, value in by_kind.items())
            + f"  worst prompt {min(per_prompt):.3f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=18)
    parser.add_argument("--group", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="benchmarks/out/tuning-traces")
    parser.add_argument(
        "--mixed", metavar="PROFILE", help="replay prose and code prompts in turn, priced with PROFILE"
    )
    parser.add_argument("--max-draft-tokens", type=int, default=6, help="with --mixed: drafts per position")
    parser.add_argument("--seeds", type=int, default=8, help="with --mixed: controller seeds per setting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mixed:
        mixed(args)
        return
    by_drafter = traces(args)
    rows = []
    for options in grid():
        row: dict = {"options": options}
        for label, groups in by_drafter.items():
            ratios = []
            for trace in groups:
                _, fixed = best_fixed(trace)
                result = replay(trace, build_controller(("thompson", options)))
                ratios.append(result.time_per_token / fixed)
            row[label] = (statistics.mean(ratios), max(ratios))
        rows.append(row)
        print(options, {k: f"{v[0]:.3f}/{v[1]:.3f}" for k, v in row.items() if k != "options"}, flush=True)
    worst = min(rows, key=lambda r: max(r[label][1] for label in by_drafter))
    print("best worst-case:", worst)


if __name__ == "__main__":
    main()
