"""Key/value buffers allocated once, the masks that make attending over all of them exact, and
passes captured on them.

A :class:`StaticCache` writes a pass's keys at its slots (a tensor, :meth:`StaticCache.prepare`) and
hands every layer the whole buffer; the mask (the core's :func:`~eesd_core.models.base.padded_mask`)
hides each query's future slots, the slots of other rows' padding and, since rolling back only
moves a length, whatever a rejected draft left behind until it is overwritten. Everything a pass
reads then lives at fixed addresses with fixed sizes, which is what a CUDA graph needs: with
``graphs``, the second pass of a shape over the same layers is captured and every later one
replays it (:meth:`StaticCache.replay`).
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from eesd_core.cache import KVCache, RowWriter
from eesd_core.models.base import padded_mask

#: Slabs kept for the calls to come once theirs ended (each holds a call's keys and values).
KEPT_SLABS = 2
#: Passes over more positions than this (prefills, backlogs) always run eagerly: each shape would
#: keep a graph, and its memory, for a pass that a call makes once.
MOST_CAPTURED_POSITIONS = 16
#: Captured passes a slab keeps at most; further shapes run eagerly.
MOST_CAPTURED = 64
#: One capture at a time in the process: a capture synchronises the device and shares torch's
#: capture stream.
_CAPTURING = threading.Lock()


class StaticPasses:
    """The passes of one adapter on :class:`StaticCache` buffers: ``compile="static"`` runs them
    eagerly, ``compile="graphs"`` captures them (CUDA). A call's buffers and captured passes (its
    :class:`Slab`) go to a later call that fits them once the first call's cache is gone, so that a
    decoder captures each shape of pass once, not once per call."""

    def __init__(self, adapter: Any, graphs: bool = False) -> None:
        self.device, self.graphs = adapter.device, graphs  # not the adapter: it holds this
        self.captures, self.capture_seconds, self.failed = 0, 0.0, 0  # over every call so far
        self._free: list[Slab] = []
        self._lock = threading.RLock()  # _keep may run from a collection inside new_cache

    def describe(self) -> str:
        if not self.graphs:
            return "static buffers, eager passes"
        return (
            f"static buffers, CUDA graphs ({self.captures} passes captured in {self.capture_seconds:.2f} s)"
        )

    def new_cache(self, num_layers: int, capacity: int) -> StaticCache:
        """A cache on the smallest kept slab of ``num_layers`` layers that holds ``capacity`` slots
        (and at most twice that), else on a new one (rounded up to 64 slots, so that it fits more)."""
        with self._lock:
            fits = [
                s for s in self._free if s.num_layers == num_layers and capacity <= s.capacity <= 2 * capacity
            ]
            slab = min(fits, key=lambda s: s.capacity) if fits else Slab(num_layers, -(-capacity // 64) * 64)
            if fits:
                self._free.remove(slab)
        with torch.inference_mode():  # what a failed call left (NaN, say) would meet a zero weight
            for buffer in (*slab.keys, *slab.values):
                if buffer is not None:
                    buffer.zero_()
        cache = StaticCache(self, slab)
        weakref.finalize(cache, self._keep, slab)
        return cache

    def _keep(self, slab: Slab) -> None:
        with self._lock:
            self._free = [slab, *self._free][:KEPT_SLABS]

    def capture(self, run: Callable[[], torch.Tensor]) -> Any:
        """A graph of ``run``: ``replay()`` runs it again, ``out`` is where it leaves its output."""
        start = time.perf_counter()
        with _CAPTURING:
            graph = CudaGraph(run, self.device)
        with self._lock:
            self.captures, self.capture_seconds = (
                self.captures + 1,
                self.capture_seconds + time.perf_counter() - start,
            )
        return graph


class CudaGraph:
    """``run`` captured into a ``torch.cuda.CUDAGraph`` (warmed up on a side stream first, as
    capture requires); ``replay()`` runs it again on whatever its buffers hold then."""

    def __init__(self, run: Callable[[], torch.Tensor], device: torch.device) -> None:
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = run()

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class Slab:
    """What a :class:`StaticCache` allocates and captures, kept apart so that it outlives the call."""

    num_layers: int
    capacity: int
    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    captured: dict[tuple[Any, ...], Captured | bool | None] = field(default_factory=dict)  # None: met once

    def __post_init__(self) -> None:
        self.keys, self.values = [None] * self.num_layers, [None] * self.num_layers


@dataclass
class Captured:
    """One captured pass: the buffers it reads, and its graph."""

    hidden: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seen: torch.Tensor
    graph: Any = None


class StaticCache(KVCache):
    """Per-layer buffers ``[batch, kv_heads, capacity, head_dim]``, all as wide as ``capacity``; a
    pass past it widens every buffer by half (a copy, and captured passes dropped: rare, since a
    call asks for what it needs)."""

    def __init__(self, passes: StaticPasses | None, slab: Slab) -> None:
        self.passes, self.slab, self.num_layers = passes, slab, slab.num_layers
        self.keys, self.values, self.captured = slab.keys, slab.values, slab.captured  # the slab's own
        self.lengths = [0] * slab.num_layers
        self.slots: torch.Tensor | None = None  # [m]: the slots the current pass writes
        self.seen: torch.Tensor | None = None  # [B or 1, capacity]: the slots that hold keys
        self._capturing = False

    @property
    def capacity(self) -> int:  # type: ignore[override]
        return self.slab.capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.slab.capacity = value

    def _room(self, old: torch.Tensor | None, like: torch.Tensor, needed: int) -> torch.Tensor:
        self.capacity = max(self.capacity, needed)
        if old is not None and old.shape[-2] == self.capacity and old.shape[0] == like.shape[0]:
            return old
        self.captured.clear()  # new buffers: what was captured reads the old ones
        new = like.new_zeros((*like.shape[:2], self.capacity, like.shape[3]))
        if old is not None and old.shape[0] == like.shape[0]:  # widened; other rows: a new call's
            new[:, :, : old.shape[-2]] = old[:, :, : self.capacity]
        return new

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` ``[b, h, m, d]`` at the pass's slots; return every slot."""
        end = self.lengths[layer_idx] + key.shape[-2]
        keys = self.keys[layer_idx] = self._room(self.keys[layer_idx], key, end)
        values = self.values[layer_idx] = self._room(self.values[layer_idx], value, end)
        keys.index_copy_(2, self.slots, key)  # type: ignore[arg-type]
        values.index_copy_(2, self.slots, value)  # type: ignore[arg-type]
        self.lengths[layer_idx] = end
        return keys, values

    def relayout(self, rows: torch.Tensor, index: torch.Tensor) -> None:
        """As a growing cache's, with the slots past the new length zeroed: a masked slot still
        meets a zero weight in attention, and garbage there could be NaN."""
        super().relayout(rows, index)
        self.captured.clear()
        for buffer in (*self.keys, *self.values):
            if buffer is not None:
                buffer[:, :, index.shape[1] :] = 0

    def writers(self, batch: int, groups: list[tuple[torch.Tensor, int]]) -> list[Any]:
        """As a growing cache's, on the slab's buffers (the writers allocate them anew)."""
        if any(self.lengths):
            raise ValueError("packed writes need a cache that nothing has written yet")
        self.captured.clear()
        self.keys[:], self.values[:] = [None] * self.num_layers, [None] * self.num_layers
        return [RowWriter(self, batch, rows, first) for rows, first in groups]

    def prepare(
        self, hidden: torch.Tensor, positions: int | torch.Tensor, valid: torch.Tensor | None
    ) -> None:
        """:attr:`slots` and :attr:`seen` of a pass over ``hidden`` ``[B, m, H]``: its queries sit at
        the slots after those the cache holds (``positions`` in a dense layout, the last m of
        ``valid`` ``[B, S]`` otherwise) and see the valid slots up to their own."""
        rows, m, device = hidden.shape[0], hidden.shape[1], hidden.device
        start = int(positions) if valid is None else valid.shape[1] - m
        if start + m > self.capacity:
            self.capacity = max(start + m, self.capacity + self.capacity // 2)
        seen = torch.zeros(rows if valid is not None else 1, self.capacity, dtype=torch.bool, device=device)
        if valid is None:
            seen[:] = True  # dense: slot s holds position s; causality hides what lies past a query
        else:
            seen[:, : valid.shape[1]] = valid.to(device)
        self.slots, self.seen = torch.arange(start, start + m, device=device), seen

    def mask(
        self,
        hidden: torch.Tensor,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None,
        window: int | None,
    ) -> torch.Tensor:
        """The additive mask ``[B, 1, m, capacity]`` of a pass (:meth:`prepare`); a captured pass
        builds it from the buffers its replays fill."""
        if not self._capturing:
            self.prepare(hidden, positions, valid)
        return padded_mask(self.seen, self.slots, window, hidden.dtype)  # type: ignore[arg-type]

    def replay(
        self, run: Callable[..., torch.Tensor], hidden: torch.Tensor, positions: Any, valid: Any
    ) -> torch.Tensor | None:
        """The pass ``run(hidden, cache, positions, valid, rotary, index)`` replayed from its
        capture, or ``None`` to run it as it comes: without graphs, with gradients, the first time
        a shape meets these layers (captured the second time), over many positions, where buffers
        are missing, or where its capture failed."""
        passes = self.passes
        if passes is None or not passes.graphs or self._capturing or torch.is_grad_enabled():
            return None
        pairs, m = run.args[0], hidden.shape[1]  # type: ignore[attr-defined]
        layers = [layer.self_attn.layer_idx for layer, _ in pairs]
        if m > MOST_CAPTURED_POSITIONS or any(self._unready(i, hidden.shape[0]) for i in layers):
            return None  # a prefill or a backlog, a layer's first pass, or buffers about to widen
        self.prepare(hidden, positions, valid)
        slots, seen = self.slots, self.seen
        if slots is None or seen is None or self._unready(layers[0], hidden.shape[0]):
            return None
        ids = positions.to(hidden.device) if isinstance(positions, torch.Tensor) else slots[None]
        modules = tuple(id(layer) for layer, _ in pairs)  # a slab may serve the exit layers next
        key = (modules, tuple(layers), tuple(hidden.shape), tuple(ids.shape), tuple(seen.shape))
        entry = self.captured.get(key, True)
        if entry is True:
            if len(self.captured) < MOST_CAPTURED:
                self.captured[key] = None
            return None
        if entry is False:
            return None  # its capture failed: eager for good
        before = [self.lengths[i] for i in layers]
        if entry is None:
            entry = Captured(hidden.clone(), ids.clone(), slots.clone(), seen.clone())
            entry.graph = self._capture(run, entry)
            if entry.graph is None:
                self.captured[key] = False
                return None
            self.captured[key] = entry
        else:
            for buffer, new in ((entry.hidden, hidden), (entry.positions, ids), (entry.slots, slots)):
                buffer.copy_(new)
            entry.seen.copy_(seen)
        entry.graph.replay()
        for i, length in zip(layers, before, strict=True):
            self.lengths[i] = length + m
        return entry.graph.out.clone()

    def _capture(self, run: Callable[..., torch.Tensor], entry: Captured) -> Any:
        """``entry``'s pass captured (on a cache of the slab's own, which keeps no call's cache
        alive), or ``None`` with a warning where capture fails: the pass then runs eagerly."""
        capturing = StaticCache(None, self.slab)
        try:
            return self.passes.capture(lambda: capturing._again(run, entry))  # type: ignore[union-attr]
        except Exception as exc:  # a pass that reads the device, hooks that move weights, ...
            self.passes.failed += 1  # type: ignore[union-attr]
            warnings.warn(
                f"eesd: a pass over {entry.hidden.shape[1]} positions could not be captured into a CUDA "
                f"graph ({type(exc).__name__}: {exc}); it runs eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
            return None

    def _unready(self, layer: int, rows: int) -> bool:
        buffer = self.keys[layer]
        return buffer is None or buffer.shape[-2] != self.capacity or buffer.shape[0] != rows

    def _again(self, run: Callable[..., torch.Tensor], entry: Captured) -> torch.Tensor:
        """The pass on ``entry``'s buffers, as a capture records it (this cache's lengths mean nothing)."""
        saved = self._capturing, self.slots, self.seen
        self._capturing, self.slots, self.seen = True, entry.slots, entry.seen
        self.lengths = [0] * self.num_layers
        try:
            return run(entry.hidden, self, entry.positions, None, None, None)
        finally:
            self._capturing, self.slots, self.seen = saved
