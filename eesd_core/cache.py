"""A key/value cache that rolls back by moving a length, never by copying.

Speculative decoding appends drafts to the cache and then drops the rejected ones every round.
:class:`KVCache` preallocates one buffer per layer and keeps one length per layer; ``update`` writes
in place and returns views, ``crop`` just moves lengths. It speaks the part of transformers' ``Cache``
interface that decoder layers use (``update(key, value, layer_idx)``), so the attention modules of an
HF model write into it directly. The layers of the target [0, L) and the drafter's own layers live in
separate instances; the early-exit drafter shares the target's instance for layers [0, N).

A batch of ragged prompts is left-padded into one cache, but its prefill need not run the padding:
:func:`packed_groups` splits the rows into groups that each start at their longest prompt, and a
:class:`RowWriter` per group lets a pass over those rows alone write their slots.
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

    def writers(self, batch: int, groups: list[tuple[torch.Tensor, int]]) -> list[RowWriter]:
        """One :class:`RowWriter` per group ``(rows, first)`` of a ``batch``-row cache that nothing
        has written yet; the slots no group writes read zeros."""
        if any(self.lengths):
            raise ValueError("packed writes need a cache that nothing has written yet")
        self.keys, self.values = [None] * self.num_layers, [None] * self.num_layers
        return [RowWriter(self, batch, rows, first) for rows, first in groups]

    def nbytes(self) -> int:
        """Bytes held by the buffers (what the cache costs in memory)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


class RowWriter:
    """A pass over batch rows ``rows`` alone, writing their keys at slots ``first ..`` of a batch
    cache (:meth:`KVCache.writers`), so that a prefill of ragged prompts runs each group of rows
    over its own slots only and skips the others' left padding. The pass sees only its own keys,
    which is all a prefill's queries read; ``lengths`` are its own (slots written from ``first``)."""

    is_compileable = False

    def __init__(self, cache: KVCache, batch: int, rows: torch.Tensor, first: int) -> None:
        self.cache, self.batch, self.rows, self.first = cache, batch, rows, first
        self.num_layers = cache.num_layers
        self.lengths = [0] * cache.num_layers

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.first + key.shape[-2]
        for buffers, new in ((self.cache.keys, key), (self.cache.values, value)):
            if buffers[layer_idx] is None:
                size = (self.batch, new.shape[1], max(self.cache.capacity, end), new.shape[3])
                buffers[layer_idx] = new.new_zeros(size)
            buffers[layer_idx][self.rows.to(new.device), :, self.first : end] = new  # type: ignore[index]
        self.cache.lengths[layer_idx] = max(self.cache.lengths[layer_idx], end)
        self.lengths[layer_idx] = end - self.first
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]


def packed_groups(
    valid: torch.Tensor, slack: float = 1.25, max_tokens: int | None = None
) -> list[tuple[torch.Tensor, int]] | None:
    """Rows of ``valid`` ``[B, S]`` in groups that each run slots ``first ..`` only, so that a pass
    skips most of the left padding of ragged prompts: rows sorted by their first valid slot join a
    group while its area stays within ``slack`` times the slots its rows hold from their first
    valid one, and within ``max_tokens`` (a row alone may exceed it). None when one group would
    cover every slot of every row (nothing to skip, nothing to split)."""
    rows, width = valid.shape
    slots = torch.arange(width, device=valid.device)
    first = torch.where(valid, slots, width).min(dim=1).values.clamp_max(width - 1).tolist()
    order = sorted(range(rows), key=lambda r: first[r])
    groups: list[tuple[list[int], int]] = []
    held = 0
    for row in order:
        if groups:
            members, start = groups[-1]
            area = (len(members) + 1) * (width - start)
            fits = max_tokens is None or area <= max_tokens
            if fits and area <= slack * (held + width - first[row]):
                members.append(row)
                held += width - first[row]
                continue
        groups.append(([row], first[row]))
        held = width - first[row]
    if len(groups) == 1 and groups[0][1] == 0:
        return None
    device = valid.device
    return [(torch.tensor(rows, dtype=torch.long, device=device), first) for rows, first in groups]
