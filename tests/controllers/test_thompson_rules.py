"""The Thompson controller's decisions on hand-made rounds, and its cost rule's arithmetic."""

from __future__ import annotations

import pytest
from eesd_thompson import ThompsonController, ThompsonOptions
from eesd_thompson.controller import LONGEST_WAIT
from eesd_thompson.rule import best_rate, draft_on, expected_tokens
from outcomes import Driven, outcome

from eesd_core.config import validate
from eesd_core.errors import ConfigError
from eesd_core.protocols import Confidence, Costs, Request, SamplingParams

CHEAP = Costs(draft_step=0.01, propose_base=0.0, verify=lambda m: 0.1)  # drafting nearly free
DEAR = Costs(draft_step=0.1, propose_base=0.0, verify=lambda m: 0.1)  # a draft costs a forward


def run_round(run, costs=CHEAP, limit=8, accepted=None, conf=0.9):
    """One round of a lone sequence, asked and reported; returns k. ``accepted=None`` accepts
    everything."""
    return run.round(costs, limit, accepted, conf)


def started(**options):
    return Driven(
        ThompsonController(ThompsonOptions(**options)), Request(4, 64, 8, SamplingParams(), Costs())
    )


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
    run = started()
    assert run_round(run, Costs()) == 1
    assert run_round(run, Costs()) == 0


def test_a_drafter_that_is_always_right_drafts_to_the_cap_when_drafting_is_cheap():
    run = started(alpha0=50, beta0=1)
    run.controller.kinds_seen |= {0, 1}
    assert [run_round(run) for _ in range(5)] == [8] * 5
    assert run_round(run, limit=3) == 3


def test_a_drafter_that_is_never_right_ends_up_decoding_plainly():
    run = started()
    ks = [run_round(run, DEAR if i > 1 else Costs(), accepted=0) for i in range(200)]
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
    run = started(probe_tokens=probe_tokens, alpha0=1, beta0=30)
    run.controller.kinds_seen |= {0, 1}
    run.state.rng = Lucky()  # the generation's stream
    assert run_round(run) == expected


def test_bernoulli_rule_follows_theta():
    sure = started(stop_rule="bernoulli", alpha0=1e6, beta0=1e-3)
    assert run_round(sure) == 8
    never = started(stop_rule="bernoulli", alpha0=1e-3, beta0=1e6)
    assert run_round(never) == 0


def test_calibration_stops_after_a_doubtful_draft():
    run = started(variant="calibration")
    run.controller.kinds_seen |= {0, 1}
    seen = (Confidence(0.95, 0.95, 0.1), Confidence(0.95, 0.95, 0.1), Confidence(0.1, 0.1, 2.0))
    for _ in range(60):  # confident drafts are accepted, doubtful ones never
        run.learn(outcome(3, 2, seen, 0.0, 0.0, CHEAP))
    assert run_round(run, conf=0.95) >= 4
    assert run_round(run, conf=0.05) == 1


def test_own_cap_is_respected():
    run = started(alpha0=50, beta0=1, max_draft_tokens=2)
    run.controller.kinds_seen |= {0, 1}
    assert run_round(run) == 2


def test_same_seed_same_decisions():
    def decisions(seed):
        run = started(seed=seed, stop_rule="bernoulli")
        return [run_round(run, accepted=1) for _ in range(30)]

    assert decisions(3) == decisions(3)
    assert decisions(3) != decisions(4)


def test_request_scope_replays_the_same_stream_each_generation():
    run = started(scope="request", stop_rule="bernoulli")
    first = [run_round(run, accepted=1) for _ in range(20)]
    again = Driven(run.controller, Request(4, 64, 8, SamplingParams(), Costs()))
    assert [run_round(again, accepted=1) for _ in range(20)] == first


@pytest.mark.parametrize(
    "bad", [{"edges": [0.5, 0.2]}, {"variant": "gaussian"}, {"decay": 0.0}, {"alfa0": 1}]
)
def test_bad_options_are_errors(bad):
    with pytest.raises(ConfigError):
        validate(ThompsonOptions, bad, "controller options")


def test_default_edges_follow_the_signal():
    assert ThompsonOptions(signal="entropy").edges != ThompsonOptions().edges


# -- batches: costs per batch size, and draft steps that every row waits for ----------------------

