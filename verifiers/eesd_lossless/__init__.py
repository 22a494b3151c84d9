"""The lossless verifier (``verifier="lossless"``): speculative sampling, exact match at temperature 0.

The algorithm and its randomness contract are described in :mod:`eesd_lossless.verifier`. This
module stays import-light (no torch): listing plug-ins or building the command line loads it.
"""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_lossless.options import LosslessOptions

__all__ = ["LosslessOptions", "LosslessVerifier"]


def __getattr__(name: str) -> Any:
    if name == "LosslessVerifier":
        from eesd_lossless.verifier import LosslessVerifier

        return LosslessVerifier
    raise AttributeError(f"module 'eesd_lossless' has no attribute {name!r}")


def _lossless(options: LosslessOptions) -> Any:
    from eesd_lossless.verifier import LosslessVerifier

    return LosslessVerifier(options)


@hookimpl
def eesd_register_verifiers(register: Any) -> None:
    register.add("lossless", _lossless, options=LosslessOptions)
