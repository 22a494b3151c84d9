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
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
from eesd_bench.trace import Trace, best_fixed, build_controller, record_trace, replay
from transformers import AutoModelForCausalLM, AutoTokenizer

from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
from eesd_core.tools import encode_prompt

HELDOUT = Path(__file__).resolve().parents[1] / "drafters" / "eesd_early_exit" / "prompts" / "heldout.json"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=18)
    parser.add_argument("--group", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="benchmarks/out/tuning-traces")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    by_drafter = traces(args)
    keys = list(GRID)
    rows = []
    for values in itertools.product(*(GRID[k] for k in keys)):
        options = dict(zip(keys, values, strict=True))
        row = {"options": options}
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
