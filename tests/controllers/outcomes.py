"""Rounds for controller tests: the records a controller learns from, and a generation driven as
:class:`eesd_core.control.Control` drives it (``start``, then per round ``begin_round``, the asks
and ``update`` with every row's outcome)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eesd_core.protocols import Confidence, Costs, DraftStep, Request, RoundOutcome, RoundStart, Withdrawn


def conf(c: float | Confidence) -> Confidence:
    """A draft's confidence: q(d) = top-1 = c, entropy 1 - c (a ``Confidence`` is kept as it is)."""
    return c if isinstance(c, Confidence) else Confidence(c, c, 1 - c)


def outcome(
    k: int,
    n: int,
    confidences: Sequence[float | Confidence] | None = None,
    draft_time: float = 0.0,
    verify_time: float = 0.0,
    costs: Costs | None = None,
    row: int = 0,
    withdrawn: Withdrawn | None = None,
) -> RoundOutcome:
    """k drafted, n accepted, draft i seen with ``confidences[i]`` (0.9 each by default); the
    committed tokens' ids do not matter to a controller."""
    seen = tuple(conf(c) for c in (confidences if confidences is not None else (0.9,) * k))
    assert len(seen) == k
    tokens = (0,) * (n + 1)
    return RoundOutcome(0, k, n, tokens, draft_time, verify_time, seen, costs or Costs(), row, withdrawn)


class Driven:
    """One generation of a controller, driven round by round as the engine drives it."""

    def __init__(self, controller: Any, request: Request) -> None:
        self.controller = controller
        self.state = controller.start(request)
        self.costs = request.costs
        self.rounds = 0  # rounds begun

    def begin(self, costs: Costs | None = None, rows: Sequence[int] = (0,)) -> None:
        """A round of ``rows`` begins, at ``costs`` (the request's by default)."""
        start = RoundStart(tuple(rows), costs if costs is not None else self.costs, self.rounds)
        self.controller.begin_round(self.state, start)
        self.rounds += 1

    def ask(self, index: int, limit: int, latest: float | Confidence | None = None, row: int = 0) -> bool:
        """``should_continue`` after ``index`` drafts, the latest seen with ``latest``."""
        if index:
            step = DraftStep(index, limit, row, 5, conf(0.9 if latest is None else latest))
        else:
            step = DraftStep(0, limit, row)
        decision = self.controller.should_continue(self.state, step)
        assert decision is True or decision is False
        return decision

    def keep(self, index: int, limit: int, seen: float | Confidence, row: int = 0) -> bool:
        """``keep`` for the draft after ``index`` ones, whose q was seen (it is not drawn yet)."""
        c = conf(seen)
        step = DraftStep(index + 1, limit, row, None, Confidence(None, c.top1, c.entropy))
        decision = self.controller.keep(self.state, step)
        assert decision is True or decision is False
        return decision

    def end(self, *outcomes: RoundOutcome) -> None:
        """The round is over: every row's outcome."""
        self.controller.update(self.state, outcomes)

    def learn(self, *outcomes: RoundOutcome) -> None:
        """Outcomes to learn from, of earlier rounds that the test does not run. No round begins
        for them: a count of rounds kept as they begin (``refresh``) sees the last of them alone,
        as the round before the next one."""
        self.controller.update(self.state, outcomes)

    def drafts(self, limit: int = 8, confidences: Sequence[float | Confidence] = (), row: int = 0) -> int:
        """How many drafts a row asks for this round (begun already), bounded by ``limit`` as the
        engine bounds it; draft i is seen with ``confidences[i]`` (0.9 beyond them)."""
        k = 0
        while k < limit and self.ask(
            k, limit, confidences[k - 1] if 0 < k <= len(confidences) else None, row
        ):
            k += 1
        return k

    def round(
        self,
        costs: Costs | None = None,
        limit: int = 8,
        accepted: int | None = None,
        confidence: float | Confidence = 0.9,
        times: tuple[float, float] = (0.0, 0.0),
    ) -> int:
        """One whole round of a lone sequence whose drafts are all seen with ``confidence``: the
        first ``accepted`` are accepted (all: ``None``). Returns k."""
        costs = costs if costs is not None else self.costs
        self.begin(costs)
        k = self.drafts(limit, (confidence,) * limit)
        n = k if accepted is None else min(k, accepted)
        self.end(outcome(k, n, (confidence,) * k, *times, costs))
        return k

    def lockstep(self, costs: Costs, limits: Sequence[int], confidence: float = 0.9) -> list[int]:
        """A batch round (begun here, not ended) asked as the engine asks it: before each draft
        step, every row still drafting in turn, none past its limit. The drafts of each row."""
        self.begin(costs, range(len(limits)))
        ks = [0] * len(limits)
        feeding, index = list(range(len(limits))), 0
        while feeding:
            feeding = [
                row
                for row in feeding
                if index < limits[row] and self.ask(index, limits[row], confidence, row)
            ]
            for row in feeding:
                ks[row] += 1
            index += 1
        return ks
