"""BanditSpec-style UCB1 over the draft length k, rewarding committed tokens per second."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class UcbOptions(PluginOptions):
    """``max_k``: arms are k = 0 .. max_k (default: the engine's ``max_draft_tokens``);
    ``exploration``: c in mean + c * sqrt(2 ln t / n); ``per_request``: forget the arms'
    statistics at every generation instead of carrying them across generations."""

    max_k: int | None = Field(None, ge=0)
    exploration: float = Field(1.0, ge=0.0)
    per_request: bool = False


class UcbDraftLength:
    """Chooses each round's k by UCB1; the reward is (n + 1) / measured round time.

    Rewards are divided by the best rate seen so far, so the exploration bonus compares with
    numbers in [0, 1] whatever the hardware's speed.
    """

    def __init__(self, options: UcbOptions | None = None) -> None:
        self.options = options or UcbOptions()
        self.counts: list[int] = []
        self.totals: list[float] = []
        self.best = 0.0
        self._lock = threading.Lock()

    def start(self, request: Request) -> dict[int, int]:
        """The generation's state: the arm of each row's current round."""
        arms = (self.options.max_k if self.options.max_k is not None else request.max_draft_tokens) + 1
        with self._lock:
            if self.options.per_request or len(self.counts) != arms:
                self.counts, self.totals, self.best = [0] * arms, [0.0] * arms, 0.0
        return {}

    def begin_round(self, state: dict[int, int], round: RoundStart) -> None:
        for row in round.rows:
            state[row] = self.choose()

    def should_continue(self, state: dict[int, int], step: DraftStep) -> bool:
        return step.index < state.get(step.row, 0)

    def choose(self) -> int:
        for arm, count in enumerate(self.counts):
            if not count:
                return arm
        t = sum(self.counts)
        scale = self.best or 1.0

        def index(arm: int) -> float:
            bonus = self.options.exploration * math.sqrt(2 * math.log(t) / self.counts[arm])
            return self.totals[arm] / self.counts[arm] / scale + bonus

        return max(range(len(self.counts)), key=index)

    def update(self, state: dict[int, int], outcomes: Sequence[RoundOutcome]) -> None:
        for outcome in outcomes:
            elapsed = outcome.draft_time + outcome.verify_time
            if elapsed <= 0 or outcome.drafted >= len(self.counts):
                continue
            rate = (outcome.accepted + 1) / elapsed
            with self._lock:
                self.counts[outcome.drafted] += 1
                self.totals[outcome.drafted] += rate
                self.best = max(self.best, rate)
