"""The contracts between the engine and its plug-ins, and the frozen records they exchange.

Notation (see :mod:`eesd_core.sampling`): p is the target distribution, q the draft distribution,
k the number of drafts in a round, n the number accepted, N the exit layer, L the number of layers.

A round, as the engine runs it (the one draft loop, :meth:`SpeculativeDecoder._draft`)::

    token = pending
    while controller.should_continue(DraftStep(i, ...)):   # asked before every draft, i = 0 first
        draft = drafter.step(state, token, position + i, history)   # q's logits, or fixed tokens
        if not controller.keep(DraftStep(i + 1, top-1, entropy of q)):  # optional; before sampling
            withdraw the step's draft; token = None; stop
        token = sample from q (or the next fixed token); record q(token), top-1, entropy
    hidden = drafter.finish(state, token, position + k)  # layer-N states of [pending, d_1..d_k]
    p = target layers [N, L) over hidden                 # [k+1, V]
    n, token = verifier.verify(drafts, q, p, rng)        # lossless acceptance
    commit d_1..d_n, token; roll every cache back; controller.update(outcome); observers see it

Tensors carry their shapes in comments: ``# [k, V]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

    ``draft_step`` is one draft token; ``propose_base`` what a round's drafting costs beyond its
    draft steps (for the early-exit drafter: pushing the last token through layers [0, N));
    ``verify`` maps a number of verified positions m = k + 1 to the cost of one target pass.
    ``batch_size``: how many rows share these rounds (their times are the whole batch's, so one
    row's longer round costs every row that time). ``peek``: what a round's drafting costs beyond
    its kept drafts when its last draft step was withdrawn (see :meth:`Controller.keep`): measured
    once a round withdrew, else modelled as ``draft_step - propose_base``.
    """

    draft_step: float | None = None
    propose_base: float | None = None
    verify: Callable[[int], float | None] = field(default=lambda m: None, compare=False)
    batch_size: int = 1
    measured_peek: float | None = None

    def round_time(self, k: int) -> float | None:
        """Modelled time of a round with k drafts (k = 0 is a plain decoding step)."""
        verify = self.verify(k + 1)
        if verify is None or self.propose_base is None or (k and self.draft_step is None):
            return None
        return self.propose_base + k * (self.draft_step or 0.0) + verify

    @property
    def plain_step(self) -> float | None:
        return self.round_time(0)

    @property
    def peek(self) -> float | None:
        if self.measured_peek is not None:
            return self.measured_peek
        if self.draft_step is None or self.propose_base is None:
            return None
        return max(self.draft_step - self.propose_base, 0.0)


@dataclass(frozen=True)
class Request:
    """What a controller learns about a generation when it starts. ``withdraws``: whether the
    engine will ask :meth:`Controller.keep` this generation (a drafter that can take a draft back,
    a controller that has ``keep``; alone or in a batch)."""

    prompt_length: int
    max_new_tokens: int
    max_draft_tokens: int
    sampling: SamplingParams
    costs: Costs
    batch_size: int = 1
    withdraws: bool = False


@dataclass(frozen=True)
class DraftStep:
    """Handed to ``Controller.should_continue`` before each draft token of a round.

    ``index`` drafts were made so far (0: none yet; answering False makes a plain decoding step);
    at most ``max_draft_tokens`` are allowed this round. For index > 0, ``token``, ``prob`` (its
    q), ``top1`` (max q) and ``entropy`` (of q, nats) describe the latest draft. ``row`` is the
    row of a batch the step belongs to (0 alone): in a batch the engine asks the rows in turn
    before each draft, so a controller keeps what it holds for a round per row.
    """

    index: int
    max_draft_tokens: int
    costs: Costs
    token: int | None = None
    prob: float | None = None
    top1: float | None = None
    entropy: float | None = None
    row: int = 0


