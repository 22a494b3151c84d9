"""One generation of B rows (one sequence is B = 1): a prefill, then rounds of draft -> verify ->
accept -> roll back, the same code for every batch size.

The rows share one cache whose *slots* are columns; prompts are left-padded into slots [0, T). The
cache holds every committed token but the last, the row's *pending* one. A round writes slots [S, S
+ m) for every row (m = 1 + the most drafts): row b feeds its pending token and k_b drafts, keeps
its n_b + 1 accepted inputs (the rest become gaps), and the batch moves on to S + max(n_b + 1).
Drafting runs in lockstep, each row asked through :class:`~eesd_core.control.Control` and drawing
from its own random source. A call owns everything here: calls may run in any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from eesd_core.cache import BatchLayout, packed_groups
from eesd_core.config import GenerationConfig
from eesd_core.control import Control, RowDrafts, acceptance_chance, row_outcome
from eesd_core.costs import CostBook
from eesd_core.devices import HOST, later, pass_tokens
from eesd_core.errors import EESDError, NumericalError
from eesd_core.guards import Guarded
from eesd_core.protocols import FIXED, Confidence, Request, RoundOutcome, SamplingParams
from eesd_core.sampling import check_finite, confidence, log_probs, process_logits
from eesd_core.stats import BatchStats, GenerationStats


@dataclass(frozen=True)
class Parts:
    """What a generation uses of its decoder, which outlives it and may serve several at once."""

    adapter: Any
    drafter: Any
    controller: Any
    verifier: Any
    guard: Guarded
    costs: CostBook
    max_draft_tokens: int
    withdraws: bool  # the drafter can take a draft back and the controller declares ``withdraws``
    clock: Callable[[], float]
    observe: Callable[[RoundOutcome], None] | None = None
    finished: Callable[[GenerationStats], None] | None = None


class Generation:
    """Iterate for each round's new tokens: a list per row (empty for finished rows), or, for one
    sequence (``single``), the list itself. ``stats`` holds the totals so far."""

    def __init__(
        self,
        parts: Parts,
        prompts: list[list[int]],
        config: GenerationConfig,
        rngs: list[Any],
        single: bool = False,
    ) -> None:
        self.parts, self.config, self.rngs, self.single = parts, config, rngs, single
        self.padded: torch.Tensor | None = None  # a tensor batch as given, for the padded output
        self.sampling = SamplingParams(config.temperature, config.top_k, config.top_p)
        rows, width, k = len(prompts), max(len(p) for p in prompts), parts.max_draft_tokens
        new = config.max_new_tokens
        self.tokens = torch.zeros(rows, width + new + k + 1, dtype=torch.long, device=HOST)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=HOST)
        self.lengths = [len(p) for p in prompts]
        self.prompt_lengths = list(self.lengths)
        self.finished = [False] * rows
        self.row_stats = [GenerationStats(prompt_tokens=len(p)) for p in prompts]
        self.stats: Any = self.row_stats[0] if single else BatchStats(rows=self.row_stats)
        self.ids = list(range(rows))  # the generation row of each slot row of the cache
        slack = 0 if rows == 1 else max(new // 4, 2 * (k + 1))  # room for gaps before a realignment
        self.layout = BatchLayout(rows, width + new + slack + k + 1, parts.adapter.device)
        self.cache = parts.adapter.new_cache(capacity=width + min(new, 512) + slack + k + 1)
        self.control: Control | None = None
        self.draft_state: Any = None
        self.done = False
        self._written: list[tuple[int, int, list[int]]] = []  # (row, at, tokens) not yet in tokens
        wanted = config.logprobs or config.top_logprobs
        self.logprobs: list[list[float]] | None = [[] for _ in prompts] if wanted else None  # per row
        self.top_logprobs: list[Any] | None = [[] for _ in prompts] if config.top_logprobs else None
        self._scores: torch.Tensor | None = None  # the last target pass's processed logits [B, m, V]
        self.shaping = bool(config.logits_processor or config.min_new_tokens)
        self._dead: set[tuple[int, int]] = set()  # (row, offset) of the last pass with no token allowed
        self._started: float | None = None
        self._interrupted = False

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Any:
        """Run one round (the first call prefills) and return the tokens it committed."""
        if self.done:
            raise StopIteration
        if self._interrupted:
            raise EESDError(
                "This generation was interrupted in the middle of a round (an exception or Ctrl-C) and "
                "its caches are in no state to go on: start a new generate() or stream() call."
            )
        self._interrupted = True
        with torch.inference_mode():
            committed = self._prefill() if self._started is None else self._round()
        self._interrupted = False
        now = self.parts.clock() - self._started  # type: ignore[operator]
        self.stats.total_time = now
        for row, tokens in enumerate(committed):
            if tokens:
                self.row_stats[row].total_time = now
        if self.done and self.parts.finished is not None:
            for stats in self.row_stats:
                self.parts.finished(stats)
        return committed[0] if self.single else committed

    @property
    def sequences(self) -> list[list[int]]:
        """Each row's prompt and committed tokens."""
        return [self.tokens[row, :length].tolist() for row, length in enumerate(self.lengths)]

    @property
    def sequence(self) -> list[int]:
        """The prompt and committed tokens of row 0 (of the one sequence)."""
        return self.tokens[0, : self.lengths[0]].tolist()

    def _remaining(self, row: int) -> int:
        return self.config.max_new_tokens - (self.lengths[row] - self.prompt_lengths[row])

    def _prefill(self) -> list[list[int]]:
        """Every row's prompt, left-padded, through every layer; p draws each row's first token."""
        parts, layout = self.parts, self.layout
        self._started = parts.clock()
        drafter, guard = parts.drafter, parts.guard
        rows, width = len(self.lengths), max(self.lengths)
        feed = torch.zeros(rows, width, dtype=torch.long, device=HOST)
        if any(length != width for length in self.lengths):
            valid, positions = layout.spread()
        for row, length in enumerate(self.lengths):
            feed[row, width - length :] = self.tokens[row, :length]
            if not layout.dense:
                valid[row, width - length : width] = True
                positions[row, width - length : width] = torch.arange(length, device=layout.device)
        layout.slots = layout.filled = width
        hidden, top = self._prefill_pass(feed)
        if drafter is not None:
            self.draft_state = guard.call("drafter", "begin", drafter.begin, self.cache, layout, hidden)
            if drafter.reads_top_states:
                guard.call("drafter", "top_states", drafter.top_states, self.draft_state, top, 0)
            costs, new = parts.costs(rows).snapshot(), self.config.max_new_tokens
            request = Request(width, new, parts.max_draft_tokens, self.sampling, costs, rows, parts.withdraws)
            self.control = Control(parts.controller, guard, request)
        last = width - 1 if top.shape[1] > 1 else 0
        p, logits = self._p(top[:, last], [(row, 0) for row in range(rows)])
        self._scores, none = logits[:, None] if self.logprobs is not None else None, feed[0, :0]
        drawn = guard.verify(parts.verifier, [none] * rows, [None] * rows, p[:, None], self.rngs)
        self._unchecked()
        committed = []
        for row, (_, token) in enumerate(drawn):
            self.row_stats[row].rounds += 1  # a target pass that committed one token
            committed.append(self._commit(row, [token]))
            self._note(row, row, committed[-1])
        self.stats.prefill_time = parts.clock() - self._started
        return self._close(committed)

    def _close(self, committed: list[list[int]]) -> list[list[int]]:
        """The end of a round: tokens written, the batch realigned if it needs to be."""
        self._write()
        if not self.single:
            self.stats.rounds += 1
        self.done = all(self.finished)
        if not self.done:
            self._maybe_relayout()
        return committed

    def _prefill_pass(self, feed: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Every layer over ``feed`` ``[B, T]``: the layer-N states ``[B, T, H]`` (None if N = 0) and
        the last-layer states, all ``[B, capacity, H]`` for a drafter that reads them, else ``[B, 1,
        H]``. Where the adapter skips padding, rows run in groups (:func:`packed_groups`)."""
        adapter, layout, drafter = self.parts.adapter, self.layout, self.parts.drafter
        shared = drafter.shared_layers if drafter is not None else 0
        keep_tops = drafter is not None and drafter.reads_top_states
        rows, width = feed.shape
        like = {"dtype": adapter.dtype, "device": adapter.device}

        def run(pick: Any, first: int, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
            where, seen = (first, None) if layout.dense else (layout.positions, layout.valid)
            if seen is not None:
                where, seen = where[pick, first:width], seen[pick, first:width]  # type: ignore[index]
            hidden = adapter.embed(feed[pick.to(HOST), first:].to(adapter.device))
            rotary = adapter.rotary(hidden, where)
            hidden = adapter.run(hidden, 0, shared, cache, where, seen, rotary)
            top = adapter.run(hidden, shared, adapter.num_layers, cache, where, seen, rotary)
            return hidden, top if keep_tops else top[:, -1:]

        tops = torch.zeros(rows, layout.capacity if keep_tops else 1, adapter.hidden_size, **like)
        groups = None
        if getattr(adapter, "skips_padding", True):
            ones = torch.ones(rows, width, dtype=torch.bool, device=layout.device)
            valid = ones if layout.valid is None else layout.valid
            groups = packed_groups(valid[:, :width], max_tokens=pass_tokens(adapter.device))
        if groups is None:
            hidden, top = run(torch.arange(rows, device=adapter.device), 0, self.cache)
            tops[:, : top.shape[1]] = top
            return (hidden if shared else None), tops
        kept = torch.zeros(rows, width, adapter.hidden_size, **like) if shared else None
        for (group, first), writer in zip(groups, self.cache.writers(rows, groups), strict=True):
            pick = group.to(adapter.device)
            hidden, top = run(pick, first, writer)
            if kept is not None:
                kept[pick, first:] = hidden
            at = first if keep_tops else 0  # kept whole by slot, or the last slot's alone
            tops[pick, at : at + top.shape[1]] = top
        return kept, tops

    def _round(self) -> list[list[int]]:
        parts, layout, ids = self.parts, self.layout, self.ids
        start, clock = layout.slots, parts.clock
        live = [not self.finished[row] for row in ids]
        tracker = parts.costs(len(ids))
        costs = tracker.snapshot()
        if self.control is not None:
            cap, rows = parts.max_draft_tokens, zip(ids, live, strict=True)
            limits = [min(cap, self._remaining(row) - 1) if alive else 0 for row, alive in rows]
            self.control.begin(ids, costs, limits, live)
        t0 = clock()
        drafts, hidden = self._draft(start, live)
        t1 = clock()
        m = max(len(d.tokens) for d in drafts) + 1
        p, top = self._target(start, m, hidden)  # [B, m, V]
        taking = [j for j, alive in enumerate(live) if alive]
        tokens = [torch.tensor(drafts[j].tokens, dtype=torch.long, device=HOST) for j in taking]
        qs, rngs = [drafts[j].q(p.shape[-1]) for j in taking], [self.rngs[ids[j]] for j in taking]
        p_live = p if len(taking) == len(ids) else p[taking]
        judged = [j for j in taking if drafts[j].withdrawn is not None]  # read after the verifier's read
        chances = {j: later(acceptance_chance(drafts[j], p[j, len(drafts[j].tokens)])) for j in judged}
        results = dict(zip(taking, parts.guard.verify(parts.verifier, tokens, qs, p_live, rngs), strict=True))
        self._unchecked()
        drafter = parts.drafter
        if drafter is not None and drafter.reads_top_states:
            parts.guard.call("drafter", "top_states", drafter.top_states, self.draft_state, top, start)
        t2 = clock()
        upto = [results[j][0] if j in results else -1 for j in range(len(ids))]
        self._rollback(upto)
        peeked = any(d.withdrawn is not None and len(d.tokens) == m - 1 for d in drafts)
        tracker.observe(m - 1, t1 - t0, t2 - t1, peeked)
        committed: list[list[int]] = [[] for _ in self.lengths]
        outcomes = []
        for j in taking:
            row, (n, token), d = ids[j], results[j], drafts[j]
            judge = float(chances[j]) if j in chances and n == len(d.tokens) else None
            new, times = [*d.tokens[:n], token], (t1 - t0, t2 - t1)
            outcome = row_outcome(self.lengths[row] - 1, d, n, new, times, costs, row, judge)
            committed[row] = self._commit(row, new)
            self._note(j, row, committed[row])
            self.row_stats[row].add_round(outcome)
            outcomes.append(outcome)
        if self.control is not None:
            self.control.end(outcomes)
        for outcome in outcomes if parts.observe is not None else ():
            parts.observe(outcome)  # type: ignore[misc]
        return self._close(committed)

    def _draft(self, start: int, live: list[bool]) -> tuple[list[RowDrafts], torch.Tensor | None]:
        """The draft loop in lockstep: step i writes slot ``start + i`` of every row that feeds it."""
        ids, drafter, guard = self.ids, self.parts.drafter, self.parts.guard
        drafts = [RowDrafts() for _ in ids]
        if drafter is None or self.control is None:
            self._mark(start, live, 0)
            return drafts, None
        control, feeding, steps, state = self.control, live, 0, self.draft_state
        fixed: list[list[int]] = [[] for _ in ids]  # fixed proposals not taken yet
        while True:
            self._mark(start + steps, feeding, steps)
            drafting = [feeding[j] and control.ask(j, drafts[j]) for j in range(len(ids))]
            if not any(drafting):
                break
            asked = [drafting[j] and not fixed[j] for j in range(len(ids))]
            draft = None
            if drafter.shared_layers or any(asked):
                ends = [self.lengths[r] + len(d.tokens) for r, d in zip(ids, drafts, strict=True)]
                history = [self.tokens[r, :end] for r, end in zip(ids, ends, strict=True)]
                feed, slot = self._feed(steps)[:, 0], start + steps
                draft = guard.call("drafter", "step", drafter.step, state, feed, slot, asked, history)
                guard.check_draft(draft, asked)
            logits = None if draft is None else draft.logits
            sampled = [j for j, a in enumerate(asked) if a] if logits is not None else []
            drawn = dict(zip(sampled, self._sample(sampled, logits, drafts) if sampled else [], strict=True))  # type: ignore[arg-type]
            for j in range(len(ids)):
                if not drafting[j]:
                    continue
                if asked[j] and logits is None:
                    fixed[j] = list(draft.tokens[j]) if draft.tokens else []  # type: ignore[union-attr]
                if fixed[j]:
                    token: int | None = fixed[j].pop(0)
                    drafts[j].add(token, FIXED)  # type: ignore[arg-type]
                else:
                    token = drawn.get(j)
                if token is None:  # nothing proposed, or taken back before it was drawn
                    drafting[j] = False
                    continue
                self.tokens[ids[j], self.lengths[ids[j]] + steps] = token
            feeding = drafting
            steps += 1
        tokens = self._feed(steps)[:, 0] if any(feeding) else None  # None: every last draft taken back
        hidden = guard.call("drafter", "finish", drafter.finish, self.draft_state, tokens, start + steps)
        k = steps if tokens is not None else steps - 1
        guard.check_hidden(hidden, k, drafter.shared_layers, len(ids))
        return drafts, hidden

    def _sample(self, rows: list[int], logits: torch.Tensor, drafts: list[RowDrafts]) -> list[int | None]:
        """Draw the next draft of each slot row in ``rows`` from q (its row of ``logits``; the argmax
        when greedy, with one read of the device for every row), unless the controller, shown q's
        confidence at temperature 1 first, takes it back (``None``)."""
        check = check_finite(logits := logits[rows], "Draft")
        logits = self._shape(logits, [(self.ids[j], len(drafts[j].tokens)) for j in rows])
        greedy, control, withdraws = self.sampling.greedy, self.control, self.parts.withdraws
        probs = torch.softmax(logits.float(), dim=-1) if greedy else process_logits(logits, self.sampling)
        tops = confidence(probs, logits.argmax(-1)) if greedy or withdraws else []
        check()
        out: list[int | None] = []
        for i, j in enumerate(rows):
            q = None if greedy else probs[i]
            if withdraws:
                token, prob, top, entropy = tops[i]
                seen = Confidence(None, top, entropy)
                if not control.keep(j, len(drafts[j].tokens), seen):  # type: ignore[union-attr]
                    drafts[j].withdrawn = (seen, q, logits[i])
                    out.append(None)
                    continue
            choice = None if q is None else torch.tensor([self.rngs[self.ids[j]].categorical(q)], device=HOST)
            token, prob, top, entropy = tops[i] if q is None else confidence(q[None], choice)[0]  # type: ignore[arg-type]
            drafts[j].add(token, Confidence(prob, top, entropy), q)
            out.append(token)
        return out

    def _feed(self, step: int, m: int = 1) -> torch.Tensor:
        """The tokens each slot row feeds at steps ``step .. step + m`` ``[B, m]`` (the pending
        token first; any token where it feeds nothing: the layout hides that slot)."""
        at = [self.lengths[row] - 1 + step for row in self.ids]
        if len(at) == 1:  # one row: always dense
            return self.tokens[self.ids[0], at[0] : at[0] + m][None]
        index = torch.tensor(at, device=HOST)[:, None] + torch.arange(m, device=HOST)
        return self.tokens[torch.tensor(self.ids, device=HOST)[:, None], index]

    def _mark(self, slot: int, feeding: list[bool], step: int) -> None:
        self.layout.mark(slot, feeding, [self.lengths[row] - 1 + step for row in self.ids])

    def _target(self, start: int, m: int, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """p ``[B, m, V]`` over slots [start, start + m), running the layers the drafter did not,
        and the last-layer states ``[B, m, H]``."""
        parts, layout, adapter = self.parts, self.layout, self.parts.adapter
        first = 0 if hidden is None else parts.drafter.shared_layers
        if hidden is None:
            hidden = adapter.embed(self._feed(0, m).to(adapter.device, non_blocking=True))
        parts.guard.check_cache(self.cache, first, start, m)
        positions, valid = layout.window(start, start + m)
        top = adapter.run(hidden, first, adapter.num_layers, self.cache, positions, valid)
        rows, flat = top.shape[0], top.reshape(top.shape[0] * m, -1)
        at = [(row, i) for row in self.ids for i in range(m)] if self.shaping else []  # of each flat one
        live = None if valid is None or not getattr(adapter, "skips_padding", True) else valid[:, start:]
        if live is None or bool(live.all()):
            p, logits = self._p(flat, at)
        else:
            index = live.reshape(-1).to(top.device).nonzero().squeeze(1)  # the LM head over what counts
            p, logits = self._p(flat.index_select(0, index), [at[i] for i in index.tolist()] if at else at)
            p = p.new_zeros(rows * m, p.shape[-1]).index_copy_(0, index, p)
            if self.logprobs is not None:
                logits = logits.new_zeros(rows * m, logits.shape[-1]).index_copy_(0, index, logits)
        self._scores = logits.view(rows, m, -1) if self.logprobs is not None else None
        return p.view(rows, m, -1), top

    def _p(self, top: torch.Tensor, at: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's p ``[r, V]`` from last-layer states ``[r, H]`` at ``at``, and its logits."""
        logits = self.parts.adapter.logits(self.parts.adapter.norm(top))
        self._unchecked = check_finite(logits, "Target")  # read once the verifier has read p
        logits = self._shape(logits, at)
        return process_logits(logits, self.sampling), logits

    def _shape(self, logits: torch.Tensor, at: list[tuple[int, int]]) -> torch.Tensor:
        """``logits`` ``[r, V]`` through the logits processors, row i at ``at[i]`` = (row, offset) seeing
        the row's tokens to its pending one and ``offset`` drafts: p's prefix there, for p and q alike."""
        if not self.shaping:
            return logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
        for i, (row, offset) in enumerate(at):
            end = self.lengths[row] + offset
            if end - self.prompt_lengths[row] < self.config.min_new_tokens:
                logits[i, list(self.config.eos_token_id)] = -torch.inf
            prefix = self.tokens[row, :end][None].to(logits.device)
            for processor in self.config.logits_processor:
                logits[i : i + 1] = processor(prefix, logits[i : i + 1])
        dead = logits.isneginf().all(-1)  # no token may follow: an error once a commit reaches it
        self._dead = {at[i] for i in dead.nonzero()[:, 0].tolist()}
        return logits.masked_fill_(dead[:, None], 0.0)  # past a draft p rules out, or any draft

    def _note(self, j: int, row: int, tokens: list[int]) -> None:
        """Each committed token's log p (and the best ``top_logprobs``) from slot row j's scores."""
        if self.logprobs is None or not tokens:
            return
        scores = log_probs(self._scores[j, : len(tokens)], self.sampling)  # type: ignore[index]
        self.logprobs[row] += scores[list(range(len(tokens))), tokens].tolist()
        if self.top_logprobs is not None:
            values, index = scores.topk(self.config.top_logprobs, dim=-1)
            pairs = zip(index.tolist(), values.tolist(), strict=True)
            self.top_logprobs[row] += [list(zip(*pair, strict=True)) for pair in pairs]

    def _rollback(self, upto: list[int]) -> None:
        """Keep each row's accepted inputs (-1: a finished row keeps none); the batch moves on."""
        self.layout.keep(self.layout.slots, upto)
        self.cache.crop(self.layout.slots)
        drafter = self.parts.drafter
        if drafter is not None:
            self.parts.guard.call(
                "drafter", "rollback", drafter.rollback, self.draft_state, self.layout.slots
            )

    def _commit(self, row: int, tokens: list[int]) -> list[int]:
        """Append a row's tokens, cut at its first EOS or at max_new_tokens."""
        if any((row, i) in self._dead for i in range(len(tokens))):
            raise NumericalError(f"The logits processors allow no token after {self.sequences[row]}.")
        stats, tokens = self.row_stats[row], tokens[: self._remaining(row)]
        for i, token in enumerate(tokens):
            end = "eos" if token in self.config.eos_token_id else self._stopped(row, tokens[: i + 1])
            if end:
                tokens, stats.stopped_by = tokens[: i + 1], end
                break
        if stats.stopped_by or len(tokens) == self._remaining(row):
            self.finished[row], stats.stopped_by = True, stats.stopped_by or "max_new_tokens"
        self._written.append((row, self.lengths[row], tokens))
        self.lengths[row] += len(tokens)
        stats.new_tokens += len(tokens)
        return tokens

    def _stopped(self, row: int, new: list[int]) -> str:
        """``"stop"`` when a stopping criterion holds once ``new`` follows the row's tokens."""
        if not (criteria := self.config.stopping_criteria):
            return ""
        ids = torch.cat([self.tokens[row, : self.lengths[row]], torch.tensor(new, device=HOST)])[None]
        return "stop" if any(bool(torch.as_tensor(holds(ids, None)).all()) for holds in criteria) else ""

    def _write(self) -> None:
        """Put the tokens committed since the last call into ``tokens``, in one assignment."""
        rows = [row for row, _, tokens in self._written for _ in tokens]
        at = [start + i for _, start, tokens in self._written for i in range(len(tokens))]
        new = [token for _, _, tokens in self._written for token in tokens]
        self.tokens[rows, at] = torch.tensor(new, dtype=torch.long, device=HOST)
        self._written.clear()

    def _maybe_relayout(self) -> None:
        """Drop finished rows once a quarter are done; squeeze out gaps when a round might not fit."""
        layout, ids = self.layout, self.ids
        alive = [j for j, row in enumerate(ids) if not self.finished[row]]
        leave = len(ids) - len(alive) >= max(1, len(ids) // 4)
        full = layout.slots + self.parts.max_draft_tokens + 1 > layout.capacity
        if not (leave or full):
            return
        keep = torch.tensor(alive if leave else list(range(len(ids))), dtype=torch.long, device=HOST)
        index = layout.aligned(keep.to(layout.device, non_blocking=True))
        drafter = self.parts.drafter
        if drafter is not None:  # before the layout changes: the drafter may still run on the old one
            self.parts.guard.call("drafter", "relayout", drafter.relayout, self.draft_state, keep, index)
        layout.relayout(keep.to(layout.device), index)
        self.cache.relayout(keep, index)
        self.ids = [ids[j] for j in keep.tolist()]
        if not self.single:
            self.stats.relayouts += 1
