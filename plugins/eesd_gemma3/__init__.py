"""An adapter for Gemma 3 text models (``gemma3_text``), a plug-in like any other family's would be;
registered without importing torch (:mod:`eesd_gemma3.adapter` loads when a Gemma 3 is wrapped)."""

from __future__ import annotations

from typing import Any

from eesd_core.hookspecs import hookimpl
from eesd_core.models import AdapterOptions, LazyAdapter

GEMMA3_TYPES = ("gemma3_text",)


@hookimpl
def eesd_register_model_adapters(register: Any) -> None:
    register.add(
        "gemma3", LazyAdapter("eesd_gemma3.adapter", "Gemma3Adapter", GEMMA3_TYPES), options=AdapterOptions
    )
