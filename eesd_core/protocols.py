"""The contracts between the engine and its plug-ins, and the frozen records they exchange.

Notation (see :mod:`eesd_core.sampling`): p is the target distribution, q the draft distribution,
k the number of drafts in a round, n the number accepted, N the exit layer, L the number of layers.

A round, as the engine runs it::

    proposal = drafter.propose(pending, ctx)      # k drafts; ctx.ask(step) consults the controller
    p = target over [pending, d_1..d_k]           # [k+1, V], from proposal.hidden when layers_done > 0
    n, token = verifier.verify(drafts, q, p, rng) # lossless acceptance
    commit d_1..d_n, token; roll every cache back to the committed length

Tensors carry their shapes in comments: ``# [k, V]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from eesd_core.cache import KVCache


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution; the same for p and q so that verification is exact."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Costs:
    """Measured costs in seconds, smoothed over recent rounds; ``None`` until first measured.

    ``draft_step`` is one draft token; ``propose_base`` what a proposal costs beyond its draft
    steps (for the early-exit drafter: pushing the last token through layers [0, N));
    ``verify`` maps a number of verified positions m = k + 1 to the cost of one target pass.
    """

    draft_step: float | None = None
    propose_base: float | None = None
    verify: Callable[[int], float | None] = field(default=lambda m: None, compare=False)

    def round_time(self, k: int) -> float | None:
        """Modelled time of a round with k drafts (k = 0 is a plain decoding step)."""
        verify = self.verify(k + 1)
        if verify is None or self.propose_base is None or (k and self.draft_step is None):
            return None
        return self.propose_base + k * (self.draft_step or 0.0) + verify

    @property
    def plain_step(self) -> float | None:
        return self.round_time(0)


@dataclass(frozen=True)
class Request:
    """What a controller and a drafter learn about a generation when it starts."""

    prompt_length: int
    max_new_tokens: int
    max_draft_tokens: int
    sampling: SamplingParams
    costs: Costs


@dataclass(frozen=True)
class DraftStep:
    """Handed to ``Controller.should_continue`` before each draft token of a round.

    ``index`` drafts were made so far (0: none yet; answering False makes a plain decoding step).
    For index > 0, ``token``, ``prob`` (its q), ``top1`` (max q) and ``entropy`` (of q, nats)
    describe the latest draft.
    """

    index: int
    max_tokens: int
    costs: Costs
    token: int | None = None
    prob: float | None = None
    top1: float | None = None
    entropy: float | None = None


@dataclass(frozen=True)
class RoundOutcome:
    """Handed to ``Controller.update`` after verification: k drafted, n accepted."""

    drafted: int
    accepted: int
    probs: tuple[float, ...]
    top1: tuple[float, ...]
    entropies: tuple[float, ...]
    draft_time: float
    verify_time: float
    costs: Costs


@dataclass(frozen=True)
class Proposal:
    """A drafter's answer for one round.

    ``tokens`` are the k drafts; ``q`` the distributions they were sampled from, or ``None`` for a
    deterministic drafter (each draft had q = 1). ``hidden`` holds the target's hidden states after
    ``layers_done`` layers for the k + 1 inputs [pending, d_1..d_k], so the target only runs the rest;
    with ``layers_done == 0`` it may be ``None``.
    """

    tokens: torch.Tensor  # [k] long
    q: torch.Tensor | None  # [k, V]
    hidden: torch.Tensor | None  # [1, k+1, H]
    layers_done: int
    top1: tuple[float, ...] = ()
    entropies: tuple[float, ...] = ()

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class DraftContext:
    """What the engine lends a drafter for one ``propose`` call."""

    position: int
    max_tokens: int
    sampling: SamplingParams
    rng: RandomSource
    ask: Callable[[DraftStep], bool]
    costs: Costs
    cache: KVCache
    history: torch.Tensor  # [T] long, every committed token, the pending one last


@runtime_checkable
class RandomSource(Protocol):
    """All randomness of a generation; tests substitute one that enumerates outcomes exactly."""

    def bernoulli(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


@runtime_checkable
class Controller(Protocol):
    """Decides after each draft token whether to draft another; learns from each round."""

    def start(self, request: Request) -> None: ...

    def should_continue(self, step: DraftStep) -> bool: ...

    def update(self, outcome: RoundOutcome) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """Accepts a prefix of the drafts so that the output follows p exactly; returns (n, token)."""

    def verify(
        self,
        draft_tokens: torch.Tensor,  # [k]
        q: torch.Tensor | None,  # [k, V]
        p: torch.Tensor,  # [k+1, V]
        rng: RandomSource,
    ) -> tuple[int, int]: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens; keeps its own state at the committed length.

    ``shared_layers`` is how many of the target's first layers the drafter runs itself over the
    target's own cache (N for the early-exit drafter, 0 for an independent one). The engine runs
    those layers over the prompt and hands their output to ``prefill``.

    Optional: a drafter whose ``wants_top_states`` is true also gets
    ``top_states(hidden, position)``, the target's last-layer states ``[1, m, H]`` (before the final
    norm) at positions ``position .. position + m - 1``: those of the prompt after prefill, and
    those of [pending, d_1..d_k] after each verification, before ``rollback``. They cost nothing
    extra: the target computes them anyway.
    """

    shared_layers: int

    def attach(self, adapter: ModelAdapter) -> None: ...

    def prefill(self, cache: KVCache, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None: ...

    def propose(self, pending: int, ctx: DraftContext) -> Proposal: ...

    def rollback(self, length: int) -> None: ...


@runtime_checkable
class ModelAdapter(Protocol):
    """One architecture's view of a causal LM: embed, layers [a, b), final norm, LM head."""

    model: Any
    config: Any
    num_layers: int
    vocab_size: int
    hidden_size: int

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def mask(
        self, queries: int, position: int, window: int | None, like: torch.Tensor
    ) -> torch.Tensor | None: ...

    def call_layer(
        self, layer: Any, hidden: torch.Tensor, mask: torch.Tensor | None, rotary: Any, cache: KVCache
    ) -> torch.Tensor: ...

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache: ...

    def embed(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def rotary(self, hidden: torch.Tensor, position: int) -> Any: ...

    def run_layers(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        position: int,
        rotary: Any = None,
    ) -> torch.Tensor: ...

    def norm(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...
