"""What the adapters for Hugging Face decoder-only models share.

The models served here are laid out as ``model.model.embed_tokens``, ``.layers``, ``.norm``,
``.rotary_emb`` and ``model.lm_head``; each decoder layer takes ``(hidden, attention_mask,
position_embeddings, cache)`` (``past_key_values`` before transformers 5.23 renamed it) and writes
its keys and values through ``cache.update(key, value, layer_idx)``. Masks are built here, per
layer kind (full or sliding window), as additive float masks that both the SDPA and the eager
attention accept.

:class:`DecoderAdapter` does the work; a family's subclass says which ``model_type`` values it
serves and overrides what differs (Gemma 3: one rotary embedding per layer kind, soft-capped logits).
Nothing outside :mod:`eesd_core.models` reads these modules: the exit head, distillation and the
engine go through the adapter's methods.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eesd_core.cache import KVCache
from eesd_core.models import AdapterOptions
from eesd_core.models.products import LinearRouter, MatmulPlan, plan_for, product_linear


class DecoderAdapter:
    """Runs any slice of a decoder-only model's layers over hidden states with a shared cache."""

    model_types: tuple[str, ...] = ()

    def __init__(self, model: Any, options: AdapterOptions | None = None) -> None:
        self.model = model
        self.config = model.config
        self.options = options or AdapterOptions()
        self.model_type = str(self.config.model_type)
        self._backbone = model.model
        self._layers = self._backbone.layers
        self.num_layers = len(self._layers)
        self.vocab_size = int(model.lm_head.weight.shape[0])
        self.hidden_size = int(self.config.hidden_size)
        self._windows = [self._window_of(layer) for layer in self._layers]
        self._cache_keyword = _cache_keyword(self._layers[0])
        self.products = MatmulPlan()
        self._routers: dict[Any, LinearRouter] = {}

    @classmethod
    def supports(cls, model: Any) -> bool:
        config = getattr(model, "config", None)
        return (
            getattr(config, "model_type", None) in cls.model_types
            and hasattr(model, "lm_head")
            and hasattr(model, "model")
        )

    def _window_of(self, layer: nn.Module) -> int | None:
        """The attention window of a decoder layer (or of a copy of one), ``None`` if it sees all.

        Families with per-layer kinds (Qwen2, Qwen3, Gemma 3) keep the window on the attention
        module, ``None`` on full layers; others (Mistral) have one window for every layer.
        """
        attention: Any = layer.self_attn
        if hasattr(attention, "sliding_window"):
            return attention.sliding_window
        return getattr(self.config, "sliding_window", None)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def skips_padding(self) -> bool:
        """Whether batched passes multiply only the positions that count (``skip_padding``)."""
        option = self.options.skip_padding
        return self.device.type == "cpu" if option == "auto" else bool(option)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight ``[V, H]`` (tied to the embeddings in some models)."""
        return self.model.lm_head.weight

    # -- the product of short passes -------------------------------------------------------------

    def prepare(self, max_rows: int) -> None:
        """Choose the product for passes over 1 .. ``max_rows`` positions (``options.matmul``).

        ``"auto"`` times a few passes the first time a model is prepared in a process (per thread
        count); later adapters of the same model reuse the measurement.
        """
        self.products = plan_for(self, self.options.matmul, max_rows)

    def _planned(self, m: int) -> bool:
        """Whether a pass over m positions takes the planned product: never under autograd
        (oneDNN's linear has no backward)."""
        return m in self.products and not torch.is_grad_enabled()

    def _router(self, key: Any, modules: Sequence[nn.Module], m: int) -> LinearRouter:
        """The router of ``modules`` to the planned product of passes over m positions."""
        product = self.products.product(m)
        router = self._routers.get((key, product))
        if router is None:
            router = self._routers[(key, product)] = LinearRouter(modules, product)
        return router

    # -- one sequence ----------------------------------------------------------------------------

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache:
        return KVCache(self.num_layers if num_layers is None else num_layers, capacity)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``[m]`` to input hidden states ``[1, m, H]``; ids ``[B, m]`` to ``[B, m, H]``."""
        return self._backbone.embed_tokens(tokens.view(1, -1) if tokens.dim() < 2 else tokens)

    def _position_ids(self, hidden: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        if isinstance(position, torch.Tensor):
            return position.to(hidden.device)
        return torch.arange(position, position + hidden.shape[1], device=hidden.device).view(1, -1)

    def rotary(self, hidden: torch.Tensor, position: int | torch.Tensor) -> Any:
        """Rotary (cos, sin) for ``hidden`` ``[B, m, H]``: at positions [position, position + m)
        for an int, or at per-row positions ``[B, m]``."""
        return self._backbone.rotary_emb(hidden, self._position_ids(hidden, position))

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
        return _additive(allowed, like.dtype).view(1, 1, queries, total)

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

        def masks(window: int | None) -> torch.Tensor | None:
            return self.mask(hidden.shape[1], position, window, hidden)

        rotary = self.rotary(hidden, position) if rotary is None else rotary
        m = hidden.shape[0] * hidden.shape[1]
        if not self._planned(m):
            return self._run(hidden, start, end, cache, rotary, masks)
        with self._router((start, end), self._layers[start:end], m):
            return self._run(hidden, start, end, cache, rotary, masks)

    def _run(
        self, hidden: torch.Tensor, start: int, end: int, cache: KVCache, rotary: Any, masks: Any
    ) -> torch.Tensor:
        made: dict[int | None, torch.Tensor | None] = {}
        for index in range(start, end):
            window = self._windows[index]
            if window not in made:
                made[window] = masks(window)
            hidden = self.call_layer(self._layers[index], hidden, made[window], rotary, cache)
        return hidden

    def call_layer(
        self,
        layer: nn.Module,
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
            use_cache=True,
            **{self._cache_keyword: cache},
        )
        return out[0] if isinstance(out, tuple) else out

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._backbone.norm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed hidden ``[1, m, H]`` to logits ``[m, V]``."""
        m = hidden.shape[0] * hidden.shape[1]
        if not self._planned(m):
            return self.lm_logits(hidden)[0]
        with self._router("lm_head", [self.model.lm_head], m):
            return self.lm_logits(hidden)[0]

    def lm_logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Normed states ``[..., H]`` to logits ``[..., V]`` through the LM head, or through
        ``weight`` ``[V', H]`` (rows of it, say), with whatever the model applies after the head."""
        if weight is None:
            return self.model.lm_head(hidden)
        m = hidden.numel() // hidden.shape[-1]
        if self._planned(m):  # a draft step, not training
            return product_linear(self.products.product(m), hidden, weight)
        return F.linear(hidden, weight)

    # -- batches of sequences --------------------------------------------------------------------

    def run_batch(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        positions: torch.Tensor,
        valid: torch.Tensor,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Layers [start, end) over rows of different sequences ``[B, m, H]`` sharing ``cache``.

        ``positions`` ``[B, m]`` are each row's own positions (rotary); ``valid`` ``[B, total]``
        says which cache slots hold a key of that row, ``total`` counting this pass's m (the
        last m slots). A row's valid keys must be its positions 0, 1, 2, ... in slot order: left
        padding, and gaps of dropped keys, are fine. Each query sees the valid keys of its row up
        to its own slot, within the window of sliding layers, as that row would alone.

        A query whose own slot is not valid is padding (a row that drafted fewer tokens, or is
        done): its output is unspecified (finite). Where the adapter :attr:`skips_padding`, the
        linear layers skip it, so a pass costs the positions that count.
        """
        if start >= end:
            return hidden

        def masks(window: int | None) -> torch.Tensor:
            return _padded_mask(valid.to(hidden.device), hidden.shape[1], window, hidden.dtype)

        rotary = self.rotary(hidden, positions) if rotary is None else rotary
        m = hidden.shape[0] * hidden.shape[1]
        n = m  # every position: training, or an adapter that does not skip
        if self.skips_padding and not torch.is_grad_enabled():
            live = valid[:, valid.shape[1] - hidden.shape[1] :].reshape(-1)  # queries that count
            n = int(live.sum())
        if 0 < n < m:  # the linear layers skip the padding
            index = live.nonzero().squeeze(1).to(hidden.device)
            product = self.products.product(n) if self._planned(n) else None
            with LinearRouter(self._layers[start:end], product, index):
                return self._run(hidden, start, end, cache, rotary, masks)
        if not self._planned(m):
            return self._run(hidden, start, end, cache, rotary, masks)
        with self._router((start, end), self._layers[start:end], m):
            return self._run(hidden, start, end, cache, rotary, masks)

    # -- what an exit head is made of ------------------------------------------------------------

    def copy_layer(self, index: int, slot: int) -> nn.Module:
        """A trainable copy of decoder layer ``index`` that writes slot ``slot`` of its cache; it
        keeps the layer's kind (window, rotary), also when its weights are loaded from a file."""
        layer = copy.deepcopy(self._layers[index])
        layer.self_attn.layer_idx = slot
        return layer.requires_grad_(True)

    def copy_norm(self) -> nn.Module:
        """A trainable copy of the final norm."""
        return copy.deepcopy(self._backbone.norm).requires_grad_(True)

    def run_copies(
        self,
        layers: Sequence[nn.Module],
        hidden: torch.Tensor,
        cache: KVCache,
        position: int | torch.Tensor,
        rotary: Any = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layers made by :meth:`copy_layer`, in order, over ``hidden`` ``[B, m, H]`` at positions
        from ``position`` (the same for every row), each writing its slot of ``cache``; or, with
        ``valid`` ``[B, total]``, at per-row ``position`` ``[B, m]`` as :meth:`run_batch` runs."""
        rotary = self.rotary(hidden, position) if rotary is None else rotary
        made: dict[int | None, torch.Tensor | None] = {}
        m = hidden.shape[0] * hidden.shape[1]
        routed = self._planned(m)  # a draft step, not training
        with self._router(("copies", *layers), layers, m) if routed else nullcontext():
            for layer in layers:
                window = self._window_of(layer)
                if window not in made:
                    if valid is None:
                        made[window] = self.mask(hidden.shape[1], int(position), window, hidden)
                    else:
                        made[window] = _padded_mask(
                            valid.to(hidden.device), hidden.shape[1], window, hidden.dtype
                        )
                hidden = self.call_layer(layer, hidden, made[window], rotary, cache)
        return hidden


def _cache_keyword(layer: nn.Module) -> str:
    """The keyword a decoder layer takes its cache by: ``cache`` from transformers 5.23 on (which
    warns at ``past_key_values``, to be removed in 5.40), ``past_key_values`` before."""
    parameters = inspect.signature(type(layer).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _padded_mask(valid: torch.Tensor, m: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[B, 1, m, total]``: causal, valid keys only, windowed for sliding layers.

    A query in a padding slot sees itself, so that no row of the softmax is empty.
    """
    total = valid.shape[1]
    slots = torch.arange(total - m, total, device=valid.device).view(-1, 1)
    cols = torch.arange(total, device=valid.device).view(1, -1)
    allowed = (cols <= slots) & valid[:, None, :]  # [B, m, total]
    if window is not None:
        key_positions = valid.long().cumsum(1) - 1  # [B, total]
        query_positions = key_positions[:, total - m :]  # [B, m]
        allowed &= key_positions[:, None, :] > query_positions[:, :, None] - window
    allowed |= cols == slots
    return _additive(allowed, dtype)[:, None]
