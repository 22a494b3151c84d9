"""Comparison controllers: the draft-length schedules in use elsewhere, as eesd plug-ins.

``fixed`` (constant k), ``heuristic`` (transformers' +2/-1), ``confidence`` (transformers'
``assistant_confidence_threshold``, optionally re-fitted on the ROC curve), ``ema`` (SGLang's EMA of
the accepted length) and ``ucb`` (a BanditSpec-style UCB1 bandit over k, rewarding tokens per second).
"""

from __future__ import annotations

from typing import Any

from eesd_baselines.confidence import ConfidenceOptions, ConfidenceThreshold
from eesd_baselines.ema import EmaOptions, EmaSteps
from eesd_baselines.schedules import FixedK, FixedOptions, Heuristic, HeuristicOptions
from eesd_baselines.ucb import UcbDraftLength, UcbOptions
from eesd_core.hookspecs import hookimpl

__all__ = [
    "ConfidenceOptions",
    "ConfidenceThreshold",
    "EmaOptions",
    "EmaSteps",
    "FixedK",
    "FixedOptions",
    "Heuristic",
    "HeuristicOptions",
    "UcbDraftLength",
    "UcbOptions",
]


@hookimpl
def eesd_register_controllers(register: Any) -> None:
    register.add("fixed", FixedK, options=FixedOptions)
    register.add("heuristic", Heuristic, options=HeuristicOptions)
    register.add("confidence", ConfidenceThreshold, options=ConfidenceOptions)
    register.add("ema", EmaSteps, options=EmaOptions)
    register.add("ucb", UcbDraftLength, options=UcbOptions)
