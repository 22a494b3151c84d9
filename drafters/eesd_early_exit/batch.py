"""The early-exit drafter over a batch: every row drafts in one pass per step.

The same scheme as one sequence (:mod:`eesd_early_exit.drafter`), laid out by cache slot instead of
by position: the exit cache and the kept top states are slot-aligned with the target's cache, and
every pass masks by the engine's :class:`~eesd_core.batch.BatchLayout`, so each row sees only its
own valid slots. Layer-N states of slots the exit layers have not run on wait in ``deferred``
(rounds in which no row drafts never run the head, and rows that leave the batch before the exit
layers ever ran take their waiting states along); a top-input head reads, for each slot, the
target's last-layer state of the row's previous valid slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from eesd_core.cache import KVCache, packed_groups
from eesd_core.devices import pass_tokens


@dataclass
class BatchExitState:
    """The drafter's part of one batched generation; ``exit_slots`` slots have run the exit layers,
    ``deferred`` holds the layer-N states ``[B, c, H]`` of the slots after them."""

    cache: KVCache
    layout: Any
    exit_cache: KVCache
    exit_slots: int = 0
    deferred: list[torch.Tensor] = field(default_factory=list)
    tops: torch.Tensor | None = None  # [B, capacity, H], slot-aligned
    round_states: list[torch.Tensor] = field(default_factory=list)
    stand_in: torch.Tensor | None = None
    drafted_round: tuple[torch.Tensor, int] | None = None
    caught: list[int] | None = None  # joined rows: committed inputs caught up on (see join)
    waiting: torch.Tensor | None = None  # [B, w]: those inputs' ids, run with the first step's


class BatchDrafting:
    """The :class:`~eesd_core.protocols.BatchDrafter` half of the early-exit drafter."""

    adapter: Any
    head: Any
    shared_layers: int
    reads_top_states: bool

    def begin_batch(self, cache: KVCache, layout: Any, hidden: torch.Tensor | None) -> BatchExitState:
        state = BatchExitState(cache, layout, self.head.new_cache())
        if hidden is not None and hidden.shape[1]:
            self._defer_batch(state, hidden)
        return state

    def step_batch(
        self, state: BatchExitState, tokens: torch.Tensor, slot: int, drafting: torch.Tensor
    ) -> torch.Tensor:
        first = not state.round_states
        h, rotary = self._lower_batch(state, tokens, slot)
        self._flush_batch(state)
        top = None
        if self.reads_top_states:
            top = self._tops_before_batch(state, slot, 1) if first else self.head.top_state(state.stand_in)
        layout = state.layout
        positions, valid = layout.positions[:, slot : slot + 1], layout.valid[:, : slot + 1]
        state.stand_in = self.head.hidden(h, positions, state.exit_cache, rotary, top, valid)
        state.exit_slots = slot + 1
        return self.head.batch_logits(state.stand_in)  # [B, V]

    def finish_batch(self, state: BatchExitState, tokens: torch.Tensor | None, slot: int) -> torch.Tensor:
        if tokens is not None:  # None: no row feeds ``slot`` (each took its last draft back)
            h, _ = self._lower_batch(state, tokens, slot)
            self._defer_batch(state, h)
            slot += 1
        states = state.round_states
        hidden = states[0] if len(states) == 1 else torch.cat(states, dim=1)
        if self.reads_top_states and len(states) > 1:
            state.drafted_round = (hidden, slot - len(states))
        state.round_states, state.stand_in = [], None
        return hidden  # [B, k+1, H]

    def top_states_batch(self, state: BatchExitState, hidden: torch.Tensor, slot: int) -> None:
        rows, capacity = state.layout.valid.shape
        if state.tops is None and slot == 0 and hidden.shape[1] == capacity:
            state.tops = hidden  # the prefill's buffer, as wide as the cache: kept, not copied
            return
        if state.tops is None:
            state.tops = hidden.new_zeros(rows, capacity, hidden.shape[2])
        state.tops[:, slot : slot + hidden.shape[1]] = hidden

    def rollback_batch(self, state: BatchExitState, slots: int) -> None:
        if state.drafted_round is not None:
            # slots after the round's first were run on stand-in top states: run them again
            (states, start), state.drafted_round = state.drafted_round, None
            state.exit_slots = min(slots, start + 1)
            state.exit_cache.crop(state.exit_slots)
            keep = max(0, slots - start - 1)
            state.deferred = [states[:, 1 : 1 + keep]] if keep and self.head.num_layers else []
            return
        state.exit_slots = min(state.exit_slots, slots)
        state.exit_cache.crop(state.exit_slots)
        keep = slots - state.exit_slots
        if keep < sum(t.shape[1] for t in state.deferred):  # a round with nothing to cut copies nothing
            state.deferred = [torch.cat(state.deferred, dim=1)[:, :keep]] if keep else []

    def relayout_batch(self, state: BatchExitState, rows: torch.Tensor, index: torch.Tensor) -> None:
        if state.exit_slots == 0 and state.deferred:  # the exit layers never ran: move their inputs
            backlog = torch.cat(state.deferred, dim=1)  # [B, slots, H]
            take = index.clamp_min(0).to(backlog.device)
            moved = backlog.index_select(0, rows.to(backlog.device))
            moved = moved.gather(1, take[:, :, None].expand(-1, -1, backlog.shape[2]))
            state.deferred = [moved.masked_fill((index < 0).to(moved.device)[:, :, None], 0.0)]
        else:  # the engine realigns its layout and the target's cache after this: run the backlog first
            self._flush_batch(state)
            state.exit_cache.relayout(rows, index)
            state.exit_slots = index.shape[1]
        if state.tops is not None:
            take = index.clamp_min(0).to(state.tops.device)
            tops = state.tops.index_select(0, rows.to(state.tops.device))
            gathered = tops.gather(1, take[:, :, None].expand(-1, -1, tops.shape[2]))
            state.tops = tops.new_zeros(tops.shape)
            state.tops[:, : index.shape[1]] = gathered

    # -- single-sequence states drafting together (a serving engine's requests) ----------------

    def join(self, states: list[Any], extra: int, behind: list[list[int]] | None = None) -> BatchExitState:
        """One batch state over single-sequence states (:class:`~eesd_early_exit.drafter.ExitState`)
        whose caches may differ in length: row b's cached positions end at slot W (the longest
        row's length), ``extra`` free slots follow for a round's inputs. ``behind[b]``: committed
        tokens row b's caches lack; they run through layers [0, N) here, in one pass for every
        row, in a window of slots after W as wide as the longest (each row's right-aligned, the
        slots before them masked), in the same pass as the first draft step's inputs, which
        follow the window (a pass over w + 1 positions costs little more than one over one where
        passes are bound by reading the weights); the exit layers see them at that step too. For
        a top-input head, each state must hold the top states of its cached positions and of
        those tokens; they are laid out by slot too. Copies every row's cache once;
        :meth:`part` hands the round back."""
        from eesd_core.batch import BatchLayout

        for state in states:
            self._flush(state)
        counts = [state.cache.lengths[0] if state.cache.num_layers else 0 for state in states]
        caught = [len(b) for b in behind] if behind else [0] * len(states)
        width, window = max(counts), max(caught)
        capacity = width + window + extra
        layout = BatchLayout(len(states), capacity, self.adapter.device)
        for row, (n, b) in enumerate(zip(counts, caught, strict=True)):
            layout.valid[row, width - n : width] = True
            layout.valid[row, width + window - b : width + window] = True
            layout.positions[row, width - n : width] = torch.arange(n, device=layout.positions.device)
            slots = slice(width + window - b, width + window)
            layout.positions[row, slots] = torch.arange(n, n + b, device=layout.positions.device)
        layout.slots = width
        cache = stacked([state.cache for state in states], width, capacity)
        exit_cache = stacked([state.exit_cache for state in states], width, capacity)
        joined = BatchExitState(cache, layout, exit_cache, exit_slots=width, caught=caught)
        if self.reads_top_states:
            adapter = self.adapter
            size = (len(states), capacity, adapter.hidden_size)
            tops = torch.zeros(size, dtype=adapter.dtype, device=adapter.device)
            for row, (state, n, b) in enumerate(zip(states, counts, caught, strict=True)):
                if n + b:
                    if state.tops is None or state.top_count < n + b:
                        raise ValueError("join: a state lacks the top states of its cached positions")
                    tops[row, width - n : width] = state.tops[:n]
                    tops[row, width + window - b : width + window] = state.tops[n : n + b]
            joined.tops = tops
        if window:
            ids = torch.zeros(len(states), window, dtype=torch.long)
            for row, tokens in enumerate(behind or []):
                if tokens:
                    ids[row, window - len(tokens) :] = torch.as_tensor(tokens, dtype=torch.long)
            joined.waiting = ids.to(self.adapter.device)
            layout.slots = width + window
        return joined

    def part(self, joined: BatchExitState, states: list[Any], fed: list[int], hidden: torch.Tensor) -> None:
        """Give each single-sequence state its row of a joined round: row b fed ``fed[b]`` inputs
        from slot W on (its pending token and drafts), ``hidden`` is what :meth:`finish_batch`
        returned. Each state then holds what a round of its own through :meth:`step` and
        :meth:`finish` would have left, so ``rollback`` cuts it as usual; the tokens it caught up
        on at :meth:`join` come first (W is then the slot after their window)."""
        width = joined.layout.slots
        caught = joined.caught or [0] * len(states)
        if joined.waiting is not None:  # no step ran: the window's inputs have not run yet
            self._lower_waiting(joined, width)
        if joined.exit_slots < width:  # nor have their exit layers
            self._flush_batch(joined)
        steps = joined.exit_slots - width  # step_batch calls: the exit layers ran on slots W .. W + steps - 1
        for row, (state, count) in enumerate(zip(states, fed, strict=True)):
            if caught[row]:  # their exit layers ran at the round's first step, with its backlog
                append_slots(state.cache, joined.cache, row, width - caught[row], caught[row])
                append_slots(state.exit_cache, joined.exit_cache, row, width - caught[row], caught[row])
            start = state.cache.lengths[0] if state.cache.num_layers else 0
            append_slots(state.cache, joined.cache, row, width, count)
            append_slots(state.exit_cache, joined.exit_cache, row, width, min(count, steps))
            if count > steps and self.head.num_layers:  # its last input ran layers [0, N) only
                self._defer(state, hidden[row : row + 1, steps:count])
            if self.reads_top_states and count > 1:  # drafts after the first read stand-in tops
                state.drafted_round = (hidden[row : row + 1, :count], start)

    # -- internals ----------------------------------------------------------------------------

    def _lower_batch(
        self, state: BatchExitState, tokens: torch.Tensor, slot: int
    ) -> tuple[torch.Tensor, Any]:
        """Layers [0, N) on every row's token for ``slot``, after the waiting inputs of a joined
        round's window in the same pass (their states wait for the exit layers). # [B, 1, H]"""
        adapter, layout = self.adapter, state.layout
        ids, first = tokens.view(-1, 1).to(adapter.device), slot
        if state.waiting is not None:
            ids, first = torch.cat([state.waiting, ids], dim=1), slot - state.waiting.shape[1]
            state.waiting = None
        x = adapter.embed(ids)
        positions, valid = layout.positions[:, first : slot + 1], layout.valid[:, : slot + 1]
        rotary = adapter.rotary(x, positions)
        h = adapter.run_batch(x, 0, self.shared_layers, state.cache, positions, valid, rotary)
        if first < slot:
            self._defer_batch(state, h[:, :-1])
            h = h[:, -1:]
            rotary = adapter.rotary(h, positions[:, -1:])
        state.round_states.append(h)
        return h, rotary

    def _lower_waiting(self, state: BatchExitState, end: int) -> None:
        """Layers [0, N) on a joined round's waiting window alone (slots before ``end``)."""
        assert state.waiting is not None
        adapter, layout = self.adapter, state.layout
        ids, state.waiting = state.waiting, None
        first = end - ids.shape[1]
        x = adapter.embed(ids)
        positions, valid = layout.positions[:, first:end], layout.valid[:, :end]
        h = adapter.run_batch(x, 0, self.shared_layers, state.cache, positions, valid)
        self._defer_batch(state, h)

    def _defer_batch(self, state: BatchExitState, hidden: torch.Tensor) -> None:
        if self.head.num_layers:
            state.deferred.append(hidden)

    def _flush_batch(self, state: BatchExitState) -> None:
        if not state.deferred:
            return
        backlog = torch.cat(state.deferred, dim=1)
        start, count = state.exit_slots, backlog.shape[1]
        top = self._tops_before_batch(state, start, count) if self.reads_top_states else None
        layout = state.layout
        positions, valid = layout.positions[:, start : start + count], layout.valid[:, : start + count]
        packs = start == 0 and getattr(self.adapter, "skips_padding", True)  # as the target's prefill
        groups = packed_groups(valid, max_tokens=pass_tokens(self.adapter.device)) if packs else None
        if groups is None:
            self.head.hidden(backlog, positions, state.exit_cache, None, top, valid)
        else:  # mostly left padding (ragged prompts): each group of rows runs its own slots only
            writers = state.exit_cache.writers(len(valid), groups)
            for (rows, first), writer in zip(groups, writers, strict=True):
                pick, at = rows.to(backlog.device), rows.to(valid.device)
                tops = None if top is None else top[pick, first:]
                h, where, seen = backlog[pick, first:], positions[at, first:], valid[at, first:]
                self.head.hidden(h, where, writer, None, tops, seen)
        state.exit_slots, state.deferred = start + count, []

    def _tops_before_batch(self, state: BatchExitState, start: int, count: int) -> torch.Tensor:
        """The normalised top state of each row's previous valid slot, for slots ``start ..
        start + count - 1`` (zeros where a row has none). # [B, count, H]"""
        valid = state.layout.valid[:, : start + count]
        slots = torch.arange(start + count, device=valid.device)
        last = torch.where(valid, slots, -1).cummax(dim=1).values  # last valid slot up to each
        before = torch.cat([last.new_full((last.shape[0], 1), -1), last[:, :-1]], dim=1)
        previous = before[:, start : start + count]  # [B, count]
        rows, hidden = valid.shape[0], self.adapter.hidden_size
        if state.tops is None:
            return torch.zeros(rows, count, hidden, dtype=self.adapter.dtype, device=self.adapter.device)
        take = previous.clamp_min(0).to(state.tops.device)
        gathered = state.tops.gather(1, take[:, :, None].expand(-1, -1, state.tops.shape[2]))
        normed = self.head.top_state(gathered)
        return normed.masked_fill((previous < 0).to(normed.device)[:, :, None], 0.0)


