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
from eesd_core.models.products import MatmulPlan
from eesd_core.protocols import Draft, IndependentDrafter, ModelAdapter, SamplingParams
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
        self.products = MatmulPlan()
        self.num_layers = model.num_layers
        self.vocab_size = model.vocab_size
        self.hidden_size = 2 + model.window
        self.device = torch.device("cpu")
        self.dtype = torch.float64

    @classmethod
    def supports(cls, model: Any) -> bool:
        return isinstance(model, ToyModel)

    def prepare(self, max_rows: int) -> None:
        """Tables have no products to choose."""

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

    def run_layers(
        self, hidden: torch.Tensor, start: int, end: int, cache: KVCache, position: int, rotary: Any = None
    ) -> torch.Tensor:
        for layer in range(start, end):
            hidden = self._layer(hidden, layer, cache, position)
        return hidden

    def _layer(self, hidden: torch.Tensor, layer: int, cache: KVCache, position: int) -> torch.Tensor:
        """Write the tokens into this layer's cache and rebuild each position's window from it."""
        if not hidden.shape[1]:
            return hidden
        depth = int(hidden[0, 0, 0])
        if depth != layer:
            raise ToyInvariantError(
                f"layer {layer} received a hidden state that went through {depth} layers."
            )
        if cache.lengths[layer] != position:
            raise ToyInvariantError(
                f"layer {layer} holds {cache.lengths[layer]} cached tokens at position {position}: "
                "the cache was not rolled back to the committed length."
            )
        ids = hidden[:, :, 1].reshape(1, 1, -1, 1)  # [1, 1, m, 1]
        keys, _ = cache.update(ids, ids, layer)
        seen = [int(t) for t in keys.view(-1).tolist()]
        windows = [self.model.context(seen[: position + j + 1]) for j in range(hidden.shape[1])]
        out = hidden.clone()
        out[0, :, 0] += 1
        if self.model.window:
            window = torch.tensor(windows, dtype=torch.float64)  # [m, w]
            if depth and not torch.equal(window, hidden[0, :, 2:]):
                raise ToyInvariantError(f"layer {layer} sees another context than the layers before it.")
            out[0, :, 2:] = window
        return out

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[1, m, H]`` to ``[m, V]``: the target table after all layers, the draft table before."""
        rows = []
        for state in hidden[0]:
            depth = int(state[0])
            if not 0 < depth <= self.num_layers:
                raise ToyInvariantError(f"logits asked of a hidden state at depth {depth}.")
            window = [int(t) for t in state[2:].tolist()]
            table = self.model.target if depth == self.num_layers else self.model.draft
            rows.append(table[self.model.row(window)])
        return torch.stack(rows)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        raise NotImplementedError("a toy model is tables: it has no LM head to share")

    def lm_logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., H]`` to ``[..., V]`` as :meth:`logits` reads each state; no other weight."""
        if weight is not None:
            raise NotImplementedError("a toy model has no LM head: exit heads need a real model")
        flat = hidden.reshape(1, -1, hidden.shape[-1])
        return self.logits(flat).view(*hidden.shape[:-1], self.vocab_size)

    def run_batch(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        positions: torch.Tensor,
        valid: torch.Tensor,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Rows of a batch ``[B, m, H]``: each query's window is rebuilt from its own row's valid
        slots only, and its position must be the number of those before it."""
        for layer in range(start, end):
            hidden = self._batch_layer(hidden, layer, cache, positions, valid)
        return hidden

    def _batch_layer(
        self, hidden: torch.Tensor, layer: int, cache: KVCache, positions: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        rows, m = hidden.shape[:2]
        if not m:
            return hidden
        total = valid.shape[1]
        if bool((hidden[:, :, 0] != layer).any()):
            raise ToyInvariantError(f"layer {layer} received hidden states that went through other layers.")
        if cache.lengths[layer] != total - m:
            raise ToyInvariantError(
                f"layer {layer} holds {cache.lengths[layer]} slots before a pass over slots "
                f"[{total - m}, {total}): the batch cache and its layout disagree."
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
                before = valid[row, :slot]
                if int(positions[row, j]) != int(before.sum()):
                    raise ToyInvariantError(
                        f"row {row} slot {slot} is at position {int(positions[row, j])} but follows "
                        f"{int(before.sum())} valid slots of its row."
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

    def step(self, state: None, token: int, position: int, history: torch.Tensor) -> Draft:
        logits = self.model.logits(history.tolist(), draft=True)  # [V]
        if self.deterministic:
            return Draft(tokens=(int(logits.argmax()),))
        return Draft(logits=logits)
