"""Beta posteriors over the probability that a draft is accepted, alone or per confidence bucket."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Beta:
    """Beta(alpha, beta) over theta; the counts beyond the prior shrink by ``decay`` on request."""

    alpha0: float
    beta0: float
    alpha: float = 0.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.alpha, self.beta = self.alpha0, self.beta0

    def decay(self, factor: float, cap: float | None = None) -> None:
        """Shrink the evidence by ``factor``, then to at most ``cap`` observations."""
        evidence = (self.alpha - self.alpha0) + (self.beta - self.beta0)
        if cap is not None and factor * evidence > cap:
            factor = cap / evidence
        self.alpha = self.alpha0 + factor * (self.alpha - self.alpha0)
        self.beta = self.beta0 + factor * (self.beta - self.beta0)

    def observe(self, successes: float, failures: float) -> None:
        self.alpha += successes
        self.beta += failures

    def sample(self, rng: random.Random, center: float | None = None) -> float:
        """A draw of theta; with ``center``, the prior is moved to that mean, keeping its weight."""
        if center is None:
            return rng.betavariate(self.alpha, self.beta)
        weight = self.alpha0 + self.beta0
        return rng.betavariate(
            self.alpha - self.alpha0 + weight * center, self.beta - self.beta0 + weight * (1 - center)
        )

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)

    def centered_mean(self, center: float) -> float:
        """The mean with the prior moved to ``center`` (as :meth:`sample` draws with it)."""
        weight = self.alpha0 + self.beta0
        alpha = self.alpha - self.alpha0 + weight * center
        return alpha / (self.alpha + self.beta - self.alpha0 - self.beta0 + weight)


class Buckets:
    """One Beta per confidence bucket: bucket b holds values in [edges[b-1], edges[b]).

    A bucket that saw few drafts should say what drafts say overall, not what the prior says, so
    the controller draws from each bucket with its prior centred on the overall posterior mean.
    """

    def __init__(self, edges: Sequence[float], alpha0: float, beta0: float) -> None:
        self.edges = tuple(edges)
        self.cells = [Beta(alpha0, beta0) for _ in range(len(self.edges) + 1)]

    def index(self, value: float) -> int:
        return bisect.bisect_right(self.edges, value)

    def reset(self) -> None:
        for cell in self.cells:
            cell.reset()

    def decay(self, factor: float, cap: float | None = None) -> None:
        for cell in self.cells:
            cell.decay(factor, cap)

    def observe_round(self, values: Sequence[float], accepted: int) -> None:
        """Accepted drafts are successes, the first rejected one a failure; later ones censored."""
        for i, value in enumerate(values[: accepted + 1]):
            self.cells[self.index(value)].observe(float(i < accepted), float(i >= accepted))


class Frequencies:
    """How often values fall in each bucket: decayed counts under a Dirichlet(1/2) prior."""

    def __init__(self, size: int) -> None:
        self.counts = [0.0] * size

    def reset(self) -> None:
        self.counts = [0.0] * len(self.counts)

    def decay(self, factor: float, cap: float | None = None) -> None:
        total = sum(self.counts)
        if cap is not None and factor * total > cap:
            factor = cap / total
        self.counts = [factor * c for c in self.counts]

    def observe(self, cell: int) -> None:
        self.counts[cell] += 1.0

    def shares(self) -> list[float]:
        total = sum(self.counts) + 0.5 * len(self.counts)
        return [(c + 0.5) / total for c in self.counts]
