"""eesd plug-in: the ``entropy_stop`` controller (early draft stopping from the draft's entropy)."""

from __future__ import annotations

from typing import Any

from eesd_core import hookimpl
from eesd_entropy_stop.controller import EntropyStop, EntropyStopOptions

__all__ = ["EntropyStop", "EntropyStopOptions"]


@hookimpl
def eesd_register_controllers(register: Any) -> None:
    register.add("entropy_stop", EntropyStop, options=EntropyStopOptions)