@dataclass(frozen=True)
class RoundOutcome:
    """The one record of a round: the controller learns from it, observers and stats read it.

    At ``position`` (where the pending token sits) k = ``drafted`` drafts were made and n =
    ``accepted`` of them kept; ``tokens`` are the n + 1 tokens committed (before any cut at EOS or
    ``max_new_tokens``). ``probs``, ``top1`` and ``entropies`` hold, per draft, exactly what
    ``should_continue`` saw in its :class:`DraftStep`. ``costs`` are those the round started with
    (in a batch, those of its batch size, and the times are the whole batch round's); ``row`` is
    the row of the batch (0 alone). ``withdrawn`` describes a draft the controller took back
    (:meth:`Controller.keep`), ``None`` if it took none back; ``drafted`` does not count it.
    """

    position: int
    drafted: int
    accepted: int
    tokens: tuple[int, ...]
    draft_time: float
    verify_time: float
    probs: tuple[float, ...] = ()
    top1: tuple[float, ...] = ()
    entropies: tuple[float, ...] = ()
    costs: Costs = field(default_factory=Costs, compare=False)
    row: int = 0
    withdrawn: Withdrawn | None = None


@dataclass(frozen=True)
class Withdrawn:
    """A draft taken back before it was sampled: ``top1`` and ``entropy`` of its q, and
    ``acceptance``, the chance the verifier would have accepted a draft from that q, sum_x min(p(x),
    q(x)) (0 or 1 when greedy), read from the target pass the round made anyway; ``None`` when
    an earlier draft of the round was rejected, so that pass never reached its position."""

    top1: float
    entropy: float
    acceptance: float | None = None


@dataclass(frozen=True)
class Draft:
    """What one :meth:`Drafter.step` proposes: either ``logits`` ``[V]`` of q for the next draft
    (the engine samples it), or ``tokens``, fixed proposals for the next drafts (q = 1 each; the
    engine takes them one at a time while the controller agrees, and asks the drafter again only
    once they are used up). Neither (``Draft()``) means the drafter has nothing to propose."""

    logits: torch.Tensor | None = None  # [V]
    tokens: tuple[int, ...] = ()


