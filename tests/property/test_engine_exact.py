"""The whole engine, exactly: the distribution of its output equals plain sampling from the target.

Toy targets with 2-3 tokens, every drafter that works on them, erratic controllers, top-k, top-p,
EOS; each example enumerates every random choice of every generation (see the kit's oracles).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eesd_core.protocols import SamplingParams
from eesd_core.round import Generation
from eesd_core.testing import strategies as es
from eesd_core.testing.checks import check_greedy, check_lossless, check_lossless_batch
from eesd_core.testing.controllers import ErraticController, always
from eesd_core.testing.errors import ReplayError, ToyInvariantError
from eesd_core.testing.kit import TOY, Setup
from eesd_core.testing.oracles import engine_distribution
from eesd_core.testing.toy import ToyModel

DRAFTERS = st.sampled_from([(TOY, {}), (TOY, {"deterministic": True}), ("early_exit", {}), (None, {})])


@settings(max_examples=60)
@given(
    model=es.toy_models(),
    sampling=es.sampling_params(greedy=False),
    drafter=DRAFTERS,
    controller=es.erratic_controllers(),
    cap=st.integers(1, 3),
    data=st.data(),
)
def test_generations_follow_the_target(model, sampling, drafter, controller, cap, data):
    name, options = drafter
    setup = Setup(
        model,
        drafter=name,
        drafter_options=options,
        controller=lambda: replace(controller),
        max_draft_tokens=cap,
    )
    eos = data.draw(st.sampled_from([(), (0,), (model.vocab_size - 1,)]))
    check_lossless(setup, data.draw(es.prompts(model.vocab_size, 2)), 4, sampling, eos)


@settings(max_examples=60)
@given(
    model=es.toy_models(vocab_sizes=st.integers(2, 5), windows=st.integers(0, 2)),
    drafter=DRAFTERS,
    controller=es.erratic_controllers(),
    data=st.data(),
)
def test_greedy_generations_are_the_targets(model, drafter, controller, data):
    name, options = drafter
    setup = Setup(
        model,
        drafter=name,
        drafter_options=options,
        controller=lambda: replace(controller),
        max_draft_tokens=data.draw(st.integers(1, 6)),
    )
    check_greedy(setup, data.draw(es.prompts(model.vocab_size, 4)), data.draw(st.integers(1, 10)))


@pytest.mark.slow
def test_a_longer_horizon_with_many_drafts():
    """Five tokens over three symbols (the prefill's, then rounds of up to three drafts): thousands
    of generations."""
    torch.manual_seed(3)
    model = ToyModel(torch.rand(4, 3), torch.rand(4, 3), window=1, num_layers=3)
    for name in [TOY, "early_exit"]:
        setup = Setup(model, drafter=name, controller=always, max_draft_tokens=3)
        check_lossless(setup, [2], 5, SamplingParams(0.9, top_k=2))


def test_an_engine_that_forgets_to_roll_back_is_caught(monkeypatch):
    def rollback(self, upto):
        self.layout.keep(self.layout.slots, upto)
        self.cache.crop(
            self.layout.slots, start=self.parts.drafter.shared_layers
        )  # [0, N) keep rejected drafts

    monkeypatch.setattr(Generation, "_rollback", rollback)
    model = ToyModel(torch.tensor([[1.0, 2.0], [3.0, 1.0], [1.0, 1.0]]), torch.ones(3, 2), window=1)
    with pytest.raises(ToyInvariantError, match="rolled back"):
        engine_distribution(Setup(model, drafter="early_exit", controller=always), [0], 4)


def test_a_controller_with_its_own_unseeded_randomness_is_reported():
    entropy = random.SystemRandom()

    class Moody(ErraticController):
        def should_continue(self, state, step):
            return entropy.random() < 0.5

    model = ToyModel(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 1.0]]), window=0)
    with pytest.raises(ReplayError, match="cannot replay"):
        for _ in range(10):
            engine_distribution(Setup(model, controller=Moody, max_draft_tokens=3), [0], 5)


@pytest.mark.parametrize("name", [pytest.param(TOY, marks=pytest.mark.slow), "early_exit"])
def test_batches_that_take_drafts_back_follow_the_target(name):
    """A batch whose controller takes drafts back on their q, on fixed toy targets: each draft
    step's q is seen before the draft is drawn, so the rows still follow the target exactly."""
    controller = ErraticController((True,), salt=1, keeps=(True, False, True))
    for seed in range(2):
        torch.manual_seed(seed)
        model = ToyModel(torch.rand(4, 3), torch.rand(4, 3), window=1, num_layers=3)
        setup = Setup(model, drafter=name, controller=lambda: replace(controller), max_draft_tokens=2)
        check_lossless_batch(setup, [[1], [2, 0]], 3, SamplingParams(1.0))
