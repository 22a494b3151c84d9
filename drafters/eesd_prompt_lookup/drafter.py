"""The prompt-lookup drafter (``drafter="prompt_lookup"``).

Per round it looks for the longest suffix of the committed tokens, between ``max_ngram`` and
``min_ngram`` tokens long, that also occurs earlier, takes the most recent such occurrence and
proposes the tokens that followed it, one at a time while the controller agrees. The drafts are
deterministic (q = None: each had probability one), so the verifier's acceptance test stays exact at
any temperature.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from eesd_core.cache import KVCache
from eesd_core.config import PluginOptions
from eesd_core.protocols import DraftContext, DraftStep, ModelAdapter, Proposal


class PromptLookupOptions(PluginOptions):
    """``max_ngram``, ``min_ngram``: the longest and shortest suffix searched for, longest first.

    How many tokens a round copies is the controller's choice within the engine's draft cap.
    """

    max_ngram: int = Field(3, ge=1)
    min_ngram: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> PromptLookupOptions:
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")
        return self


def find_continuation(history: torch.Tensor, max_ngram: int, min_ngram: int, limit: int) -> list[int]:
    """Up to ``limit`` tokens that followed the most recent earlier occurrence of the longest suffix.

    ``history`` is ``[T]``. The suffix itself is not an occurrence; an occurrence may overlap it
    (in ``a b a b a`` the suffix ``a b a`` recurs at 0 and proposes ``b a``). Empty when no suffix
    of ``min_ngram`` or more tokens recurs.
    """
    length = int(history.shape[0])
    if limit <= 0:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = history[: length - 1].unfold(0, n, 1)  # [T - n, n], every start but the suffix's
        hits = (windows == history[length - n :]).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return history[start : start + limit].tolist()
    return []


class PromptLookupDrafter:
    """Copies continuations of repeated n-grams; keeps no state beyond the engine's history."""

    shared_layers = 0

    def __init__(self, options: PromptLookupOptions | None = None) -> None:
        self.options = options or PromptLookupOptions()

    def attach(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter

    def prefill(self, cache: KVCache, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        pass

    def rollback(self, length: int) -> None:
        pass

    def propose(self, pending: int, ctx: DraftContext) -> Proposal:
        tokens: list[int] = []
        if ctx.ask(DraftStep(0, ctx.max_tokens, ctx.costs)):
            found = find_continuation(
                ctx.history, self.options.max_ngram, self.options.min_ngram, ctx.max_tokens
            )
            for token in found:
                tokens.append(token)
                step = DraftStep(len(tokens), ctx.max_tokens, ctx.costs, token, 1.0, 1.0, 0.0)
                if len(tokens) == len(found) or not ctx.ask(step):
                    break
        k = len(tokens)
        return Proposal(
            tokens=torch.tensor(tokens, dtype=torch.long),
            q=None,
            hidden=None,
            layers_done=0,
            top1=(1.0,) * k,
            entropies=(0.0,) * k,
        )
