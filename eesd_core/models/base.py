"""What the adapters for Hugging Face decoder-only models share, and the Llama family's adapter.

Models laid out as ``model.model.embed_tokens``, ``.layers``, ``.norm``, ``.rotary_emb`` and
``model.lm_head``; masks are built here per layer kind (full or sliding window). The model is never
changed: an adapter runs its own module tree around the model's parameters, in which each
``nn.Linear`` is a :class:`RoutedLinear` that multiplies as the current pass says (a context
variable, so threads and decoders sharing the model never see each other's passes).
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eesd_core.cache import KVCache
from eesd_core.models import AdapterOptions, from_plugins
from eesd_core.models.builtin import LLAMA_TYPES

Linear = Callable[..., torch.Tensor]  # (x, weight, bias) -> F.linear(x, weight, bias)
_PASS: ContextVar[Linear | None] = ContextVar("eesd_pass", default=None)


class RoutedLinear(nn.Module):
    """One of the model's ``nn.Linear`` (held, not registered), multiplied as the pass says."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        object.__setattr__(self, "linear", linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        route, linear = _PASS.get() or F.linear, self.__dict__["linear"]
        return route(x, linear.weight, linear.bias)


def shadow(module: nn.Module) -> nn.Module:
    """``module``'s tree, new objects down to each plain ``nn.Linear`` (a :class:`RoutedLinear`);
    parameters, buffers and other leaves are the model's own."""
    if type(module) is nn.Linear:
        return RoutedLinear(module)
    if not any(type(m) is nn.Linear for m in module.modules()):
        return module
    clone = copy.copy(module)
    clone._modules = {name: None if c is None else shadow(c) for name, c in module._modules.items()}
    return clone


def _skipping(index: torch.Tensor, product: Linear, x: torch.Tensor, weight: Any, bias: Any) -> torch.Tensor:
    """``product`` over the rows ``index`` of ``x`` alone; zeros for the others (padding)."""
    rows = x.reshape(-1, x.shape[-1]).index_select(0, index)
    out = product(rows, weight, bias)
    full = out.new_zeros(x.shape[:-1].numel(), out.shape[-1]).index_copy_(0, index, out)
    return full.view(*x.shape[:-1], out.shape[-1])


