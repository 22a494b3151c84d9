"""assert_same_distribution: passes true samples, fails wrong ones, keeps its false-fail promise."""

from __future__ import annotations

import math

import pytest
import torch

from eesd_core.testing.errors import DistributionMismatch, KitError
from eesd_core.testing.statistical import assert_same_distribution, l1_radius

EXPECTED = {"a": 0.5, "b": 0.3, "c": 0.2}


def draw(probs, n, seed):
    generator = torch.Generator().manual_seed(seed)
    keys = list(probs)
    picks = torch.multinomial(
        torch.tensor([probs[k] for k in keys]), n, replacement=True, generator=generator
    )
    return [keys[i] for i in picks.tolist()]


def test_samples_of_the_expected_distribution_pass():
    for seed in range(5):
        assert_same_distribution(draw(EXPECTED, 2000, seed), EXPECTED, 1e-9)


def test_a_shifted_distribution_fails():
    with pytest.raises(DistributionMismatch, match="binomial|L1"):
        assert_same_distribution(draw({"a": 0.4, "b": 0.4, "c": 0.2}, 5000, 0), EXPECTED, 1e-9)


def test_mass_spread_thinly_fails_in_l1():
    expected = {i: 1 / 8 for i in range(8)}
    tilted = {i: (1 / 8) * (1.25 if i % 2 else 0.75) for i in range(8)}
    with pytest.raises(DistributionMismatch):
        assert_same_distribution(draw(tilted, 20000, 1), expected, 1e-9)


def test_an_impossible_outcome_fails_at_once():
    with pytest.raises(DistributionMismatch, match="probability 0"):
        assert_same_distribution(["a"] * 99 + ["z"], EXPECTED, 1e-9)


def test_false_fails_stay_below_the_stated_rate():
    """At a false-fail rate of 0.25, fewer than a quarter of 200 honest runs fail (seeds fixed)."""
    failures = 0
    for seed in range(200):
        try:
            assert_same_distribution(draw(EXPECTED, 300, seed), EXPECTED, 0.25)
        except DistributionMismatch:
            failures += 1
    assert failures < 50


def test_l1_radius_is_the_weissman_bound():
    eps = l1_radius(1000, 3, 1e-9)
    assert (2**3 - 2) * math.exp(-1000 * eps**2 / 2) <= 1e-9


@pytest.mark.parametrize(
    ("samples", "expected", "rate"), [([], EXPECTED, 1e-9), (["a"], EXPECTED, 0.0), (["a"], {"a": 0.5}, 1e-9)]
)
def test_misuse_is_a_kit_error(samples, expected, rate):
    with pytest.raises(KitError):
        assert_same_distribution(samples, expected, rate)
