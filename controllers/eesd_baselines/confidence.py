"""Stop drafting when the drafter doubts its latest draft (transformers' confidence threshold)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class ConfidenceOptions(PluginOptions):
    """``threshold``: stop after a draft whose confidence is below it (transformers: 0.4);
    ``signal``: ``"prob"`` (q of the drafted token, as transformers) or ``"top1"``;
    ``adaptive``: re-fit the threshold after each round from (confidence, accepted?) pairs,
    minimising FPR + 3 * FNR over the ROC curve, as transformers does with scikit-learn;
    ``k``: drafts per round at most (transformers' ``num_assistant_tokens``, 20)."""

    threshold: float = Field(0.4, ge=0.0, le=1.0)
    signal: Literal["prob", "top1"] = "prob"
    adaptive: bool = False
    k: int = Field(20, ge=1)


def roc_threshold(scores: list[float], labels: list[int], fn_weight: float = 3.0) -> float | None:
    """The score threshold minimising FPR + fn_weight * FNR, or None without both classes."""
    positives = sum(labels)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    best, best_cost = None, float("inf")
    for threshold in sorted(set(scores), reverse=True):
        tp = sum(1 for s, y in zip(scores, labels, strict=True) if y and s >= threshold)
        fp = sum(1 for s, y in zip(scores, labels, strict=True) if not y and s >= threshold)
        cost = fp / negatives + fn_weight * (1 - tp / positives)
        if cost < best_cost:
            best, best_cost = threshold, cost
    return best


class ConfidenceThreshold:
    """Draft at least one token, then stop after any draft less confident than the threshold."""

    def __init__(self, options: ConfidenceOptions | None = None) -> None:
        self.options = options or ConfidenceOptions()
        self.threshold = self.options.threshold
        self.scores: list[float] = []  # learnt across generations
        self.labels: list[int] = []
        self._lock = threading.Lock()

    def start(self, request: Request) -> None:
        return None

    def begin_round(self, state: None, round: RoundStart) -> None:
        pass

    def should_continue(self, state: None, step: DraftStep) -> bool:
        if step.index >= self.options.k:
            return False
        if step.index == 0 or step.confidence is None:
            return step.index == 0
        value = step.confidence.prob if self.options.signal == "prob" else step.confidence.top1
        return value is not None and value >= self.threshold

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        """Record the accepted drafts and the first rejected one; later drafts were never judged."""
        if not self.options.adaptive:
            return
        for outcome in outcomes:
            if outcome.drafted:
                with self._lock:
                    self._learn(outcome)

    def _learn(self, outcome: RoundOutcome) -> None:
        n, judged = outcome.accepted, outcome.confidences[: outcome.accepted + 1]
        if any(c is None for c in judged):
            return  # a replay that recorded no confidences
        self.scores.extend(c.prob if self.options.signal == "prob" else c.top1 for c in judged)  # type: ignore[misc]
        self.labels.extend(int(i < n) for i in range(len(judged)))
        if len(self.scores) > 5:
            fitted = roc_threshold(self.scores, self.labels)
            if fitted is not None:
                self.threshold = fitted
