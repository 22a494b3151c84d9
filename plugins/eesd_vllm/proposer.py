"""The eesd early-exit proposer for vLLM's ``custom_class`` speculative method.

vLLM calls :meth:`EarlyExitProposer.propose` once per engine step with, for each request of the
step (in the step's order, which changes as requests come and go), the tokens it just sampled, how
many tokens the request holds and all of them. It sees no request ids, no attention metadata and
no hidden states, and the target's own layers cannot be called from here; so the proposer keeps
its own copy of the target's first N layers and the exit head (loaded from the checkpoint vLLM
serves, through eesd's adapters), with its own cache of those layers per request.

**Top states.** A top-input head also reads the target's last-layer state of the previous
position. vLLM hands a proposer its model in ``load_model``; when vLLM runs that model eagerly
(``enforce_eager=True``), the proposer hooks it: the model's positions and its final norm's input
(the last-layer states before the norm) are kept at every forward pass, with the step's
``query_start_loc``, which says which tokens are whose. ``propose`` then stores, per request, the
states of the positions the step fed and vLLM committed (rejected drafts' states are dropped), in
records matched by token prefix like the caches. A request whose record lacks a position (its
prompt partly served from vLLM's prefix cache by a request since gone) drafts nothing. A compiled
model is not hooked, so there a top-input head is refused at start, and ``head="auto"`` takes a
head that reads layer N alone.

**Which cache is whose.** A cache of layers [0, N) is a function of the tokens it has seen, so the
proposer keys caches by their tokens, not by request: each row of a step takes the free cache that
shares the longest prefix with the row's tokens, cuts it to that prefix and runs the rest. That
follows vLLM's request lifecycle without being told it: a continued request finds its own cache
and the cut rolls back the drafts vLLM rejected (accepted ones are reused); a new request starts
empty (or from a request with the same prompt); a finished request's cache is left unclaimed and
dropped; a preempted and recomputed request finds its cache if it is still there, else rebuilds.
A row first tries the cache it claimed last step, which is its own while the tokens it had then
are a prefix of its tokens now (vLLM keeps a running request on its row): one comparison instead
of a search, and a request that has drafted nothing, whose cache is empty and shares no prefix,
keeps it (and the controller does not see a new request at every step).

**Drafting.** For each row the controller (Thompson by default) decides before every draft token,
zero included, from what it learnt of acceptance and from the measured costs: this proposer's own
time, and the time vLLM takes between two calls, which is its verification pass. It sees each
request as a generation of one row whose rounds are vLLM's steps, through a
:class:`~eesd_core.control.Control` of its own, as eesd's engine shows it its rounds. Every step is
reported to it, plain ones too (a controller that learns costs by k needs both), and the first
costs it sees are not a cold call's: the proposer drafts twice for throwaway requests when it
loads. A row that drafts nothing this step costs nothing: the tokens its cache lacks wait until it
next drafts. Catching up on no more than a round's tokens (the last draft vLLM kept: drafting every
step is what makes it run each step) runs in the pass of the round's first draft step, for all the
rows drafting together, and is charged to the step's drafts; a longer backlog (a prompt, a stretch
of plain steps) happens once, runs in a pass of its own and is not charged. The last draft of a
round is not fed through layers [0, N): if vLLM keeps it, it runs with the next tokens vLLM
commits. A gate (:mod:`eesd_vllm.gate`, option ``guard``) lets no row draft at a batch size where
steps that drafted were measured slower than plain ones would have been, probing rarely.

The rows that draft do so together, one pass of layers [0, N) and the head per draft step
for all of them (the drafter's batch path over their caches, joined for the round), and a row the
controller stops takes no more drafts. Drafts are the exit head's argmax. A controller that
declares ``withdraws`` (the Thompson controller does) is shown each draft's confidence before the
draft is proposed and may take it back; whether vLLM would have accepted it is read from the next
step's tokens when every draft before it was accepted: the token vLLM sampled at its position.

**Lossless.** vLLM's rejection sampler treats drafts given as token ids alone as drawn from a
one-hot q on each draft: at temperature 0 a draft is kept iff it is the target's argmax, and at
temperature > 0 draft d is kept with probability p(d) and a rejection samples from
norm(max(0, p - onehot(d))). A drafter whose draft is a deterministic function of the context, as
this argmax is, has exactly that q, so the output distribution is the target's: plain sampling.
Taking a draft back changes only how many drafts vLLM sees, which any controller may choose.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eesd_core.cache import BatchLayout
from eesd_core.control import Control, RowDrafts, row_outcome
from eesd_core.costs import CostBook, CostTracker
from eesd_core.devices import HOST
from eesd_core.errors import ConfigError
from eesd_core.guards import Guarded
from eesd_core.protocols import Confidence, Request, SamplingParams
from eesd_core.sampling import confidence
from eesd_vllm.fixes import repair_cpu_expand
from eesd_vllm.gate import DraftGate
from eesd_vllm.options import ProposerOptions, read_options

GREEDY = SamplingParams()
BATCH_ROWS = 16  # passes over up to this many positions have products decided at start
LARGEST_BUCKET = 64  # steps of more requests share the costs and the gate of 64
HEADS = Path(__file__).resolve().parent / "heads"


def _capturing() -> bool:
    """Whether a CUDA graph is being captured (no reading tensors back then; and a graph's
    replays run no hooks, so passes inside graphs go unseen)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _bucket(rows: int) -> int:
    """The batch size whose costs and gate a step of ``rows`` requests shares: ``rows`` rounded
    up to a power of two (as a :class:`~eesd_core.costs.CostBook` rounds it), at most 64."""
    return 1 << (max(min(rows, LARGEST_BUCKET), 1) - 1).bit_length()


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _owns(entry: RequestCache, tokens: np.ndarray) -> bool:
    """Whether the request with ``tokens`` is the one that claimed ``entry`` last step (or one with
    the same tokens): its tokens then are a prefix of ``tokens``."""
    seen = entry.seen
    return seen is not None and len(seen) <= len(tokens) and np.array_equal(seen, tokens[: len(seen)])


