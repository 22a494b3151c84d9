"""The eesd early-exit proposer for vLLM's ``custom_class`` speculative method.

vLLM calls :meth:`EarlyExitProposer.propose` once per engine step with, for each request of the
step (in the step's order, which changes as requests come and go), the tokens it just sampled, how
many tokens the request holds and all of them. It sees no request ids, no attention metadata and
no hidden states, and the target's own layers cannot be called from here; so the proposer keeps
its own copy of the target's first N layers and the exit head (loaded from the checkpoint vLLM
serves, through eesd's adapters), with its own cache of those layers per request.

**Which cache is whose.** A cache of layers [0, N) is a function of the tokens it has seen, so the
proposer keys caches by their tokens, not by request: each row of a step takes the free cache that
shares the longest prefix with the row's tokens, cuts it to that prefix and runs the rest. That
follows vLLM's request lifecycle without being told it: a continued request finds its own cache
and the cut rolls back the drafts vLLM rejected (accepted ones are reused); a new request starts
empty (or from a request with the same prompt); a finished request's cache is left unclaimed and
dropped; a preempted and recomputed request finds its cache if it is still there, else rebuilds.

**Drafting.** For each row the controller (Thompson by default) decides before every draft token,
zero included, from what it learnt of acceptance and from the measured costs: this proposer's own
time, and the time vLLM takes between two calls, which is its verification pass. A row that drafts
nothing this step costs nothing: the tokens its cache lacks wait, and run in one pass when it next
drafts. The rows that draft do so together, one pass of layers [0, N) and the head per draft step
for all of them (the drafter's batch path over their caches, joined for the round), and a row the
controller stops takes no more drafts. Drafts are the exit head's argmax. A controller with
``keep`` (the Thompson controller's default) is shown each draft's confidence before the draft is
proposed and may take it back; whether vLLM would have accepted it is read from the next step's
tokens when every draft before it was accepted: the token vLLM sampled at its position.

**Lossless.** vLLM's rejection sampler treats drafts given as token ids alone as drawn from a
one-hot q on each draft: at temperature 0 a draft is kept iff it is the target's argmax, and at
temperature > 0 draft d is kept with probability p(d) and a rejection samples from
norm(max(0, p - onehot(d))). A drafter whose draft is a deterministic function of the context, as
this argmax is, has exactly that q, so the output distribution is the target's: plain sampling.
Taking a draft back changes only how many drafts vLLM sees, which any controller may choose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eesd_core.costs import CostTracker
from eesd_core.devices import HOST
from eesd_core.errors import ConfigError
from eesd_core.generation import sample_draft
from eesd_core.protocols import DraftStep, Request, RoundOutcome, SamplingParams, Withdrawn
from eesd_vllm.fixes import repair_cpu_expand
from eesd_vllm.options import ProposerOptions, read_options

GREEDY = SamplingParams()
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
Signal = tuple[float, float, float]  # a draft's q(token), top-1 probability and entropy
HEADS = Path(__file__).resolve().parent / "heads"


def _bucket(rows: int) -> int:
    return next((b for b in BATCH_BUCKETS if rows <= b), BATCH_BUCKETS[-1])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass
class RequestCache:
    """The proposer's part of one request: its layers-[0, N) cache and the tokens in it."""

    state: Any  # the early-exit drafter's ExitState (shared cache and exit cache)
    tokens: np.ndarray  # token ids the caches hold, position t at t
    drafts: list[int] = field(default_factory=list)  # proposed last step, after ``committed``
    committed: int = 0  # the request's length when those drafts were proposed
    signals: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] = ((), (), ())
    withdrawn: tuple[int, float, float] | None = None  # taken back after ``drafts``: token, top-1, entropy


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
        self.trackers: dict[int, CostTracker] = {}
        # rows, most drafts, propose seconds, end, whether a row with the most drafts took one back
        self._previous: tuple[int, int, float, float, bool] | None = None
        self.repaired = repair_cpu_expand()
        self.stats: dict[str, float] = dict(
            steps=0,
            rows=0,
            drafted=0,
            accepted=0,
            withdrawn=0,
            rounds_with_drafts=0,
            joined_rounds=0,
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
        self.keep = getattr(self.controller, "keep", None)
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
        drafters = registry("drafter").get("early_exit")
        candidates = [*self._shipped_heads(), None] if head == "auto" else [head]
        for candidate in candidates:
            chosen = {
                "exit_layer": self.options.exit_layer,
                "head": None if candidate is None else str(candidate),
            }
            self.drafter = drafters.factory(validate(drafters.options, chosen, "early-exit options"))
            try:
                self.drafter.attach(self.adapter)
                break
            except HeadError:
                if head != "auto":
                    raise
        if self.drafter.reads_top_states:
            raise ConfigError(
                f"eesd proposer: the exit head {head} reads the target's last-layer states, which vLLM "
                "does not show a custom proposer. Use a head distilled without --top-input, the "
                "untrained exit (head=null), or head='auto'."
            )
        if not hasattr(self.drafter, "extend"):
            raise ConfigError("eesd proposer: this early-exit drafter cannot take states it did not run.")
        self.adapter.prepare(1)  # the product for one-position passes, timed while every layer is here
        for layer in model.model.layers[self.drafter.shared_layers :]:
            layer.to("meta")  # never run here: vLLM verifies with its own copy
        self.kept_bytes = sum(
            p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta"
        )
        self.kept_bytes += sum(p.numel() * p.element_size() for p in self.drafter.head.parameters())

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
        called outside vLLM's forward context)."""

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
        self._observe_step(started)
        costs = self._tracker(rows).snapshot()
        claimed: set[int] = set()
        out: list[list[int]] = [[] for _ in range(rows)]
        group: list[tuple[int, RequestCache, np.ndarray, int]] = []  # row, cache, tokens, room
        with torch.inference_mode():
            for row in range(rows):
                length = int(num_tokens_no_spec[row])
                if not sampled_token_ids[row] or length >= self.max_model_len - 1:
                    continue  # a prefill still running, or no room left: nothing to draft
                tokens = np.asarray(token_ids_cpu[row, :length])
                entry = self._claim(tokens, claimed)
                self._learn(entry, tokens, row, costs)
                entry.committed = length
                room = min(self.max_k, self.max_model_len - 1 - length)
                if room > 0 and self.controller.should_continue(DraftStep(0, room, costs, row=row)):
                    self._catch_up(entry, tokens)
                    group.append((row, entry, tokens, room))
            if len(group) == 1:
                row, entry, tokens, room = group[0]
                out[row] = self._draft(entry, tokens, row, room, costs)
            elif group:
                for (row, *_), drafts in zip(group, self._draft_together(group, costs), strict=True):
                    out[row] = drafts
        self._forget(claimed)
        finished = time.perf_counter()
        longest = max(map(len, out), default=0)
        peeked = any(entry.withdrawn is not None and len(entry.drafts) == longest for _, entry, _, _ in group)
        self._previous = (rows, longest, finished - started, finished, peeked)
        self.stats["steps"] += 1
        self.stats["rows"] += rows
        self.stats["seconds"] += finished - started
        self.stats["rounds_with_drafts"] += len(group)
        return out

    def _tracker(self, rows: int) -> CostTracker:
        bucket = _bucket(rows)
        if bucket not in self.trackers:
            self.trackers[bucket] = CostTracker(self.max_k, batch_size=bucket)
        return self.trackers[bucket]

    def _observe_step(self, now: float) -> None:
        """The previous step's costs: this proposer's time, and vLLM's pass in between."""
        if self._previous is None:
            return
        rows, longest, propose_time, ended, peeked = self._previous
        tracker, between = self._tracker(rows), now - ended
        known = tracker.verify[longest + 1]
        if known is not None and between > 4 * known:
            return  # the engine sat idle between two requests' steps: not a verification pass
        tracker.observe(longest, propose_time, between, withdrawn=peeked)

    def _claim(self, tokens: np.ndarray, claimed: set[int]) -> RequestCache:
        """The free cache sharing the longest prefix with ``tokens``, cut to it; or a new one."""
        best, best_len = None, 0
        for index, entry in enumerate(self.caches):
            if index in claimed:
                continue
            shared = common_prefix(entry.tokens, tokens)
            if shared > best_len:
                best, best_len = index, shared
        if best is None:
            cache = self.adapter.new_cache(num_layers=self.drafter.shared_layers)
            state = self.drafter.begin(cache, torch.empty(0, dtype=torch.long, device=HOST), None)
            self.caches.append(RequestCache(state, tokens[:0].copy()))
            best = len(self.caches) - 1
            room = self.max_model_len - len(tokens)
            costs = self._tracker(1).snapshot()
            request = Request(len(tokens), room, self.max_k, GREEDY, costs, withdraws=self.keep is not None)
            self.controller.start(request)
        claimed.add(best)
        entry = self.caches[best]
        self._cut(entry, min(best_len, len(tokens) - 1))
        return entry

    def _cut(self, entry: RequestCache, length: int) -> None:
        if length < len(entry.tokens):
            entry.state.cache.crop(length)
            self.drafter.rollback(entry.state, length)
            entry.tokens = entry.tokens[:length]

    def _forget(self, claimed: set[int]) -> None:
        """Drop the caches no request claimed: finished requests (a preempted one rebuilds)."""
        self.caches = [entry for index, entry in enumerate(self.caches) if index in claimed]

    def _learn(self, entry: RequestCache, tokens: np.ndarray, row: int, costs: Any) -> None:
        """Tell the controller how many of the drafts proposed last step were kept, and whether the
        draft it took back after them would have been: the token vLLM sampled at its position once
        every draft before it was accepted, as plain decoding there does (greedy: the argmax; else a
        draw from p, so 1 with probability p(draft), the chance the draft had)."""
        if not entry.drafts and entry.withdrawn is None:
            return
        start = entry.committed
        kept = common_prefix(np.asarray(entry.drafts), tokens[start : start + len(entry.drafts)])
        k = len(entry.drafts)
        probs, top1, entropies = entry.signals
        withdrawn = None
        if entry.withdrawn is not None:
            token, top, entropy = entry.withdrawn
            seen = None
            if kept == k and len(tokens) > start + k:
                seen = float(int(tokens[start + k]) == token)
            withdrawn = Withdrawn(top, entropy, seen)
            self.stats["withdrawn"] += 1
        outcome = RoundOutcome(
            position=start - 1,
            drafted=k,
            accepted=kept,
            tokens=tuple(int(t) for t in tokens[start : start + kept + 1]),
            draft_time=0.0,
            verify_time=0.0,
            probs=probs,
            top1=top1,
            entropies=entropies,
            costs=costs,
            row=row,
            withdrawn=withdrawn,
        )
        self.controller.update(outcome)
        self.stats["drafted"] += k
        self.stats["accepted"] += kept
        entry.drafts, entry.withdrawn = [], None

    def _catch_up(self, entry: RequestCache, tokens: np.ndarray) -> None:
        """Committed tokens the caches lack (all but the pending last): one pass through layers
        [0, N); the exit layers see them at the next draft step."""
        done, length = len(entry.tokens), len(tokens)
        if done < length - 1:
            behind = torch.as_tensor(tokens[done : length - 1], dtype=torch.long).to(self.adapter.device)
            x = self.adapter.embed(behind)
            h = self.adapter.run_layers(x, 0, self.drafter.shared_layers, entry.state.cache, done)
            self.drafter.extend(entry.state, h)
            entry.tokens = tokens[: length - 1]

    def _draft(self, entry: RequestCache, tokens: np.ndarray, row: int, room: int, costs: Any) -> list[int]:
        """One request's round, drafting while the controller says so (it said yes to the first)."""
        state, length = entry.state, len(tokens)
        drafts: list[int] = []
        signals: list[Signal] = []
        token, position = int(tokens[-1]), length - 1
        history = torch.as_tensor(tokens, dtype=torch.long)
        withdrawn = None
        while True:
            draft = self.drafter.step(state, token, position + len(drafts), history)
            token, _, prob, top, entropy = sample_draft(draft, GREEDY, None)  # type: ignore[arg-type]
            if not self._keeps(row, room, costs, len(drafts), top, entropy):
                withdrawn = (token, top, entropy)
                break
            drafts.append(token)
            signals.append((prob, top, entropy))
            if not self._draft_on(row, room, costs, drafts, signals):
                break
        # the last draft goes through layers [0, N) too, so that a fully accepted round needs nothing
        # (a draft taken back was never fed: its input, the draft before it, is in)
        self.drafter.finish(state, None if withdrawn else token, position + len(drafts))
        self._record(entry, tokens, drafts, signals, withdrawn)
        return drafts

    def _draft_together(
        self, group: list[tuple[int, RequestCache, np.ndarray, int]], costs: Any
    ) -> list[list[int]]:
        """The requests of ``group`` draft in lockstep, one pass of layers [0, N) and the head per
        draft step for all of them (the drafter's batch path over their caches, joined for the
        round); a request the controller stops feeds its last draft and takes no more."""
        drafter, device = self.drafter, self.adapter.device
        joined = drafter.join([entry.state for _, entry, _, _ in group], extra=self.max_k + 1)
        layout, width = joined.layout, joined.layout.slots
        rows = len(group)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        signals: list[list[Signal]] = [[] for _ in range(rows)]
        feed = torch.tensor([int(tokens[-1]) for _, _, tokens, _ in group], dtype=torch.long, device=HOST)
        feeding, drafting = [True] * rows, [True] * rows  # every request said yes to a first draft
        withdrawn: list[tuple[int, float, float] | None] = [None] * rows
        steps = 0
        while True:
            layout.valid[:, width + steps] = torch.tensor(feeding, device=layout.valid.device)
            layout.positions[:, width + steps] = torch.tensor(
                [len(tokens) - 1 + steps for _, _, tokens, _ in group], device=layout.positions.device
            )
            if steps:
                for j, (row, _, _, room) in enumerate(group):
                    drafting[j] = feeding[j] and self._draft_on(row, room, costs, drafts[j], signals[j])
            if not any(drafting):
                break
            logits = drafter.step_batch(joined, feed, width + steps, torch.tensor(drafting, device=device))
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
                row, _, _, room = group[j]
                if drafting[j] and not self._keeps(row, room, costs, len(drafts[j]), top, entropy):
                    withdrawn[j], drafting[j], feed[j] = (int(token), top, entropy), False, 0  # input is in
                elif drafting[j]:
                    drafts[j].append(int(token))
                    signals[j].append((prob, top, entropy))
                    feed[j] = int(token)
                else:
                    feed[j] = 0
            feeding = list(drafting)
            steps += 1
        hidden = drafter.finish_batch(joined, feed if any(feeding) else None, width + steps)
        drafter.part(joined, [entry.state for _, entry, _, _ in group], [len(d) + 1 for d in drafts], hidden)
        for (_, entry, tokens, _), made, signal, back in zip(group, drafts, signals, withdrawn, strict=True):
            self._record(entry, tokens, made, signal, back)
        self.stats["joined_rounds"] += 1
        return drafts

    def _draft_on(self, row: int, room: int, costs: Any, drafts: list[int], signals: list[Signal]) -> bool:
        """Whether the controller lets a request that drafted ``drafts`` draft one more."""
        if len(drafts) >= room:
            return False
        prob, top, entropy = signals[-1]
        step = DraftStep(len(drafts), room, costs, drafts[-1], prob, top, entropy, row)
        return self.controller.should_continue(step)

    def _keeps(self, row: int, room: int, costs: Any, made: int, top: float, entropy: float) -> bool:
        """Whether the controller keeps the draft after ``made`` ones, from its q alone."""
        if self.keep is None:
            return True
        return bool(self.keep(DraftStep(made + 1, room, costs, None, None, top, entropy, row)))

    def _record(
        self,
        entry: RequestCache,
        tokens: np.ndarray,
        drafts: list[int],
        signals: list[Signal],
        withdrawn: tuple[int, float, float] | None = None,
    ) -> None:
        entry.tokens = np.concatenate([tokens, np.asarray(drafts, dtype=tokens.dtype)])
        entry.drafts, entry.committed, entry.withdrawn = drafts, len(tokens), withdrawn
        probs, top1, entropies = zip(*signals, strict=True) if signals else ((), (), ())
        entry.signals = (tuple(probs), tuple(top1), tuple(entropies))
