"""Adapter for the Llama family in transformers 5.x: Llama, Mistral, Qwen2, Qwen3 (SmolLM2 is Llama),
whose layout :class:`~eesd_core.models.base.DecoderAdapter` runs as it is."""

from __future__ import annotations

from eesd_core.models.base import DecoderAdapter
from eesd_core.models.builtin import LLAMA_TYPES


class LlamaFamilyAdapter(DecoderAdapter):
    """Runs any slice of a Llama-family model's layers over hidden states with a shared cache."""

    model_types = LLAMA_TYPES
