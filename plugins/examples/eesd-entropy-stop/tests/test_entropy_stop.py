"""entropy_stop: its rule, its discovery through the entry point, and eesd's controller contract."""

from __future__ import annotations

import math

import pytest
from eesd_entropy_stop import EntropyStop, EntropyStopOptions
from eesd_entropy_stop.controller import Threshold, acceptance_bound

from eesd_core.protocols import Confidence, DraftStep, RoundOutcome
from eesd_core.registry import get_manager, reset_manager
from eesd_core.testing import ControllerContract, registered


class TestEntropyStopContract(ControllerContract):
    @pytest.fixture(params=[{}, {"gamma": 4.0, "threshold": 0.9, "step": 0.5}])
    def make_controller(self, request):
        return registered("controller", "entropy_stop", request.param)


def step(entropy):
    return DraftStep(index=1, max_draft_tokens=8, token=0, confidence=Confidence(0.5, 0.5, entropy))


def outcome(drafted, accepted):
    return RoundOutcome(
        position=0,
        drafted=drafted,
        accepted=accepted,
        tokens=(0,) * (accepted + 1),
        draft_time=0.0,
        verify_time=0.0,
        confidences=(Confidence(0.5, 0.5, 1.0),) * drafted,
    )


def test_the_bound():
    assert acceptance_bound(0.0, 1.0) == 1.0
    assert acceptance_bound(0.25, 1.0) == pytest.approx(0.5)


def test_confident_drafts_continue_and_uncertain_ones_stop():
    controller = EntropyStop(EntropyStopOptions(threshold=0.5))
    state = Threshold(0.5)
    assert controller.should_continue(state, DraftStep(index=0, max_draft_tokens=8))
    assert controller.should_continue(state, step(0.1))
    assert not controller.should_continue(state, step(math.log(8)))


def test_the_threshold_follows_acceptance():
    controller = EntropyStop(EntropyStopOptions(threshold=0.5, target=0.5, step=0.1))
    state = Threshold(0.5)
    controller.update(state, [outcome(4, 0)])
    assert state.value == pytest.approx(0.55)
    controller.update(state, [outcome(4, 4)])
    assert state.value == pytest.approx(0.5)
    controller.update(state, [outcome(0, 0)])
    assert state.value == pytest.approx(0.5)


def test_found_through_its_own_entry_point():
    reset_manager()
    info = get_manager().info["entropy_stop"]
    assert info.distribution == "eesd-entropy-stop"
    assert "entropy_stop" in get_manager().registry("controller").names()
