"""The cost-aware stopping rule: draft only while the expected tokens per second say it pays.

Under i.i.d. acceptance with probability theta, a round with k drafts commits on average
E(k) = 1 + theta + ... + theta^k tokens (the accepted prefix plus one token from p) and takes
round_time(k). The long-run rate of the best fixed k, lambda = max_k E(k) / round_time(k), prices
time; k = 0 (plain decoding) is always a candidate, so lambda >= 1 / plain_step. Having drafted i
tokens that all survive with probability s, drafting on to k > i adds s * (theta + ... +
theta^(k-i)) expected tokens for round_time(k) - round_time(i) more seconds; the rule drafts on
while some k makes that trade better than lambda.
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_tokens(theta: float, k: int) -> float:
    """1 + theta + ... + theta^k: tokens a k-draft round commits on average."""
    return sum(theta**j for j in range(k + 1))


def best_rate(theta: float, times: Sequence[float]) -> float:
    """lambda: the best expected tokens per second over k = 0 .. len(times) - 1."""
    return max(expected_tokens(theta, k) / t for k, t in enumerate(times) if t > 0)


def draft_on(index: int, survival: float, theta: float, times: Sequence[float], rate: float) -> bool:
    """Whether drafting beyond ``index`` drafts gains more tokens than ``rate`` says its time is worth."""
    gain = 0.0
    for k in range(index + 1, len(times)):
        gain += survival * theta ** (k - index)
        if gain > rate * (times[k] - times[index]):
            return True
    return False
