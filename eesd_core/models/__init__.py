"""Model adapters: how eesd splits an HF causal LM into embed / layers [a, b) / norm / head.

Adapters are plug-ins (hook ``eesd_register_model_adapters``); :func:`find_adapter` picks the first
registered one whose ``supports(model)`` is true and hands it its options, validated against the
options model it registered (:class:`AdapterOptions` for the built-ins). This package stays
import-light: the built-ins register as :class:`LazyAdapter` (:mod:`eesd_core.models.builtin`), so
listing plug-ins imports no torch; an adapter's module loads when a model it serves is wrapped.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from eesd_core.config import PluginOptions, validate
from eesd_core.errors import ConfigError, UnsupportedModelError
from eesd_core.protocols import ModelAdapter


class AdapterOptions(PluginOptions):
    """``matmul``: the product of the linear layers in passes over a few positions (decoding
    steps, draft steps, verification), :mod:`eesd_core.models.products`. ``"auto"`` measures on
    CPUs, when the adapter is prepared, where ``(W @ x.T).T`` or oneDNN's linear clearly beats
    ``F.linear``, and keeps the faster; ``"standard"`` keeps ``F.linear``; ``"transposed"`` and
    ``"onednn"`` use that product for every prepared pass. ``skip_padding``: on, a batched pass
    multiplies only the positions that are not padding (the left padding of prompts, the slots
    of rows that drafted fewer tokens than the longest draft of the round, rows that are done);
    off, it multiplies every position, as one dense batch. ``"auto"`` skips on CPUs, where a
    pass costs the arithmetic of its positions, and not elsewhere: on a GPU a decoding pass is
    bound by launching kernels and reading weights, and gathering the rows that count before
    every linear layer and scattering them back costs more than the rows it saves."""

    matmul: Literal["auto", "standard", "transposed", "onednn"] = "auto"
    skip_padding: bool | Literal["auto"] = "auto"


class LazyAdapter:
    """An adapter class named by module and attribute, imported the first time it is needed.

    ``supports`` answers from ``model_types`` alone when the model's type is not among them, so
    models of other families never import this one's module.
    """

    def __init__(self, module: str, name: str, model_types: tuple[str, ...]) -> None:
        self.module, self.name, self.model_types = module, name, model_types

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)

    def supports(self, model: Any) -> bool:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return model_type in self.model_types and bool(self.load().supports(model))

    def __call__(self, model: Any, options: Any = None) -> Any:
        return self.load()(model, options)


def find_adapter(model: Any, options: dict[str, Any] | None = None) -> ModelAdapter:
    """Wrap ``model`` in the adapter that supports its architecture, or say which ones exist."""
    from eesd_core.registry import get_manager

    entries = get_manager().registry("model_adapter").entries()
    for entry in entries:
        if not entry.factory.supports(model):
            continue
        if entry.options is None:
            if options:
                raise ConfigError(f"Model adapter {entry.name!r} takes no options, got {sorted(options)}.")
            return entry.factory(model)
        return entry.factory(model, validate(entry.options, options, f"adapter options for {entry.name!r}"))
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    supported = sorted({t for e in entries for t in getattr(e.factory, "model_types", ())})
    raise UnsupportedModelError(
        f"No model adapter supports architecture {model_type!r}. Supported: "
        f"{', '.join(supported) or 'none registered'}. Install a plug-in that registers an adapter "
        "for it (hook eesd_register_model_adapters), or use a model of a supported family."
    )
