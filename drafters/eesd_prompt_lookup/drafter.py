"""The prompt-lookup drafter (``drafter="prompt_lookup"``).

Each draft step looks for the longest suffix of the committed tokens and the drafts so far,
between ``max_ngram`` and ``min_ngram`` tokens long, that also occurs earlier, takes the most recent
such occurrence and proposes the tokens that followed it as fixed drafts; the engine takes them one
at a time while the controller agrees. Fixed drafts have q = 1, so the verifier's acceptance test
stays exact at any temperature.
"""

from __future__ import annotations

import torch

from eesd_core.config import MAX_DRAFT_TOKENS_LIMIT
from eesd_core.protocols import IndependentDrafter, ModelAdapter
from eesd_prompt_lookup.options import PromptLookupOptions


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


class PromptLookupDrafter(IndependentDrafter):
    """Copies continuations of repeated n-grams; keeps no state beyond the engine's history."""

    def __init__(self, options: PromptLookupOptions | None = None) -> None:
        self.options = options or PromptLookupOptions()

    def attach(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter

    def describe(self) -> str:
        return f"prompt lookup of {self.options.min_ngram}..{self.options.max_ngram}-grams"

    def propose(self, history: torch.Tensor) -> tuple[int, ...]:
        o = self.options
        return tuple(find_continuation(history, o.max_ngram, o.min_ngram, MAX_DRAFT_TOKENS_LIMIT))