# a batch of 4 whose pass over 2 positions a row costs a quarter more than over 1 (memory-bound)
BATCH = Costs(draft_step=0.05, propose_base=0.0, verify=lambda m: 1.0 + 0.25 * (m > 1), batch_size=4)


def lockstep_round(run, costs=BATCH, limits=(8, 8, 8, 8)):
    """One batch round of ``len(limits)`` rows asked as the engine asks it: each step, the rows
    still drafting in turn. Returns the drafts of each row (the round is not reported)."""
    return run.lockstep(costs, limits)


def measured(run, batch_size):
    """As if the engine had measured a batch size's rounds: one of one draft, then a plain one."""
    run.learn(outcome(1, 1, (0.9,), 0.0, 0.0, Costs(batch_size=batch_size)))
    run.learn(outcome(0, 0, (), 0.0, 0.0, Costs(batch_size=batch_size)))


def test_each_batch_size_has_its_costs_explored():
    """Solo costs say nothing of a batch's: a batch size met for the first time drafts one token
    a row to measure a round with drafts there, as the first solo round does."""
    run = started()
    measured(run, 1)
    empty = Costs(batch_size=4)
    assert lockstep_round(run, empty) == [1, 1, 1, 1]
    measured(run, 4)
    assert run.controller.kinds[4] == {0, 1}


class Draws(Lucky):
    """Every theta draw is ``theta``, and so is every other draw."""

    def __init__(self, theta):
        self.theta = theta

    def betavariate(self, alpha, beta):
        return self.theta

    def random(self):
        return self.theta


def test_a_step_every_row_drafts_costs_each_row_its_time_once():
    """Drafts accepted 0.7 of the time and a draft round 0.3 of a step dearer: worth it when
    every row drafts (0.7 tokens a row for 0.3 of a step), not for one row alone, whose longer
    round the other three wait for too (0.7 tokens against 4 x 0.3 steps)."""
    run = started(alpha0=700, beta0=300)
    measured(run, 4)
    run.state.rng = Draws(0.7)
    assert lockstep_round(run, limits=(1, 1, 1, 1)) == [1, 1, 1, 1]
    run.begin(BATCH, range(4))
    for row in (0, 1, 2):  # three rows at the end of their budget refuse the step
        assert not run.ask(0, 0, row=row)
    assert not run.ask(0, 1, row=3)


class Counted(Draws):
    """``Draws``, counting the draws."""

    def __init__(self, theta):
        super().__init__(theta)
        self.draws = 0

    def betavariate(self, alpha, beta):
        self.draws += 1
        return super().betavariate(alpha, beta)

    def random(self):
        self.draws += 1
        return super().random()


@pytest.mark.parametrize("theta", [0.7, 0.01])
def test_the_rows_of_a_batch_round_share_one_draw(theta):
    """A draft step is every row's time, so the batch explores as one: the rows of a round share
    the round's draws (B rows cost one posterior draw, not B), and once a row free to draft its
    longest round refuses, the round is plain and the rows after it cost a lookup. The next round
    draws afresh."""
    run = started(alpha0=700, beta0=300, variant="beta")
    measured(run, 4)
    for _ in range(2):
        run.state.rng = Counted(theta)
        ks = lockstep_round(run, limits=(8, 8, 8, 8))
        assert len(set(ks)) == 1 and (ks[0] > 0) is (theta > 0.5)
        assert run.state.rng.draws == 1 if theta < 0.5 else run.state.rng.draws <= 2
    alone = started(alpha0=700, beta0=300, variant="beta")
    measured(alone, 1)
    alone.state.rng = Counted(theta)
    run_round(alone)
    run_round(alone)
    assert alone.state.rng.draws >= 2  # a round alone draws once, as before


def test_rows_asked_after_a_step_was_made_draft_it_for_free():
    """Once a row made a draft step, the round is that long for every row: the rows asked after
    it draft too, whatever they expect, while a row asked alone would not."""
    run = started(alpha0=700, beta0=300)
    measured(run, 4)
    run.begin(BATCH, range(4))
    run.state.rng = Lucky()
    assert run.ask(0, 1, row=0)
    run.state.rng = Draws(0.01)
    assert [run.ask(0, 1, row=row) for row in (1, 2, 3)] == [True] * 3
    # the next round, nobody made the step before row 0 asks: it judges by its own draw
    run.begin(BATCH, range(4))
    assert not run.ask(0, 1, row=0)


