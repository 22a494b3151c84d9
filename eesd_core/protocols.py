"""The contracts between the engine and its plug-ins, and the frozen records they exchange.

p is the target distribution, q the draft distribution, k the drafts of a round, n those accepted,
N the exit layer. How a round calls them, and each contract in detail: ``docs/protocols.md``.
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
    """Measured seconds, smoothed over recent rounds (``None`` until measured): ``draft_step`` a
    draft token, ``propose_base`` a round's drafting beyond its steps, ``verify(m)`` a target pass
    over m = k + 1 positions, at ``batch_size`` rows (times are the whole batch's); ``peek`` what
    drafting costs beyond the kept drafts when the last one was taken back."""

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
class Confidence:
    """How sure the drafter was of a draft: ``prob`` q(d) (``None`` before it is drawn), ``top1``
    max q, ``entropy`` of q in nats. A fixed draft is (1, 1, 0)."""

    prob: float | None
    top1: float
    entropy: float


FIXED = Confidence(1.0, 1.0, 0.0)


@dataclass(frozen=True)
class Request:
    """A generation as its controller learns of it; ``withdraws``: the engine will ask ``keep``."""

    prompt_length: int
    max_new_tokens: int
    max_draft_tokens: int
    sampling: SamplingParams
    costs: Costs
    batch_size: int = 1
    withdraws: bool = False


@dataclass(frozen=True)
class RoundStart:
    """A round begins: the batch ``rows`` taking part (0 alone), its ``costs``, its ``index``."""

    rows: tuple[int, ...]
    costs: Costs
    index: int = 0


@dataclass(frozen=True)
class DraftStep:
    """Before each draft of a row: ``index`` drafts made so far (0: none; False then makes a plain
    step), at most ``max_draft_tokens``; ``token`` and ``confidence`` describe the latest draft
    (for ``keep``: the draft about to be drawn, no token yet)."""

    index: int
    max_draft_tokens: int
    row: int = 0
    token: int | None = None
    confidence: Confidence | None = None


@dataclass(frozen=True)
class Withdrawn:
    """A draft taken back before it was drawn; ``acceptance``: sum_x min(p(x), q(x)), the chance it
    would have passed, read from the round's target pass (``None`` when an earlier draft failed)."""

    confidence: Confidence
    acceptance: float | None = None


@dataclass(frozen=True)
class RoundOutcome:
    """The one record of a row's round, for the controller, observers and stats: at ``position``
    (the pending token's) k = ``drafted`` drafts, n = ``accepted``, the n + 1 ``tokens`` committed
    (before any cut at EOS), what ``should_continue`` saw of each draft, the round's costs and times."""

    position: int
    drafted: int
    accepted: int
    tokens: tuple[int, ...]
    draft_time: float
    verify_time: float
    confidences: tuple[Confidence | None, ...] = ()  # None only where a replay recorded none
    costs: Costs = field(default_factory=Costs, compare=False)
    row: int = 0
    withdrawn: Withdrawn | None = None


@dataclass(frozen=True)
class Draft:
    """What :meth:`Drafter.step` proposes for the rows asked: ``logits`` ``[B, V]`` of q, or one
    tuple of fixed ``tokens`` per row (q = 1 each; taken one at a time while the controller agrees).
    An empty tuple proposes nothing."""

    logits: torch.Tensor | None = None  # [B, V]
    tokens: tuple[tuple[int, ...], ...] = ()


class Register(Protocol):
    """What a registration hook receives (:class:`~eesd_core.registry.Registrar`)."""

    def add(self, name: str, factory: Callable[..., Any], options: Any = None) -> None: ...


@runtime_checkable
class RandomSource(Protocol):
    """All randomness of a row; tests substitute one that enumerates outcomes exactly."""

    def bernoulli(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


@runtime_checkable
class Controller(Protocol):
    """Decides before each draft whether to draft it; learns from each round. ``start`` returns
    the generation's own state (generations may run at once, in several threads); ``withdraws =
    True`` promises ``keep(state, step) -> bool`` too (``docs/protocols.md``)."""

    def start(self, request: Request) -> Any: ...

    def begin_round(self, state: Any, round: RoundStart) -> None: ...

    def should_continue(self, state: Any, step: DraftStep) -> bool: ...

    def update(self, state: Any, outcomes: Sequence[RoundOutcome]) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """Accepts a prefix of each row's drafts so that the output follows p exactly: row b drafted
    ``drafts[b]`` ``[k_b]`` from ``qs[b]`` ``[k_b, V]`` (``None``: one-hot); ``p`` is ``[B, m, V]``.
    Returns (n_b, token_b) per row, drawing only from ``rngs[b]``."""

    def verify(
        self, drafts: Sequence[Any], qs: Sequence[Any], p: Any, rngs: Sequence[Any]
    ) -> list[tuple[int, int]]: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes drafts for the rows of a batch, one step at a time; the engine runs the loop.
    It runs the target's first ``shared_layers`` layers itself over the target's cache, keeps its
    per-generation state in what ``begin`` returns, and declares the capabilities ``withdraws``
    and ``batches``. Each member's contract: ``docs/protocols.md``."""

    shared_layers: int
    reads_top_states: bool
    withdraws: bool
    batches: bool

    def attach(self, adapter: ModelAdapter) -> None: ...

    def describe(self) -> str: ...

    def begin(self, cache: KVCache, layout: Any, hidden: torch.Tensor | None) -> Any: ...

    def step(
        self, state: Any, tokens: Any, slot: int, drafting: Sequence[bool], history: Sequence[Any]
    ) -> Draft: ...

    def finish(self, state: Any, tokens: torch.Tensor | None, slot: int) -> torch.Tensor | None: ...

    def top_states(self, state: Any, hidden: torch.Tensor, slot: int) -> None: ...

    def rollback(self, state: Any, slots: int) -> None: ...

    def relayout(self, state: Any, rows: torch.Tensor, index: torch.Tensor) -> None: ...


class IndependentDrafter:
    """A base for drafters that run no target layers and keep no state (prompt lookup, a table, a
    service): subclass it and write ``attach``, ``describe`` and ``propose(history)``, which
    returns one row's q logits ``[V]`` or a tuple of fixed tokens (empty: nothing to propose)."""

    shared_layers = 0
    reads_top_states = False
    withdraws = True
    batches = True

    def propose(self, history: torch.Tensor) -> torch.Tensor | tuple[int, ...]:
        raise NotImplementedError

    def _nothing(self, *args: Any) -> None:
        """Nothing to keep: such a drafter has no state and reads no target states."""

    begin = finish = top_states = rollback = relayout = _nothing

    def step(
        self, state: None, tokens: Any, slot: int, drafting: Sequence[bool], history: Sequence[Any]
    ) -> Draft:
        drafts = [self.propose(history[b]) if asked else () for b, asked in enumerate(drafting)]
        rows = [d for d in drafts if not isinstance(d, tuple)]
        if not rows:
            return Draft(tokens=tuple(tuple(d) for d in drafts))  # type: ignore[arg-type]
        import torch

        zeros = rows[0].new_zeros(rows[0].shape)
        return Draft(logits=torch.stack([zeros if isinstance(d, tuple) else d for d in drafts]))


REQUIRED = {
    "drafter": ("attach", "describe", "begin", "step", "finish", "top_states", "rollback", "relayout"),
    "controller": ("start", "begin_round", "should_continue", "update"),
    "verifier": ("verify",),
}
CAPABILITIES = {"drafter": ("withdraws", "batches"), "controller": ("withdraws",), "verifier": ()}


def contract_breaches(kind: str, component: Any) -> list[str]:
    """What a drafter, controller or verifier (a class or an instance) lacks of its protocol: a
    method, a declared capability that is not a bool, or ``keep`` for a controller that declares
    ``withdraws``."""
    missing = [
        f"no {name}()" for name in REQUIRED.get(kind, ()) if not callable(getattr(component, name, None))
    ]
    for name in CAPABILITIES.get(kind, ()):
        declared = getattr(component, name, False)
        if not isinstance(declared, bool) and not isinstance(component, type):
            missing.append(f"{name}={declared!r}, not a bool")
    withdraws = kind == "controller" and getattr(component, "withdraws", False) is True
    if withdraws and not callable(getattr(component, "keep", None)):
        missing.append("declares withdraws but has no keep()")
    return missing


@runtime_checkable
class ModelAdapter(Protocol):
    """One architecture's view of a causal LM (embed, layers [a, b), final norm, LM head),
    through which eesd does everything to a model, never changing it. Registered by hook
    ``eesd_register_model_adapters``; each member's contract: ``docs/protocols.md``."""

    model: Any
    config: Any
    model_type: str
    num_layers: int
    vocab_size: int
    hidden_size: int

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def lm_head_weight(self) -> torch.Tensor: ...

    def new_cache(self, num_layers: int | None = None, capacity: int = 64) -> KVCache: ...

    def embed(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def rotary(self, hidden: torch.Tensor, positions: int | torch.Tensor) -> Any: ...

    def run(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None = None,
        rotary: Any = None,
    ) -> torch.Tensor: ...

    def norm(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor: ...

    def copy_layer(self, index: int, slot: int) -> torch.nn.Module: ...

    def copy_norm(self) -> torch.nn.Module: ...

    def run_copies(
        self,
        layers: Any,
        hidden: torch.Tensor,
        cache: KVCache,
        positions: int | torch.Tensor,
        valid: torch.Tensor | None = None,
        rotary: Any = None,
    ) -> torch.Tensor: ...
