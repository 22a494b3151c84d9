"""SGLang-style adaptive speculation: the draft length follows an EMA of the accepted length."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class EmaOptions(PluginOptions):
    """``alpha``: EMA weight of the newest round (SGLang: 0.2); ``warmup``: rounds drafted at
    ``start`` before the EMA steers (10); ``interval``: rounds between changes of the length (5);
    ``hysteresis``: how far beyond the rounding point the EMA must move before the length changes;
    ``start``: the length during warm-up (default: the engine's ``max_draft_tokens``);
    ``min_steps``: the least length (1; 0 lets it fall to plain decoding, where the EMA freezes)."""

    alpha: float = Field(0.2, gt=0.0, le=1.0)
    warmup: int = Field(10, ge=0)
    interval: int = Field(5, ge=1)
    hysteresis: float = Field(0.25, ge=0.0)
    start: int | None = Field(None, ge=0)
    min_steps: int = Field(1, ge=0)


class EmaSteps:
    """steps = round(EMA of accepted drafts) + 1, re-decided every ``interval`` rounds."""

    def __init__(self, options: EmaOptions | None = None) -> None:
        self.options = options or EmaOptions()
        self.ema: float | None = None
        self.rounds = 0
        self.steps = self.options.start if self.options.start is not None else 1
        self.ceiling: int | None = None
        self._lock = threading.Lock()

    def start(self, request: Request) -> None:
        with self._lock:
            if self.ceiling is None and self.options.start is None:
                self.steps = request.max_draft_tokens
            self.ceiling = request.max_draft_tokens

    def begin_round(self, state: None, round: RoundStart) -> None:
        pass

    def should_continue(self, state: None, step: DraftStep) -> bool:
        return step.index < self.steps

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        """What the EMA learns is the decoder's, across generations."""
        for outcome in outcomes:
            if outcome.drafted:
                with self._lock:
                    self._learn(outcome)

    def _learn(self, outcome: RoundOutcome) -> None:
        a = self.options.alpha
        self.ema = outcome.accepted if self.ema is None else (1 - a) * self.ema + a * outcome.accepted
        self.rounds += 1
        if self.rounds >= self.options.warmup and self.rounds % self.options.interval == 0:
            self.steps = self._target(self.ema)

    def _target(self, ema: float) -> int:
        """round(ema) + 1, kept at the current length while within the hysteresis band."""
        if abs(ema + 1 - self.steps) <= 0.5 + self.options.hysteresis:
            return self.steps
        ceiling = self.ceiling if self.ceiling is not None else self.steps
        return max(self.options.min_steps, min(round(ema) + 1, ceiling))
