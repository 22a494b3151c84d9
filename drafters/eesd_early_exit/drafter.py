"""The early-exit drafter (``drafter="early_exit"``).

Per round, with pending token t_0 at position P: for i = 0, 1, ... it runs layers [0, N) on t_i
(writing the shared cache at P + i), the exit head on the result (writing its own cache), and draws
d_{i+1} from q; the controller is asked before each draft. The last draft d_k goes through layers
[0, N) only: its layer-N state waits (with those of rounds that drafted nothing) until the exit
layers next run, in one batched pass. So every cache, counting what waits, holds all k + 1 inputs,
and one crop to the committed length restores the invariant whatever is accepted.
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

    def prefill(self, cache: KVCache, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.exit_cache = self.head.new_cache()
        self.deferred = []
        self.deferred_count = 0
        if hidden is not None and hidden.shape[1]:
            self._defer(hidden)

    def rollback(self, length: int) -> None:
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
            self.head.hidden(backlog, self._exit_cached(), self.exit_cache, None)
            self.deferred, self.deferred_count = [], 0

    def _lower(
        self, token: int, position: int, cache: KVCache, draft: bool = True
    ) -> tuple[torch.Tensor, Any]:
        """Layers [0, N) on one token, and the exit layers if it is drafted from. # [1, 1, H]"""
        x = self.adapter.embed(torch.tensor([token], device=self.adapter.device))
        rotary = self.adapter.rotary(x, position)
        h = self.adapter.run_layers(x, 0, self.shared_layers, cache, position, rotary)
        if not draft:
            self._defer(h)
            return h, None
        self._flush()
        return h, self.head.hidden(h, position, self.exit_cache, rotary)

    def propose(self, pending: int, ctx: DraftContext) -> Proposal:
        greedy = ctx.sampling.greedy
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        hiddens: list[torch.Tensor] = []
        top1: list[float] = []
        entropies: list[float] = []
        token = pending
        go = ctx.ask(DraftStep(0, ctx.max_tokens, ctx.costs))
        while go:
            h, exit_hidden = self._lower(token, ctx.position + len(hiddens), ctx.cache)
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
        return Proposal(
            tokens=torch.tensor(tokens, dtype=torch.long),
            q=torch.stack(rows) if rows else None,
            hidden=torch.cat(hiddens, dim=1),
            layers_done=self.shared_layers,
            top1=tuple(top1),
            entropies=tuple(entropies),
        )