def assemble(cache: KVCache, parts: list[tuple[KVCache, torch.Tensor, int]], rows: int, length: int) -> None:
    """Fill ``cache``, empty until now, with ``rows`` rows of ``length`` slots from ``parts``: each
    a cache of batch rows ``rows`` holding their slots ``start .. length``. Slots no part holds
    are zeros (padding, masked by whoever reads them, but never garbage)."""
    for layer in range(cache.num_layers):
        for name in ("keys", "values"):
            held = [(getattr(part, name)[layer], which, start) for part, which, start in parts]
            like = next((t for t, _, _ in held if t is not None), None)
            if like is None:
                continue
            buffer = like.new_zeros((rows, like.shape[1], max(cache.capacity, length), like.shape[3]))
            for t, which, start in held:
                if t is not None:
                    buffer[which.to(buffer.device), :, start:length] = t[:, :, : length - start]
            getattr(cache, name)[layer] = buffer
        cache.lengths[layer] = length


def stacked(caches: list[KVCache], width: int, capacity: int) -> KVCache:
    """One batch cache of single-sequence caches (each row a cache), row b's keys right-aligned
    to end at slot ``width``, zeros before them, room for ``capacity`` slots in all."""
    out = KVCache(caches[0].num_layers, capacity)
    if out.num_layers:
        parts = [(cache, torch.tensor([row]), width - cache.lengths[0]) for row, cache in enumerate(caches)]
        assemble(out, parts, len(caches), width)
    return out


def append_slots(cache: KVCache, other: KVCache, row: int, start: int, count: int) -> None:
    """Append slots [start, start + count) of batch row ``row`` of ``other`` to every layer of
    ``cache``."""
    for layer in range(min(cache.num_layers, other.num_layers)):
        keys, values = other.keys[layer], other.values[layer]
        if keys is not None and values is not None and count > 0:
            end = start + count
            cache.update(keys[row : row + 1, :, start:end], values[row : row + 1, :, start:end], layer)
