"""A minimal eesd controller plug-in: keep drafting while the drafter is confident."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from eesd_core import hookimpl
from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart


class MyOptions(PluginOptions):
    """``min_top1``: stop once the latest draft's top-1 probability falls below this."""

    min_top1: float = Field(0.5, ge=0.0, le=1.0)


class MyController:
    def __init__(self, options: MyOptions | None = None) -> None:
        self.options = options or MyOptions()

    def start(self, request: Request) -> None:
        return None  # this generation's state, handed back to every call below: none needed

    def begin_round(self, state: None, round: RoundStart) -> None:
        pass

    def should_continue(self, state: None, step: DraftStep) -> bool:
        confidence = step.confidence
        return step.index == 0 or (confidence is not None and confidence.top1 >= self.options.min_top1)

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        pass


@hookimpl
def eesd_register_controllers(register: Any) -> None:
    register.add("my_controller", MyController, options=MyOptions)
