"""Thompson-sampling draft-length controller (EESD's Beta-TS and Calibration-TS), cost-aware."""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_thompson.controller import ThompsonController
from eesd_thompson.options import ThompsonOptions

__all__ = ["ThompsonController", "ThompsonOptions"]


@hookimpl
def eesd_register_controllers(register: Any) -> None:
    register.add("thompson", ThompsonController, options=ThompsonOptions)
