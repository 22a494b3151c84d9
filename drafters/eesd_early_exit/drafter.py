"""The early-exit drafter (``drafter="early_exit"``).

Per round, with pending token t_0 at position P: for i = 0, 1, ... it runs layers [0, N) on t_i
(writing the shared cache at P + i), the exit head on the result (writing its own cache), and draws
d_{i+1} from q; the controller is asked before each draft. The last draft d_k goes through layers
[0, N) only: its layer-N state waits (with those of rounds that drafted nothing) until the exit
layers next run, in one batched pass. So every cache, counting what waits, holds all k + 1 inputs,
and one crop to the committed length restores the invariant whatever is accepted.

A top-input head (``exit_input`` ``hidden+top`` in its file) also reads the target's last-layer
state of the previous position. The drafter asks the engine for those states
(``wants_top_states``) and keeps them for every committed position. Within a round only the first
draft has the real one; later drafts read the head's own previous output instead. So after
verification the exit cache keeps only the round's first position, and the accepted positions
after it wait to run again with the target's states, in the next batched pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import field_validator

from eesd_core.cache import KVCache
from eesd_core.config import PluginOptions
from eesd_core.errors import ConfigError
from eesd_core.protocols import DraftContext, DraftStep, ModelAdapter, Proposal
from eesd_core.sampling import check_finite, confidence, process_logits
from eesd_early_exit.head import UntrainedHead
from eesd_early_exit.headfile import find_shipped_head, load_head, read_metadata


class EarlyExitOptions(PluginOptions):
    """``exit_layer``: N, the number of target layers the drafter runs (default: the head's, or
    a quarter of the layers for the untrained head). ``head``: a head file; ``None`` for the
    target's own norm and LM head on layer N; ``"auto"`` (default) for the head shipped with eesd
    for this exact target if there is one, else ``None``."""

    exit_layer: int | None = None
    head: str | Path | None = "auto"

    @field_validator("exit_layer")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("exit_layer must be at least 1 (layer 0 would draft from embeddings)")
        return value


class EarlyExitDrafter:
    """Drafts with the target's layers [0, N) and an exit head, sharing the target's cache."""

    def __init__(self, options: EarlyExitOptions | None = None) -> None:
        self.options = options or EarlyExitOptions()
        self.shared_layers = 0
        self.head: Any = None
        self.exit_cache = KVCache(0)
        self.deferred: list[torch.Tensor] = []
        self.deferred_count = 0
        self.wants_top_states = False
        self.tops: torch.Tensor | None = None  # [1, T, H] normalised top states, position t at t
        self.top_count = 0
        self.round_states: torch.Tensor | None = None
        self.round_start = 0

    def attach(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        exit_layer = self.options.exit_layer
        head_path = self.options.head
        if head_path == "auto":
            head_path = find_shipped_head(adapter)
            # a shipped head distilled at another layer than the one asked for is not used
            if (
                head_path is not None
                and exit_layer is not None
                and int(read_metadata(head_path)["exit_layer"]) != exit_layer
            ):
                head_path = None
        self.head_path = head_path
        if head_path is not None:
            head_layer = int(read_metadata(head_path)["exit_layer"])
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
        if head_path is None:
            self.head = UntrainedHead(adapter, exit_layer)
        else:
            self.head = load_head(head_path, adapter)
        self.wants_top_states = bool(self.head.top_input)

    def prefill(self, cache: KVCache, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.exit_cache = self.head.new_cache()
        self.deferred = []
        self.deferred_count = 0
        self.top_count = 0
        self.round_states = None
        if hidden is not None and hidden.shape[1]:
            self._defer(hidden)

    def top_states(self, hidden: torch.Tensor, position: int) -> None:
        """The target's last-layer states ``[1, m, H]`` (before its final norm) at positions
        ``position .. position + m - 1``, from the prompt's pass and each verification."""
        m = hidden.shape[1]
        if self.tops is None or self.tops.shape[1] < position + m:
            grown = hidden.new_zeros(1, max(2 * (position + m), 64), hidden.shape[2])
            if self.tops is not None:
                grown[:, : self.top_count] = self.tops[:, : self.top_count]
            self.tops = grown
        self.tops[:, position : position + m] = self.head.top_state(hidden)
        self.top_count = position + m

    def _tops_before(self, start: int, count: int) -> torch.Tensor:
        """The top states of positions ``start - 1 .. start + count - 2`` (zeros before 0). # [1, count, H]"""
        if start + count - 1 > self.top_count:
            raise RuntimeError("the top states of verified positions were not handed to the drafter")
        if self.tops is None:  # nothing verified yet: only position 0, which has no predecessor
            return torch.zeros(
                1, count, self.adapter.hidden_size, dtype=self.adapter.dtype, device=self.adapter.device
            )
        first = self.tops[:, max(start - 1, 0) : start + count - 1]
        if start == 0:
            first = torch.cat([first.new_zeros(1, 1, first.shape[2]), first], dim=1)
        return first

    def rollback(self, length: int) -> None:
        self.top_count = min(self.top_count, length)
        if self.round_states is not None:
            # the exit cache after the round's first position was built from stand-in top states:
            # drop it, and let the accepted positions run again with the target's own
            states, start, self.round_states = self.round_states, self.round_start, None
            self.exit_cache.crop(min(length, start + 1))
            keep = max(0, length - start - 1)
            self.deferred = [states[:, 1 : 1 + keep]] if keep else []
            self.deferred_count = keep
            return
        self.exit_cache.crop(length)
        keep = max(0, length - self._exit_cached())
        if keep < self.deferred_count:
            self.deferred = [torch.cat(self.deferred, dim=1)[:, :keep]] if keep else []
            self.deferred_count = keep

    def exit_length(self) -> int:
        """Positions the exit layers have seen or will see before the next draft."""
        return self._exit_cached() + self.deferred_count

    def _exit_cached(self) -> int:
        return self.exit_cache.lengths[0] if self.head.num_layers else 0

    def _defer(self, hidden: torch.Tensor) -> None:
        """Layer-N states the exit layers have not run on yet. # [1, m, H]

        Rounds that draft nothing never need the exit layers; their inputs wait here and go
        through in one batched pass when drafting resumes, so plain steps cost no more than
        the target's own forward.
        """
        if self.head.num_layers:
            self.deferred.append(hidden)
            self.deferred_count += hidden.shape[1]

    def _flush(self) -> None:
        if self.deferred:
            backlog = torch.cat(self.deferred, dim=1)
            start = self._exit_cached()
            top = self._tops_before(start, backlog.shape[1]) if self.wants_top_states else None
            self.head.hidden(backlog, start, self.exit_cache, None, top)
            self.deferred, self.deferred_count = [], 0

    def _lower(
        self,
        token: int,
        position: int,
        cache: KVCache,
        draft: bool = True,
        stand_in: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Layers [0, N) on one token, and the exit layers if it is drafted from. # [1, 1, H]

        ``stand_in``: for a top-input head, the head's output at the previous position, read in
        place of the target's top state when that position is itself a draft.
        """
        x = self.adapter.embed(torch.tensor([token], device=self.adapter.device))
        rotary = self.adapter.rotary(x, position)
        h = self.adapter.run_layers(x, 0, self.shared_layers, cache, position, rotary)
        if not draft:
            self._defer(h)
            return h, None
        self._flush()
        top = None
        if self.wants_top_states:
            top = self.head.top_state(stand_in) if stand_in is not None else self._tops_before(position, 1)
        return h, self.head.hidden(h, position, self.exit_cache, rotary, top)

    def propose(self, pending: int, ctx: DraftContext) -> Proposal:
        greedy = ctx.sampling.greedy
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        hiddens: list[torch.Tensor] = []
        top1: list[float] = []
        entropies: list[float] = []
        token = pending
        exit_hidden = None
        go = ctx.ask(DraftStep(0, ctx.max_tokens, ctx.costs))
        while go:
            h, exit_hidden = self._lower(token, ctx.position + len(hiddens), ctx.cache, stand_in=exit_hidden)
            hiddens.append(h)
            logits = self.head.logits(exit_hidden)  # [1, V]
            check_finite(logits, "Draft")
            if greedy:
                probs = torch.softmax(logits[0].float(), dim=-1)
                token = int(logits[0].argmax())
            else:
                probs = process_logits(logits, ctx.sampling)[0]
                token = ctx.rng.categorical(probs)
                rows.append(probs)
            prob, top, entropy = confidence(probs, token)
            tokens.append(token)
            top1.append(top)
            entropies.append(entropy)
            go = ctx.ask(DraftStep(len(tokens), ctx.max_tokens, ctx.costs, token, prob, top, entropy))
        h, _ = self._lower(token, ctx.position + len(hiddens), ctx.cache, draft=False)
        hiddens.append(h)
        hidden = torch.cat(hiddens, dim=1)
        if self.wants_top_states and tokens:
            self.round_states, self.round_start = hidden, ctx.position
        return Proposal(
            tokens=torch.tensor(tokens, dtype=torch.long),
            q=torch.stack(rows) if rows else None,
            hidden=hidden,
            layers_done=self.shared_layers,
            top1=tuple(top1),
            entropies=tuple(entropies),
        )
