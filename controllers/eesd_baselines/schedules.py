"""Schedules that fix the draft length of each round before it starts: fixed k and HF's +2/-1."""

from __future__ import annotations

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome


class FixedOptions(PluginOptions):
    """``k``: drafts per round (0 drafts nothing: plain decoding through the drafter's path)."""

    k: int = Field(4, ge=0)


class FixedK:
    """Always draft ``k`` tokens (the engine still caps them at ``max_draft_tokens``)."""

    def __init__(self, options: FixedOptions | None = None) -> None:
        self.k = (options or FixedOptions()).k

    def start(self, request: Request) -> None:
        pass

    def should_continue(self, step: DraftStep) -> bool:
        return step.index < self.k

    def update(self, outcome: RoundOutcome) -> None:
        pass


class HeuristicOptions(PluginOptions):
    """``start``: the first round's draft length (transformers' ``num_assistant_tokens``, 20);
    ``transient``: restart from ``start`` at every generation (``"heuristic_transient"``) instead
    of carrying the length across generations (``"heuristic"``)."""

    start: int = Field(20, ge=1)
    transient: bool = False


class Heuristic:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a round whose drafts
    were all accepted, -1 (never below 1) otherwise.

    Unlike transformers, the length is kept within the engine's ``max_draft_tokens``: a length the
    engine would cap anyway would otherwise take many rejected rounds to come back into range.
    """

    def __init__(self, options: HeuristicOptions | None = None) -> None:
        self.options = options or HeuristicOptions()
        self.k = self.options.start
        self.ceiling = self.k

    def start(self, request: Request) -> None:
        self.ceiling = request.max_draft_tokens
        if self.options.transient:
            self.k = self.options.start
        self.k = min(self.k, self.ceiling)

    def should_continue(self, step: DraftStep) -> bool:
        return step.index < self.k

    def update(self, outcome: RoundOutcome) -> None:
        if outcome.drafted and outcome.accepted == outcome.drafted:
            self.k = min(self.k + 2, self.ceiling)
        elif outcome.drafted:
            self.k = max(1, self.k - 1)
