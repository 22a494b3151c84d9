"""A toy target the real engine drives: an n-gram model in tables, laid out like a transformer.

:class:`ToyModel` holds two next-token tables over a small vocabulary: ``target`` (what the full
model predicts) and ``draft`` (what its shallow layers predict, so an early exit drafts from q != p).
:class:`ToyAdapter` makes it a :class:`~eesd_core.protocols.ModelAdapter`: the hidden state of a
position is ``[depth, token, window...]``, each layer writes its token into its own cache slot and
rebuilds the context window from that cache, as attention would. Because a layer reads only its
cache, a cache that was not rolled back, or a layer run twice or skipped, changes p or raises
:class:`~eesd_core.testing.errors.ToyInvariantError` at once. Everything is float64, so exact
oracles can compare probabilities to 1e-12.

:class:`ToyDrafter` is an independent drafter (``shared_layers = 0``) that samples from the draft
table; with ``deterministic=True`` it proposes the draft table's argmax as a fixed draft (q = 1).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.config import PluginOptions
from eesd_core.protocols import IndependentDrafter, ModelAdapter, SamplingParams
from eesd_core.sampling import process_logits
from eesd_core.testing.errors import KitError, ToyInvariantError


def _log_table(probs: torch.Tensor, vocab: int, window: int) -> torch.Tensor:
    table = torch.as_tensor(probs, dtype=torch.float64)
    if table.shape != ((vocab + 1) ** window, vocab) or bool((table < 0).any()):
        raise KitError(
            f"A toy table must be [(V+1)^w, V] = {((vocab + 1) ** window, vocab)} of probabilities."
        )
    if bool((table.sum(-1) <= 0).any()):
        raise KitError("Every row of a toy table needs a positive entry: some token must be possible.")
    return table.log()  # [(V+1)^w, V], -inf where a token is impossible


class ToyModel:
    """An n-gram model: p(next | last ``window`` tokens), tokens before the start read as ``V``.

    ``target`` and ``draft`` are ``[(V+1)^window, V]`` tables of (unnormalised) probabilities;
    exact zeros make impossible tokens (logit -inf). ``num_layers`` is how deep the model pretends
    to be: hidden states that went through fewer layers predict from ``draft``.
    """

    def __init__(self, target: Any, draft: Any = None, *, window: int = 1, num_layers: int = 3) -> None:
        vocab = int(torch.as_tensor(target).shape[-1])
        if num_layers < 2 or window < 0 or vocab < 2:
            raise KitError("A toy model needs num_layers >= 2, window >= 0 and a vocabulary of >= 2 tokens.")
        self.vocab_size = vocab
        self.window = window
        self.num_layers = num_layers
        self.target = _log_table(target, vocab, window)
        self.draft = self.target if draft is None else _log_table(draft, vocab, window)
        self.config = SimpleNamespace(model_type="eesd_toy", max_position_embeddings=None)

    def __repr__(self) -> str:
        return f"ToyModel(V={self.vocab_size}, window={self.window}, L={self.num_layers})"

    def context(self, tokens: list[int]) -> list[int]:
        """The last ``window`` tokens, padded on the left with ``V``."""
        pad = [self.vocab_size] * max(0, self.window - len(tokens))
        return (pad + list(tokens))[len(pad) + len(tokens) - self.window :]

    def row(self, context: list[int]) -> int:
        index = 0
        for token in context:
            index = index * (self.vocab_size + 1) + int(token)
        return index

    def logits(self, tokens: list[int], draft: bool = False) -> torch.Tensor:
        """Next-token logits after ``tokens`` (the whole history). # [V]"""
        table = self.draft if draft else self.target
        return table[self.row(self.context(tokens))]

    def next_probs(self, tokens: list[int], sampling: SamplingParams) -> torch.Tensor:
        """p after ``tokens`` under ``sampling``: what plain autoregressive sampling draws from. # [V]"""
        return process_logits(self.logits(tokens)[None], sampling)[0]


