"""eesd: lossless early-exiting speculative decoding for Hugging Face causal LMs.

>>> from eesd_core import SpeculativeDecoder
>>> dec = SpeculativeDecoder(model, drafter="early_exit", drafter_options={"exit_layer": 4})
>>> res = dec.generate(input_ids, max_new_tokens=128)

The names below load on first use, so that importing the package (as every plug-in and the
``eesd`` command do) does not import torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eesd_core.engine import GenerationResult, SpeculativeDecoder
    from eesd_core.errors import EESDError
    from eesd_core.hookspecs import hookimpl
    from eesd_core.protocols import RoundOutcome
    from eesd_core.registry import register
    from eesd_core.stats import GenerationStats

__version__ = "0.1.0"

_WHERE = dict(
    EESDError="errors", GenerationResult="engine", GenerationStats="stats", RoundOutcome="protocols"
)
_WHERE.update(SpeculativeDecoder="engine", hookimpl="hookspecs", register="registry")
__all__ = ["EESDError", "GenerationResult", "GenerationStats", "RoundOutcome", "SpeculativeDecoder"]
__all__ += ["hookimpl", "register", "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'eesd_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"eesd_core.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