def test_a_plain_round_comes_back_to_measure_plain_decoding_again():
    """A drafter that is always right drafts every round, so plain decoding's cost, which drafting
    is weighed against, would keep its first measurement: every ``refresh`` rounds one is plain."""
    run = started(alpha0=50, beta0=1, refresh=8)
    run.controller.kinds_seen |= {0, 1}
    ks = [run_round(run) for _ in range(30)]
    assert [i for i, k in enumerate(ks) if k == 0] == [8, 17, 26]
    never = started(alpha0=50, beta0=1, refresh=None)
    never.controller.kinds_seen |= {0, 1}
    assert min(run_round(never) for _ in range(30)) == 8


def test_a_round_that_may_not_draft_counts_as_plain():
    """A round the engine allows no draft (the last token of a generation) is a plain step too:
    the rounds to the next refreshing one count from it."""
    run = started(alpha0=50, beta0=1, refresh=8)
    run.controller.kinds_seen |= {0, 1}
    ks = [run_round(run, limit=0 if i == 5 else 8) for i in range(20)]
    assert [i for i, k in enumerate(ks) if k == 0] == [5, 14]


def test_a_refreshing_round_is_plain_for_every_row_of_a_batch():
    run = started(alpha0=700, beta0=300, refresh=4)
    measured(run, 4)
    rounds = []
    for _ in range(6):
        ks = lockstep_round(run)
        rounds.append(ks)
        run.end(*(outcome(k, k, None, 0.0, 0.0, BATCH, row) for row, k in enumerate(ks)))
    assert rounds[4] == [0, 0, 0, 0]
    assert all(all(k >= 1 for k in ks) for i, ks in enumerate(rounds) if i != 4)


def test_the_cost_tracker_smooths_a_slower_measurement_and_takes_a_faster_or_stale_one():
    from eesd_core.costs import STALE, CostTracker

    tracker = CostTracker(4)
    tracker.observe(0, 0.1, 0.5)
    tracker.observe(0, 0.1, 1.0)  # a slow pass, smoothed: 0.5 + 0.2 * (1.0 - 0.5)
    assert tracker.verify[1] == pytest.approx(0.6)
    tracker.observe(0, 0.1, 0.55)  # faster than the figure: it replaces it
    assert tracker.verify[1] == pytest.approx(0.55)
    for _ in range(STALE):
        tracker.observe(1, 0.2, 0.6)
    tracker.observe(0, 0.1, 0.9)  # plain again after STALE rounds: the old figure is dropped
    assert tracker.verify[1] == pytest.approx(0.9)
    assert tracker.snapshot().plain_step == pytest.approx(1.0)


