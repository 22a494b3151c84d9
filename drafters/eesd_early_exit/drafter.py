"""The early-exit drafter (``drafter="early_exit"``), for one sequence or a batch alike.

Per round starting at slot S, each ``step`` runs layers [0, N) on every feeding row's token (writing
the shared cache at slot S + i) and the exit head on the result (writing its own cache), and returns
q's logits ``[B, V]``; ``finish`` runs the last slot through layers [0, N) only. Its layer-N states
wait (with those of rounds that drafted nothing) until the exit layers next run, in one batched
pass. So every cache, counting what waits, holds all the round's inputs, and one crop to the
committed slots restores the invariant whatever is accepted; a round that drafts nothing costs the
target's own step and nothing more. A row whose latest draft the controller took back simply feeds
nothing more: its input already went through every layer, and the step spent only the exit head on
a draft nobody verifies.

Every pass is laid out by slot and masked by the engine's :class:`~eesd_core.cache.BatchLayout`,
so each row sees only its own keys (a dense layout, one row always, needs no mask). A top-input
head (``exit_input`` ``hidden+top`` in its file) also reads the target's last-layer state of the
row's previous position; the engine hands those over (``reads_top_states``) and the state keeps
them by slot. Within a round only the first draft has the real one; later drafts read the head's
own previous output instead. So after verification the exit cache keeps only the round's first
slot, and the accepted slots after it wait to run again with the target's states.

Serving engines that keep one cache per request use the same drafter through
:class:`~eesd_early_exit.joined.JoinedRounds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_core.cache import KVCache, packed_groups
from eesd_core.devices import pass_tokens
from eesd_core.errors import ConfigError
from eesd_core.protocols import Draft, ModelAdapter
from eesd_early_exit.head import UntrainedHead
from eesd_early_exit.headfile import check_head, find_shipped_head, load_head
from eesd_early_exit.joined import JoinedRounds
from eesd_early_exit.options import EarlyExitOptions


@dataclass
class ExitState:
    """The drafter's part of one generation (or one request): ``exit_slots`` slots have run the
    exit layers, ``deferred`` holds the layer-N states ``[B, c, H]`` of the slots after them."""

    cache: KVCache
    layout: Any
    exit_cache: KVCache
    exit_slots: int = 0
    deferred: list[torch.Tensor] = field(default_factory=list)
    tops: torch.Tensor | None = None  # [B, capacity, H], the target's last-layer states by slot
    round_states: list[torch.Tensor] = field(default_factory=list)  # this round's layer-N states
    stand_in: torch.Tensor | None = None  # the exit output of the latest draft step
    drafted_round: tuple[torch.Tensor, int] | None = None  # (states, first slot) of a top-input round
    caught: list[int] | None = None  # joined rows: committed inputs caught up on (see JoinedRounds)
    waiting: torch.Tensor | None = None  # [B, w]: ids of inputs to run with the next step's


class EarlyExitDrafter(JoinedRounds):
    """Drafts with the target's layers [0, N) and an exit head, sharing the target's cache."""

    withdraws = True
    batches = True

    def __init__(self, options: EarlyExitOptions | None = None) -> None:
        self.options = options or EarlyExitOptions()
        self.shared_layers = 0
        self.reads_top_states = False
        self.head: Any = None
        self.head_path: Path | None = None

    def attach(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        exit_layer = self.options.exit_layer
        head_path = self.options.head
        if head_path == "auto":
            head_path = find_shipped_head(adapter)
        if head_path is not None:
            head_layer = check_head(head_path, adapter).exit_layer  # refuses a head that does not fit
            if exit_layer is not None and exit_layer != head_layer and self.options.head == "auto":
                head_path = None  # a shipped head distilled at another layer than the one asked for
            elif exit_layer is not None and exit_layer != head_layer:
                raise ConfigError(
                    f"exit_layer={exit_layer} but the head file was distilled at layer {head_layer}: "
                    "drop exit_layer or use a head distilled for that layer."
                )
            else:
                exit_layer = head_layer
        if exit_layer is None:
            exit_layer = max(1, adapter.num_layers // 4)
        if not 1 <= exit_layer < adapter.num_layers:
            raise ConfigError(
                f"exit_layer={exit_layer} is out of range for a model of {adapter.num_layers} layers: "
                f"choose 1 <= exit_layer <= {adapter.num_layers - 1}."
            )
        self.shared_layers = exit_layer
        self.head_path = None if head_path is None else Path(head_path)
        self.head = UntrainedHead(adapter, exit_layer) if head_path is None else load_head(head_path, adapter)
        self.reads_top_states = bool(self.head.top_input)

    def describe(self) -> str:
        if self.head_path is None:
            return f"target layers [0, {self.shared_layers}) + the target's own norm and LM head"
        top = " (reading the target's top state)" if self.reads_top_states else ""
        return f"target layers [0, {self.shared_layers}) + exit head {self.head_path.name}{top}"

    # -- the protocol -------------------------------------------------------------------------

    def begin(self, cache: KVCache, layout: Any, hidden: torch.Tensor | None) -> ExitState:
        state = ExitState(cache, layout, self.head.new_cache(layout.capacity))
        if hidden is not None and hidden.shape[1]:
            self._defer(state, hidden)
        return state

    def step(
        self, state: ExitState, tokens: torch.Tensor, slot: int, drafting: Sequence[bool], history: Any
    ) -> Draft:
        first = not state.round_states
        h, rotary = self._lower(state, tokens, slot)
        self._flush(state)
        top = None
        if self.reads_top_states:
            top = self._tops_before(state, slot, 1) if first else self.head.top_state(state.stand_in)
        positions, valid = state.layout.window(slot, slot + 1)
        state.stand_in = self.head.hidden(h, positions, state.exit_cache, rotary, top, valid)
        state.exit_slots = slot + 1
        return Draft(logits=self.head.logits(state.stand_in[:, -1]))  # [B, V]

    def finish(self, state: ExitState, tokens: torch.Tensor | None, slot: int) -> torch.Tensor:
        if tokens is not None:  # None: no row feeds ``slot`` (each took its last draft back)
            h, _ = self._lower(state, tokens, slot)
            self._defer(state, h)
            slot += 1
        states = state.round_states
        hidden = states[0] if len(states) == 1 else torch.cat(states, dim=1)
        if self.reads_top_states and len(states) > 1:
            state.drafted_round = (hidden, slot - len(states))
        state.round_states, state.stand_in = [], None
        return hidden  # [B, k+1, H]

    def top_states(self, state: ExitState, hidden: torch.Tensor, slot: int) -> None:
        """Keep the target's last-layer states ``[B, m, H]`` of slots ``slot ..``; the prefill's
        come as a buffer as wide as the layout, kept rather than copied."""
        rows, capacity = state.layout.rows, state.layout.capacity
        if state.tops is None and slot == 0 and hidden.shape[1] == capacity:
            state.tops = hidden
            return
        if state.tops is None:
            state.tops = hidden.new_zeros(rows, capacity, hidden.shape[2])
        state.tops[:, slot : slot + hidden.shape[1]] = hidden

    def rollback(self, state: ExitState, slots: int) -> None:
        state.waiting = None  # inputs after the cache: cut with everything after ``slots``
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

    def relayout(self, state: ExitState, rows: torch.Tensor, index: torch.Tensor) -> None:
        if state.exit_slots == 0 and state.deferred:  # the exit layers never ran: move their inputs
            backlog = torch.cat(state.deferred, dim=1)  # [B, slots, H]
            take = index.clamp_min(0).to(backlog.device)
            moved = backlog.index_select(0, rows.to(backlog.device))
            moved = moved.gather(1, take[:, :, None].expand(-1, -1, backlog.shape[2]))
            state.deferred = [moved.masked_fill((index < 0).to(moved.device)[:, :, None], 0.0)]
        else:  # the engine realigns its layout and the target's cache after this: run the backlog first
            self._flush(state)
            state.exit_cache.relayout(rows, index)
            state.exit_slots = index.shape[1]
        if state.tops is not None:
            take = index.clamp_min(0).to(state.tops.device)
            tops = state.tops.index_select(0, rows.to(state.tops.device))
            gathered = tops.gather(1, take[:, :, None].expand(-1, -1, tops.shape[2]))
            state.tops = tops.new_zeros(tops.shape)
            state.tops[:, : index.shape[1]] = gathered

    # -- internals ----------------------------------------------------------------------------

    def _lower(self, state: ExitState, tokens: torch.Tensor, slot: int) -> tuple[torch.Tensor, Any]:
        """Layers [0, N) on every row's token for ``slot``, after the waiting inputs of a joined
        round's window in the same pass (their states wait for the exit layers). # [B, 1, H]"""
        adapter, layout = self.adapter, state.layout
        ids, first = tokens.view(-1, 1).to(adapter.device, non_blocking=True), slot  # no wait for the device
        if state.waiting is not None:
            ids, first = torch.cat([state.waiting, ids], dim=1), slot - state.waiting.shape[1]
            state.waiting = None
        x = adapter.embed(ids)
        positions, valid = layout.window(first, slot + 1)
        rotary = adapter.rotary(x, positions)
        h = adapter.run(x, 0, self.shared_layers, state.cache, positions, valid, rotary)
        if first < slot:
            self._defer(state, h[:, :-1])
            h = h[:, -1:]
            rotary = adapter.rotary(h, layout.window(slot, slot + 1)[0])
        state.round_states.append(h)
        return h, rotary

    def _defer(self, state: ExitState, hidden: torch.Tensor) -> None:
        """Rounds that draft nothing never need the exit layers; their inputs wait here and go
        through in one batched pass when drafting resumes."""
        if self.head.num_layers:
            state.deferred.append(hidden)

    def _flush(self, state: ExitState) -> None:
        if not state.deferred:
            return
        backlog = torch.cat(state.deferred, dim=1)
        start, count, layout = state.exit_slots, backlog.shape[1], state.layout
        top = self._tops_before(state, start, count) if self.reads_top_states else None
        positions, valid = layout.window(start, start + count)
        groups = None
        if start == 0 and valid is not None and getattr(self.adapter, "skips_padding", True):
            groups = packed_groups(valid, max_tokens=pass_tokens(self.adapter.device))  # as the prefill
        if groups is None:
            self.head.hidden(backlog, positions, state.exit_cache, None, top, valid)
        else:  # mostly left padding (ragged prompts): each group of rows runs its own slots only
            writers = state.exit_cache.writers(len(valid), groups)  # type: ignore[arg-type]
            for (rows, first), writer in zip(groups, writers, strict=True):
                pick, at = rows.to(backlog.device), rows.to(valid.device)  # type: ignore[union-attr]
                tops = None if top is None else top[pick, first:]
                where, seen = positions[at, first:], valid[at, first:]  # type: ignore[index]
                self.head.hidden(backlog[pick, first:], where, writer, None, tops, seen)
        state.exit_slots, state.deferred = start + count, []

    def _tops_before(self, state: ExitState, start: int, count: int) -> torch.Tensor:
        """The normalised top state of each row's previous valid slot, for slots ``start ..
        start + count - 1`` (zeros where a row has none). # [B, count, H]"""
        previous = _previous(state.layout, start, count)  # [B, count]
        rows, hidden = previous.shape[0], self.adapter.hidden_size
        if state.tops is None:
            return torch.zeros(rows, count, hidden, dtype=self.adapter.dtype, device=self.adapter.device)
        take = previous.clamp_min(0).to(state.tops.device)
        gathered = state.tops.gather(1, take[:, :, None].expand(-1, -1, state.tops.shape[2]))
        normed = self.head.top_state(gathered)
        return normed.masked_fill((previous < 0).to(normed.device)[:, :, None], 0.0)


def _previous(layout: Any, start: int, count: int) -> torch.Tensor:
    """The slot of each row's valid key before each of slots [start, start + count) ``[B, count]``
    (-1 where the row has none)."""
    if layout.valid is None:  # dense: the slot before
        return torch.arange(start - 1, start + count - 1, device=layout.device).expand(layout.rows, -1)
    valid = layout.valid[:, : start + count]
    slots = torch.arange(start + count, device=valid.device)
    last = torch.where(valid, slots, -1).cummax(dim=1).values
    before = torch.cat([last.new_full((last.shape[0], 1), -1), last[:, :-1]], dim=1)
    return before[:, start : start + count]
