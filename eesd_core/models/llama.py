"""Adapter for the Llama family in transformers 5.x: Llama, Mistral, Qwen2, Qwen3 (SmolLM2 is Llama).

These models share one layout: ``model.model.embed_tokens``, ``.layers``, ``.norm``,
``.rotary_emb`` and ``model.lm_head``; each decoder layer takes ``(hidden, attention_mask,
position_ids, past_key_values, position_embeddings)`` and writes its keys and values through
``past_key_values.update(key, value, layer_idx)``. Masks are built here, per layer kind (full or
sliding window), as additive float masks that both the SDPA and the eager attention accept.
"""

from __future__ import annotations

from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.hookspecs import hookimpl

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class LlamaFamilyAdapter:
    """Runs any slice of a Llama-family model's layers over hidden states with a shared cache."""

    model_types = MODEL_TYPES

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.backbone = model.model
        self.layers = self.backbone.layers
        self.num_layers = len(self.layers)
        self.vocab_size = int(model.lm_head.weight.shape[0])
        self.hidden_size = int(self.config.hidden_size)
        self.windows = [self._window(i) for i in range(self.num_layers)]

    @classmethod
    def supports(cls, model: Any) -> bool:
        config = getattr(model, "config", None)
        return getattr(config, "model_type", None) in MODEL_TYPES and hasattr(model, "lm_head")

    def _window(self, layer: int) -> int | None:
        window = getattr(self.config, "sliding_window", None)
        layer_types = getattr(self.config, "layer_types", None)
        if layer_types is not None and layer_types[layer] != "sliding_attention":
            return None
        if self.config.model_type in ("qwen2", "qwen3") and layer_types is None:
            return window if getattr(self.config, "use_sliding_window", False) else None
        return window

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache:
        return KVCache(self.num_layers if num_layers is None else num_layers, capacity)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``[m]`` to input hidden states ``[1, m, H]``."""
        return self.backbone.embed_tokens(tokens.view(1, -1))

    def rotary(self, hidden: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary (cos, sin) for positions [position, position + m) of ``hidden`` ``[1, m, H]``."""
        ids = torch.arange(position, position + hidden.shape[1], device=hidden.device).view(1, -1)
        return self.backbone.rotary_emb(hidden, ids)

    def mask(
        self, queries: int, position: int, window: int | None, like: torch.Tensor
    ) -> torch.Tensor | None:
        """Additive mask ``[1, 1, m, position + m]``: causal, and windowed for sliding layers."""
        total = position + queries
        if queries == 1 and (window is None or total <= window):
            return None
        rows = torch.arange(position, total, device=like.device).view(-1, 1)
        cols = torch.arange(total, device=like.device).view(1, -1)
        allowed = cols <= rows
        if window is not None:
            allowed &= cols > rows - window
        mask = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device)
        return mask.masked_fill_(~allowed, torch.finfo(like.dtype).min).view(1, 1, queries, total)

    def run_layers(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        position: int,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Layers [start, end) over ``hidden`` ``[1, m, H]`` at positions from ``position``."""
        if start >= end:
            return hidden
        rotary = self.rotary(hidden, position) if rotary is None else rotary
        masks: dict[int | None, torch.Tensor | None] = {}
        for index in range(start, end):
            window = self.windows[index]
            if window not in masks:
                masks[window] = self.mask(hidden.shape[1], position, window, hidden)
            hidden = self.call_layer(self.layers[index], hidden, masks[window], rotary, cache)
        return hidden

    def call_layer(
        self,
        layer: torch.nn.Module,
        hidden: torch.Tensor,
        mask: torch.Tensor | None,
        rotary: Any,
        cache: KVCache,
    ) -> torch.Tensor:
        """One decoder layer; ``layer.self_attn.layer_idx`` says where in ``cache`` it writes."""
        out = layer(
            hidden,
            attention_mask=mask,
            position_embeddings=rotary,
            past_key_values=cache,
            use_cache=True,
        )
        return out[0] if isinstance(out, tuple) else out

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.backbone.norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed hidden ``[1, m, H]`` to logits ``[m, V]``."""
        return self.model.lm_head(hidden)[0]


@hookimpl
def eesd_register_model_adapters(register: Any) -> None:
    register.add("llama_family", LlamaFamilyAdapter)
