"""Round records for controller tests: the counts and confidences a controller learns from."""

from __future__ import annotations

from collections.abc import Sequence

from eesd_core.protocols import Costs, RoundOutcome


def outcome(
    k: int,
    n: int,
    probs: Sequence[float],
    top1: Sequence[float],
    entropies: Sequence[float],
    draft_time: float,
    verify_time: float,
    costs: Costs,
) -> RoundOutcome:
    """k drafted, n accepted (the committed tokens' ids do not matter to a controller)."""
    return RoundOutcome(
        position=0,
        drafted=k,
        accepted=n,
        tokens=(0,) * (n + 1),
        draft_time=draft_time,
        verify_time=verify_time,
        probs=tuple(probs),
        top1=tuple(top1),
        entropies=tuple(entropies),
        costs=costs,
    )