class DecoderAdapter:
    """Runs any slice of a decoder-only model's layers over hidden states with a shared cache."""

    model_types: tuple[str, ...] = ()

    def __init__(self, model: Any, options: AdapterOptions | None = None) -> None:
        self.model = model
        self.config = model.config
        self.options = options or AdapterOptions()
        self.model_type = str(self.config.model_type)
        self._backbone = model.model
        self._layers = [(shadow(layer), self._window_of(layer)) for layer in self._backbone.layers]
        self.num_layers = len(self._layers)
        self.vocab_size = int(model.lm_head.weight.shape[0])
        self.hidden_size = int(self.config.hidden_size)
        self._cache_keyword = _cache_keyword(self._backbone.layers[0])
        self._copies: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.products = from_plugins("eesd_linear_products", self, "products", "standard")
        self.passes = from_plugins("eesd_passes", self, "compile", "off")

    @classmethod
    def supports(cls, model: Any) -> bool:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return model_type in cls.model_types and hasattr(model, "lm_head") and hasattr(model, "model")

    def _window_of(self, layer: nn.Module) -> int | None:
        """A decoder layer's attention window (on the module, or in the config), ``None``: none."""
        return getattr(layer.self_attn, "sliding_window", getattr(self.config, "sliding_window", None))

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def skips_padding(self) -> bool:
        option = self.options.skip_padding
        return self.device.type == "cpu" if option == "auto" else bool(option)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.lm_head.weight

    def _route(self, rows: int, index: torch.Tensor | None = None) -> Linear | None:
        """How a pass over ``rows`` positions multiplies (``None``: F.linear); ``index``: the
        positions that count, when it skips its padding."""
        product = None if self.products is None or torch.is_grad_enabled() else self.products.product(rows)
        return product if index is None else functools.partial(_skipping, index, product or F.linear)

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache:
        layers = self.num_layers if num_layers is None else num_layers
        return KVCache(layers, capacity) if self.passes is None else self.passes.new_cache(layers, capacity)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._backbone.embed_tokens(tokens.view(1, -1) if tokens.dim() < 2 else tokens)

    def _position_ids(self, hidden: torch.Tensor, positions: int | torch.Tensor) -> torch.Tensor:
        if isinstance(positions, torch.Tensor):
            return positions.to(hidden.device)
        return torch.arange(positions, positions + hidden.shape[1], device=hidden.device).view(1, -1)

    def rotary(self, hidden: torch.Tensor, positions: int | torch.Tensor) -> Any:
        return self._backbone.rotary_emb(hidden, self._position_ids(hidden, positions))

    def run(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None = None,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Layers [start, end) (:class:`~eesd_core.protocols.ModelAdapter`); where the adapter
        :attr:`skips_padding`, a pass with empty slots multiplies only the positions that count."""
        if start >= end:
            return hidden
        index = None
        if valid is not None and self.skips_padding and not torch.is_grad_enabled():
            live = valid[:, valid.shape[1] - hidden.shape[1] :].reshape(-1)  # queries that count
            if 0 < int(live.sum()) < live.numel():
                index = live.nonzero().squeeze(1).to(hidden.device)
        return self._run(self._layers[start:end], hidden, cache, positions, valid, rotary, index)

    def _run(
        self, layers: Any, hidden: Any, cache: KVCache, positions: Any, valid: Any, rotary: Any, index: Any
    ) -> torch.Tensor:
        """One pass, routed (:meth:`_route`), through ``layers`` ((layer, window) pairs); a cache with a
        ``mask`` of its own masks it, one with ``replay`` may run it (a captured pass, say)."""
        replay = getattr(cache, "replay", None) if index is None else None  # a replay runs every row
        out = replay and replay(functools.partial(self._run, layers), hidden, positions, valid)
        if out is not None:
            return out
        rotary = self.rotary(hidden, positions) if rotary is None else rotary
        masks = functools.cache(functools.partial(getattr(cache, "mask", _mask), hidden, positions, valid))
        rows = hidden.shape[0] * hidden.shape[1] if index is None else len(index)
        token = _PASS.set(self._route(rows, index))
        try:
            for layer, window in layers:
                hidden = self.call_layer(layer, hidden, masks(window), rotary, cache)
            return hidden
        finally:
            _PASS.reset(token)

    def call_layer(
        self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None, rotary: Any, cache: KVCache
    ) -> torch.Tensor:
        kwargs = {"attention_mask": mask, "position_embeddings": rotary, self._cache_keyword: cache}
        out = layer(hidden, use_cache=True, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._backbone.norm(hidden)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Normed states ``[..., H]`` to logits ``[..., V]`` (through ``weight`` if given)."""
        head = self.model.lm_head
        if weight is None and type(head) is not nn.Linear:
            return head(hidden)
        weight, bias = (head.weight, head.bias) if weight is None else (weight, None)
        route = self._route(hidden.numel() // hidden.shape[-1])
        return (route or F.linear)(hidden, weight, bias)

    def copy_layer(self, index: int, slot: int) -> nn.Module:
        """A trainable copy of decoder layer ``index`` writing slot ``slot`` of its cache, of the
        layer's kind (window, rotary)."""
        layer = copy.deepcopy(self._backbone.layers[index])
        layer.self_attn.layer_idx = slot
        return layer.requires_grad_(True)

    def copy_norm(self) -> nn.Module:
        return copy.deepcopy(self._backbone.norm).requires_grad_(True)

    def run_copies(
        self,
        layers: Sequence[nn.Module],
        hidden: torch.Tensor,
        cache: KVCache,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None = None,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Layers made by :meth:`copy_layer`, in order, positioned and masked as :meth:`run`."""
        pairs = [(self._copy_shadow(layer), self._window_of(layer)) for layer in layers]
        return self._run(pairs, hidden, cache, positions, valid, rotary, None)

    def _copy_shadow(self, layer: nn.Module) -> nn.Module:
        if (found := self._copies.get(layer)) is None:
            with self._lock:
                found = self._copies.setdefault(layer, shadow(layer))
        return found


class LlamaFamilyAdapter(DecoderAdapter):
    """Llama, Mistral, Qwen2, Qwen3 (SmolLM2 is Llama) in transformers 5.x, whose layout
    :class:`DecoderAdapter` runs as it is."""

    model_types = LLAMA_TYPES


def _cache_keyword(layer: nn.Module) -> str:
    """``cache`` from transformers 5.23 on (which warns at ``past_key_values``), else the old name."""
    parameters = inspect.signature(type(layer).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _mask(
    hidden: torch.Tensor, positions: int | torch.Tensor, valid: torch.Tensor | None, window: int | None
) -> torch.Tensor | None:
    """The additive mask of a pass over ``hidden`` (:func:`padded_mask`); ``None`` where a lone query
    of a dense layout (``valid`` ``None``) sees every key."""
    m = hidden.shape[1]
    if valid is None:  # every key up to the last query counts
        total = int(positions) + m
        if m == 1 and (window is None or total <= window):
            return None
        valid = torch.ones(1, total, dtype=torch.bool, device=hidden.device)
    slots = torch.arange(valid.shape[1] - m, valid.shape[1], device=hidden.device)  # the last m
    return padded_mask(valid.to(hidden.device), slots, window, hidden.dtype)


def padded_mask(valid: torch.Tensor, slots: torch.Tensor, window: int | None, dtype: Any) -> torch.Tensor:
    """Additive mask ``[B, 1, m, total]`` of queries at slots ``slots`` ``[m]``: causal, valid keys
    only, windowed; a padding query sees itself, so that no row of the softmax is empty."""
    total, slots = valid.shape[1], slots.view(-1, 1)
    cols = torch.arange(total, device=valid.device).view(1, -1)
    allowed = (cols <= slots) & valid[:, None, :]  # [B, m, total]
    if window is not None:
        key_positions = valid.long().cumsum(1) - 1  # [B, total]
        query_positions = key_positions[:, slots[:, 0]]  # [B, m]
        allowed &= key_positions[:, None, :] > query_positions[:, :, None] - window
    allowed |= cols == slots
    return torch.zeros_like(allowed, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
