"""The Llama family's adapter as a plug-in (entry point ``llama_family``), registered without
importing torch: the adapter class loads when a model of the family is wrapped."""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_core.models import AdapterOptions, LazyAdapter

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@hookimpl
def eesd_register_model_adapters(register: Any) -> None:
    adapter = LazyAdapter("eesd_core.models.base", "LlamaFamilyAdapter", LLAMA_TYPES)
    register.add("llama_family", adapter, options=AdapterOptions)
