"""Random sources that tests control: one that enumerates every outcome, one driven by given uniforms.

:func:`enumerate_runs` computes the exact distribution of whatever a function returns when all its
randomness comes through a :class:`~eesd_core.protocols.RandomSource`. It runs the function again
and again with an :class:`EnumeratingRandom` that replays a recorded prefix of choices and then takes
the first outcome at each new call, so the runs walk the tree of choices depth first; each leaf's
probability is the product of the chosen outcomes' probabilities. Outcomes of probability zero are
never taken, so exact zeros stay exact. A run that meets different choices on replay raises
:class:`~eesd_core.testing.errors.ReplayError`: it draws randomness the kit cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from eesd_core.testing.errors import KitError, ReplayError

T = TypeVar("T")

MAX_RUNS = 100_000


def _weights(probs: torch.Tensor) -> tuple[list[int], list[float]]:
    """Support and normalised probabilities of a categorical draw, in float64."""
    values = probs.detach().to("cpu", torch.float64).view(-1)
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()) or float(values.sum()) <= 0:
        raise KitError(f"categorical() was given {values.tolist()}, not a distribution.")
    support = values.nonzero().view(-1)
    return support.tolist(), (values[support] / values.sum()).tolist()


def _check_prob(prob: float) -> float:
    prob = float(prob)
    if not 0.0 <= prob <= 1.0:
        raise KitError(f"bernoulli() was given {prob!r}: a probability must lie in [0, 1] (clip it).")
    return prob


class EnumeratingRandom:
    """Follows ``script`` (one outcome index per call), then takes outcome 0; records each call."""

    def __init__(self, script: Sequence[int] = (), expected: Sequence[list[float]] = ()) -> None:
        self.script = list(script)
        self.expected = list(expected)
        self.path: list[int] = []
        self.points: list[list[float]] = []
        self.probability = 1.0

    def _choose(self, weights: list[float], what: str) -> int:
        call = len(self.path)
        if call < len(self.expected) and weights != self.expected[call]:
            raise ReplayError(
                f"Random call #{call} ({what}) saw outcomes {weights} on replay, {self.expected[call]} "
                "before. The run draws randomness the kit cannot replay (its own random generator, the "
                "wall clock): take all randomness from the RandomSource, or seed it in start()."
            )
        choice = self.script[call] if call < len(self.script) else 0
        self.path.append(choice)
        self.points.append(weights)
        self.probability *= weights[choice]
        return choice

    def bernoulli(self, prob: float) -> bool:
        prob = _check_prob(prob)
        outcomes = [(value, weight) for value, weight in ((True, prob), (False, 1.0 - prob)) if weight > 0]
        return outcomes[self._choose([w for _, w in outcomes], f"bernoulli({prob})")][0]

    def categorical(self, probs: torch.Tensor) -> int:
        support, weights = _weights(probs)
        return support[self._choose(weights, "categorical")]


def _next_script(rng: EnumeratingRandom) -> list[int] | None:
    """The path of the next leaf in depth-first order, or None when the tree is exhausted."""
    depth = len(rng.path) - 1
    while depth >= 0 and rng.path[depth] + 1 >= len(rng.points[depth]):
        depth -= 1
    if depth < 0:
        return None
    return rng.path[:depth] + [rng.path[depth] + 1]


def enumerate_runs(run: Callable[[EnumeratingRandom], T], max_runs: int = MAX_RUNS) -> list[tuple[T, float]]:
    """Every outcome of ``run`` with its exact probability (one entry per leaf of the choice tree)."""
    leaves: list[tuple[T, float]] = []
    script: list[int] | None = []
    expected: list[list[float]] = []
    while script is not None:
        if len(leaves) >= max_runs:
            raise KitError(
                f"More than {max_runs} random outcomes to enumerate: use a smaller vocabulary, fewer "
                "new tokens or fewer drafts per round."
            )
        rng = EnumeratingRandom(script, expected)
        leaves.append((run(rng), rng.probability))
        script = _next_script(rng)
        expected = rng.points[: len(script)] if script is not None else []
    total = math.fsum(p for _, p in leaves)
    if abs(total - 1.0) > 1e-9:
        raise KitError(f"The enumerated outcomes have total probability {total}, not 1.")
    return leaves


def distribution(leaves: list[tuple[T, float]]) -> dict[T, float]:
    """Sum leaf probabilities by outcome."""
    out: dict[T, list[float]] = {}
    for value, prob in leaves:
        out.setdefault(value, []).append(prob)
    return {value: math.fsum(probs) for value, probs in out.items()}


class ScriptedRandom:
    """Decides with given uniforms: ``bernoulli(p)`` is ``u <= p``, ``categorical`` an inverse CDF.

    Acceptance uniforms and sampling uniforms are separate queues, so a test can hand the same
    draws to another implementation that consumes them in another order.
    """

    def __init__(self, accept: Sequence[float] = (), sample: Sequence[float] = ()) -> None:
        self.accept = list(accept)
        self.sample = list(sample)
        self.calls: list[str] = []

    def bernoulli(self, prob: float) -> bool:
        self.calls.append("bernoulli")
        if not self.accept:
            raise KitError("ScriptedRandom ran out of acceptance uniforms.")
        return self.accept.pop(0) <= _check_prob(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        self.calls.append("categorical")
        if not self.sample:
            raise KitError("ScriptedRandom ran out of sampling uniforms.")
        return inverse_cdf(probs, self.sample.pop(0))


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The first index whose cumulative (normalised) probability exceeds ``u``, skipping zeros."""
    support, weights = _weights(probs)
    cumulative = 0.0
    for index, weight in zip(support, weights, strict=True):
        cumulative += weight
        if u < cumulative:
            return index
    return support[-1]


class NoRandom:
    """A RandomSource for code that must draw nothing (greedy decoding): it answers only certain
    outcomes (probability 0 or 1, a one-point distribution) and fails on anything random."""

    def bernoulli(self, prob: float) -> bool:
        prob = _check_prob(prob)
        if prob not in (0.0, 1.0):
            raise KitError(f"bernoulli({prob}) was called where no randomness may be drawn.")
        return prob == 1.0

    def categorical(self, probs: torch.Tensor) -> int:
        support, _ = _weights(probs)
        if len(support) != 1:
            raise KitError(
                f"categorical() over {len(support)} tokens was called where no randomness may be drawn."
            )
        return support[0]