@runtime_checkable
class RandomSource(Protocol):
    """All randomness of a generation; tests substitute one that enumerates outcomes exactly."""

    def bernoulli(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


@runtime_checkable
class Controller(Protocol):
    """Decides before each draft token whether to draft it; learns from each round.

    A controller lives as long as its decoder and may learn across generations; whatever it
    decides, the output distribution is unchanged (the engine caps drafts at ``max_draft_tokens``
    and the verifier is lossless).

    A controller may also have ``keep(step: DraftStep) -> bool``. When the request says
    ``withdraws``, the engine asks it after each draft step that returned logits and before
    sampling: ``step.index`` counts that draft, ``step.top1`` and ``step.entropy`` describe its q,
    ``token`` and ``prob`` are ``None``. False takes the draft back: the round ends with the drafts
    before it, and only a drafting step was spent on it, never a verified position. The answer may
    depend on q but not on a sampled token, so verification stays exact (a keep rule that read
    the token would select drafts by their value).
    """

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


class BatchVerifier(Verifier, Protocol):
    """A verifier that also verifies the rows of a batch round in one call, reading the device
    once rather than once per row: ``verify_batch(drafts, qs, p [B, m, V], rngs)`` returns, for
    each row b, what ``verify(drafts[b], qs[b], p[b, : k_b + 1], rngs[b])`` would, drawing from
    ``rngs[b]`` in the same order. The engine uses it when a verifier has it."""

    def verify_batch(
        self,
        drafts: Sequence[torch.Tensor],
        qs: Sequence[torch.Tensor | None],
        p: torch.Tensor,
        rngs: Sequence[RandomSource],
    ) -> list[tuple[int, int]]: ...


@runtime_checkable
class Drafter(Protocol):
    """Takes one draft step at a time; the engine runs the loop, samples, asks the controller.

    ``shared_layers`` is N, how many of the target's first layers the drafter runs itself over the
    target's own cache (0 for a drafter that needs no target layers). The engine runs those layers
    over the whole prompt and hands their output to ``begin``, which returns the drafter's state
    for one generation (every later call gets it back); the prefill then draws the first new token.

    In a round at ``position`` with pending token t_0, ``step(state, t_i, position + i, history)``
    feeds t_i (the pending token, then each draft) and proposes what follows; ``history`` ``[T]``
    holds every committed token and the drafts so far. ``finish(state, t_k, position + k)`` feeds
    the last token without drafting and returns the target's states after N layers for the k + 1
    inputs ``[1, k+1, H]`` (``None`` when N = 0): verification runs only layers [N, L) on them.
    A drafter whose ``withdraws`` attribute is true also takes ``finish(state, None, position +
    k)``: the controller took back what the latest step proposed, so every input was fed already.
    Before the round ends, ``rollback(state, length)`` cuts the drafter's state to the committed
    length. A drafter whose ``reads_top_states`` is true also gets ``top_states(state, hidden,
    position)``: the target's last-layer states ``[1, m, H]`` (before the final norm) of positions
    ``position ..``, after the prompt and after each verification, before ``rollback``.
    """

    shared_layers: int
    reads_top_states: bool

    def attach(self, adapter: ModelAdapter) -> None: ...

    def describe(self) -> str: ...

    def begin(self, cache: KVCache, prompt: torch.Tensor, hidden: torch.Tensor | None) -> Any: ...

    def step(self, state: Any, token: int, position: int, history: torch.Tensor) -> Draft: ...

    def finish(self, state: Any, token: int | None, position: int) -> torch.Tensor | None: ...

    def top_states(self, state: Any, hidden: torch.Tensor, position: int) -> None: ...

    def rollback(self, state: Any, length: int) -> None: ...


@runtime_checkable
class BatchDrafter(Drafter, Protocol):
    """A drafter that runs target layers and drafts for many rows in one pass per step.

    A batch shares one cache whose slots are columns (:class:`eesd_core.batch.BatchLayout`:
    ``layout.valid`` ``[B, capacity]`` marks the slots holding a key of each row, ``positions``
    their positions; pass both to ``ModelAdapter.run_batch``). ``begin_batch`` gets the layer-N
    states of the prompt slots ``[B, S, H]`` (``None`` if there are none). In a round starting at
    slot S, step i calls ``step_batch(state, tokens [B], S + i, drafting [B] bool)``: every row's
    token for that slot (the layout says which rows feed one) goes through layers [0, N), and the
    logits of q ``[B, V]`` are returned (read only for ``drafting`` rows). ``finish_batch(state,
    tokens, S + k)`` feeds the last slot without drafting and returns the layer-N states of slots
    [S, S + k] ``[B, k + 1, H]``; ``tokens`` is ``None`` when no row feeds that slot (every row
    that drafted last took its draft back), and then the states of slots [S, S + k) come back.
    ``top_states_batch(state, hidden [B, m, H], slot)`` hands over the last-layer states of slots
    ``slot ..`` (if ``reads_top_states``); the prefill's come as a buffer ``[B, capacity, H]``,
    zeros past the prompt, that the drafter may keep instead of copying (the engine does not touch
    it again); ``rollback_batch(state, slots)`` cuts back to ``slots``
    slots (the layout already marks what each row kept);
    ``relayout_batch(state, rows [B'], index [B', S'])`` keeps slot rows ``rows`` with new slot j
    of row b holding old slot ``index[b, j]`` (-1: empty), as the engine did to the cache.
    """

    def begin_batch(self, cache: KVCache, layout: Any, hidden: torch.Tensor | None) -> Any: ...

    def step_batch(
        self, state: Any, tokens: torch.Tensor, slot: int, drafting: torch.Tensor
    ) -> torch.Tensor: ...

    def finish_batch(self, state: Any, tokens: torch.Tensor | None, slot: int) -> torch.Tensor: ...

    def top_states_batch(self, state: Any, hidden: torch.Tensor, slot: int) -> None: ...

    def rollback_batch(self, state: Any, slots: int) -> None: ...

    def relayout_batch(self, state: Any, rows: torch.Tensor, index: torch.Tensor) -> None: ...


class IndependentDrafter:
    """A base for drafters that run no target layers and keep no state between steps (prompt
    lookup, a table, a service): subclass it and write ``attach``, ``describe`` and ``step``."""

    shared_layers = 0
    reads_top_states = False
    withdraws = True

    def begin(self, cache: KVCache, prompt: torch.Tensor, hidden: torch.Tensor | None) -> None:
        return None

    def finish(self, state: None, token: int | None, position: int) -> None:
        return None

    def top_states(self, state: None, hidden: torch.Tensor, position: int) -> None:
        """Never called: such a drafter reads no top states."""

    def rollback(self, state: None, length: int) -> None:
        """Nothing to cut: the engine's history is all such a drafter reads."""


@runtime_checkable
class ModelAdapter(Protocol):
    """One architecture's view of a causal LM: embed, layers [a, b), final norm, LM head.

    Everything eesd does to a model goes through these members, so a new architecture needs only
    an adapter (hook ``eesd_register_model_adapters``). The factory is called as
    ``factory(model)``, or ``factory(model, options)`` when it registered an options model, and
    must have a ``supports(model) -> bool`` class method. Shapes: B rows (sequences), m positions,
    H hidden size, V vocabulary. ``rotary`` is whatever :meth:`rotary` returned; callers only hand
    it back. The engine uses the one-sequence members and :meth:`prepare`; the exit head uses
    :meth:`copy_layer`, :meth:`copy_norm`, :meth:`run_copies`, :meth:`lm_logits` and
    ``lm_head_weight``; distillation uses :meth:`run_batch` and :meth:`lm_logits`. An adapter of a
    model that has no layers to copy (a table, say) may raise ``NotImplementedError`` from the exit
    head's and distillation's members.

    ``model``, ``config``: the wrapped model and its configuration; ``model_type`` names the
    architecture (it is recorded in exit-head files). ``products`` is the plan of the product of
    short passes chosen by :meth:`prepare` (``.describe() -> str``); an adapter with no choice to
    make keeps ``eesd_core.models.products.MatmulPlan()`` there and does nothing in ``prepare``.
    """

    model: Any
    config: Any
    model_type: str
    num_layers: int
    vocab_size: int
    hidden_size: int
    products: Any

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight ``[V, H]``."""
        ...

    def prepare(self, max_rows: int) -> None:
        """Get ready for passes over 1 .. ``max_rows`` positions (choose how they multiply);
        idempotent and cheap after the first call for a model. The adapter applies its choice
        itself, pass by pass, in :meth:`run_layers`, :meth:`run_batch` and :meth:`logits`."""
        ...

    # -- one sequence (the engine and the drafters) ------------------------------------------------

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache:
        """An empty cache for ``num_layers`` layers (default: all of the model's)."""
        ...

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``[m]`` to input states ``[1, m, H]``; ids ``[B, m]`` to ``[B, m, H]``."""
        ...

    def rotary(self, hidden: torch.Tensor, position: int | torch.Tensor) -> Any:
        """Position embeddings for ``hidden`` ``[B, m, H]`` at positions [position, position + m),
        or at per-row positions ``[B, m]``; passed back to the run methods to avoid recomputing."""
        ...

    def run_layers(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        position: int,
        rotary: Any = None,
    ) -> torch.Tensor:
        """Layers [start, end) over ``hidden`` ``[1, m, H]`` at positions from ``position`` (the
        length of those layers' cache), appending to ``cache``; returns ``[1, m, H]``."""
        ...

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm, ``[..., H]`` to ``[..., H]``."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed states ``[1, m, H]`` to the target's logits ``[m, V]``."""
        ...

    # -- batches (distillation; batched decoding) ---------------------------------------------------

    def lm_logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Normed states ``[..., H]`` to logits ``[..., V]``, through ``weight`` ``[V', H]`` instead
        of the LM head if given (a vocabulary subset), with whatever the model applies after its
        head (soft-capping)."""
        ...

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
        """Layers [start, end) over B sequences ``[B, m, H]`` at per-row ``positions`` ``[B, m]``.

        ``valid`` ``[B, total]`` marks the cache slots that hold a key of each row, this pass's m
        (the last m slots) included; a row's valid keys are its positions 0, 1, ... in slot order
        (left padding and gaps allowed). Each row computes what it would alone."""
        ...

    # -- an exit head --------------------------------------------------------------------------------

    def copy_layer(self, index: int, slot: int) -> torch.nn.Module:
        """A trainable copy of decoder layer ``index`` that writes slot ``slot`` of the cache it is
        run with, and keeps the kind of that layer (window, rotary)."""
        ...

    def copy_norm(self) -> torch.nn.Module:
        """A trainable copy of the final norm."""
        ...

    def run_copies(
        self,
        layers: Any,
        hidden: torch.Tensor,
        cache: KVCache,
        position: int | torch.Tensor,
        rotary: Any = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Copies made by :meth:`copy_layer`, in order, over ``hidden`` ``[B, m, H]`` at positions
        from ``position`` (every row alike), or with ``valid`` ``[B, total]`` at per-row positions
        ``[B, m]`` masked as :meth:`run_batch` masks; returns ``[B, m, H]``."""
        ...
