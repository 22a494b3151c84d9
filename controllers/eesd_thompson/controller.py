"""The Thompson-sampling controller (``controller="thompson"``): Beta-TS and Calibration-TS.

Each round it draws theta from the posterior over "a draft is accepted", then either flips
chi ~ Bernoulli(theta) before every draft (the paper's rule) or, by default, weighs the expected
tokens against the measured cost of drafting and verifying (:mod:`eesd_thompson.rule`), so that a
drafter that is rarely right ends up decoding plainly and is only probed when a posterior draw
says drafting might pay; when the measured costs say drafting could never pay, it still probes now
and then (ever more rarely, down to a floor), in case a measurement taken under load overstated
them. Calibration-TS replaces theta for the drafts already made by the posterior of their
confidence bucket. Where the engine allows it, ``keep`` takes back a draft whose bucket says it
would not repay its verification, and a round may draft one token only to look at its confidence
(``ThompsonOptions.withdraw``). The rows of a batch round share its draws: a draft step is the
whole batch's time, so the batch explores as one.

:class:`ThompsonController` keeps what carries across generations (the posteriors with
``scope="global"``, the round kinds measured at each batch size, the batch gates) behind a lock;
each generation decides with a :class:`_Run` of its own, which ``start`` returns.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eesd_core.protocols import Confidence, Costs, DraftStep, Request, RoundOutcome, RoundStart
from eesd_thompson.gate import BatchGate
from eesd_thompson.options import ThompsonOptions
from eesd_thompson.posterior import Beta, Buckets, Frequencies
from eesd_thompson.rule import best_rate, draft_on, round_times

LONGEST_WAIT = 1024  # rounds: the most a decoder locked out of drafting waits between probes


@dataclass
class _Learnt:
    """What acceptance taught: across generations (``scope="global"``) or in one."""

    posterior: Beta
    buckets: Buckets
    first_seen: Frequencies  # buckets of first drafts' signals


@dataclass
class _Round:
    """What a row's round holds between its draft decisions."""

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

    def __init__(self, rows: int = 1) -> None:
        self.rows = max(rows, 1)
        self.made: dict[int, int] = {}  # index -> rows that drafted at that index this round
        self.refused: dict[int, int] = {}  # index -> rows that stopped at that index
        self.plain = False  # this round is plain for every row (``refresh``, or the batch's gate)

    def answered(self, index: int, drafts: bool) -> None:
        tally = self.made if drafts else self.refused
        tally[index] = tally.get(index, 0) + 1

    def weight(self, index: int) -> float:
        """Rows whose time one more step spends, per row that may still draft it."""
        before = self.rows if index == 0 else self.made.get(index - 1, 0)
        return self.rows / max(before - self.refused.get(index, 0), 1)


class ThompsonController:
    """Thompson sampling over the acceptance probability, stopping by cost or by a Bernoulli draw."""

    withdraws = True

    def __init__(self, options: ThompsonOptions | None = None) -> None:
        self.options = options or ThompsonOptions()
        self.rng = random.Random(self.options.seed)
        self.learnt = self._fresh()
        self.kinds: dict[int, set[int]] = {}  # the k of rounds seen, by batch size (Costs.batch_size)
        self.rounds = 0  # rows' rounds learnt from
        self.since_plain: dict[int, int] = {}  # rounds since a plain one, by batch size
        self.since_drafted: dict[int, int] = {}  # rounds since one made a draft step, by batch size
        self.waits: dict[int, int] = {}  # rounds a locked-out batch size waits to probe (_probe_due)
        self.since_verified = 0  # rounds since one verified a draft (``refresh`` of kept drafts)
        self.gates: dict[int, BatchGate] = {}  # by batch size, for static batches (``gate``)
        self._lock = threading.Lock()

    def _fresh(self) -> _Learnt:
        o = self.options
        buckets = Buckets(o.edges or (), o.alpha0, o.beta0)
        return _Learnt(Beta(o.alpha0, o.beta0), buckets, Frequencies(len(buckets.cells)))

    @property
    def posterior(self) -> Beta:
        """The posterior the latest generation learns in (the shared one with ``scope="global"``)."""
        return self.learnt.posterior

    @property
    def buckets(self) -> Buckets:
        return self.learnt.buckets

    @property
    def kinds_seen(self) -> set[int]:
        """The k of the rounds seen alone (a batch size's costs are learnt apart: ``kinds``)."""
        return self.kinds.setdefault(1, set())

    @kinds_seen.setter
    def kinds_seen(self, kinds: set[int]) -> None:
        self.kinds[1] = kinds

    # -- the protocol ---------------------------------------------------------------------------

    def start(self, request: Request) -> _Run:
        o = self.options
        with self._lock:
            for gate in self.gates.values():
                gate.start(0.0 if o.scope == "request" else o.decay)
            if o.scope == "request":
                self.learnt, rng = self._fresh(), random.Random(o.seed)
            else:
                for part in (self.learnt.posterior, self.learnt.buckets, self.learnt.first_seen):
                    part.decay(o.decay, o.carry)
                rng = self.rng
        return _Run(self, request, self.learnt, rng)

    def begin_round(self, state: _Run, round: RoundStart) -> None:
        state.begin_round(round)

    def should_continue(self, state: _Run, step: DraftStep) -> bool:
        return state.should_continue(step)

    def keep(self, state: _Run, step: DraftStep) -> bool:
        return state.keep(step)

    def update(self, state: _Run, outcomes: Sequence[RoundOutcome]) -> None:
        with self._lock:
            for outcome in outcomes:
                state.learn(outcome)
            if state.static and outcomes and outcomes[0].costs.batch_size > 1:
                size = outcomes[0].costs.batch_size
                self.gates.setdefault(size, BatchGate()).observe_round(outcomes)
        state.drafted = any(o.drafted or o.withdrawn is not None for o in outcomes)


