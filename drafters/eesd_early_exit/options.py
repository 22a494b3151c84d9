"""Options of the early-exit drafter (import-light: read when plug-ins are listed)."""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator

from eesd_core.config import PluginOptions


class EarlyExitOptions(PluginOptions):
    """``exit_layer``: N, the number of target layers the drafter runs (default: the head's, or
    a quarter of the layers for the untrained head). ``head``: a head file; ``None`` for the
    target's own norm and LM head on layer N; ``"auto"`` (default) for the head shipped with eesd
    for this exact target if there is one, else ``None``."""

    exit_layer: int | None = None
    head: str | Path | None = "auto"

    @field_validator("exit_layer")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("exit_layer must be at least 1 (layer 0 would draft from embeddings)")
        return value
