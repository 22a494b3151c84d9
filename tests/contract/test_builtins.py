"""The contracts applied to every registered drafter, controller and verifier, by walking the registry."""

from __future__ import annotations

import pytest

from eesd_core.registry import get_manager
from eesd_core.testing import ControllerContract, DrafterContract, VerifierContract, registered


def names(kind: str) -> list[str]:
    return get_manager().registry(kind).names()


class TestRegisteredControllers(ControllerContract):
    covers = tuple(names("controller"))
    # the default and the fixed controller in every run, the baselines in the slow suite
    params = [n if n in ("thompson", "fixed") else pytest.param(n, marks=pytest.mark.slow) for n in covers]

    @pytest.fixture(params=params)
    def make_controller(self, request):
        return registered("controller", request.param)


class TestFixedControllerSettings(ControllerContract):
    """``fixed`` at the edges of its option: never draft, and draft past the engine's cap."""

    covers = ("fixed",)

    @pytest.fixture(params=[0, 9])
    def make_controller(self, request):
        return registered("controller", "fixed", {"k": request.param})


class TestRegisteredDrafters(DrafterContract):
    covers = tuple(names("drafter"))

    @pytest.fixture(params=covers)
    def make_drafter(self, request):
        return registered("drafter", request.param)


class TestEarlyExitDeeper(DrafterContract):
    """An exit below the first layer, so layers [0, N) shared with the target are more than one."""

    covers = ("early_exit",)

    @pytest.fixture
    def make_drafter(self):
        return registered("drafter", "early_exit", {"exit_layer": 2, "head": None})


class TestRegisteredVerifiers(VerifierContract):
    covers = tuple(names("verifier"))

    @pytest.fixture(params=covers)
    def make_verifier(self, request):
        return registered("verifier", request.param)
