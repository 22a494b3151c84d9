"""The cost-aware stopping rule: draft only while the expected tokens per second say it pays.

Under i.i.d. acceptance with probability theta, a round with k drafts commits on average
E(k) = 1 + theta + ... + theta^k tokens (the accepted prefix plus one token from p) and takes
round_time(k). The long-run rate of the best fixed k, lambda = max_k E(k) / round_time(k), prices
time; k = 0 (plain decoding) is always a candidate, so lambda >= 1 / plain_step. Having drafted i
tokens that all survive with probability s, drafting on to k > i adds s * (theta + ... +
theta^(k-i)) expected tokens for round_time(k) - round_time(i) more seconds; the rule drafts on
while some k makes that trade better than lambda.

Round times come from the engine's measurements. For a k never tried, the engine extrapolates a
line through what it measured, which on a CPU (where verifying two positions costs much more than
one, and eight barely more than two) would make long rounds look prohibitive forever; so beyond the
longest round tried, verification is assumed to cost no more than there, optimistically, until a
longer round measures it. In a batch, the round times are the whole batch's, and a longer round is
longer for every row; the controller weighs that time by the rows it delays per row that would
draft the step (``weight``), so a step that every row drafts costs each row its time once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eesd_core.protocols import Costs


def expected_tokens(theta: float, k: int) -> float:
    """1 + theta + ... + theta^k: tokens a k-draft round commits on average."""
    return sum(theta**j for j in range(k + 1))


def best_rate(theta: float, times: Sequence[float]) -> float:
    """lambda: the best expected tokens per second over k = 0 .. len(times) - 1 (times <= 0 skipped)."""
    best, expected, power = 0.0, 0.0, 1.0
    for t in times:
        expected += power  # expected_tokens(theta, k), summed as k grows
        if t > 0:
            best = max(best, expected / t)
        power *= theta
    return best


def draft_on(
    index: int, survival: float, theta: float, times: Sequence[float], rate: float, weight: float = 1.0
) -> bool:
    """Whether drafting beyond ``index`` drafts gains more tokens than ``rate`` says its time is worth.

    ``weight``: how many rows' time the longer round spends for each row whose tokens it gains (1
    alone, or when every row of a batch drafts it; the batch size when one row drafts alone)."""
    gain = 0.0
    for k in range(index + 1, len(times)):
        gain += survival * theta ** (k - index)
        if gain > rate * weight * (times[k] - times[index]):
            return True
    return False


def round_times(costs: Costs, limit: int, tried: Iterable[int]) -> list[float] | None:
    """round_time(k) for k = 0 .. limit, flat in verification beyond the longest round tried;
    None while some cost is unknown."""
    times = [costs.round_time(k) for k in range(limit + 1)]
    if any(t is None or t <= 0 for t in times) or costs.draft_step is None:
        return None
    longest = max(tried, default=0)
    if longest < limit:
        base = times[longest]
        for k in range(longest + 1, limit + 1):
            times[k] = min(times[k], base + (k - longest) * costs.draft_step)  # type: ignore[operator]
    return times  # type: ignore[return-value]
