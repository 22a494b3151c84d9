"""Stateful properties of the Thompson controller: its posterior and its decisions."""

from __future__ import annotations

import pytest
from eesd_thompson import ThompsonController, ThompsonOptions
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from outcomes import Driven, outcome

from eesd_core.protocols import Confidence, Costs, Request, SamplingParams

COSTS = Costs(draft_step=0.01, propose_base=0.01, verify=lambda m: 0.05 + 0.002 * m)
options = st.builds(
    ThompsonOptions,
    variant=st.sampled_from(["beta", "calibration"]),
    stop_rule=st.sampled_from(["cost", "bernoulli"]),
    failures=st.sampled_from(["first", "all"]),
    resample=st.sampled_from(["round", "step"]),
    alpha0=st.floats(0.1, 5),
    beta0=st.floats(0.1, 5),
    scope=st.sampled_from(["request", "global"]),
    decay=st.floats(0.01, 1.0),
    carry=st.none() | st.floats(0, 20),
    max_draft_tokens=st.none() | st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
confidences = st.floats(0.0, 1.0)


def request(max_draft: int = 8) -> Request:
    return Request(4, 64, max_draft, SamplingParams(), Costs())


def seen(confidences) -> tuple[Confidence, ...]:
    """Drafts whose q(d), top-1 and entropy are all the confidence drawn."""
    return tuple(Confidence(c, c, c) for c in confidences)


class ThompsonMachine(RuleBasedStateMachine):
    """Drives generations (start, then rounds: begin_round, the asks, update); checks the posterior
    against hand counts."""

    @initialize(opts=options)
    def build(self, opts: ThompsonOptions) -> None:
        self.opts = opts
        self.ctrl = ThompsonController(opts)
        self.alpha, self.beta = opts.alpha0, opts.beta0
        self.started = False

    @rule()
    def start(self) -> None:
        self.run = Driven(self.ctrl, request())
        o = self.opts
        if o.scope == "request":
            self.alpha, self.beta = o.alpha0, o.beta0
        else:
            evidence = (self.alpha - o.alpha0) + (self.beta - o.beta0)
            factor = o.decay
            if o.carry is not None and factor * evidence > o.carry:
                factor = o.carry / evidence
            self.alpha = o.alpha0 + factor * (self.alpha - o.alpha0)
            self.beta = o.beta0 + factor * (self.beta - o.beta0)
        self.started = True

    @precondition(lambda self: self.started)
    @rule(
        limit=st.integers(0, 8),
        known=st.booleans(),
        conf=st.lists(confidences, min_size=8, max_size=8),
        accepted=st.integers(0, 8),
    )
    def round(self, limit: int, known: bool, conf: list[float], accepted: int) -> None:
        costs = COSTS if known else Costs()
        self.run.begin(costs)
        k = 0
        while True:
            decision = self.run.ask(k, limit, conf[k - 1] if k else None)
            if not decision:
                break
            assert k < limit and (self.opts.max_draft_tokens is None or k < self.opts.max_draft_tokens)
            k += 1
        n = min(accepted, k)
        self.run.end(outcome(k, n, seen(conf[:k]), 0.01, 0.05, costs))
        if k:
            self.alpha += n
            self.beta += (k - n) if self.opts.failures == "all" else float(n < k)

    @invariant()
    def posterior_matches_the_counts(self) -> None:
        if not hasattr(self, "ctrl"):
            return
        post = self.ctrl.posterior
        assert post.alpha == pytest.approx(self.alpha) and post.beta == pytest.approx(self.beta)
        assert post.alpha >= self.opts.alpha0 - 1e-9 and post.beta >= self.opts.beta0 - 1e-9

    @invariant()
    def buckets_stay_above_the_prior(self) -> None:
        if not hasattr(self, "ctrl"):
            return
        for cell in self.ctrl.buckets.cells:
            assert cell.alpha >= self.opts.alpha0 - 1e-9 and cell.beta >= self.opts.beta0 - 1e-9


ThompsonMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestThompsonMachine = ThompsonMachine.TestCase


@given(opts=options, accepted=st.integers(0, 8), extra=st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_more_accepted_drafts_never_lower_the_posterior_mean(opts, accepted, extra):
    low, high = ThompsonController(opts), ThompsonController(opts)
    k = accepted + extra
    Driven(low, request()).learn(outcome(k, accepted, seen((0.5,) * k), 0.0, 0.0, COSTS))
    Driven(high, request()).learn(outcome(k, min(k, accepted + 1), seen((0.5,) * k), 0.0, 0.0, COSTS))
    assert high.posterior.mean >= low.posterior.mean
    assert high.posterior.alpha > low.posterior.alpha and high.posterior.beta <= low.posterior.beta


@given(opts=options, conf=st.lists(confidences, min_size=1, max_size=8), accepted=st.integers(0, 8))
@settings(max_examples=60, deadline=None)
def test_calibration_buckets_count_judged_drafts_only(opts, conf, accepted):
    ctrl = ThompsonController(opts.model_copy(update={"variant": "calibration"}))
    run = Driven(ctrl, request())
    k, n = len(conf), min(accepted, len(conf))
    before = sum(c.alpha + c.beta for c in ctrl.buckets.cells)
    run.learn(outcome(k, n, seen(conf), 0.0, 0.0, COSTS))
    after = sum(c.alpha + c.beta for c in ctrl.buckets.cells)
    assert after - before == pytest.approx(min(n + 1, k))
