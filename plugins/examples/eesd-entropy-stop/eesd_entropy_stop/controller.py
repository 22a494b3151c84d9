"""Stop drafting when a lower bound on the next acceptance probability falls below a threshold.

AdaEDL (Agrawal et al., 2024) observes that a draft's chance of acceptance is bounded below by
``1 - sqrt(gamma * H(q))``, where H(q) is the entropy of the draft distribution: a confident drafter
(low entropy) is usually right. Drafting continues while that bound stays at or above a threshold.
The threshold follows the observed acceptance rate: when rounds accept less than ``target``, it
rises (stop earlier); when they accept more, it falls (draft longer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class EntropyStopOptions(PluginOptions):
    """``gamma`` scales the entropy in the bound; ``threshold`` is where drafting stops at first;
    ``target`` is the acceptance rate the threshold steers toward, by ``step`` per round (0 keeps
    the threshold fixed)."""

    gamma: float = Field(1.0, gt=0.0)
    threshold: float = Field(0.4, ge=0.0, le=1.0)
    target: float = Field(0.7, ge=0.0, le=1.0)
    step: float = Field(0.05, ge=0.0, le=1.0)


def acceptance_bound(entropy: float, gamma: float) -> float:
    """1 - sqrt(gamma * H): a lower bound on the chance the next draft is accepted."""
    return 1.0 - math.sqrt(gamma * max(entropy, 0.0))


@dataclass
class Threshold:
    """A generation's threshold: it starts where the options say and follows its rounds."""

    value: float


class EntropyStop:
    """Entropy-bound early draft stopping with a self-adjusting threshold."""

    def __init__(self, options: EntropyStopOptions | None = None) -> None:
        self.options = options or EntropyStopOptions()

    def start(self, request: Request) -> Threshold:
        return Threshold(self.options.threshold)

    def begin_round(self, state: Threshold, round: RoundStart) -> None:
        pass

    def should_continue(self, state: Threshold, step: DraftStep) -> bool:
        entropy = None if step.confidence is None else step.confidence.entropy
        if step.index == 0 or entropy is None or math.isnan(entropy):
            return True
        return acceptance_bound(entropy, self.options.gamma) >= state.value

    def update(self, state: Threshold, outcomes: Sequence[RoundOutcome]) -> None:
        for outcome in outcomes:
            if outcome.drafted:
                rate = outcome.accepted / outcome.drafted
                moved = state.value + self.options.step * (self.options.target - rate)
                state.value = min(1.0, max(0.0, moved))
