"""The built-in model adapters as plug-ins, registered without importing torch.

Each object here is an entry point of the ``eesd`` group (``module:attribute``), like a plug-in
module; the adapter classes themselves load when a model of their family is wrapped.
"""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_core.models import AdapterOptions, LazyAdapter

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
GEMMA3_TYPES = ("gemma3_text",)


class BuiltinAdapter:
    """Registers one adapter class of :mod:`eesd_core.models` under ``name``."""

    def __init__(self, name: str, module: str, cls: str, model_types: tuple[str, ...]) -> None:
        self.name, self.adapter = name, LazyAdapter(module, cls, model_types)

    @hookimpl
    def eesd_register_model_adapters(self, register: Any) -> None:
        register.add(self.name, self.adapter, options=AdapterOptions)


llama_family = BuiltinAdapter("llama_family", "eesd_core.models.llama", "LlamaFamilyAdapter", LLAMA_TYPES)
gemma3 = BuiltinAdapter("gemma3", "eesd_core.models.gemma3", "Gemma3Adapter", GEMMA3_TYPES)