class ToyAdapter:
    """:class:`~eesd_core.protocols.ModelAdapter` over a :class:`ToyModel`; checks invariants as it runs."""

    model_types = ("eesd_toy",)

    def __init__(self, model: ToyModel) -> None:
        self.model = model
        self.config = model.config
        self.model_type = "eesd_toy"
        self.num_layers = model.num_layers
        self.vocab_size = model.vocab_size
        self.hidden_size = 2 + model.window
        self.device = torch.device("cpu")
        self.dtype = torch.float64

    @classmethod
    def supports(cls, model: Any) -> bool:
        return isinstance(model, ToyModel)

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache:
        return KVCache(self.num_layers if num_layers is None else num_layers, capacity)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[m]`` ids to ``[1, m, H]`` (``[B, m]`` to ``[B, m, H]``): depth 0, the token, an
        unknown (-1) window."""
        rows = tokens.view(1, -1) if tokens.dim() == 1 else tokens
        hidden = torch.full((*rows.shape, self.hidden_size), -1.0, dtype=torch.float64)
        hidden[:, :, 0] = 0.0
        hidden[:, :, 1] = rows.to(torch.float64)
        return hidden

    def rotary(self, hidden: torch.Tensor, position: int | torch.Tensor) -> None:
        return None

    def run(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None = None,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Each layer writes its tokens into its cache and rebuilds each query's window from its
        own row's valid slots only (every slot of a dense pass); a query's position must be the
        number of its row's valid slots before it."""
        for layer in range(start, end):
            hidden = self._layer(hidden, layer, cache, positions, valid)
        return hidden

    def _layer(
        self, hidden: torch.Tensor, layer: int, cache: KVCache, positions: Any, valid: torch.Tensor | None
    ) -> torch.Tensor:
        rows, m = hidden.shape[:2]
        if not m:
            return hidden
        before = cache.lengths[layer]
        if valid is None:
            if before != int(positions):
                raise ToyInvariantError(
                    f"layer {layer} holds {before} cached tokens at position {int(positions)}: "
                    "the cache was not rolled back to the committed length."
                )
            valid = torch.ones(rows, before + m, dtype=torch.bool)
            positions = torch.arange(before, before + m).expand(rows, -1)
        total = valid.shape[1]
        depths = hidden[:, :, 0]
        if bool((depths != layer).any()):
            depth = int(depths[depths != layer][0])
            raise ToyInvariantError(
                f"layer {layer} received a hidden state that went through {depth} layers."
            )
        if before != total - m:
            raise ToyInvariantError(
                f"layer {layer} holds {before} slots before a pass over slots [{total - m}, {total}): "
                "the cache and its layout disagree (was it rolled back to the committed length?)."
            )
        ids = hidden[:, :, 1].reshape(rows, 1, m, 1)
        keys, _ = cache.update(ids, ids, layer)
        out = hidden.clone()
        out[:, :, 0] += 1
        for row in range(rows):
            seen = keys[row, 0, :, 0]
            for j in range(m):
                slot = total - m + j
                if not valid[row, slot]:  # padding: an empty context, read by no one
                    if self.model.window:
                        out[row, j, 2:] = torch.tensor(self.model.context([]), dtype=torch.float64)
                    continue
                if int(positions[row, j]) != int(valid[row, :slot].sum()):
                    raise ToyInvariantError(
                        f"row {row} slot {slot} is at position {int(positions[row, j])} but follows "
                        f"{int(valid[row, :slot].sum())} valid slots of its row."
                    )
                tokens = [int(t) for t in seen[: slot + 1][valid[row, : slot + 1]].tolist()]
                if self.model.window:
                    window = torch.tensor(self.model.context(tokens), dtype=torch.float64)
                    if layer and not torch.equal(window, hidden[row, j, 2:]):
                        raise ToyInvariantError(
                            f"layer {layer} sees another context than the layers before it."
                        )
                    out[row, j, 2:] = window
        return out

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., H]`` to ``[..., V]``: the target table after all layers, the draft table before."""
        if weight is not None:
            raise NotImplementedError("a toy model has no LM head: exit heads need a real model")
        rows = []
        for state in hidden.reshape(-1, hidden.shape[-1]):
            depth = int(state[0])
            if not 0 < depth <= self.num_layers:
                raise ToyInvariantError(f"logits asked of a hidden state at depth {depth}.")
            window = [int(t) for t in state[2:].tolist()]
            table = self.model.target if depth == self.num_layers else self.model.draft
            rows.append(table[self.model.row(window)])
        return torch.stack(rows).view(*hidden.shape[:-1], self.vocab_size)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        raise NotImplementedError("a toy model is tables: it has no LM head to share")

    def copy_layer(self, index: int, slot: int) -> torch.nn.Module:
        raise NotImplementedError("a toy model's layers are tables: there is nothing to copy")

    def copy_norm(self) -> torch.nn.Module:
        raise NotImplementedError("a toy model has no norm to copy")

    def run_copies(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError("a toy model's layers are tables: there are no copies to run")


class ToyDrafterOptions(PluginOptions):
    """``deterministic``: propose the draft table's argmax and pass ``q=None``, like prompt lookup."""

    deterministic: bool = False


class ToyDrafter(IndependentDrafter):
    """An independent drafter over a :class:`ToyModel`'s draft table (``shared_layers = 0``)."""

    def __init__(self, options: ToyDrafterOptions | None = None) -> None:
        self.deterministic = (options or ToyDrafterOptions()).deterministic

    def attach(self, adapter: ModelAdapter) -> None:
        if not isinstance(adapter.model, ToyModel):
            raise KitError("The toy drafter drafts only for a ToyModel target.")
        self.model = adapter.model

    def describe(self) -> str:
        return "the toy model's draft table" + (" (argmax)" if self.deterministic else "")

    def propose(self, history: torch.Tensor) -> torch.Tensor | tuple[int, ...]:
        logits = self.model.logits(history.tolist(), draft=True)  # [V]
        return (int(logits.argmax()),) if self.deterministic else logits
