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
from outcomes import outcome as record

from eesd_core.protocols import Costs, DraftStep, Request, SamplingParams
from eesd_core.registry import get_manager

COSTS = Costs()


def request(max_draft=8):
    return Request(4, 64, max_draft, SamplingParams(), COSTS)


def drafts(ctrl, limit=8, confs=()):
    """How many drafts the controller makes in a round; draft i has confidence confs[i] (0.9)."""
    k, step = 0, DraftStep(index=0, max_draft_tokens=limit, costs=COSTS)
    while k < limit and ctrl.should_continue(step):
        c = confs[k] if k < len(confs) else 0.9
        k += 1
        step = DraftStep(k, limit, COSTS, 7, c, c, 1 - c)
    return k


def outcome(k, n, confs=None, seconds=1.0):
    confs = tuple(confs) if confs is not None else (0.9,) * k
    return record(k, n, confs, confs, tuple(1 - c for c in confs), seconds / 2, seconds / 2, COSTS)


def test_every_baseline_is_registered():
    names = get_manager().registry("controller").names()
    assert {"fixed", "heuristic", "confidence", "ema", "ucb", "thompson"} <= set(names)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_fixed_drafts_k(k):
    assert drafts(FixedK(FixedOptions(k=k))) == k


def test_heuristic_adds_two_after_a_clean_round_and_drops_one_otherwise():
    ctrl = Heuristic(HeuristicOptions(start=3))
    ctrl.start(request(max_draft=8))
    assert drafts(ctrl) == 3
    ctrl.update(outcome(3, 3))
    assert drafts(ctrl) == 5
    ctrl.update(outcome(5, 2))
    assert drafts(ctrl) == 4
    for _ in range(10):
        ctrl.update(outcome(4, 0))
    assert drafts(ctrl) == 1  # never below one
    for _ in range(10):
        ctrl.update(outcome(1, 1))
    assert ctrl.k == 8  # kept within max_draft_tokens


def test_heuristic_carries_its_length_unless_transient():
    kept, reset = Heuristic(HeuristicOptions(start=4)), Heuristic(HeuristicOptions(start=4, transient=True))
    for ctrl in (kept, reset):
        ctrl.start(request())
        ctrl.update(outcome(4, 0))
        ctrl.start(request())
    assert (kept.k, reset.k) == (3, 4)


def test_confidence_stops_after_the_first_doubtful_draft():
    ctrl = ConfidenceThreshold(ConfidenceOptions(threshold=0.4))
    ctrl.start(request())
    assert drafts(ctrl, confs=(0.9, 0.5, 0.3, 0.9)) == 3
    assert drafts(ctrl, confs=(0.1,)) == 1  # the first draft is always made
    assert drafts(ConfidenceThreshold(ConfidenceOptions(k=2))) == 2


def test_roc_threshold_minimises_fpr_plus_three_fnr():
    assert roc_threshold([0.9, 0.8, 0.3, 0.2], [1, 1, 0, 0]) == 0.8
    assert roc_threshold([0.9, 0.1], [1, 1]) is None
    # missing one positive costs 3 * 1/2, passing one negative costs 1/2: keep the low threshold
    assert roc_threshold([0.9, 0.5, 0.3, 0.2], [1, 0, 1, 0]) == 0.3


def test_adaptive_confidence_refits_on_judged_drafts_only():
    ctrl = ConfidenceThreshold(ConfidenceOptions(adaptive=True))
    ctrl.start(request())
    ctrl.update(outcome(4, 2, (0.95, 0.9, 0.7, 0.99)))  # the 0.99 after the rejection is censored
    ctrl.update(outcome(3, 2, (0.92, 0.97, 0.6)))
    assert ctrl.scores == [0.95, 0.9, 0.7, 0.92, 0.97, 0.6]
    assert ctrl.labels == [1, 1, 0, 1, 1, 0]
    assert ctrl.threshold == 0.9


def test_ema_warms_up_then_follows_the_accepted_length():
    ctrl = EmaSteps(EmaOptions(warmup=4, interval=2, alpha=0.5, hysteresis=0.0))
    ctrl.start(request(max_draft=6))
    assert drafts(ctrl) == 6
    for _ in range(3):
        ctrl.update(outcome(6, 1))
    assert drafts(ctrl) == 6  # still warming up
    ctrl.update(outcome(6, 1))
    assert drafts(ctrl) == 2  # round(EMA = 1) + 1
    ctrl.update(outcome(2, 2))
    assert drafts(ctrl) == 2  # changes only every `interval` rounds
    ctrl.update(outcome(2, 2))
    assert ctrl.ema == pytest.approx(1.75) and drafts(ctrl) == 3


def test_ema_hysteresis_holds_the_length():
    ctrl = EmaSteps(EmaOptions(warmup=0, interval=1, alpha=1.0, hysteresis=0.5, start=3))
    ctrl.start(request())
    ctrl.update(outcome(3, 1))  # EMA + 1 = 2, within 1.0 of 3: hold
    assert drafts(ctrl) == 3
    ctrl.update(outcome(3, 0))  # EMA + 1 = 1: move
    assert drafts(ctrl) == 1


def test_ucb_tries_every_arm_then_prefers_the_fastest():
    ctrl = UcbDraftLength(UcbOptions(max_k=3, exploration=0.1))
    ctrl.start(request())
    tried = []
    for _ in range(4):
        k = drafts(ctrl)
        tried.append(k)
        ctrl.update(outcome(k, min(k, 2), seconds=1.0 + 0.1 * k))  # k = 2 gives 3 tokens in 1.2 s
    assert tried == [0, 1, 2, 3]
    chosen = []
    for _ in range(20):
        k = drafts(ctrl)
        chosen.append(k)
        ctrl.update(outcome(k, min(k, 2), seconds=1.0 + 0.1 * k))
    assert chosen.count(2) >= 15


def test_ucb_forgets_per_request_when_asked():
    ctrl = UcbDraftLength(UcbOptions(max_k=2, per_request=True))
    ctrl.start(request())
    ctrl.update(outcome(0, 0))
    ctrl.start(request())
    assert ctrl.counts == [0, 0, 0]
