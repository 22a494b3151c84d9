"""Controllers that test the engine rather than speed it up: erratic, but replayable.

No controller decision may change what is generated, only how fast. :class:`ErraticController`
makes arbitrary decisions that depend on the call count and on the drafted token (so a stop can
depend on what was drafted, as real stopping rules do), from a schedule a test draws; it restarts the
schedule at every ``start()``, so replaying a generation replays its decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


@dataclass
class _Calls:
    """How many times a generation asked so far."""

    calls: int = 0
    keeps: int = 0


@dataclass
class ErraticController:
    """Continue iff ``schedule[(calls + salt * (token + 1)) % len(schedule)]``; keep a draft whose
    q it has seen iff ``keeps[(keep_calls + salt * int(10 * top1)) % len(keeps)]`` (so a withdrawal
    can depend on q, as a real keep rule does; never on the token, which is not drawn yet)."""

    schedule: tuple[bool, ...] = (True,)
    salt: int = 0
    keeps: tuple[bool, ...] = (True,)
    withdraws = True

    def __post_init__(self) -> None:
        self.schedule = tuple(self.schedule) or (False,)
        self.keeps = tuple(self.keeps) or (True,)
        self.updates: list[RoundOutcome] = []

    def start(self, request: Request) -> _Calls:
        return _Calls()

    def begin_round(self, state: _Calls, round: RoundStart) -> None:
        pass

    def should_continue(self, state: _Calls, step: DraftStep) -> bool:
        token = -1 if step.token is None else step.token
        decision = self.schedule[(state.calls + self.salt * (token + 1)) % len(self.schedule)]
        state.calls += 1
        return decision

    def keep(self, state: _Calls, step: DraftStep) -> bool:
        top1 = 0.0 if step.confidence is None else step.confidence.top1
        decision = self.keeps[(state.keeps + self.salt * int(10 * top1)) % len(self.keeps)]
        state.keeps += 1
        return decision

    def update(self, state: _Calls, outcomes: Sequence[RoundOutcome]) -> None:
        self.updates.extend(outcomes)


def always() -> ErraticController:
    """Draft as long as the engine allows."""
    return ErraticController((True,))


def never() -> ErraticController:
    """Never draft: every round is a plain decoding step."""
    return ErraticController((False,))
