"""What taking drafts back gains, replayed in modelled time on recorded traces.

Records (or loads) a greedy trace of the early-exit drafter (``eesd_bench.trace``: every position's
drafts, their confidences and accepted prefix, and the measured costs) for code prompts of our own
(``prompts/code-heldout.json``) and for general chat prompts of our own (``prompts/heldout.json``),
then replays, with one long-lived controller each, the prompts of both kinds interleaved (code,
chat, code, ...) twice, timing the second pass:

* ``keep_all``: the Thompson controller with ``withdraw=False`` (every draft made is verified);
* ``withdraw``: the default (doubtful drafts taken back; looks when only confident drafts pay);
* ``withdraw, no looks``: drafts taken back, but a round drafts only when the cost rule says so;
* ``fixed k=1``, ``fixed k=2``.

It prints, per kind, plain decoding's modelled time over each controller's (above 1: faster than
plain) and the worst prompt. ``--costs`` replaces the recorded costs (seconds: draft step, base,
then verification of m = 1, 2, ... positions), for traces recorded on a busy machine::

    python benchmarks/withdraw_replay.py --model qwen2.5-coder-1.5b-instruct --prompts 6 \\
        --max-new-tokens 48 --cache benchmarks/out/withdraw-traces
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import torch
from eesd_baselines import FixedK, FixedOptions
from eesd_bench.trace import CostModel, Trace, record_trace, replay
from eesd_thompson import ThompsonController, ThompsonOptions
from eesd_thompson.controller import _Run

from eesd_core import SpeculativeDecoder
from eesd_core.protocols import Request
from eesd_core.registry import resolve_model

PROMPTS = Path(__file__).resolve().parents[1] / "drafters" / "eesd_early_exit" / "prompts"
KINDS = {"code": PROMPTS / "code-heldout.json", "chat": PROMPTS / "heldout.json"}


class _NoLooksRun(_Run):
    """A generation of :class:`NoLooks`: the default's decisions, never a look."""

    def _look_pays(self, weight: float) -> bool:
        return False


class NoLooks(ThompsonController):
    """The default controller, drafting only when its cost rule says so (no looks)."""

    def start(self, request: Request) -> _Run:
        run = super().start(request)  # what a start learns and forgets, then the same run without looks
        return _NoLooksRun(self, request, run.learnt, run.rng)


CONTROLLERS = {
    "keep_all": lambda: ThompsonController(ThompsonOptions(withdraw=False)),
    "withdraw": lambda: ThompsonController(ThompsonOptions()),
    "withdraw, no looks": lambda: NoLooks(ThompsonOptions()),
    "fixed k=1": lambda: FixedK(FixedOptions(k=1)),
    "fixed k=2": lambda: FixedK(FixedOptions(k=2)),
}


def traces(args: argparse.Namespace) -> dict[str, Trace]:
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    found: dict[str, Trace] = {}
    decoder = None
    for kind, path in KINDS.items():
        file = cache / f"{Path(args.model).name}-{kind}-{args.prompts}x{args.max_new_tokens}.json"
        if not file.exists():
            if decoder is None:
                torch.set_num_threads(args.threads)
                decoder = SpeculativeDecoder.from_pretrained(
                    str(resolve_model(args.model)),
                    controller="fixed",
                    controller_options={"k": 4},
                    max_draft_tokens=4,
                )
            texts = json.loads(path.read_text())[: args.prompts]
            tok = decoder.tokenizer
            prompts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
                )["input_ids"]
                for text in texts
            ]
            record_trace(decoder, prompts, args.max_new_tokens).save(file)
        found[kind] = Trace.load(file)
    return found


def run(make, found: dict[str, Trace], costs: CostModel) -> dict[str, tuple[float, float]]:
    controller = make()
    order = [p for pair in itertools.zip_longest(*(t.prompts for t in found.values())) for p in pair if p]
    kind_of = {id(p): kind for kind, t in found.items() for p in t.prompts}
    plain: dict[str, float] = {}
    spent: dict[str, float] = {}
    ratios: dict[str, list[float]] = {}
    for repeat in range(2):
        for prompt in order:
            result = replay(Trace(4, costs, (prompt,), {}), controller, learn_costs=False)
            if repeat:
                kind, base = kind_of[id(prompt)], result.tokens * costs.round_time(0)
                plain[kind] = plain.get(kind, 0.0) + base
                spent[kind] = spent.get(kind, 0.0) + result.time
                ratios.setdefault(kind, []).append(base / result.time)
    return {kind: (plain[kind] / spent[kind], min(ratios[kind])) for kind in plain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--prompts", type=int, default=6, help="prompts of each kind")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="benchmarks/out/withdraw-traces")
    parser.add_argument("--costs", type=float, nargs="+", default=None)
    args = parser.parse_args()
    found = traces(args)
    costs = next(iter(found.values())).costs
    if args.costs:
        costs = CostModel(args.costs[0], args.costs[1], tuple(args.costs[2:]))
    found = {kind: replace(t, costs=costs) for kind, t in found.items()}
    print(f"costs: {costs}")
    print(f"{'controller':20} " + " ".join(f"{kind + ' (worst)':>20}" for kind in found))
    for name, make in CONTROLLERS.items():
        row = run(make, found, costs)
        print(f"{name:20} " + " ".join(f"{row[k][0]:>11.3f} ({row[k][1]:.3f})" for k in found))


if __name__ == "__main__":
    main()