@dataclass
class TopRecord:
    """The target's last-layer states of a request's committed positions, from vLLM's passes."""

    tokens: np.ndarray  # the tokens at those positions, position t at t
    states: torch.Tensor  # [capacity, H]: position t's state at t, for t < len(tokens)
    idle: int = 0  # steps since a pass last fed it

    def write(self, first: int, tokens: np.ndarray, states: torch.Tensor) -> None:
        """Positions ``first ..``: ``tokens`` and their ``states`` (``first`` <= what it holds)."""
        end = first + len(states)
        if self.states.shape[0] < end:
            grown = self.states.new_zeros(max(2 * end, 64), self.states.shape[1])
            grown[:first] = self.states[:first]
            self.states = grown
        self.states[first:end] = states
        self.tokens = np.concatenate([self.tokens[:first], tokens])
        self.idle = 0


@dataclass
class RequestCache:
    """The proposer's part of one request: its layers-[0, N) cache and the tokens in it, and the
    controller's view of its rounds (one round per engine step)."""

    state: Any  # the early-exit drafter's one-row ExitState (shared cache and exit cache)
    tokens: np.ndarray  # token ids the caches hold, position t at t
    control: Control
    round: RowDrafts = field(default_factory=RowDrafts)  # proposed last step, after ``committed``
    committed: int = 0  # the request's length when those drafts were proposed (0: no round yet)
    seen: np.ndarray | None = None  # the committed tokens of the request that claimed it last step


class _Histories(Sequence[torch.Tensor]):
    """Each row's committed tokens and drafts so far ``[T]``, built only if the drafter reads them."""

    def __init__(self, tokens: list[np.ndarray], drafts: list[RowDrafts]) -> None:
        self.tokens, self.drafts = tokens, drafts

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, j: Any) -> Any:
        both = np.concatenate([self.tokens[j], np.asarray(self.drafts[j].tokens, dtype=self.tokens[j].dtype)])
        return torch.as_tensor(both, dtype=torch.long)


