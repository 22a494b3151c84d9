"""Early-exit drafter: the target's first N layers plus an exit head propose the drafts (EESD).

Drafting runs layers [0, N) of the target on one token at a time, writing the target's own KV cache
for those layers, and the exit head turns the layer-N state into q. Verification then runs only
layers [N, L) over the layer-N states already computed: the first N layers never run twice.
``eesd distill`` (:mod:`eesd_early_exit.distill`) trains the exit head by self-distillation.

This module stays import-light (no torch): listing plug-ins or building the command line loads it.
"""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_early_exit.options import EarlyExitOptions

__all__ = ["EarlyExitOptions"]


def _early_exit(options: EarlyExitOptions) -> Any:
    from eesd_early_exit.drafter import EarlyExitDrafter

    return EarlyExitDrafter(options)


@hookimpl
def eesd_register_drafters(register: Any) -> None:
    register.add("early_exit", _early_exit, options=EarlyExitOptions)


@hookimpl
def eesd_cli_commands(subparsers: Any) -> None:
    from eesd_early_exit.command import add_distill_command

    add_distill_command(subparsers)
