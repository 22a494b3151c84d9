"""Comparison controllers: the draft-length schedules in use elsewhere, as eesd plug-ins."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from eesd_core.config import PluginOptions
from eesd_core.hookspecs import hookimpl
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


@hookimpl
def eesd_register_controllers(register: Any) -> None:
    register.add("fixed", FixedK, options=FixedOptions)
