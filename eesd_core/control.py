"""What a controller sees of a generation's rounds, written once (:class:`Control`, :func:`row_outcome`):
the engine's round, eesd's vLLM proposer and the trace replay all call it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eesd_core.guards import Guarded
from eesd_core.protocols import Confidence, Costs, DraftStep, Request, RoundOutcome, RoundStart, Withdrawn


@dataclass
class RowDrafts:
    """One row's drafts in a round, what the controller saw of each and q (``None``: one-hot);
    ``withdrawn``: the confidence, q and logits of a draft taken back."""

    tokens: list[Any] = field(default_factory=list)  # token ids (None where a replay has none)
    confidences: list[Confidence | None] = field(default_factory=list)
    qs: list[torch.Tensor | None] = field(default_factory=list)
    withdrawn: tuple[Confidence, torch.Tensor | None, torch.Tensor] | None = None

    def add(self, token: int | None, confidence: Confidence | None, q: torch.Tensor | None = None) -> None:
        self.tokens.append(token)
        self.confidences.append(confidence)
        self.qs.append(q)

    def q(self, vocab: int) -> torch.Tensor | None:
        """q of every draft ``[k, V]``, one-hot where fixed; ``None`` when every draft is one-hot."""
        if all(q is None for q in self.qs):
            return None
        like = next(q for q in self.qs if q is not None)
        eye = torch.eye(1, vocab, dtype=like.dtype, device=like.device)[0]  # one-hot at 0
        return torch.stack(
            [eye.roll(t) if q is None else q for t, q in zip(self.tokens, self.qs, strict=True)]
        )


def acceptance_chance(drafts: RowDrafts, p: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) of the draft ``drafts`` took back: the chance that it would have been
    accepted against p ``[V]`` (q ``None``: one-hot at its logits' argmax), still on p's device."""
    _, q, logits = drafts.withdrawn  # type: ignore[misc]
    return p[logits.argmax()] if q is None else torch.minimum(p, q.to(p.dtype)).sum()


class Control:
    """A controller's view of one generation's rounds; see the module."""

    def __init__(self, controller: Any, guard: Guarded, request: Request) -> None:
        self.controller, self.guard, self.withdraws = controller, guard, request.withdraws
        self.costs = request.costs
        self.state = guard.call("controller", "start", controller.start, request)
        self.rounds, self.rows, self.limits = 0, (), ()  # type: tuple[int, Sequence[int], Sequence[int]]

    def begin(self, rows: Sequence[int], costs: Costs, limits: Sequence[int], live: Sequence[bool]) -> None:
        """A round over slot rows j (generation row ``rows[j]``), each allowed ``limits[j]``
        drafts; those ``live`` marks take part."""
        self.rows, self.limits, self.costs = rows, limits, costs
        taking = tuple(row for row, alive in zip(rows, live, strict=True) if alive)
        start = RoundStart(taking, costs, self.rounds)
        self.guard.call("controller", "begin_round", self.controller.begin_round, self.state, start)

    def ask(self, j: int, drafts: RowDrafts) -> bool:
        """Whether slot row j drafts one more, after ``drafts``."""
        index, limit = len(drafts.tokens), self.limits[j]
        if index >= limit:
            return False
        latest = (drafts.tokens[-1], drafts.confidences[-1]) if index else (None, None)
        step = DraftStep(index, limit, self.rows[j], *latest)
        return self.guard.decide("should_continue", self.controller.should_continue, self.state, step)

    def keep(self, j: int, index: int, confidence: Confidence | None) -> bool:
        """Whether slot row j verifies the draft after its ``index`` ones, from its q alone."""
        if not self.withdraws:
            return True
        step = DraftStep(index + 1, self.limits[j], self.rows[j], None, confidence)
        return self.guard.decide("keep", self.controller.keep, self.state, step)

    def end(self, outcomes: Sequence[RoundOutcome]) -> None:
        """The round is over: the controller learns from every row's outcome."""
        self.rounds += 1
        self.guard.call("controller", "update", self.controller.update, self.state, tuple(outcomes))


def row_outcome(
    position: int,
    drafts: RowDrafts,
    accepted: int,
    tokens: Sequence[int],
    times: tuple[float, float],
    costs: Costs,
    row: int,
    judge: torch.Tensor | float | None = None,
) -> RoundOutcome:
    """A row's record of a round: ``tokens`` committed, ``accepted`` of its drafts. A draft it took
    back is judged by ``judge``: p ``[V]`` at its position, or the chance itself, given only when
    every draft before it was accepted (else the round never reached it)."""
    withdrawn = None
    if drafts.withdrawn is not None:
        seen = judge if judge is None or isinstance(judge, float) else float(acceptance_chance(drafts, judge))
        withdrawn = Withdrawn(drafts.withdrawn[0], seen)
    confidences = tuple(drafts.confidences)
    return RoundOutcome(
        position, len(drafts.tokens), accepted, tuple(tokens), *times, confidences, costs, row, withdrawn
    )
