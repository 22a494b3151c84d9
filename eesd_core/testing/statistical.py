"""Sampling tests with a stated false-fail rate, for runs too large to enumerate.

:func:`assert_same_distribution` fails when samples are implausible under the expected
distribution. Its false-fail rate (the chance it fails when the samples really do follow the
expected distribution) is at most ``false_fail_rate``, by construction rather than by asymptotics:

* an outcome the expected distribution gives probability 0 fails at once (no false fails);
* half the budget goes to an exact two-sided binomial test per outcome, Bonferroni-corrected;
* the other half to the L1 concentration bound of Weissman et al. (2003),
  P(||p_hat - p||_1 >= eps) <= (2^m - 2) exp(-n eps^2 / 2), which catches mass spread thinly
  over many outcomes.

Exact binomial p-values are conservative, and the union bound adds the parts, so the stated rate
is an upper bound. In CI use 1e-9: a false failure then happens about once in a billion runs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

from eesd_core.testing.errors import DistributionMismatch, KitError


def l1_radius(samples: int, outcomes: int, false_fail_rate: float) -> float:
    """eps such that ||p_hat - p||_1 >= eps has probability at most ``false_fail_rate``."""
    log_terms = outcomes * math.log(2) + math.log(1 / false_fail_rate)
    return math.sqrt(2 * log_terms / samples)


def _binomial_pvalue(count: int, n: int, prob: float) -> float:
    from scipy.stats import binomtest

    return float(binomtest(count, n, prob, alternative="two-sided").pvalue)


def assert_same_distribution(
    samples: Iterable[Hashable],
    expected: Mapping[Hashable, float],
    false_fail_rate: float = 1e-9,
    what: str = "samples",
) -> None:
    """Fail (``DistributionMismatch``) when ``samples`` do not follow ``expected``."""
    counts = Counter(samples)
    n = sum(counts.values())
    if n == 0 or not 0 < false_fail_rate < 1:
        raise KitError("assert_same_distribution needs samples and a false_fail_rate in (0, 1).")
    support = {k: float(p) for k, p in expected.items() if p > 0}
    if abs(math.fsum(support.values()) - 1.0) > 1e-6:
        raise KitError(f"The expected probabilities sum to {math.fsum(support.values())}, not 1.")
    impossible = {k: c for k, c in counts.items() if k not in support}
    if impossible:
        raise DistributionMismatch(
            f"{what}: {sum(impossible.values())} of {n} samples are outcomes of probability 0, "
            f"e.g. {sorted(impossible.items(), key=str)[:5]}. Decoding produced something the target "
            "never would."
        )
    _binomial_tests(counts, n, support, false_fail_rate / 2, what)
    _l1_test(counts, n, support, false_fail_rate / 2, what)


def _binomial_tests(
    counts: Counter, n: int, support: dict[Hashable, float], budget: float, what: str
) -> None:
    level = budget / len(support)
    worst = min(
        ((_binomial_pvalue(counts.get(k, 0), n, p), k) for k, p in support.items()), key=lambda t: t[0]
    )
    if worst[0] < level:
        outcome = worst[1]
        raise DistributionMismatch(
            f"{what}: outcome {outcome!r} came {counts.get(outcome, 0)} times in {n} samples where "
            f"{n * support[outcome]:.1f} were expected (binomial p-value {worst[0]:.3g} < "
            f"{level:.3g}; overall false-fail rate {2 * budget:g})."
        )


def _l1_test(counts: Counter, n: int, support: dict[Hashable, float], budget: float, what: str) -> None:
    distance = math.fsum(abs(counts.get(k, 0) / n - p) for k, p in support.items())
    radius = l1_radius(n, len(support), budget)
    if distance >= radius:
        raise DistributionMismatch(
            f"{what}: the empirical distribution of {n} samples is {distance:.4f} from the expected one "
            f"in L1, beyond the {radius:.4f} allowed at false-fail rate {2 * budget:g}."
        )
