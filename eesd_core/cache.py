"""A key/value cache that rolls back by moving a length, never by copying.

Speculative decoding appends drafts to the cache and then drops the rejected ones every round.
:class:`KVCache` preallocates one buffer per layer and keeps one length per layer; ``update`` writes
in place and returns views, ``crop`` just moves lengths. It speaks the part of transformers' ``Cache``
interface that decoder layers use (``update(key, value, layer_idx)``), so the attention modules of an
HF model write into it directly. The layers of the target [0, L) and the drafter's own layers live in
separate instances; the early-exit drafter shares the target's instance for layers [0, N).
"""

from __future__ import annotations

import torch

_MIN_CAPACITY = 64


class KVCache:
    """Per-layer key/value buffers ``[batch, kv_heads, capacity, head_dim]`` with a length each."""

    is_compileable = False

    def __init__(self, num_layers: int, capacity: int = _MIN_CAPACITY) -> None:
        self.num_layers = num_layers
        self.capacity = max(capacity, 1)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``/``value`` (``[b, h, m, d]``) to a layer; return all its keys and values."""
        start = self.lengths[layer_idx]
        end = start + key.shape[-2]
        keys, values = self._room(layer_idx, key, value, end)
        keys[:, :, start:end] = key
        values[:, :, start:end] = value
        self.lengths[layer_idx] = end
        return keys[:, :, :end], values[:, :, :end]

    def _room(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, needed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or values is None or keys.shape[-2] < needed:
            old = keys.shape[-2] if keys is not None else 0
            size = max(needed, self.capacity, old + old // 2)
            keys = self._grow(keys, key, size)
            values = self._grow(values, value, size)
            self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def _grow(self, old: torch.Tensor | None, like: torch.Tensor, size: int) -> torch.Tensor:
        b, h, _, d = like.shape
        new = like.new_empty((b, h, size, d))
        if old is not None:
            new[:, :, : old.shape[-2]] = old
        return new

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def crop(self, length: int, start: int = 0, end: int | None = None) -> None:
        """Keep only the first ``length`` positions of layers [start, end)."""
        for layer in range(start, self.num_layers if end is None else end):
            self.lengths[layer] = min(self.lengths[layer], length)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (indices) of every layer: drop sequences that are done."""
        for layer in range(self.num_layers):
            keys, values = self.keys[layer], self.values[layer]
            if keys is not None and values is not None:
                self.keys[layer] = keys.index_select(0, rows.to(keys.device))
                self.values[layer] = values.index_select(0, rows.to(values.device))

    def relayout(self, rows: torch.Tensor, index: torch.Tensor) -> None:
        """Keep batch rows ``rows``, new slot j of row b holding old slot ``index[b, j]`` (any
        value where ``index`` is -1); every layer's length becomes ``index.shape[1]``."""
        for layer in range(self.num_layers):
            for buffers in (self.keys, self.values):
                old = buffers[layer]
                if old is None:
                    continue
                b, h, size, d = len(rows), old.shape[1], old.shape[2], old.shape[3]
                take = index.clamp_min(0).to(old.device)[:, None, :, None].expand(b, h, -1, d)
                new = old.new_empty((b, h, size, d))
                new[:, :, : index.shape[1]] = old.index_select(0, rows.to(old.device)).gather(2, take)
                buffers[layer] = new
            self.lengths[layer] = index.shape[1]

    def nbytes(self) -> int:
        """Bytes held by the buffers (what the cache costs in memory)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