def test_what_the_rows_of_a_round_share_is_computed_once_and_changes_no_decision():
    """A batch round's rows share its round times, its draw and what the posterior says of them;
    the controller computes them for the first row only. Every decision, over rounds whose rows
    have different limits and whose outcomes move the posterior (a drafter that turns bad) under
    costs that stay the same for rounds in a row, equals a controller's that computes everything
    but the round's draw anew for every row."""
    import random

    # a second position costs 0.7 of a step more: one draft alone does not pay, longer rounds
    # do, so rows with different limits judge the same posterior differently
    prices = [
        Costs(0.05, 0.0, lambda m, j=j: 1.0 + (0.7 + 0.05 * j) * (m > 1), batch_size=4) for j in range(3)
    ]

    def play(run) -> list[list[int]]:
        chance = random.Random(5)
        decisions = []
        for round_index in range(60):
            costs = prices[round_index // 5 % 3]  # the same costs for five rounds in a row
            limits = (1, 8, 3, 8) if round_index % 2 else (8, 8, 8, 8)
            ks = lockstep_round(run, costs, limits)
            decisions.append(ks)
            right = 0.8 if round_index < 30 else 0.1  # the drafter turns bad: drafting stops paying
            ns = [sum(1 for _ in range(k) if chance.random() < right) for k in ks]
            rows = enumerate(zip(ks, ns, strict=True))
            run.end(*(outcome(k, n, None, 0.0, 0.0, costs, row) for row, (k, n) in rows))
        return decisions

    shared, fresh = (started(alpha0=7, beta0=3, seed=3) for _ in range(2))
    computed = []
    keep = fresh.state._once
    fresh.state._once = lambda key, anchor, compute: (
        computed.append(key) or (keep(key, anchor, compute) if key == ("draw",) else compute())
    )
    measured(shared, 4)
    measured(fresh, 4)
    decisions = play(shared)
    assert decisions == play(fresh)
    assert computed and any(sum(ks) for ks in decisions) and any(0 in ks for ks in decisions)
    lockstep_round(shared, prices[0])  # what a round shared is forgotten once the posterior moves
    assert shared.state.shared
    shared.end(outcome(1, 1, None, 0.0, 0.0, prices[0]))
    shared.begin(prices[0], range(4))  # the next round, under the same costs, starts afresh
    assert not shared.state.shared


def locked_run(rounds, loaded_until=0, refresh=32):
    """A lone sequence whose drafter is always right, through a real cost tracker: a draft step
    costs 0.01 s and a pass 0.1 s, but a round with drafts before ``loaded_until`` runs ten times
    slower (a machine loaded just while drafts were measured), as did the first. The k of every
    round."""
    from eesd_core.costs import CostTracker

    tracker = CostTracker(4)
    tracker.observe(1, 0.1, 1.0)  # the first round of one draft, measured under load
    tracker.observe(0, 0.0, 0.1)
    run = started(alpha0=50, beta0=1, refresh=refresh)
    run.controller.kinds_seen |= {0, 1}
    ks = []
    for i in range(rounds):
        k = run_round(run, tracker.snapshot(), limit=4)
        slow = 10.0 if k and i < loaded_until else 1.0
        tracker.observe(k, slow * 0.01 * k, slow * 0.1)
        ks.append(k)
    return ks


def test_a_draft_step_measured_under_load_is_measured_again_however_long_it_lasted():
    """Drafting looks as if it could never pay while the draft steps measured are slow ones: the
    rounds are plain but for one-draft probes, at waits that double. Once a probe runs unloaded,
    its measurement replaces the slow one and drafting pays again, however late that is."""
    ks = locked_run(2500, loaded_until=1000)
    probes = [i for i, k in enumerate(ks) if k]
    assert all(ks[i] == 1 for i in probes if i < 1000)
    assert probes[0] == 32  # ``refresh`` plain rounds, then a probe after twice as many, ...
    assert [b - a - 1 for a, b in zip(probes, probes[1:], strict=False) if b < 1000] == [64, 128, 256, 512]
    resumed = next(i for i in probes if i >= 1000)
    assert resumed <= 1000 + LONGEST_WAIT
    assert sum(k >= 1 for k in ks[resumed:]) >= 0.9 * len(ks[resumed:])
    assert max(ks[resumed:]) == 4


def test_a_long_round_timed_while_the_machine_stalled_does_not_price_drafting_out():
    """One four-draft round timed thirty times too slow makes the draft step's line steep, and
    rounds that short never time four drafts again; once that time is stale the line rests on the
    fresher ones, so the next one-draft probe (the first, after ``refresh`` rounds) brings drafting
    back at full length."""
    from eesd_core.costs import STALE, CostTracker

    tracker = CostTracker(4)
    tracker.observe(1, 0.01, 0.1)
    tracker.observe(0, 0.0, 0.1)
    tracker.observe(4, 30 * 0.04, 0.1)  # the machine stalled during this round
    run = started(alpha0=50, beta0=1)
    run.controller.kinds_seen |= {0, 1, 4}
    ks = []
    for _ in range(600):
        k = run_round(run, tracker.snapshot(), limit=4)
        tracker.observe(k, 0.01 * k, 0.1)
        ks.append(k)
    resumed = next(i for i, k in enumerate(ks) if k)
    assert resumed <= 32 + STALE
    assert sum(k >= 1 for k in ks[resumed:]) >= 0.9 * len(ks[resumed:])
    assert max(ks) == 4 and tracker.snapshot().draft_step == pytest.approx(0.01)


def test_a_drafter_too_slow_to_ever_pay_is_probed_at_a_floor():
    """Where drafting truly never pays, probes grow rarer but never stop: one per ``LONGEST_WAIT``
    rounds at most, so that a decoder that lives long still measures again. ``refresh=None``
    probes never."""
    ks = locked_run(6000, loaded_until=6000)
    probes = [i for i, k in enumerate(ks) if k]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and set(gaps[-2:]) == {LONGEST_WAIT + 1}  # the wait, then the probe
    assert max(ks) == 1
    assert not any(locked_run(3000, loaded_until=3000, refresh=None))
