"""The kit's plumbing: it leaves the engine and the plug-in manager as it found them."""

from __future__ import annotations

import time

import pytest
import torch

from eesd_core import engine
from eesd_core.registry import get_manager
from eesd_core.sampling import TorchRandom
from eesd_core.testing import pytest_plugin
from eesd_core.testing.errors import KitError
from eesd_core.testing.kit import SUBJECT, TOY, Setup, installed
from eesd_core.testing.oracles import engine_distribution
from eesd_core.testing.toy import ToyModel


def test_the_oracle_restores_what_it_patched():
    manager, threads, state = get_manager(), torch.get_num_threads(), torch.get_rng_state()
    engine_distribution(Setup(ToyModel(torch.ones(1, 2), torch.tensor([[1.0, 3.0]]), window=0)), [0], 2)
    assert engine.TorchRandom is TorchRandom and engine.time is time
    assert get_manager() is manager and torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), state)


def test_installed_registers_the_toy_parts_and_the_subjects_only_inside():
    subject = object()
    with installed({"controller": lambda: subject}):
        assert TOY in get_manager().registry("drafter").names()
        assert get_manager().registry("controller").get(SUBJECT).factory() is subject
    assert TOY not in get_manager().registry("drafter").names()


def test_an_unknown_profile_is_named(monkeypatch):
    monkeypatch.setenv(pytest_plugin.PROFILE_VARIABLE, "no-such-profile")
    pytest_plugin._load(final=False)
    with pytest.raises(KitError, match="no-such-profile"):
        pytest_plugin._load(final=True)
