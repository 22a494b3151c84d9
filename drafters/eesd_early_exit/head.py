"""Exit heads: what turns the target's layer-N hidden state into a draft distribution q.

* :class:`UntrainedHead` (``head=None``): the target's own final norm and LM head on layer N.
* :class:`ExitHead`: trained exit decoder layer(s) with their own KV cache, then a norm and an LM
  head; the LM head is the target's (shared, frozen) unless the file restricts the draft to a
  vocabulary subset, in which case q is zero outside the subset and stays exactly the distribution
  drafts are sampled from.

The paper's head reads h_N alone. With ``top_input`` it reads a wider input: a linear map of
[h_N(t), top(t - 1)], where top(t - 1) is the target's last-layer state (after its final norm) at
the previous position. Verification computes those states anyway; for a position whose predecessor
is itself a draft, the head's own output there stands in for it.

Head files are safetensors whose metadata names the target they were distilled from; the metadata
is checked before any tensor is read (:mod:`eesd_early_exit.headfile`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eesd_core.cache import KVCache
from eesd_core.protocols import ModelAdapter


class UntrainedHead(nn.Module):
    """The target's final norm and LM head applied to layer N (LayerSkip-style, no training)."""

    num_layers = 0
    top_input = False

    def __init__(self, adapter: ModelAdapter, exit_layer: int) -> None:
        super().__init__()
        self.adapter = adapter
        self.exit_layer = exit_layer

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(0)

    def hidden(
        self,
        h: torch.Tensor,
        positions: int | torch.Tensor,
        cache: KVCache,
        rotary: Any,
        top: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[..., V]`` of states ``[..., H]``."""
        return self.adapter.logits(self.adapter.norm(h))


def mlp_width_of(layer: nn.Module) -> int:
    """The width of a decoder layer's gated MLP (its number of hidden units)."""
    return int(_gated_mlp(layer)[0].out_features)


def narrow_mlp(layer: nn.Module, width: int) -> None:
    """Keep ``width`` of the hidden units of ``layer``'s gated MLP (``down(act(gate(x)) * up(x))``).

    A narrower exit layer makes a smaller head file and a cheaper draft step. The units kept are
    those whose three weight vectors have the largest product of norms: the ones that can move the
    output most. Training then adapts the rest of the layer around the cut.
    """
    gate, up, down = _gated_mlp(layer)
    if not 1 <= width <= gate.out_features:
        raise ValueError(f"an MLP width must be in 1..{gate.out_features}, got {width}")
    if width == gate.out_features:
        return
    with torch.no_grad():
        score = (
            gate.weight.float().norm(dim=1) * up.weight.float().norm(dim=1) * down.weight.float().norm(dim=0)
        )
        keep = score.topk(width).indices.sort().values
        mlp = layer.mlp
        mlp.gate_proj = _rows(gate, keep)
        mlp.up_proj = _rows(up, keep)
        weight = down.weight
        narrow = nn.Linear(
            width, down.out_features, bias=down.bias is not None, device=weight.device, dtype=weight.dtype
        )
        narrow.weight.copy_(down.weight[:, keep])
        if down.bias is not None:
            narrow.bias.copy_(down.bias)
        mlp.down_proj = narrow.requires_grad_(down.weight.requires_grad)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = width


def _rows(linear: nn.Linear, keep: torch.Tensor) -> nn.Linear:
    out = nn.Linear(
        linear.in_features,
        len(keep),
        bias=linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )
    out.weight.copy_(linear.weight[keep])
    if linear.bias is not None:
        out.bias.copy_(linear.bias[keep])
    return out.requires_grad_(linear.weight.requires_grad)


def _gated_mlp(layer: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    mlp = getattr(layer, "mlp", None)
    parts = tuple(getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj"))
    if not all(type(p) is nn.Linear for p in parts):
        raise ValueError(
            f"{type(layer).__name__} has no gated MLP of plain linear layers (mlp.gate_proj, up_proj, "
            "down_proj), so its width cannot be changed"
        )
    return parts  # type: ignore[return-value]


class ExitHead(nn.Module):
    """Exit decoder layer(s) + norm + LM head over the target's layer-N hidden states."""

    def __init__(
        self,
        adapter: ModelAdapter,
        exit_layer: int,
        num_layers: int = 1,
        init_layer: int | None = None,
        vocab_ids: torch.Tensor | None = None,
        top_input: bool = False,
        mlp_width: int | None = None,
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.exit_layer = exit_layer
        self.num_layers = num_layers
        self.top_input = top_input
        source = adapter.num_layers - 1 if init_layer is None else init_layer
        self.layers = nn.ModuleList(adapter.copy_layer(source, i) for i in range(num_layers))
        if mlp_width:
            for layer in self.layers:
                narrow_mlp(layer, mlp_width)
        self.mlp_width = mlp_width_of(self.layers[0]) if num_layers else 0
        self.norm = adapter.copy_norm()
        self.fuse = None
        if top_input:
            # starts as the paper's head: h_N passes through, the top state is weighted zero
            size = adapter.hidden_size
            self.fuse = nn.Linear(2 * size, size, bias=False, device=adapter.device, dtype=adapter.dtype)
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, :size].copy_(torch.eye(size, device=adapter.device))
        if vocab_ids is not None:
            vocab_ids = vocab_ids.to(adapter.device)
        self.register_buffer("vocab_ids", vocab_ids, persistent=False)
        weight = adapter.lm_head_weight
        self.subset_head = None
        if vocab_ids is not None:
            self.subset_head = nn.Linear(
                weight.shape[1], len(vocab_ids), bias=False, device=weight.device, dtype=weight.dtype
            )
            self.subset_head.weight.data.copy_(weight.data[vocab_ids.to(weight.device)])

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """A cache of the exit layers: one that grows, or, where the adapter runs its passes on
        buffers allocated once (``compile``), one of those for a call of ``capacity`` slots."""
        if capacity is None or getattr(self.adapter, "passes", None) is None:
            return KVCache(self.num_layers)
        return self.adapter.new_cache(self.num_layers, capacity)

    def hidden(
        self,
        h: torch.Tensor,
        positions: int | torch.Tensor,
        cache: KVCache,
        rotary: Any,
        top: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the exit layers over ``h`` ``[B, m, H]`` at positions from ``positions``, or at
        per-row positions ``[B, m]`` over the cache slots ``valid`` ``[B, total]`` marks.

        ``top`` ``[B, m, H]``: for a top-input head, the normalised top state of each row's
        previous position (:meth:`top_state`); zeros before the first position.
        """
        if self.fuse is not None:
            if top is None:
                raise ValueError("a top-input exit head needs the top states of the previous positions")
            h = self.fuse(torch.cat([h, top.to(h.dtype)], dim=-1))
        return self.adapter.run_copies(self.layers, h, cache, positions, valid, rotary)

    def top_state(self, h: torch.Tensor) -> torch.Tensor:
        """What the head reads of a last-layer state, or of its own output standing in for one:
        the target's final norm of it."""
        return self.adapter.norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[..., V]`` of states ``[..., H]``; -inf outside the vocabulary subset, if any."""
        normed = self.norm(h)
        if self.subset_head is None:
            return self.adapter.logits(normed)
        small = self.adapter.logits(normed, self.subset_head.weight)  # [..., V_sub]
        full = small.new_full((*small.shape[:-1], self.adapter.vocab_size), float("-inf"))
        full[..., self.vocab_ids] = small
        return full

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors a head file stores. The shared LM head is not among them, nor the rows of it
        a vocabulary-subset head drafts with: they are frozen copies, rebuilt from ``vocab_ids``."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("adapter.", "subset_head."))}
