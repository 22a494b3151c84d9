"""Adapter for Gemma 3 text models (``Gemma3ForCausalLM``, model type ``gemma3_text``).

What differs from the Llama family, as transformers' own forward does it: layers are of two kinds
(``config.layer_types``), sliding-window and global, each with its own rotary embedding, so
:meth:`rotary` returns both by kind and :meth:`call_layer` hands each layer its own; logits are
soft-capped (``final_logit_softcapping``). Bidirectional models are not causal LMs and are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eesd_core.cache import KVCache
from eesd_core.errors import UnsupportedModelError
from eesd_core.models import AdapterOptions
from eesd_core.models.base import DecoderAdapter
from eesd_gemma3 import GEMMA3_TYPES


class Gemma3Adapter(DecoderAdapter):
    """Runs any slice of a Gemma 3 text model's layers over hidden states with a shared cache."""

    model_types = GEMMA3_TYPES

    def __init__(self, model: Any, options: AdapterOptions | None = None) -> None:
        if getattr(model.config, "use_bidirectional_attention", False):
            raise UnsupportedModelError(
                "This Gemma 3 model attends bidirectionally (use_bidirectional_attention=True): it is "
                "not a causal LM, and speculative decoding needs one. Use a causal Gemma 3 checkpoint."
            )
        super().__init__(model, options)
        self._kinds = sorted(set(self.config.layer_types))
        self._softcap = getattr(self.config, "final_logit_softcapping", None)

    def rotary(self, hidden: torch.Tensor, position: int | torch.Tensor) -> dict[str, Any]:
        """Rotary (cos, sin) of each layer kind, by kind (``"sliding_attention"``, ...)."""
        ids = self._position_ids(hidden, position)
        return {kind: self._backbone.rotary_emb(hidden, ids, kind) for kind in self._kinds}

    def call_layer(
        self,
        layer: nn.Module,
        hidden: torch.Tensor,
        mask: torch.Tensor | None,
        rotary: Any,
        cache: KVCache,
    ) -> torch.Tensor:
        """One decoder layer, with the rotary embedding of its kind."""
        attention: Any = layer.self_attn
        return super().call_layer(layer, hidden, mask, rotary[attention.layer_type], cache)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        logits = super().logits(hidden, weight)
        if self._softcap is None:
            return logits
        return torch.tanh(logits / self._softcap) * self._softcap
