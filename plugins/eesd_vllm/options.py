"""Options of the vLLM proposer, read from ``EESD_VLLM_OPTIONS`` (import-light: no torch, no vLLM).

vLLM builds a ``custom_class`` proposer from its own configuration alone, so what eesd needs beyond
``num_speculative_tokens`` travels in one environment variable holding JSON, which every process
vLLM starts inherits. :func:`eesd_vllm.speculative_config` writes it for you.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from eesd_core.config import PluginOptions, validate
from eesd_core.errors import ConfigError

OPTIONS_ENV = "EESD_VLLM_OPTIONS"


class GateOptions(PluginOptions):
    """The gate's settings (:class:`eesd_vllm.gate.DraftGate`, where each is explained).
    ``decay``: the weight of a step scored one step earlier. ``min_steps``: drafting steps scored
    before the gate judges by the gain's standard error, ``z`` of them. ``floor``: a gain below it
    closes the gate whatever the spread; ``quick_floor`` likewise after ``quick_steps``.
    ``probe_every``: closed steps (times the batch size) before the first probe. ``proof_from``:
    the batch size from which drafting must show a gain rather than merely no loss."""

    decay: float = Field(0.95, gt=0.0, le=1.0)
    min_steps: int = Field(12, ge=1)
    z: float = Field(1.0, ge=0.0)
    floor: float = Field(0.9, ge=0.0, le=1.0)
    quick_steps: int = Field(3, ge=1)
    quick_floor: float = Field(0.75, ge=0.0, le=1.0)
    probe_every: int = Field(64, ge=1)
    proof_from: int = Field(1, ge=1)


class ProposerOptions(PluginOptions):
    """``exit_layer`` N and ``head`` as for the early-exit drafter. ``"auto"`` takes the head
    eesd ships for the served model: the one that also reads the target's last-layer states where
    vLLM runs its model eagerly (``enforce_eager=True``: the proposer reads those states with a
    hook on vLLM's model), else one that reads layer N alone. ``controller`` (any registered one)
    with ``controller_options`` chooses each request's draft length, zero included. ``dtype`` of
    the proposer's copy of the first N layers (``"auto"``: vLLM's). ``guard``: stop drafting at
    a number of concurrent requests where steps that drafted were measured slower than plain
    ones, probing now and then (:mod:`eesd_vllm.gate`); off, the controller alone decides.
    ``guard_options`` tune the gate (:class:`GateOptions`). ``exit_layer`` is checked where the
    drafter is built, by the early-exit drafter's own options."""

    exit_layer: int | None = None
    head: str | Path | None = "auto"
    controller: str = "thompson"
    controller_options: dict[str, Any] = Field(default_factory=dict)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    guard: bool = True
    guard_options: GateOptions = Field(default_factory=GateOptions)


def read_options(environ: dict[str, str] | None = None) -> ProposerOptions:
    """The options in ``EESD_VLLM_OPTIONS`` (all defaults when it is unset)."""
    text = (os.environ if environ is None else environ).get(OPTIONS_ENV, "").strip()
    if not text:
        return ProposerOptions()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{OPTIONS_ENV} must hold a JSON object of proposer options: {exc}.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{OPTIONS_ENV} must hold a JSON object, got {type(raw).__name__}.")
    return validate(ProposerOptions, raw, f"{OPTIONS_ENV}")
