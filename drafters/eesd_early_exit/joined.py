"""Early-exit drafting for a serving engine that keeps one cache per request.

A serving engine's proposer (eesd's for vLLM) holds one one-row :class:`~eesd_early_exit.drafter.
ExitState` per request, laid out densely (slot = position), and drafts for each alone or for
several together. :meth:`JoinedRounds.catch_up` and :meth:`JoinedRounds.extend` bring a request's
caches up to what its target committed; :meth:`JoinedRounds.join` lays several requests' states
out as one batch state for a round of the drafter's own steps, and :meth:`JoinedRounds.part` hands
each request its row back.
"""

from __future__ import annotations

from typing import Any

import torch

from eesd_core.cache import BatchLayout, KVCache


class JoinedRounds:
    """The serving half of :class:`~eesd_early_exit.drafter.EarlyExitDrafter`."""

    adapter: Any
    head: Any
    shared_layers: int
    reads_top_states: bool
    _defer: Any
    _flush: Any

    def catch_up(self, state: Any, tokens: torch.Tensor) -> None:
        """Committed tokens ``[m]`` that a request's caches lack: they run through layers [0, N)
        in one pass with the next step's or finish's input, whose position must follow them, and
        through the exit layers at that step. A pass over m + 1 positions costs little more than
        one over one where passes are bound by reading the weights."""
        ids = tokens.view(1, -1).to(self.adapter.device)
        state.waiting = ids if state.waiting is None else torch.cat([state.waiting, ids], dim=1)

    def extend(self, state: Any, hidden: torch.Tensor, now: bool = False) -> None:
        """Take the layer-N states ``[1, m, H]`` of committed positions that someone else ran
        through layers [0, N) over ``state.cache``; the exit layers see them at the next step, or
        ``now`` (so that the time of this catching up is not charged to the next draft step)."""
        self._defer(state, hidden)
        if now:
            self._flush(state)

    def join(self, states: list[Any], extra: int, behind: list[list[int]] | None = None) -> Any:
        """One batch state over one-row states (:class:`~eesd_early_exit.drafter.ExitState`, each a
        request's, dense) whose caches may differ in length: row b's cached positions end at slot W
        (the longest row's length), ``extra`` free slots follow for a round's inputs. ``behind[b]``:
        committed tokens row b's caches lack; they run through layers [0, N) here, in one pass for
        every row, in a window of slots after W as wide as the longest (each row's right-aligned,
        the slots before them masked), in the same pass as the first draft step's inputs, which
        follow the window (a pass over w + 1 positions costs little more than one over one where
        passes are bound by reading the weights); the exit layers see them at that step too. For a
        top-input head, each state must hold the top states of its cached positions and of those
        tokens; they are laid out by slot too. Copies every row's cache once; :meth:`part` hands the
        round back."""
        for state in states:
            self._flush(state)
        counts = [state.cache.lengths[0] if state.cache.num_layers else 0 for state in states]
        caught = [len(b) for b in behind] if behind else [0] * len(states)
        width, window = max(counts), max(caught)
        capacity = width + window + extra
        layout = BatchLayout(len(states), capacity, self.adapter.device)
        valid, positions = layout.spread()
        for row, (n, b) in enumerate(zip(counts, caught, strict=True)):
            valid[row, width - n : width] = True
            valid[row, width + window - b : width + window] = True
            positions[row, width - n : width] = torch.arange(n, device=layout.device)
            slots = slice(width + window - b, width + window)
            positions[row, slots] = torch.arange(n, n + b, device=layout.device)
        layout.slots = width
        cache = stacked([state.cache for state in states], width, capacity)
        exit_cache = stacked([state.exit_cache for state in states], width, capacity)
        joined = type(states[0])(cache, layout, exit_cache, exit_slots=width, caught=caught)
        if self.reads_top_states:
            adapter = self.adapter
            size = (len(states), capacity, adapter.hidden_size)
            tops = torch.zeros(size, dtype=adapter.dtype, device=adapter.device)
            for row, (state, n, b) in enumerate(zip(states, counts, caught, strict=True)):
                if n + b:
                    if state.tops is None or state.tops.shape[1] < n + b:
                        raise ValueError("join: a state lacks the top states of its cached positions")
                    tops[row, width - n : width] = state.tops[0, :n]
                    tops[row, width + window - b : width + window] = state.tops[0, n : n + b]
            joined.tops = tops
        if window:
            ids = torch.zeros(len(states), window, dtype=torch.long)
            for row, tokens in enumerate(behind or []):
                if tokens:
                    ids[row, window - len(tokens) :] = torch.as_tensor(tokens, dtype=torch.long)
            joined.waiting = ids.to(self.adapter.device)
            layout.slots = width + window
        layout.filled = layout.slots
        return joined

    def part(self, joined: Any, states: list[Any], fed: list[int], hidden: torch.Tensor) -> None:
        """Give each single-sequence state its row of a joined round: row b fed ``fed[b]`` inputs
        from slot W on (its pending token and drafts), ``hidden`` is what :meth:`finish`
        returned. Each state then holds what a round of its own through :meth:`step` and
        :meth:`finish` would have left, so ``rollback`` cuts it as usual; the tokens it caught up
        on at :meth:`join` come first (W is then the slot after their window)."""
        width = joined.layout.slots
        caught = joined.caught or [0] * len(states)
        if joined.waiting is not None:  # no step ran: the window's inputs have not run yet
            self._lower_waiting(joined, width)
        if joined.exit_slots < width:  # nor have their exit layers
            self._flush(joined)
        steps = joined.exit_slots - width  # step calls: the exit layers ran on slots W .. W + steps - 1
        for row, (state, count) in enumerate(zip(states, fed, strict=True)):
            if caught[row]:  # their exit layers ran at the round's first step, with its backlog
                append_slots(state.cache, joined.cache, row, width - caught[row], caught[row])
                append_slots(state.exit_cache, joined.exit_cache, row, width - caught[row], caught[row])
            start = state.cache.lengths[0] if state.cache.num_layers else 0
            append_slots(state.cache, joined.cache, row, width, count)
            append_slots(state.exit_cache, joined.exit_cache, row, width, min(count, steps))
            state.exit_slots = start + min(count, steps)
            if count > steps and self.head.num_layers:  # its last input ran layers [0, N) only
                self._defer(state, hidden[row : row + 1, steps:count])
            if self.reads_top_states and count > 1:  # drafts after the first read stand-in tops
                state.drafted_round = (hidden[row : row + 1, :count], start)

    def _lower_waiting(self, state: Any, end: int) -> None:
        """Layers [0, N) on a joined round's waiting window alone (slots before ``end``)."""
        assert state.waiting is not None
        adapter, layout = self.adapter, state.layout
        ids, state.waiting = state.waiting, None
        first = end - ids.shape[1]
        x = adapter.embed(ids)
        positions, valid = layout.window(first, end)
        h = adapter.run(x, 0, self.shared_layers, state.cache, positions, valid)
        self._defer(state, h)


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
