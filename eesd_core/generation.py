"""One generation: prefill, then rounds of draft -> verify -> accept -> roll back.

The cache holds every committed token but the last one, the *pending* token, which the next round
feeds first. The prefill runs the whole prompt and draws the first new token from p at its last
position, as plain decoding does, so a call runs the target at most once per new token. A round
with k drafts runs the target once over [pending, d_1..d_k] and commits n + 1 tokens (n accepted
drafts and one token from p); a round with k = 0 is a plain decoding step and costs what one
costs: the drafter only pushes the pending token through its N layers, which verification then
does not run again.

Everything a call owns lives here (tokens, caches, the drafter's state, randomness, stats), so
several generations of one decoder can be interleaved without touching each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eesd_core.config import GenerationConfig
from eesd_core.devices import HOST
from eesd_core.protocols import (
    Draft,
    DraftStep,
    RandomSource,
    Request,
    RoundOutcome,
    SamplingParams,
    Withdrawn,
)
from eesd_core.sampling import check_finite, confidence, process_logits
from eesd_core.stats import GenerationStats

if TYPE_CHECKING:
    from eesd_core.engine import SpeculativeDecoder


@dataclass
class RoundDrafts:
    """The drafts of one round and what the controller saw of each."""

    tokens: list[int] = field(default_factory=list)
    rows: list[torch.Tensor | None] = field(default_factory=list)  # q of each draft, None if fixed
    probs: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    withdrawn: tuple[Draft, torch.Tensor | None, float, float] | None = None  # (draft, q, top-1, entropy)

    def add(self, token: int, row: torch.Tensor | None, prob: float, top: float, entropy: float) -> None:
        self.tokens.append(token)
        self.rows.append(row)
        self.probs.append(prob)
        self.top1.append(top)
        self.entropies.append(entropy)

    def last(self) -> tuple[int | None, float | None, float | None, float | None]:
        """The latest draft's token, q(token), top-1 probability and entropy (``None`` s if none)."""
        if not self.tokens:
            return None, None, None, None
        return self.tokens[-1], self.probs[-1], self.top1[-1], self.entropies[-1]

    def q(self, vocab: int) -> torch.Tensor | None:
        """q of every draft ``[k, V]``, one-hot for fixed ones; ``None`` when every draft is fixed."""
        if all(row is None for row in self.rows):
            return None
        like = next(row for row in self.rows if row is not None)
        rows = [
            row if row is not None else _one_hot(token, vocab, like)
            for token, row in zip(self.tokens, self.rows, strict=True)
        ]
        return torch.stack(rows)


def _one_hot(token: int, vocab: int, like: torch.Tensor) -> torch.Tensor:
    row = like.new_zeros(vocab)
    row[token] = 1.0
    return row


def sample_draft(
    draft: Draft,
    sampling: SamplingParams,
    rng: RandomSource,
    distribution: tuple[torch.Tensor | None, torch.Tensor] | None = None,
) -> tuple[int, torch.Tensor | None, float, float, float]:
    """Draw a draft from q: (token, q or None, q(token), top-1, entropy). At temperature 0 the
    argmax, with q's confidence at temperature 1 (q is then one-hot, so ``None``)."""
    q, probs = distribution or draft_distribution(draft, sampling)
    assert draft.logits is not None
    choice = draft.logits.argmax() if q is None else rng.categorical(q)
    token, prob, top, entropy = confidence(probs, choice)
    return (token, q, prob, top, entropy)


def draw_unless_withdrawn(
    draft: Draft,
    sampling: SamplingParams,
    rng: RandomSource,
    keep: Any,
    asked: DraftStep,
    drafts: RoundDrafts,
) -> tuple[int, torch.Tensor | None, float, float, float] | None:
    """:func:`sample_draft`, but with ``keep`` first asked whether to verify the draft after the
    ``asked.index`` ones, from q alone (before the token is drawn, so verification stays exact);
    ``None`` when it says no, the draft then recorded in ``drafts.withdrawn``."""
    if keep is None:
        return sample_draft(draft, sampling, rng)
    distribution = q, probs = draft_distribution(draft, sampling)
    token, prob, top, entropy = confidence(probs, draft.logits.argmax())  # type: ignore[union-attr]
    if not keep(
        DraftStep(asked.index + 1, asked.max_draft_tokens, asked.costs, None, None, top, entropy, asked.row)
    ):
        drafts.withdrawn = (draft, q, top, entropy)
        return None
    if sampling.greedy:  # the argmax, read with its confidence
        return token, None, prob, top, entropy
    return sample_draft(draft, sampling, rng, distribution)


