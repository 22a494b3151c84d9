"""Controllers that test the engine rather than speed it up: erratic, but replayable.

No controller decision may change what is generated, only how fast. :class:`ErraticController`
makes arbitrary decisions that depend on the call count and on the drafted token (so a stop can
depend on what was drafted, as real stopping rules do), from a schedule a test draws; it restarts the
schedule at every ``start()``, so replaying a generation replays its decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from eesd_core.protocols import DraftStep, Request, RoundOutcome


@dataclass
class ErraticController:
    """Continue iff ``schedule[(calls + salt * (token + 1)) % len(schedule)]``; keep a draft whose
    q it has seen iff ``keeps[(keep_calls + salt * int(10 * top1)) % len(keeps)]`` (so a withdrawal
    can depend on q, as a real keep rule does; never on the token, which is not drawn yet)."""

    schedule: tuple[bool, ...] = (True,)
    salt: int = 0
    keeps: tuple[bool, ...] = (True,)

    def __post_init__(self) -> None:
        self.schedule = tuple(self.schedule) or (False,)
        self.keeps = tuple(self.keeps) or (True,)
        self.calls = 0
        self.keep_calls = 0
        self.updates: list[RoundOutcome] = []

    def start(self, request: Request) -> None:
        self.calls = 0
        self.keep_calls = 0

    def should_continue(self, step: DraftStep) -> bool:
        token = -1 if step.token is None else step.token
        decision = self.schedule[(self.calls + self.salt * (token + 1)) % len(self.schedule)]
        self.calls += 1
        return decision

    def keep(self, step: DraftStep) -> bool:
        top1 = 0.0 if step.top1 is None else step.top1
        decision = self.keeps[(self.keep_calls + self.salt * int(10 * top1)) % len(self.keeps)]
        self.keep_calls += 1
        return decision

    def update(self, outcome: RoundOutcome) -> None:
        self.updates.append(outcome)


def always() -> ErraticController:
    """Draft as long as the engine allows."""
    return ErraticController((True,))


def never() -> ErraticController:
    """Never draft: every round is a plain decoding step."""
    return ErraticController((False,))
