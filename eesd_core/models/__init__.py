"""Model adapters: how eesd splits an HF causal LM into embed / layers [a, b) / norm / head.

Adapters are plug-ins (hook ``eesd_register_model_adapters``); :func:`find_adapter` picks the first
registered one whose ``supports(model)`` is true.
"""

from __future__ import annotations

from typing import Any

from eesd_core.errors import UnsupportedModelError
from eesd_core.protocols import ModelAdapter


def find_adapter(model: Any) -> ModelAdapter:
    """Wrap ``model`` in the adapter that supports its architecture, or say which ones exist."""
    from eesd_core.registry import get_manager

    entries = get_manager().registry("model_adapter").entries()
    for entry in entries:
        if entry.factory.supports(model):
            return entry.factory(model)
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    supported = sorted({t for e in entries for t in getattr(e.factory, "model_types", ())})
    raise UnsupportedModelError(
        f"No model adapter supports architecture {model_type!r}. Supported: "
        f"{', '.join(supported) or 'none registered'}. Install a plug-in that registers an adapter "
        "for it (hook eesd_register_model_adapters), or use a model of a supported family."
    )
