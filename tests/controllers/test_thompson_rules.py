"""The Thompson controller's decisions on hand-made rounds, and its cost rule's arithmetic."""

from __future__ import annotations

import pytest
from eesd_thompson import ThompsonController, ThompsonOptions
from eesd_thompson.rule import best_rate, draft_on, expected_tokens
from outcomes import outcome

from eesd_core.config import validate
from eesd_core.errors import ConfigError
from eesd_core.protocols import Costs, DraftStep, Request, SamplingParams

CHEAP = Costs(draft_step=0.01, propose_base=0.0, verify=lambda m: 0.1)  # drafting nearly free
DEAR = Costs(draft_step=0.1, propose_base=0.0, verify=lambda m: 0.1)  # a draft costs a forward


def run_round(ctrl, costs=CHEAP, limit=8, accepted=None, conf=0.9):
    """Ask the controller through one round; returns k. ``accepted=None`` accepts everything."""
    k = 0
    step = DraftStep(index=0, max_draft_tokens=limit, costs=costs)
    while ctrl.should_continue(step):
        k += 1
        step = DraftStep(k, limit, costs, 5, conf, conf, 1 - conf)
    n = k if accepted is None else min(k, accepted)
    ctrl.update(outcome(k, n, (conf,) * k, (conf,) * k, (1 - conf,) * k, 0.0, 0.0, costs))
    return k


def started(**options):
    ctrl = ThompsonController(ThompsonOptions(**options))
    ctrl.start(Request(4, 64, 8, SamplingParams(), Costs()))
    return ctrl


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5


def test_best_rate_includes_plain_decoding():
    times = [1.0, 2.0, 3.0]
    assert best_rate(0.0, times) == 1.0
    assert best_rate(1.0, times) == 1.0  # 2/2 and 3/3 only tie with plain
    assert best_rate(1.0, [1.0, 1.5, 2.0]) == pytest.approx(1.5)


def test_draft_on_compares_the_marginal_gain_with_the_rate():
    times = [1.0, 1.2, 1.4]
    assert draft_on(0, 1.0, 0.5, times, rate=1.0)  # 0.5 token for 0.2 s beats 1 token/s
    assert not draft_on(0, 1.0, 0.1, times, rate=1.0)  # 0.1 token for 0.2 s does not
    assert not draft_on(1, 0.1, 0.5, times, rate=1.0)  # a doomed round stops
    assert not draft_on(2, 1.0, 1.0, times, rate=1.0)  # nothing left to draft


def test_costs_are_explored_with_one_draft_then_one_plain_step():
    ctrl = started()
    assert run_round(ctrl, Costs()) == 1
    assert run_round(ctrl, Costs()) == 0


def test_a_drafter_that_is_always_right_drafts_to_the_cap_when_drafting_is_cheap():
    ctrl = started(alpha0=50, beta0=1)
    ctrl.kinds_seen |= {0, 1}
    assert [run_round(ctrl) for _ in range(5)] == [8] * 5
    assert run_round(ctrl, limit=3) == 3


def test_a_drafter_that_is_never_right_ends_up_decoding_plainly():
    ctrl = started()
    ks = [run_round(ctrl, DEAR if i > 1 else Costs(), accepted=0) for i in range(200)]
    assert sum(ks[100:]) <= 2
    assert max(ks[2:]) <= 1  # probes are single drafts


class Lucky:
    """A random stream whose every theta draw is 0.99, whatever the posterior says."""

    def betavariate(self, alpha, beta):
        return 0.99

    def random(self):
        return 0.0


@pytest.mark.parametrize(("probe_tokens", "expected"), [(1, 1), (3, 3), (None, 8)])
def test_a_lucky_draw_against_the_posterior_mean_is_a_capped_probe(probe_tokens, expected):
    ctrl = started(probe_tokens=probe_tokens, alpha0=1, beta0=30)
    ctrl.kinds_seen |= {0, 1}
    ctrl.rng = Lucky()
    assert run_round(ctrl) == expected


def test_bernoulli_rule_follows_theta():
    sure = started(stop_rule="bernoulli", alpha0=1e6, beta0=1e-3)
    assert run_round(sure) == 8
    never = started(stop_rule="bernoulli", alpha0=1e-3, beta0=1e6)
    assert run_round(never) == 0


def test_calibration_stops_after_a_doubtful_draft():
    ctrl = started(variant="calibration")
    ctrl.kinds_seen |= {0, 1}
    for _ in range(60):  # confident drafts are accepted, doubtful ones never
        conf = (0.95, 0.95, 0.1)
        ctrl.update(outcome(3, 2, conf, conf, (0.1, 0.1, 2.0), 0.0, 0.0, CHEAP))
    assert run_round(ctrl, conf=0.95) >= 4
    assert run_round(ctrl, conf=0.05) == 1


def test_own_cap_is_respected():
    ctrl = started(alpha0=50, beta0=1, max_draft_tokens=2)
    ctrl.kinds_seen |= {0, 1}
    assert run_round(ctrl) == 2


def test_same_seed_same_decisions():
    def decisions(seed):
        ctrl = started(seed=seed, stop_rule="bernoulli")
        return [run_round(ctrl, accepted=1) for _ in range(30)]

    assert decisions(3) == decisions(3)
    assert decisions(3) != decisions(4)


def test_request_scope_replays_the_same_stream_each_generation():
    ctrl = started(scope="request", stop_rule="bernoulli")
    first = [run_round(ctrl, accepted=1) for _ in range(20)]
    ctrl.start(Request(4, 64, 8, SamplingParams(), Costs()))
    assert [run_round(ctrl, accepted=1) for _ in range(20)] == first


@pytest.mark.parametrize(
    "bad", [{"edges": [0.5, 0.2]}, {"variant": "gaussian"}, {"decay": 0.0}, {"alfa0": 1}]
)
def test_bad_options_are_errors(bad):
    with pytest.raises(ConfigError):
        validate(ThompsonOptions, bad, "controller options")


def test_default_edges_follow_the_signal():
    assert ThompsonOptions(signal="entropy").edges != ThompsonOptions().edges