class _Run:
    """One generation's decisions (the controller's state for it)."""

    def __init__(
        self, owner: ThompsonController, request: Request, learnt: _Learnt, rng: random.Random
    ) -> None:
        o = owner.options
        self.owner, self.options, self.learnt, self.rng = owner, o, learnt, rng
        self.withdraws = request.withdraws and o.withdraw and o.stop_rule == "cost"
        self.static = request.batch_size > 1 and o.gate and o.stop_rule == "cost"
        self.max_k = request.max_draft_tokens
        self.rounds: dict[int, _Round] = {}  # by row
        self.round = _Round()
        self.lockstep = _Lockstep()
        self.shared: dict[tuple[Any, ...], tuple[object, Any]] = {}  # see _once
        self.drafted: bool | None = None  # whether the round just reported made a draft step (None: none)

    # -- the protocol, per generation ------------------------------------------------------------

    def begin_round(self, round: RoundStart) -> None:
        self.lockstep, self.shared = _Lockstep(len(round.rows)), {}
        if self.drafted is not None:  # the round before was reported: count it, once
            self._round_ended(self.drafted, round.costs)
            self.drafted = None
        self.costs = round.costs

    def should_continue(self, step: DraftStep) -> bool:
        if step.index == 0:
            if self.lockstep.plain:  # decided for the whole round: the rows after the first
                self.lockstep.answered(0, False)  # cost a set lookup, not a posterior draw
                return False
            self.round = self.rounds[step.row] = _Round()
            self._begin_round(step)
        else:
            self.round = self.rounds.setdefault(step.row, self.round)
        drafts = self._decide(step)
        self.lockstep.answered(step.index, drafts)
        return drafts

    def keep(self, step: DraftStep) -> bool:
        """Whether to verify a draft whose q was seen: yes while the tokens it may add are worth
        the verification it adds (its draft step is spent). The draft's chance is its confidence
        bucket's posterior mean, not a draw: a withdrawn draft after accepted ones is judged for
        free, so there is nothing to explore here. After ``refresh`` rounds without a verified
        draft one is kept whatever it may add, so that the costs that keep weighs, which only
        rounds with verified drafts measure, cannot rest on a slow first measurement for good."""
        self.round = self.rounds.setdefault(step.row, self.round)
        times = self.round.times
        if not self.withdraws or times is None or self.costs.peek is None:
            return True
        every = self.options.refresh
        if every is not None and self.owner.since_verified >= every:
            return True
        extra = max(times[step.index] - times[step.index - 1] - self.costs.peek, 0.0)
        price = self.round.rate * self.lockstep.weight(step.index - 1)
        return self.round.survival * self._expected(step.confidence) > price * extra

    def learn(self, outcome: RoundOutcome) -> None:
        """One row's outcome, into what the controller learns (its lock held)."""
        owner, learnt = self.owner, self.learnt
        owner.rounds += 1
        owner.kinds.setdefault(outcome.costs.batch_size, set()).add(outcome.drafted)
        k, n, withdrawn = outcome.drafted, outcome.accepted, outcome.withdrawn
        owner.since_verified = 0 if k else owner.since_verified + 1
        if k == 0 and withdrawn is None:
            return
        late = None if withdrawn is None else self._signal(withdrawn.confidence)
        first = self._signal(outcome.confidences[0]) if k else late
        if first is not None:
            learnt.first_seen.observe(learnt.buckets.index(first))
        # a withdrawn draft after k accepted ones is judged for free by the pass the round made
        seen = None if withdrawn is None or n < k else withdrawn.acceptance
        failures = (k - n) if self.options.failures == "all" else float(n < k)
        learnt.posterior.observe(n + (seen or 0.0), failures + (0.0 if seen is None else 1.0 - seen))
        if self.options.variant == "calibration":
            signals = [self._signal(c) for c in outcome.confidences]
            learnt.buckets.observe_round([v for v in signals if v is not None], n)
            if seen is not None and late is not None:
                learnt.buckets.cells[learnt.buckets.index(late)].observe(seen, 1.0 - seen)

    # -- internals ------------------------------------------------------------------------------

    def _decide(self, step: DraftStep) -> bool:
        if step.index >= self.round.limit:
            return False
        if step.index and self.options.resample == "step":
            self._draw()
        survival = self._advance(step)
        if self.options.stop_rule == "bernoulli":
            theta = self._latest_theta(step) if step.index else self.round.theta
            return self.rng.random() < theta
        if self.round.times is None:
            return step.index < self._explore_k(self.costs)
        if self.lockstep.plain:
            return False
        if self.lockstep.made.get(step.index, 0):
            return True  # another row of the batch made this step: the round is that long anyway
        if step.index == 0 and self._gate_shut(self.costs):
            self.lockstep.plain = True
            return False
        pays = self._pays_on(step.index, survival)
        if not pays and step.index == 0 and self.costs.batch_size > 1 and step.max_draft_tokens >= self.max_k:
            # the rows asked after this one share its draws (_draw) at a higher weight: none would
            # draft, so the round is plain, and they cost a lookup, not the rule
            self.lockstep.plain = True
        return pays

    def _round_ended(self, drafted: bool, costs: Costs) -> None:
        """Count rounds since a plain one and since a draft step at this batch size; make this
        round plain if too many were not."""
        size, owner = costs.batch_size, self.owner
        owner.since_plain[size] = owner.since_plain.get(size, 0) + 1 if drafted else 0
        owner.since_drafted[size] = 0 if drafted else owner.since_drafted.get(size, 0) + 1
        every = self.options.refresh
        if every is not None and self.options.stop_rule == "cost" and owner.since_plain[size] >= every:
            self.lockstep.plain = True

    def _begin_round(self, step: DraftStep) -> None:
        """Draw theta for the row's round; once costs are known, price time and cap probing rounds."""
        cap, costs = self.options.max_draft_tokens, self.costs
        self.round.limit = step.max_draft_tokens if cap is None else min(step.max_draft_tokens, cap)
        self.round.peek = costs.peek
        if self.options.stop_rule == "cost":
            limit = self.round.limit
            self.round.times = self._once(("times", limit), costs, lambda: self._round_times(costs, limit))
        self._draw(costs if costs.batch_size > 1 else None)
        probe, times = self.options.probe_tokens, self.round.times
        if times is not None and probe is not None and not self._once(("pays",), times, self._pays):
            self.round.limit = min(self.round.limit, probe)

    def _draw(self, batch: Costs | None = None) -> None:
        """Draw theta (and, as they are needed, the buckets' draws) for this row's round. The rows
        of a batch round (``batch``: its costs) share one draw: a draft step is the whole batch's
        time, so the batch explores as one, and B rows cost one draw, not B."""
        posterior = self.learnt.posterior
        if batch is None:
            self.round.theta, self.round.cells = posterior.sample(self.rng), {}
        else:
            self.round.theta, self.round.cells = self._once(
                ("draw",), batch, lambda: (posterior.sample(self.rng), {})
            )
        times, theta = self.round.times, self.round.theta
        if times is not None:
            rate = lambda: best_rate(theta, times)  # noqa: E731
            self.round.rate = rate() if batch is None else self._once(("rate",), times, rate)

    def _pays(self) -> bool:
        """Whether drafting pays at the posterior mean: if not, drafting now is a probe."""
        assert self.round.times is not None
        mean = self.learnt.posterior.mean
        return draft_on(0, 1.0, mean, self.round.times, best_rate(mean, self.round.times))

    def _pays_on(self, index: int, survival: float) -> bool:
        """The cost rule, then a look (a first draft kept only if its confidence says so), then
        the rare one-draft probe while drafting looks hopeless."""
        assert self.round.times is not None
        weight = self.lockstep.weight(index)
        if draft_on(index, survival, self.round.theta, self.round.times, self.round.rate, weight):
            return True
        if index == 0 and self._look_pays(weight):
            return True
        locked = index == 0 and self._once(("locked",), self.round.times, self._locked_out)
        if locked and self._once(("probe",), self.round.times, self._probe_due):
            self.round.limit = 1
            return True
        return False

    def _probe_due(self) -> bool:
        """Whether a round locked out of drafting (:meth:`_locked_out`) probes one draft: after
        ``refresh`` rounds without a draft step at this batch size, then after twice as many each
        time, up to ``LONGEST_WAIT``. Costs that a loaded machine overstated are thus measured
        again however long the decoder lives, while a drafter too slow to ever pay costs one
        probe per ``LONGEST_WAIT`` rounds."""
        size, owner, first = self.costs.batch_size, self.owner, self.options.refresh
        if first is None or owner.since_drafted.get(size, 0) < (wait := owner.waits.get(size, first)):
            return False
        owner.waits[size] = min(2 * wait, LONGEST_WAIT)
        return True

    def _once(self, key: tuple[Any, ...], anchor: object, compute: Callable[[], Any]) -> Any:
        """A value that the rows of a batch round share, computed for the first row that needs it:
        it depends only on ``anchor`` (the round's costs, or its round times) and on the posterior,
        and neither changes between the rows' asks."""
        held = self.shared.get(key)
        if held is None or held[0] is not anchor:
            held = self.shared[key] = (anchor, compute())
        return held[1]

    def _gate_shut(self, costs: Costs) -> bool:
        """Whether this batch size's gate keeps the round plain: to measure plain rounds, or
        while it is shut, when a round still probes, ever more rarely (``explore``), so that
        drafting is measured again."""
        gate = self.owner.gates.get(costs.batch_size) if self.static else None
        if gate is not None and gate.measuring:
            return True
        if gate is None or not gate.shut:
            return False
        chance = self.options.explore / (1 + gate.plain.rounds)
        return not self._once(("gate",), self.round.times, lambda: self.rng.random() < chance)

    def _look_pays(self, weight: float) -> bool:
        """Whether drafting one token only to see its confidence is worth its step: the tokens
        that the confident buckets (drawn, weighted by how often first drafts fall in them) would
        add beyond their verification, against the price of the step. In a batch the step and a
        kept draft's verification are every row's time: ``weight`` (:meth:`_Lockstep.weight`)
        prices them per row that may still look, so rows asked after others refused look only
        for more."""
        times, peek = self.round.times, self.round.peek
        if not self.withdraws or self.options.variant != "calibration" or times is None or peek is None:
            return False
        price = self.round.rate * weight
        extra = max(times[1] - times[0] - peek, 0.0)
        value, learnt = 0.0, self.learnt
        for cell, share in enumerate(learnt.first_seen.shares()):
            if cell not in self.round.cells:
                self.round.cells[cell] = learnt.buckets.cells[cell].sample(self.rng, learnt.posterior.mean)
            value += share * max(self.round.cells[cell] - price * extra, 0.0)
        return value > price * peek

    def _locked_out(self) -> bool:
        """Whether the measured costs say drafting could not pay even if every draft were accepted
        (if they say it could, a later lock-out's wait to probe starts again at ``refresh``)."""
        assert self.round.times is not None
        locked = not draft_on(0, 1.0, 1.0, self.round.times, best_rate(1.0, self.round.times))
        if not locked:
            self.owner.waits.pop(self.costs.batch_size, None)
        return locked

    def _explore_k(self, costs: Costs) -> int:
        """Drafts while costs are unknown: one round of one draft, then one plain step (at each
        batch size, whose costs are measured apart)."""
        return 0 if self.owner.kinds.get(costs.batch_size, set()) - {0} else 1

    def _round_times(self, costs: Costs, limit: int) -> list[float] | None:
        """round_time(k) for k = 0 .. limit, or None while the costs rest on a single k."""
        kinds = self.owner.kinds.get(costs.batch_size, set())
        if len(kinds) < 2:
            return None
        return round_times(costs, limit, set(kinds))

    def _advance(self, step: DraftStep) -> float:
        """Probability that every draft so far is accepted, under this round's draws."""
        if step.index:
            self.round.survival *= self._latest_theta(step)
        return self.round.survival

    def _latest_theta(self, step: DraftStep) -> float:
        """theta for the latest draft: its bucket's draw (Calibration-TS) or the round's theta."""
        value = self._signal(step.confidence)
        if self.options.variant != "calibration" or value is None:
            return self.round.theta
        buckets, cell = self.learnt.buckets, self.learnt.buckets.index(value)
        if cell not in self.round.cells:
            self.round.cells[cell] = buckets.cells[cell].sample(self.rng, self.learnt.posterior.mean)
        return self.round.cells[cell]

    def _expected(self, confidence: Confidence | None) -> float:
        """The posterior mean chance that the latest draft is accepted: its bucket's, centred on
        the overall mean (Calibration-TS), or the overall mean."""
        value, learnt = self._signal(confidence), self.learnt
        if self.options.variant != "calibration" or value is None:
            return learnt.posterior.mean
        return learnt.buckets.cells[learnt.buckets.index(value)].centered_mean(learnt.posterior.mean)

    def _signal(self, confidence: Confidence | None) -> float | None:
        """The confidence the controller conditions on (a withdrawn draft has no ``prob``)."""
        if confidence is None:
            return None
        signal = self.options.signal
        return (
            confidence.prob
            if signal == "prob"
            else confidence.top1
            if signal == "top1"
            else confidence.entropy
        )