def draft_distribution(draft: Draft, sampling: SamplingParams) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(q to sample and verify with, ``None`` when greedy: one-hot at the argmax; the
    distribution its confidence is read from: q, or at temperature 0 the softmax). # [V]"""
    logits = draft.logits
    assert logits is not None
    check_finite(logits, "Draft")
    if sampling.greedy:
        return None, torch.softmax(logits.float(), dim=-1)
    probs = process_logits(logits[None], sampling)[0]
    return probs, probs


def acceptance_chance(draft: Draft, q: torch.Tensor | None, p: torch.Tensor) -> float:
    """sum_x min(p(x), q(x)): the chance that a draft from q is accepted against p. # [V], [V]"""
    if q is None:
        assert draft.logits is not None
        return float(p[draft.logits.argmax()])
    return float(torch.minimum(p, q.to(p.dtype)).sum())


def target_probs(adapter: Any, top: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The target's p ``[n, V]`` from its last-layer states ``[1, n, H]`` (checked finite)."""
    logits = adapter.logits(adapter.norm(top))
    check_finite(logits, "Target")
    return process_logits(logits, sampling)


class Generation:
    """Iterate for the tokens each round commits; ``stats`` holds the totals so far."""

    def __init__(
        self, decoder: SpeculativeDecoder, prompt: list[int], config: GenerationConfig, rng: RandomSource
    ) -> None:
        self.decoder = decoder
        self.config = config
        self.rng = rng
        self.sampling = SamplingParams(config.temperature, config.top_k, config.top_p)
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        capacity = len(prompt) + config.max_new_tokens + decoder.config.max_draft_tokens + 1
        # committed tokens, then this round's drafts; host memory: the engine reads them every round
        self.tokens = torch.zeros(capacity, dtype=torch.long, device=HOST)
        self.tokens[: len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=HOST)
        self.length = len(prompt)
        self.prompt_length = len(prompt)
        self.cache = decoder.adapter.new_cache(
            capacity=decoder.cache_capacity(len(prompt), config.max_new_tokens)
        )
        self.draft_state: Any = None
        withdraws = decoder.drafter is not None and getattr(decoder.drafter, "withdraws", False) is True
        self.keep = decoder.guard.keeper(decoder.controller) if withdraws else None
        self.done = False
        self._started: float | None = None

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> list[int]:
        """Run one round (the first call prefills too) and return the tokens it committed."""
        if self.done:
            raise StopIteration
        with torch.inference_mode():
            committed = self._prefill() if self._started is None else self._round()
        self.stats.total_time = self.decoder.clock() - self._started  # type: ignore[operator]
        if self.done:
            self.decoder.generation_ended(self.stats)
        return committed

    @property
    def sequence(self) -> list[int]:
        """The prompt and every committed token."""
        return self.tokens[: self.length].tolist()

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - (self.length - self.prompt_length)

    # -- prefill ----------------------------------------------------------------------------------

    def _prefill(self) -> list[int]:
        """Fill every cache with the whole prompt and commit the first new token, drawn from p at
        the prompt's last position (a plain step's draw); that token becomes the pending one."""
        dec = self.decoder
        self._started = dec.clock()
        dec.prepare()
        adapter, drafter = dec.adapter, dec.drafter
        tokens = self.tokens[: self.length]
        shared = drafter.shared_layers if drafter is not None else 0
        hidden = adapter.embed(tokens.to(adapter.device))
        rotary = adapter.rotary(hidden, 0)
        hidden = adapter.run_layers(hidden, 0, shared, self.cache, 0, rotary)
        if drafter is not None:
            self.draft_state = dec.guard.call_drafter(
                "begin", drafter.begin, self.cache, tokens, hidden if shared else None
            )
        top = adapter.run_layers(hidden, shared, adapter.num_layers, self.cache, 0, rotary)
        if drafter is not None and drafter.reads_top_states:
            dec.guard.call_drafter("top_states", drafter.top_states, self.draft_state, top, 0)
        p = target_probs(adapter, top[:, -1:], self.sampling)  # [1, V]
        _, token = dec.guard.verify(dec.verifier, tokens[:0], None, p, self.rng)
        if drafter is not None:
            request = Request(
                self.prompt_length,
                self.config.max_new_tokens,
                dec.config.max_draft_tokens,
                self.sampling,
                dec.costs.snapshot(),
                withdraws=self.keep is not None,
            )
            dec.guard.call_controller("start", dec.controller.start, request)
        self.stats.rounds += 1  # a target pass that committed one token
        committed = self._commit([token])
        self.stats.prefill_time = dec.clock() - self._started
        return committed

    # -- one round --------------------------------------------------------------------------------

    def _round(self) -> list[int]:
        dec = self.decoder
        position = self.length - 1
        max_k = min(dec.config.max_draft_tokens, self.remaining - 1)
        costs = dec.costs.snapshot()
        t0 = dec.clock()
        drafts, hidden = self._draft(position, max_k, costs)
        t1 = dec.clock()
        k = len(drafts.tokens)
        p, top = self._target(position, k, hidden)  # [k+1, V]
        draft_tokens = self.tokens[position + 1 : position + 1 + k]
        n, token = dec.guard.verify(dec.verifier, draft_tokens, drafts.q(p.shape[-1]), p, self.rng)
        if dec.drafter is not None and dec.drafter.reads_top_states:
            dec.guard.call_drafter("top_states", dec.drafter.top_states, self.draft_state, top, position)
        t2 = dec.clock()
        withdrawn = None
        if drafts.withdrawn is not None:
            draft, q, top1, entropy = drafts.withdrawn
            seen = acceptance_chance(draft, q, p[k]) if n == k else None
            withdrawn = Withdrawn(top1, entropy, seen)
        committed = drafts.tokens[:n] + [token]
        self._rollback(position + n + 1)
        dec.costs.observe(k, t1 - t0, t2 - t1, withdrawn is not None)
        outcome = RoundOutcome(
            position,
            k,
            n,
            tuple(committed),
            t1 - t0,
            t2 - t1,
            tuple(drafts.probs),
            tuple(drafts.top1),
            tuple(drafts.entropies),
            costs,
            withdrawn=withdrawn,
        )
        if dec.drafter is not None:
            dec.guard.call_controller("update", dec.controller.update, outcome)
        committed = self._commit(committed)
        self.stats.add_round(outcome)
        dec.round_ended(outcome)
        return committed

    def _draft(self, position: int, max_k: int, costs: Any) -> tuple[RoundDrafts, torch.Tensor | None]:
        """The one draft loop: ask the controller, take a draft step, sample, record; repeat."""
        dec = self.decoder
        drafts = RoundDrafts()
        drafter = dec.drafter
        if drafter is None:
            return drafts, None
        ask, guard, state = dec.guard.asker(dec.controller, max_k), dec.guard, self.draft_state
        fixed: list[int] = []
        token = int(self.tokens[position])
        step = DraftStep(index=0, max_draft_tokens=max_k, costs=costs)
        while ask(step):
            i = len(drafts.tokens)
            if not fixed:
                history = self.tokens[: position + 1 + i]
                draft = guard.call_drafter("step", drafter.step, state, token, position + i, history)
                guard.check_draft(draft)
                if draft.logits is None:
                    fixed = list(draft.tokens)
                    if not fixed:
                        break
            if fixed:
                token, row, prob, top, entropy = fixed.pop(0), None, 1.0, 1.0, 0.0
            else:
                drawn = draw_unless_withdrawn(draft, self.sampling, self.rng, self.keep, step, drafts)
                if drawn is None:
                    break
                token, row, prob, top, entropy = drawn
            drafts.add(token, row, prob, top, entropy)
            self.tokens[position + 1 + i] = token
            step = DraftStep(len(drafts.tokens), max_k, costs, token, prob, top, entropy)
        k = len(drafts.tokens)
        last = None if drafts.withdrawn is not None else token
        hidden = guard.call_drafter("finish", drafter.finish, state, last, position + k)
        guard.check_hidden(hidden, k, drafter.shared_layers, dec.adapter.num_layers)
        return drafts, hidden

    def _target(
        self, position: int, k: int, hidden: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """p over [pending, d_1..d_k] ``[k+1, V]``, running only the layers the drafter did not;
        also the last-layer states ``[1, k+1, H]`` before the final norm."""
        dec = self.decoder
        adapter = dec.adapter
        start = dec.drafter.shared_layers if hidden is not None and dec.drafter is not None else 0
        if hidden is None:
            hidden = adapter.embed(self.tokens[position : position + k + 1].to(adapter.device))
        dec.guard.check_cache(self.cache, start, position, k)
        top = adapter.run_layers(hidden, start, adapter.num_layers, self.cache, position)
        return target_probs(adapter, top, self.sampling), top  # [k+1, V]

    def _rollback(self, length: int) -> None:
        self.cache.crop(length)
        dec = self.decoder
        if dec.drafter is not None:
            dec.guard.call_drafter("rollback", dec.drafter.rollback, self.draft_state, length)

    def _commit(self, tokens: list[int]) -> list[int]:
        """Append the round's tokens, cut at the first EOS or at max_new_tokens."""
        eos = self.config.eos_token_id
        for i, token in enumerate(tokens):
            if token in eos:
                tokens, self.done, self.stats.stopped_by = tokens[: i + 1], True, "eos"
                break
        if len(tokens) >= self.remaining:
            tokens, self.done = tokens[: self.remaining], True
            self.stats.stopped_by = self.stats.stopped_by or "max_new_tokens"
        new = torch.tensor(tokens, dtype=torch.long, device=HOST)
        self.tokens[self.length : self.length + len(tokens)] = new
        self.length += len(tokens)
        self.stats.new_tokens += len(tokens)
        return tokens