class EarlyExitProposer:
    """A vLLM ``custom_class`` proposer drafting with the target's first N layers and an exit head.

    ``speculative_config={"method": "custom_class", "model": "eesd_vllm.EarlyExitProposer",
    "num_speculative_tokens": K}``; options in ``EESD_VLLM_OPTIONS`` (:mod:`eesd_vllm.options`).
    """

    def __init__(self, vllm_config: Any, options: ProposerOptions | None = None) -> None:
        self.options = options or read_options()
        spec = vllm_config.speculative_config
        model_config = vllm_config.model_config
        self.max_k = int(spec.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        self.path = str(model_config.model)
        dtype = self.options.dtype
        self.dtype = model_config.dtype if dtype == "auto" else getattr(torch, dtype)
        self.caches: list[RequestCache] = []
        self.records: list[TopRecord] = []
        self._held: dict[int, RequestCache] = {}  # row -> the cache it claimed last step
        self._kept: dict[int, TopRecord] = {}  # row -> the record it was given last step
        self.eager = bool(getattr(model_config, "enforce_eager", True))
        self._forward: tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor] | None = None
        self._positions: tuple[torch.Tensor, torch.Tensor] | None = None
        self.costs = CostBook(self.max_k)  # per batch size (``_bucket``)
        # rows, most drafts, propose seconds, end, whether a row with the most drafts took one
        # back, and the positions the next pass verifies at most
        self._previous: tuple[int, int, float, float, bool, int] | None = None
        self._starts: np.ndarray | None = None  # where each request's tokens start in vLLM's last pass
        # the previous step's rows (cache, length then) when some request drafted in it
        self._scored: list[tuple[RequestCache, int, int]] | None = None
        self._spent = 0.0
        self.gate = DraftGate(**self.options.guard_options.model_dump()) if self.options.guard else None
        self.repaired = repair_cpu_expand()
        self.stats: dict[str, float] = dict(
            steps=0,
            rows=0,
            drafted=0,
            accepted=0,
            withdrawn=0,
            rounds_with_drafts=0,
            joined_rounds=0,
            caught_together=0,  # rows of joined rounds that caught up in the round's joined pass
            without_top_states=0,
            gated=0,  # steps in which the gate let no request draft
            prefill_passes=0,  # passes that also ran prompts: not measured
            seconds=0.0,
        )
        self._load()

    # -- set-up ---------------------------------------------------------------------------------

    def _load(self) -> None:
        """The target's checkpoint once, then only layers [0, N), embeddings, norm and LM head kept."""
        from transformers import AutoModelForCausalLM

        from eesd_core.config import validate
        from eesd_core.errors import HeadError
        from eesd_core.models import find_adapter
        from eesd_core.registry import get_manager

        registry = get_manager().registry
        entry = registry("controller").get(self.options.controller)  # a typo fails before loading
        if entry.options is None:
            self.controller = entry.factory()
        else:
            options = validate(entry.options, self.options.controller_options, "controller options")
            self.controller = entry.factory(options)
        head = self.options.head
        if head not in (None, "auto") and not Path(head).is_file():
            raise ConfigError(f"eesd proposer: no exit-head file at {str(head)!r}.")
        try:
            model = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"eesd proposer: cannot load {self.path!r} through transformers: {exc}"
            ) from None
        self.adapter = find_adapter(model.eval())
        self.guard = Guarded(self.adapter.vocab_size, "early_exit", self.options.controller, "vllm")
        self.guard.check_contract("controller", self.controller)
        drafters = registry("drafter").get("early_exit")
        # "auto": where vLLM runs eagerly, the drafter's own shipped head (which may read the
        # target's top states); then this package's heads, which read layer N alone
        candidates: list[Any] = [head]
        if head == "auto":
            candidates = (["auto"] if self.eager else []) + [*self._shipped_heads(), None]
        for candidate in candidates:
            chosen = {
                "exit_layer": self.options.exit_layer,
                "head": None if candidate is None else str(candidate),
            }
            self.drafter = drafters.factory(validate(drafters.options, chosen, "early-exit options"))
            try:
                self.drafter.attach(self.adapter)
            except HeadError:
                if head != "auto":
                    raise
                continue
            if candidate != "auto" or self.drafter.head_path is not None:
                break  # the drafter's "auto" found no shipped head: try the others
        if self.drafter.reads_top_states and not self.eager:
            raise ConfigError(
                f"eesd proposer: the exit head {head} reads the target's last-layer states, which the "
                "proposer reads from vLLM's model only when vLLM runs it eagerly: start vLLM with "
                "enforce_eager=True (--enforce-eager), or use a head distilled without --top-input, "
                "the untrained exit (head=null), or head='auto'."
            )
        if not hasattr(self.drafter, "extend"):
            raise ConfigError("eesd proposer: this early-exit drafter cannot take states it did not run.")
        for layer in model.model.layers[self.drafter.shared_layers :]:
            layer.to("meta")  # never run here: vLLM verifies with its own copy
        self.kept_bytes = sum(
            p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta"
        )
        self.kept_bytes += sum(p.numel() * p.element_size() for p in self.drafter.head.parameters())
        self._warm_up()

    def _warm_up(self) -> None:
        """Two throwaway requests drafting alone and together, so that the first costs the
        controller measures are not those of a cold first call (which, measured once, would
        keep it from ever drafting). First, on a CPU, the products of passes over up to
        ``BATCH_ROWS`` positions (requests x inputs) are decided, timing the layers kept here,
        so that no step of the engine waits on a timing."""
        hidden, drafter = self.adapter.hidden_size, self.drafter
        with torch.inference_mode():
            if self.adapter.products is not None:
                self.adapter.products.product(BATCH_ROWS)
            entries = []
            for length in (9, 6):
                state = self._new_state()
                if drafter.reads_top_states:
                    size = (1, 16, hidden)
                    state.tops = torch.zeros(size, dtype=self.adapter.dtype, device=self.adapter.device)
                tokens = np.arange(1, length + 1) % self.adapter.vocab_size
                self._lower(state, tokens[:-1], 0)
                entries.append((state, tokens))
            (state, tokens), (other, _) = entries
            position, one = len(tokens) - 1, torch.ones(1, dtype=torch.long)
            history = _Histories([tokens], [RowDrafts()])
            for i in range(2):
                drafter.step(state, one, position + i, [True], history)
            drafter.finish(state, None, position + 2)
            state.cache.crop(position)
            drafter.rollback(state, position)
            joined = drafter.join([other, state], extra=3)
            width, both = joined.layout.slots, [True, True]
            histories = _Histories([entries[1][1], tokens], [RowDrafts(), RowDrafts()])
            for i in range(2):
                joined.layout.mark(width + i, both, [len(entries[1][1]) - 1 + i, position + i])
                drafter.step(joined, torch.ones(2, dtype=torch.long), width + i, both, histories)
            drafter.finish(joined, None, width + 2)

    def _new_state(self) -> Any:
        """A request's drafter state: one row laid out densely (slot = position) over a cache of
        layers [0, N) of its own."""
        cache = self.adapter.new_cache(num_layers=self.drafter.shared_layers)
        layout = BatchLayout(1, self.max_model_len, self.adapter.device)
        return self.drafter.begin(cache, layout, None)

    def _shipped_heads(self) -> list[Path]:
        """Heads shipped with this package that fit the model's shape and the asked exit layer
        (attaching one checks the weights' fingerprint too)."""
        from safetensors import safe_open

        adapter, fitting = self.adapter, []
        shape = {
            "architecture": adapter.model_type,
            "hidden_size": str(adapter.hidden_size),
            "vocab_size": str(adapter.vocab_size),
            "num_target_layers": str(adapter.num_layers),
        }
        for path in sorted(HEADS.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
            layer = int(metadata.get("exit_layer", -1))
            if all(metadata.get(k) == v for k, v in shape.items()) and self.options.exit_layer in (
                None,
                layer,
            ):
                fitting.append(path)
        return fitting

    def load_model(self, target_model: Any) -> None:
        """vLLM hands over its own model; the proposer keeps its copy (vLLM's layers cannot be
        called outside vLLM's forward context). It hooks the model to see where each request's
        tokens start in every pass (a pass that also ran some request's prompt is no measure of a
        step) and, for a top-input head, to read the last-layer states of every pass."""
        norm = getattr(getattr(target_model, "model", None), "norm", None)
        if self.drafter.reads_top_states and not isinstance(norm, torch.nn.Module):
            raise ConfigError(
                f"eesd proposer: vLLM's {type(target_model).__name__} has no model.norm to read the "
                "last-layer states from: use a head distilled without --top-input or head=null."
            )
        if isinstance(target_model, torch.nn.Module):
            target_model.register_forward_pre_hook(self._see_pass, with_kwargs=True)
        if self.drafter.reads_top_states:
            norm.register_forward_hook(self._see_states)

    def _see_pass(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each of vLLM's passes: where each request's tokens start (``query_start_loc``,
        padding left out) and, for a top-input head, the tokens' ids and positions."""
        from vllm.forward_context import get_forward_context, is_forward_context_available

        self._starts, self._positions = None, None
        if not is_forward_context_available() or _capturing():
            return
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):
            return  # none, or split micro-batches: not read
        starts = next((getattr(m, "query_start_loc", None) for m in metadata.values()), None)
        if not isinstance(starts, torch.Tensor) or not starts.numel():
            return
        self._starts = starts.cpu().numpy().astype(np.int64)
        if self.drafter.reads_top_states:
            ids = kwargs.get("input_ids", args[0] if args else None)
            positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
            if isinstance(ids, torch.Tensor) and isinstance(positions, torch.Tensor):
                self._positions = (ids, positions)

    def _see_states(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        """The final norm's input, the last-layer states (with a residual, vLLM's norm adds it
        first and returns the sum second), and which tokens are whose."""
        inputs, self._positions = self._positions, None
        if inputs is None or self._starts is None:
            return
        ids, positions = inputs
        states = output[1] if isinstance(output, tuple) and len(output) > 1 else args[0]
        starts = self._starts
        used = int(starts[-1])
        self.observe_forward(ids[:used].cpu().numpy(), positions[:used].cpu().numpy(), starts, states[:used])

    def observe_forward(
        self, ids: np.ndarray, positions: np.ndarray, starts: np.ndarray, states: torch.Tensor
    ) -> None:
        """What vLLM's pass of this step computed: each token's id and position, where each
        request's tokens start (``query_start_loc``, one more entry than requests) and the
        last-layer states ``[tokens, H]`` before the final norm."""
        self._forward = (
            np.asarray(ids, dtype=np.int64),
            np.asarray(positions, dtype=np.int64),
            np.asarray(starts, dtype=np.int64),
            states.detach().to(device=self.adapter.device, dtype=self.adapter.dtype).clone(),
        )

    def dummy_run(self, num_tokens: int, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up per batch shape."""

    def describe(self) -> str:
        return f"{self.drafter.describe()}; controller {self.options.controller}; k <= {self.max_k}"

    def memory_bytes(self) -> int:
        """What the proposer holds beyond vLLM: its layers, head and every request's caches."""
        held = 0
        for entry in self.caches:
            for cache in (entry.state.cache, entry.state.exit_cache):
                held += sum(
                    t.numel() * t.element_size() for t in (*cache.keys, *cache.values) if t is not None
                )
        held += sum(r.states.numel() * r.states.element_size() for r in self.records)
        return self.kept_bytes + held

    # -- one engine step --------------------------------------------------------------------------

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        started = time.perf_counter()
        rows = len(sampled_token_ids)
        seconds = self._observe_step(started)
        costs = self._tracker(rows).snapshot()
        may_draft = self.gate is None or self.gate.open(_bucket(rows), self._plain_step(rows) is not None)
        self.stats["gated"] += not may_draft
        lengths: dict[int, int] = {}  # id of a claimed cache -> the request's length now
        out: list[list[int]] = [[] for _ in range(rows)]
        group: list[tuple[int, RequestCache, np.ndarray]] = []  # the rows drafting: row, cache, tokens
        forward, self._forward = self._forward, None
        caught = 0.0  # catching up on a backlog longer than a round: not a cost of this step's drafts
        with torch.inference_mode():
            records = self._keep_tops(forward, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            wanted: dict[int, np.ndarray] = {}
            for row in range(rows):
                length = int(num_tokens_no_spec[row])
                if sampled_token_ids[row] and length < self.max_model_len - 1:
                    wanted[row] = np.array(token_ids_cpu[row, :length])  # a copy: vLLM reuses its rows
                # else a prefill still running, or no room left: nothing to draft
            for row, entry in self._claim_all(wanted).items():
                tokens = wanted[row]
                length = len(tokens)
                lengths[id(entry)] = length
                self._learn(entry, tokens)
                entry.committed = length
                limit = min(self.max_k, self.max_model_len - 1 - length) if may_draft else 0
                if self.drafter.reads_top_states:
                    record = records[row]
                    if record is None or len(record.tokens) < length - 1:
                        self.stats["without_top_states"] += 1
                        limit = 0  # some committed position's top state was never seen: no drafts
                    else:
                        entry.state.tops = record.states[None]
                control = entry.control
                control.begin([row], costs, [max(limit, 0)], [True])  # a plain step is a round too
                if control.ask(0, entry.round):
                    if len(tokens) - 1 - len(entry.tokens) > self.max_k + 1:  # a long backlog, alone
                        caught -= time.perf_counter()
                        self._catch_up(entry, tokens)
                        caught += time.perf_counter()
                    group.append((row, entry, tokens))
            if len(group) == 1:
                row, entry, tokens = group[0]
                out[row] = self._draft(entry, tokens)
            elif group:
                for (row, *_), drafts in zip(group, self._draft_together(group), strict=True):
                    out[row] = drafts
        self._score(seconds, lengths, costs)
        if group:  # each request's cache, its length now, and the most it can commit: drafts + 1
            most = {id(entry): len(out[row]) + 1 for row, entry, _ in group}
            self._scored = [(e, e.committed, most.get(id(e), 1)) for e in self.caches if id(e) in lengths]
        else:
            self._scored = None
        finished = time.perf_counter()
        longest = max(map(len, out), default=0)
        peeked = any(e.round.withdrawn is not None and len(e.round.tokens) == longest for _, e, _ in group)
        positions = rows + sum(map(len, out))  # what the next pass verifies, at most
        self._previous = (rows, longest, finished - started - caught, finished, peeked, positions)
        self._spent = finished - started  # all of it, catching up included (the gate's score)
        self.stats["steps"] += 1
        self.stats["rows"] += rows
        self.stats["seconds"] += finished - started
        self.stats["rounds_with_drafts"] += len(group)
        return out

    def _keep_tops(
        self,
        forward: tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor] | None,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
    ) -> list[TopRecord | None]:
        """For a top-input head: each row's record of top states, with what this step's pass fed
        of it and vLLM committed (drafts it rejected are not kept); None for a row whose record
        has a gap. Records that no pass feeds for a few steps (finished requests) are dropped."""
        rows = len(sampled_token_ids)
        found: list[TopRecord | None] = [None] * rows
        if not self.drafter.reads_top_states:
            return found
        for record in self.records:
            record.idle += 1
        if forward is not None and len(forward[2]) > rows:
            ids, positions, starts, states = forward
            fed: dict[int, tuple[int, int, np.ndarray]] = {}  # row -> first position, pass index, tokens
            for row in range(rows):
                a, b = int(starts[row]), int(starts[row + 1])
                if b <= a:
                    continue
                first = int(positions[a])
                if not np.array_equal(positions[a:b], np.arange(first, first + b - a)):
                    continue
                length = int(num_tokens_no_spec[row])
                last = min(first + b - a, length - 1 if sampled_token_ids[row] else length) - 1
                tokens = np.array(token_ids_cpu[row, : last + 1])
                if last >= first and np.array_equal(ids[a : a + last + 1 - first], tokens[first:]):
                    fed[row] = (first, a, tokens)  # else nothing committed, or not this row's tokens
            for row, record in self._match_records(fed).items():
                first, a, tokens = fed[row]
                if record is not None:
                    record.write(first, tokens[first:], states[a : a + len(tokens) - first])
                found[row] = record
        self.records = [r for r in self.records if r.idle <= 2]
        self._kept = {row: record for row, record in enumerate(found) if record is not None}
        return found

    def _match_records(self, fed: dict[int, tuple[int, int, np.ndarray]]) -> dict[int, TopRecord | None]:
        """Each fed row's record, holding positions [0, first) of its tokens. A row keeps the
        record it was given last step while that record holds its tokens up to ``first``. The
        others take records by the longest prefix shared with them first (so that a new request
        sharing a prompt prefix does not take a running request's record); a row left without one
        gets a new record at position 0, a copy of the prefix another row's record holds, or None."""
        out: dict[int, TopRecord | None] = {}
        taken: set[int] = set()  # ids of records given
        for row, (first, _, tokens) in fed.items():
            record = self._kept.get(row)
            if record is None or not first or id(record) in taken or len(record.tokens) < first:
                continue
            if np.array_equal(record.tokens[:first], tokens[:first]):
                out[row] = record
                taken.add(id(record))
        free = [record for record in self.records if id(record) not in taken]
        rest = {row: item for row, item in fed.items() if row not in out}
        shared = {
            (row, index): common_prefix(record.tokens, tokens)
            for row, (_, _, tokens) in rest.items()
            for index, record in enumerate(free)
        }
        given: set[int] = set()  # indexes into free
        for (row, index), n in sorted(shared.items(), key=lambda item: -item[1]):
            if n and n >= rest[row][0] and row not in out and index not in given:
                out[row] = free[index]
                given.add(index)
        for row, (first, _, tokens) in rest.items():
            if row in out:
                continue
            donor = max(range(len(free)), key=lambda i: shared[(row, i)], default=None)
            if first and (donor is None or shared[(row, donor)] < first):
                out[row] = None  # positions before ``first`` were never seen: no drafts with it
                continue
            size = (max(64, 2 * len(tokens)), self.adapter.hidden_size)
            zeros = torch.zeros(size, dtype=self.adapter.dtype, device=self.adapter.device)
            record = TopRecord(tokens[:0], zeros)
            if first and donor is not None:  # another request holds the shared prefix: copy it
                record.write(0, tokens[:first], free[donor].states[:first])
            out[row] = record
        fresh = [r for r in out.values() if r is not None and all(r is not q for q in self.records)]
        self.records.extend(fresh)
        return out

    def _tracker(self, rows: int) -> CostTracker:
        return self.costs(_bucket(rows))

    def _observe_step(self, now: float) -> float | None:
        """The previous step's costs: this proposer's time, and vLLM's pass in between; the
        step's whole time (for the gate), or None when the engine sat idle in between."""
        starts, self._starts = self._starts, None
        if self._previous is None:
            return None
        rows, longest, propose_time, ended, peeked, positions = self._previous
        if starts is not None and starts[-1] > positions:
            self.stats["prefill_passes"] += 1
            return None  # the pass also ran some request's prompt: not a step's cost
        tracker, between = self._tracker(rows), now - ended
        known = tracker.verify[longest + 1]
        if known is not None and between > 4 * known:
            return None  # the engine sat idle between two requests' steps: not a verification pass
        tracker.observe(longest, propose_time, between, withdrawn=peeked)
        return self._spent + between

    def _score(self, seconds: float | None, lengths: dict[int, int], costs: Any) -> None:
        """Tell the gate what the previous step gained, if some request drafted in it: the tokens
        its requests committed. One for a request that has finished since (its last is unseen),
        or whose cache another request took since, which a cache's length grown by more than the
        request's drafts and one tells (requests sharing a prefix: a chat template's system
        prompt, a prompt served twice)."""
        scored, self._scored = self._scored, None
        if self.gate is None or scored is None or seconds is None:
            return
        grown = ((lengths.get(id(e), 0) - then, most) for e, then, most in scored)
        tokens = sum(n if 1 <= n <= most else 1 for n, most in grown)
        rows = len(scored)
        self.gate.score(_bucket(rows), tokens, rows, seconds, self._plain_step(rows))

    def _plain_step(self, rows: int) -> float | None:
        """A plain step's measured time at this batch size (the proposer's and vLLM's), or None
        while none was measured: not the cost model's value, which it may extrapolate from
        drafting steps."""
        tracker = self._tracker(rows)
        verify = tracker.verify[1]
        return None if verify is None else verify + (tracker.propose[0] or 0.0)

    def _claim_all(self, wanted: dict[int, np.ndarray]) -> dict[int, RequestCache]:
        """Each row's cache, cut to the prefix it shares with the row's tokens. A row keeps the
        cache it claimed last step while the request is the one that claimed it (its tokens then
        are a prefix of its tokens now): one comparison, where a search compares every free cache.
        The other rows (new, moved or recomputed requests) search the caches left, and the caches
        no row claimed (finished requests) are dropped."""
        out: dict[int, RequestCache] = {}
        claimed: set[int] = set()  # ids of claimed caches
        for row, tokens in wanted.items():
            entry = self._held.get(row)
            if entry is not None and id(entry) not in claimed and _owns(entry, tokens):
                out[row] = entry
                claimed.add(id(entry))
        for row, tokens in wanted.items():
            if row not in out:
                out[row] = self._claim(tokens, claimed)
        for row, entry in out.items():
            tokens = wanted[row]
            self._cut(entry, min(common_prefix(entry.tokens, tokens), len(tokens) - 1))
            entry.seen = tokens
        self.caches = [entry for entry in self.caches if id(entry) in claimed]
        self._held = out
        return out

    def _claim(self, tokens: np.ndarray, claimed: set[int]) -> RequestCache:
        """The free cache sharing the longest prefix with ``tokens``; else the request's own
        empty one (a request that has drafted nothing yet, on another row); else a new one, with
        the controller started for a new request."""
        best, best_len = None, 0
        free = [entry for entry in self.caches if id(entry) not in claimed]
        for entry in free:
            shared = common_prefix(entry.tokens, tokens)
            if shared > best_len:
                best, best_len = entry, shared
        if best is None:
            best = next((entry for entry in free if _owns(entry, tokens)), None)
        if best is None:
            room = self.max_model_len - len(tokens)
            costs = self._tracker(1).snapshot()
            withdraws = self.drafter.withdraws and getattr(self.controller, "withdraws", False) is True
            request = Request(len(tokens), room, self.max_k, GREEDY, costs, withdraws=withdraws)
            control = Control(self.controller, self.guard, request)
            best = RequestCache(self._new_state(), tokens[:0].copy(), control)
            self.caches.append(best)
        claimed.add(id(best))
        return best

    def _cut(self, entry: RequestCache, length: int) -> None:
        if length < len(entry.tokens):
            entry.state.cache.crop(length)
            self.drafter.rollback(entry.state, length)
            entry.tokens = entry.tokens[:length]

    def _learn(self, entry: RequestCache, tokens: np.ndarray) -> None:
        """End the request's round of last step: tell the controller how many of the drafts it
        proposed were kept, and whether the draft it took back after them would have been: the
        token vLLM sampled at its position once every draft before it was accepted, as plain
        decoding there does (greedy: the argmax; else a draw from p, so 1 with probability
        p(draft), the chance the draft had)."""
        start, drafts, control = entry.committed, entry.round, entry.control
        entry.round = RowDrafts()
        if not start:
            return  # no round yet: the request is new
        k = len(drafts.tokens)
        if not k and drafts.withdrawn is None:
            if len(tokens) > start:  # a plain step: the controller learns what it costs too
                plain = row_outcome(start - 1, drafts, 0, (int(tokens[start]),), (0.0, 0.0), control.costs, 0)
                control.end([plain])
            return
        kept = common_prefix(np.asarray(drafts.tokens), tokens[start : start + k])
        judge = None
        if drafts.withdrawn is not None:
            if kept == k and len(tokens) > start + k:
                judge = float(int(tokens[start + k]) == int(drafts.withdrawn[2].argmax()))
            self.stats["withdrawn"] += 1
        committed = tuple(int(t) for t in tokens[start : start + kept + 1])
        control.end([row_outcome(start - 1, drafts, kept, committed, (0.0, 0.0), control.costs, 0, judge)])
        self.stats["drafted"] += k
        self.stats["accepted"] += kept

    def _catch_up(self, entry: RequestCache, tokens: np.ndarray) -> None:
        """Committed tokens the caches lack (all but the pending last): one pass through layers
        [0, N) and the exit layers, for a request drafting alone or a long backlog (a prompt, a
        stretch of plain steps: not charged to drafting); rows drafting together catch up on a
        round's tokens in their joined round (:meth:`_draft_together`)."""
        done, length = len(entry.tokens), len(tokens)
        if done < length - 1:
            self._lower(entry.state, tokens[done : length - 1], done)
            entry.tokens = tokens[: length - 1]

    def _lower(self, state: Any, tokens: np.ndarray, first: int) -> None:
        """Committed ``tokens`` at positions ``first ..`` through layers [0, N) and the exit
        layers, in a pass of their own."""
        ids = torch.as_tensor(tokens, dtype=torch.long).to(self.adapter.device)[None]  # [1, m]
        hidden = self.adapter.run(self.adapter.embed(ids), 0, self.drafter.shared_layers, state.cache, first)
        self.drafter.extend(state, hidden, now=True)

    def _draft(self, entry: RequestCache, tokens: np.ndarray) -> list[int]:
        """One request's round, drafting while the controller says so (it said yes to the first);
        the committed tokens its caches lack run in the first draft step's pass."""
        state, length, control, drafts = entry.state, len(tokens), entry.control, entry.round
        if len(entry.tokens) < length - 1:
            behind = torch.as_tensor(tokens[len(entry.tokens) : length - 1], dtype=torch.long)
            self.drafter.catch_up(state, behind)
        token, position, fed = int(tokens[-1]), length - 1, 0
        history = _Histories([tokens], [drafts])
        while True:
            draft = self.drafter.step(state, torch.tensor([token]), position + fed, [True], history)
            fed += 1
            logits = draft.logits[0]  # [V]
            probs = torch.softmax(logits.float(), dim=-1)[None]
            token, prob, top, entropy = confidence(probs, logits.argmax()[None])[0]
            seen = Confidence(None, top, entropy)
            if not control.keep(0, len(drafts.tokens), seen):
                drafts.withdrawn = (seen, None, logits)
                break
            drafts.add(token, Confidence(prob, top, entropy))
            if not control.ask(0, drafts):
                break
        # the last draft is not fed through layers [0, N): vLLM may reject it, and if it is kept,
        # catching up runs it with the tokens vLLM adds (a draft taken back was never fed either)
        self.drafter.finish(state, None, position + fed)
        self._record(entry, tokens, drafts.tokens[: fed - 1])
        return list(drafts.tokens)

    def _draft_together(self, group: list[tuple[int, RequestCache, np.ndarray]]) -> list[list[int]]:
        """The requests of ``group`` draft in lockstep, one pass of layers [0, N) and the head per
        draft step for all of them (the drafter's batch path over their caches, joined for the
        round, which first runs the committed tokens each cache lacks, for all of them in one
        pass); a request the controller stops feeds its last draft and takes no more."""
        drafter = self.drafter
        states = [entry.state for _, entry, _ in group]
        controls = [entry.control for _, entry, _ in group]
        drafts = [entry.round for _, entry, _ in group]
        behind = [tokens[len(entry.tokens) : len(tokens) - 1].tolist() for _, entry, tokens in group]
        joined = drafter.join(states, self.max_k + 1, behind)
        self.stats["caught_together"] += sum(1 for tokens in behind if tokens)
        layout, width = joined.layout, joined.layout.slots
        history = _Histories([tokens for _, _, tokens in group], drafts)
        pending = [len(tokens) - 1 for _, _, tokens in group]
        feed = torch.tensor([int(tokens[-1]) for _, _, tokens in group], dtype=torch.long, device=HOST)
        feeding, drafting = [True] * len(group), [True] * len(group)  # each said yes to a first draft
        steps = 0
        while True:
            layout.mark(width + steps, feeding, [at + steps for at in pending])
            if steps:
                drafting = [on and c.ask(0, d) for on, c, d in zip(feeding, controls, drafts, strict=True)]
            if not any(drafting):
                break
            logits = drafter.step(joined, feed, width + steps, drafting, history).logits  # [B, V]
            chosen = logits.argmax(-1)
            probs = torch.softmax(logits.float(), dim=-1)
            read = torch.stack(
                [
                    chosen.double(),
                    probs.gather(1, chosen[:, None])[:, 0].double(),
                    probs.max(-1).values.double(),
                    torch.special.entr(probs).sum(-1).double(),
                ]
            ).T.tolist()
            for j, (token, prob, top, entropy) in enumerate(read):
                seen = Confidence(None, top, entropy)
                if drafting[j] and not controls[j].keep(0, len(drafts[j].tokens), seen):
                    drafts[j].withdrawn = (seen, None, logits[j])
                    drafting[j], feed[j] = False, 0  # its input is in
                elif drafting[j]:
                    drafts[j].add(int(token), Confidence(prob, top, entropy))
                    feed[j] = int(token)
                else:
                    feed[j] = 0
            feeding = list(drafting)
            steps += 1
        # a request still drafting at the end does not feed its last draft (see ``_draft``)
        fed = [len(d.tokens) + (0 if last else 1) for d, last in zip(drafts, feeding, strict=True)]
        hidden = drafter.finish(joined, None, width + steps)
        drafter.part(joined, states, fed, hidden)
        for (_, entry, tokens), d, n in zip(group, drafts, fed, strict=True):
            self._record(entry, tokens, d.tokens[: n - 1])
        self.stats["joined_rounds"] += 1
        return [list(d.tokens) for d in drafts]

    def _record(self, entry: RequestCache, tokens: np.ndarray, fed: list[int]) -> None:
        """A request's round: its caches now hold ``tokens`` and the drafts ``fed``; its drafts
        (``entry.round``) go to vLLM."""
        entry.tokens = np.concatenate([tokens, np.asarray(fed, dtype=tokens.dtype)])
