"""Synthetic traces with known structure, for replay tests and for comparing controllers.

Each output position t is *easy* (the drafter would predict it) or not; easiness follows a
two-state Markov chain, so accepted runs come in bursts as they do in real text. The K drafts made
at t are accepted up to the first hard position: a_t = number of consecutive easy positions from
t, at most K, which keeps the trace's defining property a_{t+1} >= a_t - 1. A draft's top-1
confidence is drawn higher for easy positions than for hard ones, and low once off the path.
"""

from __future__ import annotations

import random

from eesd_bench.trace import CostModel, Position, PromptTrace, Trace

SMOL_CPU = CostModel(0.035, 0.017, (0.088, 0.129, 0.163, 0.124, 0.135, 0.154, 0.144, 0.141, 0.148))
FAST_DRAFT = CostModel(0.02, 0.004, tuple(0.1 + 0.004 * m for m in range(1, 10)))


def easy_flags(rng: random.Random, n: int, rate: float, persistence: float) -> list[bool]:
    """A Markov chain with stationary P(easy) = rate; persistence in [0, 1) makes runs longer."""
    flags, easy = [], rng.random() < rate
    for _ in range(n):
        if rng.random() >= persistence:
            easy = rng.random() < rate
        flags.append(easy)
    return flags


def positions(flags: list[bool], k: int, rng: random.Random, sharpness: float) -> list[Position]:
    out = []
    n = len(flags)
    for t in range(n):
        limit = min(k, n - 1 - t)
        accepted = 0
        while accepted < limit and flags[t + accepted]:
            accepted += 1
        top1 = tuple(_confidence(rng, i <= accepted and flags[t + i], sharpness) for i in range(limit))
        out.append(Position(limit, accepted, top1, top1, tuple(1.0 - c for c in top1)))
    return out


def _confidence(rng: random.Random, easy: bool, sharpness: float) -> float:
    return rng.betavariate(1 + sharpness, 1) if easy else rng.betavariate(1, 1 + sharpness)


def synthetic_trace(
    rate: float,
    persistence: float = 0.5,
    costs: CostModel = SMOL_CPU,
    prompts: int = 5,
    tokens: int = 64,
    k: int = 8,
    sharpness: float = 2.0,
    seed: int = 0,
) -> Trace:
    rng = random.Random(seed)
    traces = []
    for _ in range(prompts):
        flags = easy_flags(rng, tokens, rate, persistence)
        traces.append(PromptTrace(8, tuple(range(tokens)), tuple(positions(flags, k, rng, sharpness))))
    return Trace(k, costs, tuple(traces), {"synthetic": {"rate": rate, "persistence": persistence}})
