"""Schedules that fix the draft length of each round before it starts: fixed k and HF's +2/-1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class FixedOptions(PluginOptions):
    """``k``: drafts per round (0 drafts nothing: plain decoding through the drafter's path)."""

    k: int = Field(4, ge=0)


class FixedK:
    """Always draft ``k`` tokens (the engine still caps them at ``max_draft_tokens``)."""

    def __init__(self, options: FixedOptions | None = None) -> None:
        self.k = (options or FixedOptions()).k

    def start(self, request: Request) -> None:
        return None

    def begin_round(self, state: None, round: RoundStart) -> None:
        pass

    def should_continue(self, state: None, step: DraftStep) -> bool:
        return step.index < self.k

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        pass


class HeuristicOptions(PluginOptions):
    """``start``: the first round's draft length (transformers' ``num_assistant_tokens``, 20);
    ``transient``: restart from ``start`` at every generation (``"heuristic_transient"``) instead
    of carrying the length across generations (``"heuristic"``)."""

    start: int = Field(20, ge=1)
    transient: bool = False


@dataclass
class _Length:
    """The draft length, and the engine's cap on it."""

    k: int
    ceiling: int


class Heuristic:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a round whose drafts
    were all accepted, -1 (never below 1) otherwise.

    Unlike transformers, the length is kept within the engine's ``max_draft_tokens``: a length the
    engine would cap anyway would otherwise take many rejected rounds to come back into range.
    """

    def __init__(self, options: HeuristicOptions | None = None) -> None:
        self.options = options or HeuristicOptions()
        self.length = _Length(self.options.start, self.options.start)  # carried across generations

    def start(self, request: Request) -> _Length:
        length = _Length(self.options.start, 0) if self.options.transient else self.length
        length.ceiling = request.max_draft_tokens
        length.k = min(length.k, length.ceiling)
        return length

    def begin_round(self, state: _Length, round: RoundStart) -> None:
        pass

    def should_continue(self, state: _Length, step: DraftStep) -> bool:
        return step.index < state.k

    def update(self, state: _Length, outcomes: Sequence[RoundOutcome]) -> None:
        for outcome in outcomes:
            if outcome.drafted and outcome.accepted == outcome.drafted:
                state.k = min(state.k + 2, state.ceiling)
            elif outcome.drafted:
                state.k = max(1, state.k - 1)

    @property
    def k(self) -> int:
        """The length carried across generations."""
        return self.length.k
