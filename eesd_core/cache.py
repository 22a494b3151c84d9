"""A key/value cache that rolls back by moving a length, never by copying (:class:`KVCache`: the
part of transformers' ``Cache`` that decoder layers use), and which slot holds what (:class:`BatchLayout`)."""

from __future__ import annotations

import torch

from eesd_core.devices import HOST

_MIN_CAPACITY = 64


class BatchLayout:
    """Slot bookkeeping of a batch cache: ``valid`` ``[B, capacity]`` marks the slots holding a key
    of each row, ``positions`` ``[B, capacity]`` its position; ``slots`` are in use between rounds.
    A *dense* layout (every row's keys are its positions 0 .. in slot order: one row always) keeps
    no tensors until a row leaves a slot empty, and its passes need no masks (:meth:`window`)."""

    def __init__(self, rows: int, capacity: int, device: torch.device) -> None:
        self.rows, self.capacity, self.device = rows, capacity, device
        self.valid: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.slots = 0
        self.filled = 0  # slots written so far, this round's included

    @property
    def dense(self) -> bool:
        return self.valid is None

    def spread(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tensors (of a dense layout: slot s holds position s of every row, if written)."""
        if self.valid is None or self.positions is None:
            slots = torch.arange(self.capacity, device=self.device)
            self.valid = (slots < self.filled).expand(self.rows, -1).clone()
            self.positions = slots.expand(self.rows, -1).clone()
        return self.valid, self.positions

    def window(self, first: int, end: int) -> tuple[int | torch.Tensor, torch.Tensor | None]:
        """(positions, valid) of a pass over slots [first, end), as ``ModelAdapter.run`` takes them."""
        if self.valid is None or self.positions is None:
            return first, None
        return self.positions[:, first:end], self.valid[:, :end]

    def mark(self, slot: int, feeding: list[bool], positions: list[int]) -> None:
        """Slot ``slot`` holds position ``positions[b]`` of every row b that ``feeding`` marks."""
        if self.valid is None and all(feeding) and all(p == slot for p in positions):
            self.filled = slot + 1
            return
        valid, where = self.spread()
        valid[:, slot] = torch.tensor(feeding, device=HOST).to(self.device, non_blocking=True)  # no wait
        where[:, slot] = torch.tensor(positions, device=HOST).to(self.device, non_blocking=True)

    def keep(self, start: int, upto: list[int]) -> None:
        """Row b keeps slots [start, start + upto[b]] of a round (-1: none); the batch moves past
        the longest."""
        end = start + max([1, *(n + 1 for n in upto)])
        if self.valid is None and len(set(upto)) > 1:  # rows kept different counts: gaps
            self.spread()
        if self.valid is not None:
            limit = torch.tensor(upto, device=HOST).to(self.device, non_blocking=True)[:, None]
            self.valid[:, start:] &= torch.arange(self.capacity - start, device=self.device)[None] <= limit
        self.slots = self.filled = end

    def aligned(self, rows: torch.Tensor) -> torch.Tensor:
        """Old slot of each new slot when rows ``rows`` are kept with their keys right-aligned
        (gaps squeezed out); ``[B', S']``, -1 where the new slot is padding."""
        valid = self.spread()[0][rows, : self.slots]
        counts = valid.sum(1)
        width = int(counts.max()) if counts.numel() else 0
        order = torch.where(valid, torch.arange(self.slots, device=valid.device), -1)
        return order.sort(dim=1).values[:, self.slots - width :] if width else order[:, :0]

    def relayout(self, rows: torch.Tensor, index: torch.Tensor) -> None:
        """Keep ``rows``, with new slot j of row b holding old slot ``index[b, j]`` (-1: padding)."""
        valid, positions = self.spread()
        take = index.clamp_min(0)
        self.valid = torch.zeros(len(rows), self.capacity, dtype=torch.bool, device=self.device)
        self.positions = torch.zeros_like(self.valid, dtype=torch.long)
        self.valid[:, : index.shape[1]] = valid[rows].gather(1, take) & (index >= 0)
        self.positions[:, : index.shape[1]] = positions[rows].gather(1, take)
        self.rows, self.slots, self.filled = len(rows), index.shape[1], index.shape[1]


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
        self.keys[layer_idx] = keys = self._room(self.keys[layer_idx], key, end)
        self.values[layer_idx] = values = self._room(self.values[layer_idx], value, end)
        keys[:, :, start:end] = key
        values[:, :, start:end] = value
        self.lengths[layer_idx] = end
        return keys[:, :, :end], values[:, :, :end]

    def _room(self, old: torch.Tensor | None, like: torch.Tensor, needed: int) -> torch.Tensor:
        """``old`` if it holds ``needed`` slots, else a copy with room (half as much again at least)."""
        if old is not None and old.shape[-2] >= needed:
            return old
        held = 0 if old is None else old.shape[-2]
        new = like.new_empty((*like.shape[:2], max(needed, self.capacity, held + held // 2), like.shape[3]))
        if old is not None:
            new[:, :, :held] = old
        return new

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def crop(self, length: int, start: int = 0, end: int | None = None) -> None:
        """Keep only the first ``length`` positions of layers [start, end)."""
        for layer in range(start, self.num_layers if end is None else end):
            self.lengths[layer] = min(self.lengths[layer], length)

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


class RowWriter:
    """A prefill pass over batch rows ``rows`` alone, writing their keys at slots ``first ..`` of a
    batch cache (:meth:`KVCache.writers`); it sees its own keys only, all a prefill reads."""

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
    return [(torch.tensor(rows, dtype=torch.long, device=valid.device), first) for rows, first in groups]
