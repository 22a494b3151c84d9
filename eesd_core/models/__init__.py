"""Model adapters: how eesd splits an HF causal LM into embed / layers [a, b) / norm / head.

Adapters are plug-ins (hook ``eesd_register_model_adapters``); :func:`find_adapter` picks the first
whose ``supports(model)`` is true, with its options validated. The built-ins register as
:class:`LazyAdapter`, so listing plug-ins imports no torch.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Literal

from eesd_core.config import PluginOptions, validate
from eesd_core.errors import ConfigError, UnsupportedModelError
from eesd_core.protocols import ModelAdapter


class AdapterOptions(PluginOptions):
    """``products`` (how linear layers multiply; ``"standard"``: ``F.linear``) and ``compile`` (how
    passes run; ``"off"``: eagerly, on a cache that grows) are the installed plug-ins' choice under
    ``"auto"`` (hooks ``eesd_linear_products``, ``eesd_passes``), or name one of theirs.
    ``skip_padding``: a batched pass multiplies only the positions that are not padding; ``"auto"``
    skips on CPUs, where a pass costs its positions' arithmetic, not on GPUs, where gathering the
    rows costs more than it saves."""

    products: str = "auto"
    skip_padding: bool | Literal["auto"] = "auto"
    compile: str = "auto"


def from_plugins(hook: str, adapter: Any, what: str, off: str) -> Any:
    """The first answer of a plug-in implementing ``hook`` to the adapter's option ``what`` (``None``
    for ``off``: the core's own way); a choice other than ``"auto"`` that none takes is an error."""
    if (choice := getattr(adapter.options, what)) == off:
        return None
    from eesd_core.registry import get_manager

    found = getattr(get_manager().pm.hook, hook)(adapter=adapter, choice=choice)
    if found is None and choice != "auto":
        raise ConfigError(
            f"No installed plug-in provides {what}={choice!r} for this model: use {what}='auto' or "
            f"{off!r} (`eesd plugins` lists what is loaded)."
        )
    return found


class LazyAdapter:
    """An adapter class named by module and attribute, imported the first time it is needed;
    ``supports`` answers from ``model_types`` alone for other families, without importing it."""

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
    from eesd_core.registry import FILTERS, get_manager

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
        + "".join(f" Plug-ins are filtered by {v}={os.environ[v]!r}." for v in FILTERS if os.environ.get(v))
    )
