"""Many sequences at once: one target pass per round over every active row, each row exact.

The rows share one preallocated cache whose *slots* are columns of the batch. Prompts are
left-padded into slots [0, T); the prefill draws each row's first new token from p at slot T - 1,
and that token is the row's pending one, as in :mod:`eesd_core.generation`. A round writes slots
[S, S + m) for every row, m = 1 + the most drafts any row made; row b feeds its pending token and
its k_b drafts and pads the rest. After verification row b keeps its n_b + 1 accepted inputs and
the rest become gaps; the batch moves on to S + max(n_b + 1). :class:`BatchLayout` says which
slot holds which position of which row, and every pass masks by it, so no row ever sees another's
keys or its own gaps and each row computes what it would alone. Nothing is copied per round: the
cache is realigned only when rows have finished (they leave the batch) or the gaps would overflow
it.

Drafting runs in lockstep: before draft i the controller is asked for every row still drafting
(``DraftStep.row`` says which); a row it stops takes no more drafts this round. A drafter that runs
target layers drafts for all rows in one pass per step (:class:`~eesd_core.protocols.BatchDrafter`);
an :class:`~eesd_core.protocols.IndependentDrafter` is asked row by row. Each row draws from its own
random source, so its tokens do not depend on which other rows share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eesd_core.cache import packed_groups
from eesd_core.config import GenerationConfig
from eesd_core.devices import HOST, pass_tokens
from eesd_core.errors import ConfigError
from eesd_core.generation import RoundDrafts, acceptance_chance, draw_unless_withdrawn, target_probs
from eesd_core.protocols import (
    Draft,
    DraftStep,
    RandomSource,
    Request,
    RoundOutcome,
    SamplingParams,
    Withdrawn,
)
from eesd_core.stats import GenerationStats

if TYPE_CHECKING:
    from eesd_core.engine import SpeculativeDecoder


class BatchLayout:
    """Slot bookkeeping of a batch cache: ``valid`` ``[B, capacity]`` marks the slots that hold a
    key of each row, ``positions`` ``[B, capacity]`` the position of each such key; ``slots`` is
    the number of slots in use (every layer's cache length between rounds)."""

    def __init__(self, rows: int, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.positions = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.slots = 0

    def aligned(self, rows: torch.Tensor) -> torch.Tensor:
        """Old slot of each new slot when rows ``rows`` are kept with their keys right-aligned
        (gaps squeezed out); ``[B', S']``, -1 where the new slot is padding."""
        valid = self.valid[rows, : self.slots]
        counts = valid.sum(1)
        width = int(counts.max()) if counts.numel() else 0
        order = torch.where(valid, torch.arange(self.slots, device=valid.device), -1)
        order = order.sort(dim=1).values[:, self.slots - width :] if width else order[:, :0]
        return order

    def relayout(self, rows: torch.Tensor, index: torch.Tensor) -> None:
        """Keep ``rows``, with new slot j of row b holding old slot ``index[b, j]`` (-1: padding)."""
        take = index.clamp_min(0)
        valid = self.valid[rows].gather(1, take) & (index >= 0)
        positions = self.positions[rows].gather(1, take)
        self.valid = torch.zeros(len(rows), self.capacity, dtype=torch.bool, device=valid.device)
        self.positions = torch.zeros_like(self.valid, dtype=torch.long)
        self.valid[:, : index.shape[1]] = valid
        self.positions[:, : index.shape[1]] = positions
        self.slots = index.shape[1]


@dataclass
class BatchStats:
    """Totals of a batched call: ``rows`` holds each row's own :class:`GenerationStats` (its
    ``total_time`` runs until that row finished); ``rounds`` counts batch rounds."""

    rows: list[GenerationStats] = field(default_factory=list)
    rounds: int = 0
    prefill_time: float = 0.0
    total_time: float = 0.0
    relayouts: int = 0

    @property
    def new_tokens(self) -> int:
        return sum(row.new_tokens for row in self.rows)

    @property
    def drafted(self) -> int:
        return sum(row.drafted for row in self.rows)

    @property
    def accepted(self) -> int:
        return sum(row.accepted for row in self.rows)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        names = "rounds new_tokens drafted accepted prefill_time total_time relayouts tokens_per_second"
        return {"rows": [row.to_dict() for row in self.rows]} | {n: getattr(self, n) for n in names.split()}


class BatchGeneration:
    """Iterate for each round's new tokens per row (a list of B lists, empty for finished rows)."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        prompts: list[list[int]],
        config: GenerationConfig,
        rngs: list[RandomSource],
        padded: torch.Tensor | None = None,
    ) -> None:
        self.decoder = decoder
        self.config = config
        self.rngs = rngs
        self.sampling = SamplingParams(config.temperature, config.top_k, config.top_p)
        rows, width = len(prompts), max(len(p) for p in prompts)
        k = decoder.config.max_draft_tokens
        self.stats = BatchStats(rows=[GenerationStats(prompt_tokens=len(p)) for p in prompts])
        self.tokens = torch.zeros(rows, width + config.max_new_tokens + k + 1, dtype=torch.long, device=HOST)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=HOST)
        self.lengths = [len(p) for p in prompts]
        self.prompt_lengths = list(self.lengths)
        self.finished = [False] * rows
        self._written: list[tuple[int, int, list[int]]] = []  # (row, at, tokens) not yet in tokens
        self.ids = torch.arange(rows, device=HOST)  # the row of each slot row of the cache
        device = decoder.adapter.device
        capacity = width + config.max_new_tokens + max(config.max_new_tokens // 4, 2 * (k + 1)) + k + 1
        self.layout = BatchLayout(rows, capacity, device)
        self.cache = decoder.adapter.new_cache(capacity=capacity)
        self.draft_state: Any = None
        self.padded = padded  # a tensor batch as given, for the padded output
        self.done = False
        self._started: float | None = None
        drafter = decoder.drafter
        self._batched = drafter is not None and drafter.shared_layers > 0
        if self._batched and not hasattr(drafter, "step_batch"):
            raise ConfigError(
                f"drafter {decoder.config.drafter!r} runs target layers but cannot draft for a batch "
                "(it has no step_batch): decode batches with drafter=None or one that supports them."
            )
        withdraws = drafter is not None and getattr(drafter, "withdraws", False) is True
        self.keep = decoder.guard.keeper(decoder.controller) if withdraws else None

    def __iter__(self) -> BatchGeneration:
        return self

    def __next__(self) -> list[list[int]]:
        if self.done:
            raise StopIteration
        with torch.inference_mode():
            committed = self._prefill() if self._started is None else self._round()
        now = self.decoder.clock() - self._started  # type: ignore[operator]
        self.stats.total_time = now
        for row, tokens in enumerate(committed):
            if tokens:
                self.stats.rows[row].total_time = now
        if self.done:
            for row_stats in self.stats.rows:
                self.decoder.generation_ended(row_stats)
        return committed

    @property
    def sequences(self) -> list[list[int]]:
        """Each row's prompt and committed tokens."""
        return [self.tokens[row, :length].tolist() for row, length in enumerate(self.lengths)]

    def _remaining(self, row: int) -> int:
        return self.config.max_new_tokens - (self.lengths[row] - self.prompt_lengths[row])

    # -- prefill ----------------------------------------------------------------------------------

    def _prefill(self) -> list[list[int]]:
        """Every row's whole prompt, left-padded, in one pass; each row's first new token is drawn
        from p at its last prompt position (the batch's last slot), as a plain step draws it."""
        dec, layout = self.decoder, self.layout
        self._started = dec.clock()
        dec.prepare(len(self.lengths))
        adapter, drafter = dec.adapter, dec.drafter
        width = max(self.lengths)
        feed = torch.zeros(len(self.lengths), width, dtype=torch.long, device=HOST)
        for row, length in enumerate(self.lengths):
            start = width - length
            feed[row, start:] = self.tokens[row, :length]
            layout.valid[row, start:width] = True
            layout.positions[row, start:width] = torch.arange(length, device=layout.positions.device)
        layout.slots = width
        hidden, top = self._prefill_pass(feed)
        if drafter is not None:
            call = dec.guard.call_drafter
            if self._batched:
                self.draft_state = call("begin_batch", drafter.begin_batch, self.cache, layout, hidden)  # type: ignore[union-attr]
                if drafter.reads_top_states:
                    call("top_states_batch", drafter.top_states_batch, self.draft_state, top, 0)  # type: ignore[union-attr]
            else:
                self.draft_state = [
                    call("begin", drafter.begin, self.cache, self.tokens[row, :length], None)
                    for row, length in enumerate(self.lengths)
                ]
            request = Request(
                max(self.prompt_lengths),
                self.config.max_new_tokens,
                dec.config.max_draft_tokens,
                self.sampling,
                dec.costs_for(len(self.lengths)).snapshot(),
                batch_size=len(self.lengths),
                withdraws=self.keep is not None,
            )
            dec.guard.call_controller("start", dec.controller.start, request)
        rows = len(self.lengths)
        last = width - 1 if top.shape[1] > 1 else 0
        p = target_probs(adapter, top[:, last : last + 1].reshape(1, rows, -1), self.sampling)  # [B, V]
        none = feed[0, :0]
        drawn = dec.guard.verify_batch(dec.verifier, [none] * rows, [None] * rows, p[:, None], self.rngs)
        committed = []
        for row, (_, token) in enumerate(drawn):
            self.stats.rows[row].rounds += 1  # a target pass that committed one token
            committed.append(self._commit(row, [token]))
        self._write()
        self.stats.rounds += 1
        self.stats.prefill_time = dec.clock() - self._started
        self.done = all(self.finished)
        if not self.done:
            self._maybe_relayout()
        return committed

    def _prefill_pass(self, feed: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Every layer over the left-padded prompts ``feed`` ``[B, T]``: the layer-N states
        ``[B, T, H]`` (for a drafter that runs target layers, else None) and the last-layer
        states: for a drafter that reads them, ``[B, capacity, H]`` with slots [T, capacity)
        zeros (the buffer it keeps for the whole call), else the last slot's ``[B, 1, H]``.
        Ragged prompts run in groups of rows, each over its own slots only
        (:func:`packed_groups`), which skips most of their left padding, and on a CPU no pass
        covers more than ``CPU_PASS_TOKENS`` tokens; skipped slots hold zeros. An adapter that
        does not skip padding (a GPU's, by default) runs them in one pass, as transformers does."""
        adapter, layout = self.decoder.adapter, self.layout
        drafter = self.decoder.drafter
        shared = drafter.shared_layers if self._batched else 0  # type: ignore[union-attr]
        keep_tops = self._batched and drafter.reads_top_states  # type: ignore[union-attr]
        rows, width = feed.shape
        positions, valid = layout.positions[:, :width], layout.valid[:, :width]

        def run(pick: Any, first: int, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
            where, seen = positions[pick, first:], valid[pick, first:]
            hidden = adapter.embed(feed[pick.to(HOST), first:].to(adapter.device))
            rotary = adapter.rotary(hidden, where)
            hidden = adapter.run_batch(hidden, 0, shared, cache, where, seen, rotary)
            top = adapter.run_batch(hidden, shared, adapter.num_layers, cache, where, seen, rotary)
            return hidden, top if keep_tops else top[:, -1:]

        like = {"dtype": adapter.dtype, "device": adapter.device}
        tops = torch.zeros(rows, layout.capacity if keep_tops else 1, adapter.hidden_size, **like)
        skips = getattr(adapter, "skips_padding", True)  # on a GPU a group costs a pass of launches
        groups = packed_groups(valid, max_tokens=pass_tokens(adapter.device)) if skips else None
        if groups is None:
            hidden, top = run(torch.arange(rows, device=adapter.device), 0, self.cache)
            tops[:, : top.shape[1]] = top
            return (hidden if self._batched else None), tops
        kept = torch.zeros(rows, width, adapter.hidden_size, **like) if self._batched else None
        for (group, first), writer in zip(groups, self.cache.writers(rows, groups), strict=True):
            pick = group.to(adapter.device)
            hidden, top = run(pick, first, writer)
            if kept is not None:
                kept[pick, first:] = hidden
            at = first if keep_tops else 0  # kept whole by slot, or the last slot's alone
            tops[pick, at : at + top.shape[1]] = top
        return kept, tops

    # -- one round --------------------------------------------------------------------------------

    def _round(self) -> list[list[int]]:
        dec, layout = self.decoder, self.layout
        rows, start = self.ids.tolist(), layout.slots
        tracker = dec.costs_for(len(rows))
        costs = tracker.snapshot()
        t0 = dec.clock()
        drafts, hidden = self._draft(rows, start, costs)
        t1 = dec.clock()
        m = max(len(d.tokens) for d in drafts) + 1
        p, top = self._target(rows, start, m, hidden)  # [B, m, V]
        live = [j for j, row in enumerate(rows) if not self.finished[row]]
        none = torch.empty(0, dtype=torch.long, device=HOST)  # the rows that drafted nothing share it
        tokens = [drafts[j].tokens for j in live]
        verified = dec.guard.verify_batch(
            dec.verifier,
            [torch.tensor(t, dtype=torch.long, device=HOST) if t else none for t in tokens],
            [drafts[j].q(p.shape[-1]) for j in live],
            p if len(live) == len(rows) else p[live],
            [self.rngs[rows[j]] for j in live],
        )
        results = [(0, -1)] * len(rows)
        for j, result in zip(live, verified, strict=True):
            results[j] = result
        if self._batched and dec.drafter.reads_top_states:  # type: ignore[union-attr]
            dec.guard.call_drafter(
                "top_states_batch", dec.drafter.top_states_batch, self.draft_state, top, start
            )  # type: ignore[union-attr]
        t2 = dec.clock()
        self._rollback(rows, start, m, results)
        peeked = any(d.withdrawn is not None and len(d.tokens) == m - 1 for d in drafts)
        tracker.observe(m - 1, t1 - t0, t2 - t1, peeked)
        committed: list[list[int]] = [[] for _ in self.lengths]
        for j, row in enumerate(rows):
            if self.finished[row]:
                continue
            n, token = results[j]
            d, withdrawn = drafts[j], None
            if d.withdrawn is not None:  # judged by p at its position when every kept draft passed
                draft, q, top1, entropy = d.withdrawn
                seen = acceptance_chance(draft, q, p[j, n]) if n == len(d.tokens) else None
                withdrawn = Withdrawn(top1, entropy, seen)
            outcome = RoundOutcome(
                self.lengths[row] - 1,
                len(d.tokens),
                n,
                tuple(d.tokens[:n]) + (token,),
                t1 - t0,
                t2 - t1,
                tuple(d.probs),
                tuple(d.top1),
                tuple(d.entropies),
                costs,
                row=row,
                withdrawn=withdrawn,
            )
            if dec.drafter is not None:
                dec.guard.call_controller("update", dec.controller.update, outcome)
            committed[row] = self._commit(row, list(outcome.tokens))
            self.stats.rows[row].add_round(outcome)
            dec.round_ended(outcome)
        self._write()
        self.stats.rounds += 1
        self.done = all(self.finished)
        if not self.done:
            self._maybe_relayout()
        return committed

    def _draft(
        self, rows: list[int], start: int, costs: Any
    ) -> tuple[list[RoundDrafts], torch.Tensor | None]:
        """The draft loop in lockstep: step i writes slot ``start + i`` of every row."""
        dec = self.decoder
        drafter, guard = dec.drafter, dec.guard
        drafts = [RoundDrafts() for _ in rows]
        live = [not self.finished[row] for row in rows]
        if drafter is None:
            self._mark(rows, start, live, 0)
            return drafts, None
        limits = [min(dec.config.max_draft_tokens, self._remaining(row) - 1) for row in rows]
        asks = {limit: guard.asker(dec.controller, limit) for limit in set(limits)}
        feeding, fixed = live, [[] for _ in rows]  # type: list[bool], list[list[int]]
        steps = 0
        while True:
            slot = start + steps
            self._mark(rows, start, feeding, steps)
            drafting = [False] * len(rows)
            for j, row in enumerate(rows):
                if feeding[j]:
                    step = DraftStep(steps, limits[j], costs, *drafts[j].last(), row=row)
                    drafting[j] = asks[limits[j]](step)
            if not any(drafting):
                break
            tokens = self._feed(rows, steps)[:, 0]
            if self._batched:
                logits = guard.call_drafter(
                    "step_batch",
                    drafter.step_batch,
                    self.draft_state,
                    tokens,
                    slot,
                    torch.tensor(drafting, device=self.layout.valid.device),  # type: ignore[union-attr]
                )
                guard.check_batch_logits(logits, len(rows))
            for j, row in enumerate(rows):
                if not drafting[j]:
                    continue
                at = self.lengths[row] - 1 + steps
                if self._batched:
                    draft = Draft(logits=logits[j])
                else:
                    if not fixed[j]:
                        draft = guard.call_drafter(
                            "step",
                            drafter.step,
                            self.draft_state[j],
                            int(self.tokens[row, at]),
                            at,
                            self.tokens[row, : at + 1],
                        )
                        guard.check_draft(draft)
                        if draft.logits is None:
                            fixed[j] = list(draft.tokens)
                            if not fixed[j]:
                                drafting[j] = False
                                continue
                if fixed[j]:
                    token, q, prob, top1, entropy = fixed[j].pop(0), None, 1.0, 1.0, 0.0
                else:
                    asked, rng = DraftStep(steps, limits[j], costs, row=row), self.rngs[row]
                    drawn = draw_unless_withdrawn(draft, self.sampling, rng, self.keep, asked, drafts[j])
                    if drawn is None:  # taken back before it was drawn: the row's input is in
                        drafting[j] = False
                        continue
                    token, q, prob, top1, entropy = drawn
                drafts[j].add(token, q, prob, top1, entropy)
                self.tokens[row, at + 1] = token
            feeding = drafting
            steps += 1
        hidden = None
        if self._batched:
            tokens = self._feed(rows, steps)[:, 0] if any(feeding) else None  # None: drafts taken back
            hidden = guard.call_drafter(
                "finish_batch", drafter.finish_batch, self.draft_state, tokens, start + steps
            )  # type: ignore[union-attr]
            k = steps if tokens is not None else steps - 1
            guard.check_hidden(hidden, k, drafter.shared_layers, dec.adapter.num_layers, rows=len(rows))
        return drafts, hidden

    def _feed(self, rows: list[int], step: int, m: int = 1) -> torch.Tensor:
        """The tokens each slot row feeds at steps ``step .. step + m`` ``[B, m]`` (the pending
        token at 0); padding reads 0. One read of the layout, whatever B."""
        slot = self.layout.slots + step
        valid = self.layout.valid[:, slot : slot + m].to(HOST)
        at = torch.tensor([self.lengths[row] - 1 + step for row in rows], device=HOST)[:, None]
        at = at + torch.arange(m, device=HOST)
        return torch.where(valid, self.tokens[self.ids[:, None], at], 0)

    def _mark(self, rows: list[int], start: int, feeding: list[bool], step: int) -> None:
        """Slot ``start + step`` holds position ``length - 1 + step`` of every feeding row."""
        slot = start + step
        layout = self.layout
        layout.valid[:, slot] = torch.tensor(feeding, device=layout.valid.device)
        layout.positions[:, slot] = torch.tensor(
            [self.lengths[row] - 1 + step for row in rows], device=layout.positions.device
        )

    def _target(
        self, rows: list[int], start: int, m: int, hidden: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """p ``[B, m, V]`` over slots [start, start + m) and the last-layer states ``[B, m, H]``."""
        dec, layout = self.decoder, self.layout
        adapter = dec.adapter
        first = 0
        if hidden is None:
            hidden = adapter.embed(self._feed(rows, 0, m).to(adapter.device))
        else:
            first = dec.drafter.shared_layers  # type: ignore[union-attr]
        end = start + m
        positions, valid = layout.positions[:, start:end], layout.valid[:, :end]
        top = adapter.run_batch(hidden, first, adapter.num_layers, self.cache, positions, valid)
        rows, skips = top.shape[0], getattr(adapter, "skips_padding", True)
        live = valid[:, start:end].reshape(-1).to(top.device) if skips else None
        if live is None or bool(live.all()):
            p = target_probs(adapter, top.reshape(1, rows * m, -1), self.sampling)  # [B * m, V]
        else:  # the LM head over the positions that count; padding reads p = 0
            index = live.nonzero().squeeze(1)
            counted = top.reshape(rows * m, -1).index_select(0, index)[None]
            picked = target_probs(adapter, counted, self.sampling)
            p = picked.new_zeros(rows * m, picked.shape[-1]).index_copy_(0, index, picked)
        return p.view(rows, m, -1), top

    def _rollback(self, rows: list[int], start: int, m: int, results: list[tuple[int, int]]) -> None:
        """Keep each row's accepted inputs; the batch moves on past the longest."""
        layout = self.layout
        upto = [-1 if self.finished[row] else results[j][0] for j, row in enumerate(rows)]
        kept = torch.arange(m, device=HOST)[None] <= torch.tensor(upto, device=HOST)[:, None]  # inputs 0..n
        layout.valid[:, start : start + m] &= kept.to(layout.valid.device)
        layout.slots = start + max([1, *(n + 1 for n in upto)])
        self.cache.crop(layout.slots)
        drafter = self.decoder.drafter
        if drafter is None:
            return
        call = self.decoder.guard.call_drafter
        if self._batched:
            call("rollback_batch", drafter.rollback_batch, self.draft_state, layout.slots)  # type: ignore[union-attr]
            return
        for j, row in enumerate(rows):
            if not self.finished[row]:
                call("rollback", drafter.rollback, self.draft_state[j], self.lengths[row] + results[j][0])

    def _commit(self, row: int, tokens: list[int]) -> list[int]:
        """Append a row's tokens, cut at its first EOS or at max_new_tokens."""
        stats = self.stats.rows[row]
        for i, token in enumerate(tokens):
            if token in self.config.eos_token_id:
                tokens, self.finished[row], stats.stopped_by = tokens[: i + 1], True, "eos"
                break
        remaining = self._remaining(row)
        if len(tokens) >= remaining:
            tokens, self.finished[row] = tokens[:remaining], True
            stats.stopped_by = stats.stopped_by or "max_new_tokens"
        self._written.append((row, self.lengths[row], tokens))
        self.lengths[row] += len(tokens)
        stats.new_tokens += len(tokens)
        return tokens

    def _write(self) -> None:
        """Put the tokens committed since the last call into ``tokens``, in one assignment."""
        rows = [row for row, _, tokens in self._written for _ in tokens]
        at = [start + i for _, start, tokens in self._written for i in range(len(tokens))]
        new = [token for _, _, tokens in self._written for token in tokens]
        self.tokens[rows, at] = torch.tensor(new, dtype=torch.long, device=HOST)
        self._written.clear()

    # -- realignment ------------------------------------------------------------------------------

    def _maybe_relayout(self) -> None:
        """Drop finished rows once a quarter of the slot rows are done, and squeeze out gaps when
        the next round might not fit; otherwise leave every buffer where it is."""
        layout = self.layout
        rows = self.ids.tolist()
        alive = [j for j, row in enumerate(rows) if not self.finished[row]]
        leave = len(rows) - len(alive) >= max(1, len(rows) // 4)
        full = layout.slots + self.decoder.config.max_draft_tokens + 1 > layout.capacity
        if not (leave or full):
            return
        keep = torch.tensor(alive if leave else list(range(len(rows))), dtype=torch.long, device=HOST)
        index = layout.aligned(keep.to(layout.valid.device))
        drafter = self.decoder.drafter
        if drafter is not None:
            if self._batched:  # before the layout changes: the drafter may still run on the old one
                self.decoder.guard.call_drafter(
                    "relayout_batch",
                    drafter.relayout_batch,
                    self.draft_state,
                    keep,
                    index,  # type: ignore[union-attr]
                )
            else:
                self.draft_state = [self.draft_state[j] for j in keep.tolist()]
        layout.relayout(keep.to(layout.valid.device), index)
        self.cache.relayout(keep, index)
        self.ids = self.ids[keep]
        self.stats.relayouts += 1
