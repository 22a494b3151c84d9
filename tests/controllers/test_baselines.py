"""Each comparison controller's rule, on hand-made rounds."""

from __future__ import annotations

import pytest
from eesd_baselines import (
    ConfidenceOptions,
    ConfidenceThreshold,
    EmaOptions,
    EmaSteps,
    FixedK,
    FixedOptions,
    Heuristic,
    HeuristicOptions,
    UcbDraftLength,
    UcbOptions,
)
from eesd_baselines.confidence import roc_threshold
from outcomes import Driven
from outcomes import outcome as record

from eesd_core.protocols import Costs, Request, SamplingParams
from eesd_core.registry import get_manager

COSTS = Costs()


def started(ctrl, max_draft=8):
    return Driven(ctrl, Request(4, 64, max_draft, SamplingParams(), COSTS))


def drafts(run, limit=8, confs=()):
    """How many drafts the controller makes in a round; draft i has confidence confs[i] (0.9).
    The round is begun here and ended by ``run.end``."""
    run.begin(COSTS)
    return run.drafts(limit, confs)


def outcome(k, n, confs=None, seconds=1.0):
    return record(k, n, confs, seconds / 2, seconds / 2, COSTS)


def test_every_baseline_is_registered():
    names = get_manager().registry("controller").names()
    assert {"fixed", "heuristic", "confidence", "ema", "ucb", "thompson"} <= set(names)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_fixed_drafts_k(k):
    assert drafts(started(FixedK(FixedOptions(k=k)))) == k


def test_heuristic_adds_two_after_a_clean_round_and_drops_one_otherwise():
    ctrl = Heuristic(HeuristicOptions(start=3))
    run = started(ctrl, max_draft=8)
    assert drafts(run) == 3
    run.end(outcome(3, 3))
    assert drafts(run) == 5
    run.end(outcome(5, 2))
    assert drafts(run) == 4
    run.end(outcome(4, 0))
    for _ in range(9):
        run.learn(outcome(4, 0))
    assert drafts(run) == 1  # never below one
    run.end(outcome(1, 1))
    for _ in range(9):
        run.learn(outcome(1, 1))
    assert ctrl.k == 8  # kept within max_draft_tokens


def test_heuristic_carries_its_length_unless_transient():
    kept, reset = Heuristic(HeuristicOptions(start=4)), Heuristic(HeuristicOptions(start=4, transient=True))
    firsts, seconds = [], []
    for ctrl in (kept, reset):
        first = started(ctrl)
        first.learn(outcome(4, 0))
        firsts.append(drafts(first))
        seconds.append(drafts(started(ctrl)))
    assert firsts == [3, 3]
    assert seconds == [3, 4]
    assert (kept.k, reset.k) == (3, 4)  # what a transient one carries is never changed


def test_confidence_stops_after_the_first_doubtful_draft():
    run = started(ConfidenceThreshold(ConfidenceOptions(threshold=0.4)))
    assert drafts(run, confs=(0.9, 0.5, 0.3, 0.9)) == 3
    run.end(outcome(3, 3, (0.9, 0.5, 0.3)))
    assert drafts(run, confs=(0.1,)) == 1  # the first draft is always made
    assert drafts(started(ConfidenceThreshold(ConfidenceOptions(k=2)))) == 2


def test_roc_threshold_minimises_fpr_plus_three_fnr():
    assert roc_threshold([0.9, 0.8, 0.3, 0.2], [1, 1, 0, 0]) == 0.8
    assert roc_threshold([0.9, 0.1], [1, 1]) is None
    # missing one positive costs 3 * 1/2, passing one negative costs 1/2: keep the low threshold
    assert roc_threshold([0.9, 0.5, 0.3, 0.2], [1, 0, 1, 0]) == 0.3


def test_adaptive_confidence_refits_on_judged_drafts_only():
    ctrl = ConfidenceThreshold(ConfidenceOptions(adaptive=True))
    run = started(ctrl)
    run.learn(outcome(4, 2, (0.95, 0.9, 0.7, 0.99)))  # the 0.99 after the rejection is censored
    run.learn(outcome(3, 2, (0.92, 0.97, 0.6)))
    assert ctrl.scores == [0.95, 0.9, 0.7, 0.92, 0.97, 0.6]
    assert ctrl.labels == [1, 1, 0, 1, 1, 0]
    assert ctrl.threshold == 0.9


def test_ema_warms_up_then_follows_the_accepted_length():
    ctrl = EmaSteps(EmaOptions(warmup=4, interval=2, alpha=0.5, hysteresis=0.0))
    run = started(ctrl, max_draft=6)
    assert drafts(run) == 6
    run.end(outcome(6, 1))
    for _ in range(2):
        run.learn(outcome(6, 1))
    assert drafts(run) == 6  # still warming up
    run.end(outcome(6, 1))
    assert drafts(run) == 2  # round(EMA = 1) + 1
    run.end(outcome(2, 2))
    assert drafts(run) == 2  # changes only every `interval` rounds
    run.end(outcome(2, 2))
    assert ctrl.ema == pytest.approx(1.75) and drafts(run) == 3


def test_ema_hysteresis_holds_the_length():
    run = started(EmaSteps(EmaOptions(warmup=0, interval=1, alpha=1.0, hysteresis=0.5, start=3)))
    run.learn(outcome(3, 1))  # EMA + 1 = 2, within 1.0 of 3: hold
    assert drafts(run) == 3
    run.end(outcome(3, 0))  # EMA + 1 = 1: move
    assert drafts(run) == 1


def test_ucb_tries_every_arm_then_prefers_the_fastest():
    run = started(UcbDraftLength(UcbOptions(max_k=3, exploration=0.1)))
    tried = []
    for _ in range(4):
        k = drafts(run)
        tried.append(k)
        run.end(outcome(k, min(k, 2), seconds=1.0 + 0.1 * k))  # k = 2 gives 3 tokens in 1.2 s
    assert tried == [0, 1, 2, 3]
    chosen = []
    for _ in range(20):
        k = drafts(run)
        chosen.append(k)
        run.end(outcome(k, min(k, 2), seconds=1.0 + 0.1 * k))
    assert chosen.count(2) >= 15


def test_ucb_chooses_each_row_s_arm_when_its_round_begins():
    """The rows of a batch round each get an arm, and a row's outcome credits the arm it drafted."""
    ctrl = UcbDraftLength(UcbOptions(max_k=2))
    run = started(ctrl)
    run.begin(COSTS, rows=(0, 1))
    assert [run.drafts(8, row=row) for row in (0, 1)] == [0, 0]  # arm 0 untried: both rows take it
    run.end(*(record(0, 0, (), 0.5, 0.5, COSTS, row) for row in (0, 1)))
    assert ctrl.counts == [2, 0, 0]
    run.begin(COSTS, rows=(1,))  # row 0 has finished
    assert run.drafts(8, row=1) == 1


def test_ucb_forgets_per_request_when_asked():
    ctrl = UcbDraftLength(UcbOptions(max_k=2, per_request=True))
    started(ctrl).learn(outcome(0, 0))
    assert ctrl.counts == [1, 0, 0]
    started(ctrl)
    assert ctrl.counts == [0, 0, 0]
