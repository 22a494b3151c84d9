"""The Thompson-sampling controller (``controller="thompson"``): Beta-TS and Calibration-TS.

Each round it draws theta from the posterior over "a draft is accepted", then either flips
chi ~ Bernoulli(theta) before every draft (the paper's rule) or, by default, weighs the expected
tokens against the measured cost of drafting and verifying (:mod:`eesd_thompson.rule`), so that a
drafter that is rarely right ends up decoding plainly and is only probed when a posterior draw
says drafting might pay; when the measured costs say drafting could never pay, it still probes ever
more rarely, in case a noisy first measurement overstated them. Calibration-TS replaces theta for
the drafts already made by the posterior of their confidence bucket. Where the engine allows it,
``keep`` takes back a draft whose bucket says it would not repay its verification, and a round may
draft one token only to look at its confidence (``ThompsonOptions.withdraw``). The rows of a batch
round share its draws: a draft step is the whole batch's time, so the batch explores as one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eesd_core.protocols import Costs, DraftStep, Request, RoundOutcome, Withdrawn
from eesd_thompson.gate import BatchGate
from eesd_thompson.options import ThompsonOptions
from eesd_thompson.posterior import Beta, Buckets, Frequencies
from eesd_thompson.rule import best_rate, draft_on, round_times


@dataclass
class _Round:
    """What a round holds between its draft decisions (one per row of a batch)."""

    theta: float = 0.5
    cells: dict[int, float] = field(default_factory=dict)
    survival: float = 1.0
    times: list[float] | None = None
    rate: float = 0.0
    limit: int = 0
    peek: float | None = None  # Costs.peek


class _Lockstep:
    """Which draft steps the rows of a batch round made or refused so far.

    A batch drafts in lockstep and verifies every row over the longest round's positions, so a
    step that one row makes lengthens the round for all, and once made it costs the rows asked
    after it nothing more. The row that would make a step weighs its time, which every row waits
    for, against the tokens of the rows that may still draft it, taken to be like itself: those
    that drafted the step before (every row, for the first step), less those that refused it
    already. Alone there is one row, and the weight is 1."""

    def __init__(self) -> None:
        self._asked: set[int] = set()  # rows asked for their first draft this round
        self._rows = 1  # rows of the round (those that wait for a longer round)
        self._made: dict[int, int] = {}  # index -> rows that drafted at that index this round
        self._refused: dict[int, int] = {}  # index -> rows that stopped at that index
        self.plain = False  # this round is plain for every row (``refresh``, or the batch's gate)

    def asked(self, row: int) -> bool | None:
        """A row asked for its first draft; if that begins a new round, whether the round before
        drafted (else ``None``)."""
        drafted = None
        if row in self._asked:  # asked again: a new round, of the rows the last one asked at most
            drafted = bool(self._made)
            self._rows = len(self._asked)
            self._asked, self._made, self._refused = set(), {}, {}
            self.plain = False
        self._asked.add(row)
        self._rows = max(self._rows, len(self._asked))
        return drafted

    def answered(self, index: int, drafts: bool) -> None:
        tally = self._made if drafts else self._refused
        tally[index] = tally.get(index, 0) + 1

    def made(self, index: int) -> bool:
        """Whether a row of this round already made draft step ``index``."""
        return self._made.get(index, 0) > 0

    def weight(self, index: int) -> float:
        """Rows whose time one more step spends, per row that may still draft it."""
        before = self._rows if index == 0 else self._made.get(index - 1, 0)
        return self._rows / max(before - self._refused.get(index, 0), 1)


class ThompsonController:
    """Thompson sampling over the acceptance probability, stopping by cost or by a Bernoulli draw."""

    def __init__(self, options: ThompsonOptions | None = None) -> None:
        self.options = o = options or ThompsonOptions()
        self.rng = random.Random(o.seed)
        self.posterior = Beta(o.alpha0, o.beta0)
        self.buckets = Buckets(o.edges or (), o.alpha0, o.beta0)
        self.first_seen = Frequencies(len(self.buckets.cells))  # buckets of first drafts' signals
        self.withdraws = False
        self._kinds: dict[int, set[int]] = {}  # the k of rounds seen, by batch size (Costs.batch_size)
        self.rounds = 0
        self._rounds: dict[int, _Round] = {}  # by row: a batch asks its rows in turn
        self._round = _Round()
        self._lockstep = _Lockstep()
        self._since_plain: dict[int, int] = {}  # rounds since a plain one, by batch size
        self._since_verified = 0  # rounds since one verified a draft (``refresh`` of kept drafts)
        self._shared: dict[tuple[Any, ...], tuple[object, Any]] = {}  # see _once
        self._gates: dict[int, BatchGate] = {}  # by batch size, for static batches (``gate``)
        self._static = False  # this generation is one batch call
        self._max_k = 0  # Request.max_draft_tokens

    @property
    def kinds_seen(self) -> set[int]:
        """The k of the rounds seen alone (a batch size's costs are learnt apart: ``_kinds``)."""
        return self._kinds.setdefault(1, set())

    @kinds_seen.setter
    def kinds_seen(self, kinds: set[int]) -> None:
        self._kinds[1] = kinds

    # -- the protocol ---------------------------------------------------------------------------

    def start(self, request: Request) -> None:
        self._lockstep = _Lockstep()  # a new generation: its rows are asked afresh
        self._shared.clear()
        self.withdraws = request.withdraws and self.options.withdraw and self.options.stop_rule == "cost"
        self._static = request.batch_size > 1 and self.options.gate and self.options.stop_rule == "cost"
        self._max_k = request.max_draft_tokens
        for gate in self._gates.values():
            gate.start(0.0 if self.options.scope == "request" else self.options.decay)
        if self.options.scope == "request":
            self.posterior.reset()
            self.buckets.reset()
            self.first_seen.reset()
            self.rng.seed(self.options.seed)
        else:
            self.posterior.decay(self.options.decay, self.options.carry)
            self.buckets.decay(self.options.decay, self.options.carry)
            self.first_seen.decay(self.options.decay, self.options.carry)

    def should_continue(self, step: DraftStep) -> bool:
        if step.index == 0:
            drafted = self._lockstep.asked(step.row)
            if drafted is not None:  # a new round: what the rows of the last one shared is done
                self._shared.clear()
                self._round_ended(drafted, step.costs)
            if self._lockstep.plain:  # decided for the whole round: the rows after the first
                self._lockstep.answered(0, False)  # cost a set lookup, not a posterior draw
                return False
            self._round = self._rounds[step.row] = _Round()
            self._begin_round(step)
        else:
            self._round = self._rounds.setdefault(step.row, self._round)
        drafts = self._decide(step)
        self._lockstep.answered(step.index, drafts)
        return drafts

    def _decide(self, step: DraftStep) -> bool:
        if step.index >= self._round.limit:
            return False
        if step.index and self.options.resample == "step":
            self._draw()
        survival = self._advance(step)
        if self.options.stop_rule == "bernoulli":
            return self.rng.random() < (self._latest_theta(step) if step.index else self._round.theta)
        if self._round.times is None:
            return step.index < self._explore_k(step.costs)
        if self._lockstep.plain:
            return False
        if self._lockstep.made(step.index):
            return True  # another row of the batch made this step: the round is that long anyway
        if step.index == 0 and self._gate_shut(step.costs):
            self._lockstep.plain = True
            return False
        pays = self._pays_on(step.index, survival)
        if (
            not pays
            and step.index == 0
            and step.costs.batch_size > 1
            and step.max_draft_tokens >= self._max_k
        ):
            # the rows asked after this one share its draws (_draw) at a higher weight: none would
            # draft, so the round is plain, and they cost a lookup, not the rule
            self._lockstep.plain = True
        return pays

    def keep(self, step: DraftStep) -> bool:
        """Whether to verify a draft whose q was seen (asked before it is sampled, only when the
        engine can take it back): yes while the tokens it may add are worth the verification it
        adds (its draft step is spent). The draft's chance is its confidence bucket's posterior
        mean, not a draw: a withdrawn draft after accepted ones is judged for free, so there is
        nothing to explore here. After ``refresh`` rounds without a verified draft one is kept
        whatever it may add, so that the costs that keep weighs, which only rounds with verified
        drafts measure, cannot rest on a slow first measurement for good."""
        self._round = self._rounds.setdefault(step.row, self._round)
        times = self._round.times
        if not self.withdraws or times is None or step.costs.peek is None:
            return True
        every = self.options.refresh
        if every is not None and self._since_verified >= every:
            return True
        extra = max(times[step.index] - times[step.index - 1] - step.costs.peek, 0.0)
        price = self._round.rate * self._lockstep.weight(step.index - 1)
        return self._round.survival * self._expected(step) > price * extra

    def update(self, outcome: RoundOutcome) -> None:
        self.rounds += 1
        self._shared.clear()
        if self._static and outcome.costs.batch_size > 1:
            size = outcome.costs.batch_size
            (self._gates.get(size) or self._gates.setdefault(size, BatchGate())).observe(outcome)
        self._kinds.setdefault(outcome.costs.batch_size, set()).add(outcome.drafted)
        k, n, withdrawn = outcome.drafted, outcome.accepted, outcome.withdrawn
        self._since_verified = 0 if k else self._since_verified + 1
        if k == 0 and withdrawn is None:
            return
        late = None if withdrawn is None else self._signal(withdrawn)
        first = self._signals(outcome)[0] if k else late
        if first is not None:
            self.first_seen.observe(self.buckets.index(first))
        # a withdrawn draft after k accepted ones is judged for free by the pass the round made
        seen = None if withdrawn is None or n < k else withdrawn.acceptance
        failures = (k - n) if self.options.failures == "all" else float(n < k)
        self.posterior.observe(n + (seen or 0.0), failures + (0.0 if seen is None else 1.0 - seen))
        if self.options.variant == "calibration":
            self.buckets.observe_round(self._signals(outcome), n)
            if seen is not None and late is not None:
                self.buckets.cells[self.buckets.index(late)].observe(seen, 1.0 - seen)

    # -- internals ------------------------------------------------------------------------------

    def _round_ended(self, drafted: bool, costs: Costs) -> None:
        """Count rounds since a plain one at this batch size; make this round plain if too many."""
        size = costs.batch_size
        self._since_plain[size] = self._since_plain.get(size, 0) + 1 if drafted else 0
        every = self.options.refresh
        if every is not None and self.options.stop_rule == "cost" and self._since_plain[size] >= every:
            self._lockstep.plain = True

    def _begin_round(self, step: DraftStep) -> None:
        """Draw theta for the round; once costs are known, price time and cap probing rounds."""
        cap = self.options.max_draft_tokens
        self._round.limit = step.max_draft_tokens if cap is None else min(step.max_draft_tokens, cap)
        self._round.survival = 1.0
        self._round.times = None
        self._round.peek = step.costs.peek
        if self.options.stop_rule == "cost":
            limit = self._round.limit
            times = self._once(("times", limit), step.costs, lambda: self._round_times(step.costs, limit))
            self._round.times = times
        self._draw(step.costs if step.costs.batch_size > 1 else None)
        probe, times = self.options.probe_tokens, self._round.times
        if times is not None and probe is not None and not self._once(("pays",), times, self._pays):
            self._round.limit = min(self._round.limit, probe)

    def _draw(self, batch: Costs | None = None) -> None:
        """Draw theta (and, as they are needed, the buckets' draws) for this row's round. The rows
        of a batch round (``batch``: its costs) share one draw: a draft step is the whole batch's
        time, so the batch explores as one, and B rows cost one draw, not B."""
        if batch is None:
            self._round.theta, self._round.cells = self.posterior.sample(self.rng), {}
        else:
            self._round.theta, self._round.cells = self._once(
                ("draw",), batch, lambda: (self.posterior.sample(self.rng), {})
            )
        times, theta = self._round.times, self._round.theta
        if times is not None:
            rate = lambda: best_rate(theta, times)  # noqa: E731
            self._round.rate = rate() if batch is None else self._once(("rate",), times, rate)

    def _pays(self) -> bool:
        """Whether drafting pays at the posterior mean: if not, drafting now is a probe."""
        assert self._round.times is not None
        mean = self.posterior.mean
        return draft_on(0, 1.0, mean, self._round.times, best_rate(mean, self._round.times))

    def _pays_on(self, index: int, survival: float) -> bool:
        """The cost rule, then a look (a first draft kept only if its confidence says so), then
        the rare one-draft probe while drafting looks hopeless."""
        assert self._round.times is not None
        weight = self._lockstep.weight(index)
        if draft_on(index, survival, self._round.theta, self._round.times, self._round.rate, weight):
            return True
        if index == 0 and self._look_pays(weight):
            return True
        locked = index == 0 and self._once(("locked",), self._round.times, self._locked_out)
        if locked and self.rng.random() < self.options.explore / (1 + self.rounds):
            self._round.limit = 1
            return True
        return False

    def _once(self, key: tuple[Any, ...], anchor: object, compute: Callable[[], Any]) -> Any:
        """A value that the rows of a batch round share, computed for the first row that needs it:
        it depends only on ``anchor`` (the round's costs, or its round times) and on the posterior,
        and neither changes between the rows' asks (``update`` and ``start`` forget them all)."""
        held = self._shared.get(key)
        if held is None or held[0] is not anchor:
            held = self._shared[key] = (anchor, compute())
        return held[1]

    def _gate_shut(self, costs: Costs) -> bool:
        """Whether this batch size's gate keeps the round plain: to measure plain rounds, or
        while it is shut, when a round still probes, ever more rarely (``explore``), so that
        drafting is measured again."""
        gate = self._gates.get(costs.batch_size) if self._static else None
        if gate is not None and gate.measuring:
            return True
        if gate is None or not gate.shut:
            return False
        chance = self.options.explore / (1 + gate.plain.rounds)
        return not self._once(("gate",), self._round.times, lambda: self.rng.random() < chance)

    def _look_pays(self, weight: float) -> bool:
        """Whether drafting one token only to see its confidence is worth its step: the tokens
        that the confident buckets (drawn, weighted by how often first drafts fall in them) would
        add beyond their verification, against the price of the step. In a batch the step and a
        kept draft's verification are every row's time: ``weight`` (:meth:`_Lockstep.weight`)
        prices them per row that may still look, so rows asked after others refused look only
        for more."""
        times, peek = self._round.times, self._round.peek
        if not self.withdraws or self.options.variant != "calibration" or times is None or peek is None:
            return False
        price = self._round.rate * weight
        extra = max(times[1] - times[0] - peek, 0.0)
        value = 0.0
        for cell, share in enumerate(self.first_seen.shares()):
            if cell not in self._round.cells:
                self._round.cells[cell] = self.buckets.cells[cell].sample(self.rng, self.posterior.mean)
            value += share * max(self._round.cells[cell] - price * extra, 0.0)
        return value > price * peek

    def _locked_out(self) -> bool:
        """Whether the measured costs say drafting could not pay even if every draft were accepted."""
        assert self._round.times is not None
        return not draft_on(0, 1.0, 1.0, self._round.times, best_rate(1.0, self._round.times))

    def _explore_k(self, costs: Costs) -> int:
        """Drafts while costs are unknown: one round of one draft, then one plain step (at each
        batch size, whose costs are measured apart)."""
        return 0 if self._seen(costs) - {0} else 1

    def _seen(self, costs: Costs) -> set[int]:
        """The k of the rounds seen at the batch size of ``costs``."""
        return self._kinds.get(costs.batch_size, set())

    def _round_times(self, costs: Costs, limit: int) -> list[float] | None:
        """round_time(k) for k = 0 .. limit, or None while the costs rest on a single k."""
        kinds = self._seen(costs)
        if len(kinds) < 2:
            return None
        return round_times(costs, limit, kinds)

    def _advance(self, step: DraftStep) -> float:
        """Probability that every draft so far is accepted, under this round's draws."""
        if step.index:
            self._round.survival *= self._latest_theta(step)
        return self._round.survival

    def _latest_theta(self, step: DraftStep) -> float:
        """theta for the latest draft: its bucket's draw (Calibration-TS) or the round's theta."""
        value = self._signal(step)
        if self.options.variant != "calibration" or value is None:
            return self._round.theta
        cell = self.buckets.index(value)
        if cell not in self._round.cells:
            self._round.cells[cell] = self.buckets.cells[cell].sample(self.rng, self.posterior.mean)
        return self._round.cells[cell]

    def _expected(self, step: DraftStep) -> float:
        """The posterior mean chance that the latest draft is accepted: its bucket's, centred on
        the overall mean (Calibration-TS), or the overall mean."""
        value = self._signal(step)
        if self.options.variant != "calibration" or value is None:
            return self.posterior.mean
        return self.buckets.cells[self.buckets.index(value)].centered_mean(self.posterior.mean)

    def _signal(self, step: DraftStep | Withdrawn) -> float | None:
        """The latest draft's confidence (a withdrawn draft has no ``prob``: it was never drawn)."""
        if self.options.signal == "prob":
            return step.prob if isinstance(step, DraftStep) else None
        return step.top1 if self.options.signal == "top1" else step.entropy

    def _signals(self, outcome: RoundOutcome) -> tuple[float, ...]:
        signals = {"top1": outcome.top1, "prob": outcome.probs, "entropy": outcome.entropies}
        return signals[self.options.signal]
