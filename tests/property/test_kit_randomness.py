"""The kit's random sources: exact enumeration, replay checks, scripted draws."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eesd_core.testing import strategies as es
from eesd_core.testing.errors import KitError, ReplayError
from eesd_core.testing.randomness import (
    EnumeratingRandom,
    NoRandom,
    ScriptedRandom,
    distribution,
    enumerate_runs,
    inverse_cdf,
)


def test_two_coins_and_a_die():
    def run(rng):
        first = rng.bernoulli(0.25)
        return (first, rng.categorical(torch.tensor([1.0, 0.0, 3.0])) if first else rng.bernoulli(0.5))

    assert distribution(enumerate_runs(run)) == {
        (True, 0): 0.25 * 0.25,
        (True, 2): 0.25 * 0.75,
        (False, True): 0.375,
        (False, False): 0.375,
    }


@given(es.prob_vectors(4), st.integers(1, 3))
def test_repeated_categorical_draws_are_exact(probs, draws):
    """n draws from p: every sequence has probability prod p, zero-probability tokens never appear."""
    dist = distribution(enumerate_runs(lambda rng: tuple(rng.categorical(probs) for _ in range(draws))))
    for tokens, prob in dist.items():
        assert prob == pytest.approx(float(torch.prod(probs[list(tokens)])), abs=1e-15)
    assert len(dist) == int((probs > 0).sum()) ** draws


def test_certain_outcomes_do_not_branch():
    leaves = enumerate_runs(
        lambda rng: (rng.bernoulli(1.0), rng.bernoulli(0.0), rng.categorical(torch.eye(3)[1]))
    )
    assert leaves == [((True, False, 1), 1.0)]


def test_randomness_the_kit_cannot_see_is_reported():
    hidden = random.Random(0)

    def run(rng):
        return rng.bernoulli(0.5) if hidden.random() < 0.5 else rng.categorical(torch.ones(3))

    with pytest.raises(ReplayError, match="cannot replay"):
        for _ in range(20):
            enumerate_runs(run)


@pytest.mark.parametrize("prob", [-0.1, 1.5, float("nan")])
def test_bernoulli_refuses_what_is_not_a_probability(prob):
    with pytest.raises(KitError, match=r"\[0, 1\]"):
        EnumeratingRandom().bernoulli(prob)


@pytest.mark.parametrize("probs", [[0.0, 0.0], [0.5, -0.1], [float("nan"), 1.0]])
def test_categorical_refuses_what_is_not_a_distribution(probs):
    with pytest.raises(KitError, match="not a distribution"):
        EnumeratingRandom().categorical(torch.tensor(probs))


def test_runaway_enumeration_stops_with_advice():
    with pytest.raises(KitError, match="smaller vocabulary"):
        enumerate_runs(lambda rng: [rng.categorical(torch.ones(4)) for _ in range(4)], max_runs=100)


def test_scripted_source_uses_its_uniforms_in_order():
    rng = ScriptedRandom(accept=[0.3, 0.9], sample=[0.55])
    assert rng.bernoulli(0.3) is True  # u <= p, as transformers compares
    assert rng.bernoulli(0.5) is False
    assert rng.categorical(torch.tensor([0.5, 0.0, 0.5])) == 2
    with pytest.raises(KitError, match="ran out"):
        rng.bernoulli(0.5)


@given(es.prob_vectors(5), st.floats(0.0, 1.0, exclude_max=True))
def test_inverse_cdf_lands_in_the_support(probs, u):
    assert probs[inverse_cdf(probs, u)] > 0


def test_no_random_answers_only_certain_outcomes():
    rng = NoRandom()
    assert rng.bernoulli(1.0) is True and rng.bernoulli(0.0) is False
    assert rng.categorical(torch.tensor([0.0, 1.0])) == 1
    with pytest.raises(KitError):
        rng.bernoulli(0.5)
    with pytest.raises(KitError):
        rng.categorical(torch.tensor([0.5, 0.5]))
