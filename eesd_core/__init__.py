"""eesd: lossless early-exiting speculative decoding for Hugging Face causal LMs.

>>> from eesd_core import SpeculativeDecoder
>>> dec = SpeculativeDecoder(model, drafter="early_exit", drafter_options={"exit_layer": 4})
>>> res = dec.generate(input_ids, max_new_tokens=128)
"""

from __future__ import annotations

from eesd_core.engine import GenerationResult, SpeculativeDecoder
from eesd_core.errors import EESDError
from eesd_core.hookspecs import hookimpl
from eesd_core.stats import GenerationStats, RoundStats

__version__ = "0.1.0"

__all__ = [
    "EESDError",
    "GenerationResult",
    "GenerationStats",
    "RoundStats",
    "SpeculativeDecoder",
    "hookimpl",
    "__version__",
]
