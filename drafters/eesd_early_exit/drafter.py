"""The early-exit drafter (``drafter="early_exit"``).

Per round, with pending token t_0 at position P, each ``step`` runs layers [0, N) on t_i (writing
the shared cache at P + i) and the exit head on the result (writing its own cache), and returns
the logits of q; ``finish`` runs the last token t_k through layers [0, N) only. Its layer-N state
waits (with those of rounds that drafted nothing) until the exit layers next run, in one batched
pass. So every cache, counting what waits, holds all k + 1 inputs, and one crop to the committed
length restores the invariant whatever is accepted; a round that drafts nothing costs the target's
own step and nothing more. When the controller withdraws the latest draft (``finish`` with no
token), its input already went through every layer, and the round simply has one draft fewer; the
step spent only the exit head on a draft nobody verifies.

A top-input head (``exit_input`` ``hidden+top`` in its file) also reads the target's last-layer
state of the previous position; the engine hands those over (``reads_top_states``) and the state
keeps them for every committed position. Within a round only the first draft has the real one;
later drafts read the head's own previous output instead. So after verification the exit cache
keeps only the round's first position, and the accepted positions after it wait to run again with
the target's states, in the next batched pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.errors import ConfigError
from eesd_core.protocols import Draft, ModelAdapter
from eesd_early_exit.batch import BatchDrafting
from eesd_early_exit.head import UntrainedHead
from eesd_early_exit.headfile import find_shipped_head, load_head, read_metadata
from eesd_early_exit.options import EarlyExitOptions


@dataclass
class ExitState:
    """The drafter's part of one generation.

    ``deferred`` are layer-N states ``[1, m, H]`` the exit layers have not run on yet;
    ``tops`` the target's last-layer states ``[T, H]`` (before its final norm), position t at t.
    """

    cache: KVCache
    exit_cache: KVCache
    deferred: list[torch.Tensor] = field(default_factory=list)
    deferred_count: int = 0
    tops: torch.Tensor | None = None
    top_count: int = 0
    round_states: list[torch.Tensor] = field(default_factory=list)  # this round's layer-N states
    stand_in: torch.Tensor | None = None  # the exit output of the latest draft step
    drafted_round: tuple[torch.Tensor, int] | None = None  # (states, start) of a top-input round
    waiting: torch.Tensor | None = None  # ids of committed tokens to run with the next input


class EarlyExitDrafter(BatchDrafting):
    """Drafts with the target's layers [0, N) and an exit head, sharing the target's cache; drafts
    for a batch too (:mod:`eesd_early_exit.batch`)."""

    def __init__(self, options: EarlyExitOptions | None = None) -> None:
        self.options = options or EarlyExitOptions()
        self.shared_layers = 0
        self.reads_top_states = False
        self.withdraws = True
        self.head: Any = None
        self.head_path: Path | None = None

    def attach(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        exit_layer = self.options.exit_layer
        head_path = self.options.head
        if head_path == "auto":
            head_path = find_shipped_head(adapter)
            # a shipped head distilled at another layer than the one asked for is not used
            if head_path is not None and exit_layer is not None and _head_layer(head_path) != exit_layer:
                head_path = None
        if head_path is not None:
            head_layer = _head_layer(head_path)
            if exit_layer is not None and exit_layer != head_layer:
                raise ConfigError(
                    f"exit_layer={exit_layer} but the head file was distilled at layer {head_layer}: "
                    "drop exit_layer or use a head distilled for that layer."
                )
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

    # -- one generation -----------------------------------------------------------------------

    def begin(self, cache: KVCache, prompt: torch.Tensor, hidden: torch.Tensor | None) -> ExitState:
        state = ExitState(cache, self.head.new_cache())
        if hidden is not None and hidden.shape[1]:
            self._defer(state, hidden)
        return state

    def extend(self, state: ExitState, hidden: torch.Tensor, now: bool = False) -> None:
        """Take the layer-N states ``[1, m, H]`` of committed positions that someone else ran
        through layers [0, N) over ``state.cache`` (a serving engine's proposer catching up on
        the tokens its target accepted); the exit layers see them at the next step, or ``now``
        (so that the time of this catching up is not charged to the next draft step)."""
        self._defer(state, hidden)
        if now:
            self._flush(state)

    def catch_up(self, state: ExitState, tokens: torch.Tensor) -> None:
        """Committed tokens ``[m]`` that ``state.cache`` lacks (a serving engine's proposer
        catching up on what its target accepted): they run through layers [0, N) in one pass with
        the next ``step``'s or ``finish``'s input, whose position must follow them, and through
        the exit layers at that step. A pass over m + 1 positions costs little more than one
        over one where passes are bound by reading the weights."""
        held = state.waiting
        state.waiting = tokens if held is None else torch.cat([held, tokens.to(held.device)])

    def step(self, state: ExitState, token: int, position: int, history: torch.Tensor) -> Draft:
        first = not state.round_states
        h, rotary = self._lower(state, token, position)
        self._flush(state)
        top = None
        if self.reads_top_states:
            top = self._tops_before(state, position, 1) if first else self.head.top_state(state.stand_in)
        state.stand_in = self.head.hidden(h, position, state.exit_cache, rotary, top)
        return Draft(logits=self.head.logits(state.stand_in)[0])  # [V]

    def finish(self, state: ExitState, token: int | None, position: int) -> torch.Tensor:
        if token is not None:  # None: the latest step's draft was withdrawn, its input is in
            h, _ = self._lower(state, token, position)
            self._defer(state, h)
        hidden = (
            state.round_states[0] if len(state.round_states) == 1 else torch.cat(state.round_states, dim=1)
        )
        if self.reads_top_states and len(state.round_states) > 1:
            state.drafted_round = (hidden, position + 1 - len(state.round_states))
        state.round_states, state.stand_in = [], None
        return hidden  # [1, k+1, H]

    def top_states(self, state: ExitState, hidden: torch.Tensor, position: int) -> None:
        """Keep the target's last-layer states ``[1, m, H]`` of positions ``position ..``."""
        m = hidden.shape[1]
        if state.tops is None or state.tops.shape[0] < position + m:
            grown = hidden.new_zeros(max(2 * (position + m), 64), hidden.shape[2])
            if state.tops is not None:
                grown[: state.top_count] = state.tops[: state.top_count]
            state.tops = grown
        state.tops[position : position + m] = hidden[0]
        state.top_count = position + m

    def rollback(self, state: ExitState, length: int) -> None:
        state.top_count = min(state.top_count, length)
        state.waiting = None  # positions after the cache: cut with everything after ``length``
        if state.drafted_round is not None:
            # the exit cache after the round's first position was built from stand-in top states:
            # drop it, and let the accepted positions run again with the target's own
            (states, start), state.drafted_round = state.drafted_round, None
            state.exit_cache.crop(min(length, start + 1))
            keep = max(0, length - start - 1)
            state.deferred = [states[:, 1 : 1 + keep]] if keep else []
            state.deferred_count = keep
            return
        state.exit_cache.crop(length)
        keep = max(0, length - self._exit_cached(state))
        if keep < state.deferred_count:
            state.deferred = [torch.cat(state.deferred, dim=1)[:, :keep]] if keep else []
            state.deferred_count = keep

    # -- internals ----------------------------------------------------------------------------

    def _lower(self, state: ExitState, token: int, position: int) -> tuple[torch.Tensor, Any]:
        """Layers [0, N) on one token at ``position``, after the waiting ones in the same pass
        (their states wait for the exit layers). # [1, 1, H]"""
        adapter = self.adapter
        ids, first = torch.tensor([token], device=adapter.device), position
        if state.waiting is not None:
            ids, first = torch.cat([state.waiting.to(adapter.device), ids]), position - len(state.waiting)
            state.waiting = None
        x = adapter.embed(ids)
        rotary = adapter.rotary(x, first)
        h = adapter.run_layers(x, 0, self.shared_layers, state.cache, first, rotary)
        if first < position:
            self._defer(state, h[:, :-1])
            h = h[:, -1:]
            rotary = adapter.rotary(h, position)
        state.round_states.append(h)
        return h, rotary

    def _exit_cached(self, state: ExitState) -> int:
        return state.exit_cache.lengths[0] if self.head.num_layers else 0

    def _defer(self, state: ExitState, hidden: torch.Tensor) -> None:
        """Rounds that draft nothing never need the exit layers; their inputs wait here and go
        through in one batched pass when drafting resumes."""
        if self.head.num_layers:
            state.deferred.append(hidden)
            state.deferred_count += hidden.shape[1]

    def _flush(self, state: ExitState) -> None:
        if state.deferred:
            backlog = torch.cat(state.deferred, dim=1)
            start = self._exit_cached(state)
            top = self._tops_before(state, start, backlog.shape[1]) if self.reads_top_states else None
            self.head.hidden(backlog, start, state.exit_cache, None, top)
            state.deferred, state.deferred_count = [], 0

    def _tops_before(self, state: ExitState, start: int, count: int) -> torch.Tensor:
        """What the head reads of the top states of positions ``start - 1 .. start + count - 2``
        (zeros before position 0). # [1, count, H]"""
        if start + count - 1 > state.top_count:
            raise RuntimeError("the top states of verified positions were not handed to the drafter")
        if state.tops is None:  # nothing verified yet: only position 0, which has no predecessor
            return torch.zeros(
                1, count, self.adapter.hidden_size, dtype=self.adapter.dtype, device=self.adapter.device
            )
        first = self.head.top_state(state.tops[max(start - 1, 0) : start + count - 1][None])
        if start == 0:
            first = torch.cat([first.new_zeros(1, 1, first.shape[2]), first], dim=1)
        return first


def _head_layer(path: str | Path) -> int:
    return int(read_metadata(path)["exit_layer"])
