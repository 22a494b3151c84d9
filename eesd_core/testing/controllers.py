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
    """Continue iff ``schedule[(calls + salt * (token + 1)) % len(schedule)]``."""

    schedule: tuple[bool, ...] = (True,)
    salt: int = 0

    def __post_init__(self) -> None:
        self.schedule = tuple(self.schedule) or (False,)
        self.calls = 0
        self.updates: list[RoundOutcome] = []

    def start(self, request: Request) -> None:
        self.calls = 0

    def should_continue(self, step: DraftStep) -> bool:
        token = -1 if step.token is None else step.token
        decision = self.schedule[(self.calls + self.salt * (token + 1)) % len(self.schedule)]
        self.calls += 1
        return decision

    def update(self, outcome: RoundOutcome) -> None:
        self.updates.append(outcome)


def always() -> ErraticController:
    """Draft as long as the engine allows."""
    return ErraticController((True,))


def never() -> ErraticController:
    """Never draft: every round is a plain decoding step."""
    return ErraticController((False,))
