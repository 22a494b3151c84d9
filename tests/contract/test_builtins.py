"""The contracts applied to every built-in plug-in; controllers by walking the registry."""

from __future__ import annotations

import pytest

from eesd_core.registry import get_manager
from eesd_core.testing import ControllerContract, DrafterContract, VerifierContract, registered

CONTROLLERS = get_manager().registry("controller").names()


class TestRegisteredControllers(ControllerContract):
    covers = tuple(CONTROLLERS)

    @pytest.fixture(params=CONTROLLERS)
    def make_controller(self, request):
        return registered("controller", request.param)


class TestFixedControllerSettings(ControllerContract):
    """``fixed`` at the edges of its option: never draft, and draft past the engine's cap."""

    covers = ("fixed",)

    @pytest.fixture(params=[0, 1, 9])
    def make_controller(self, request):
        return registered("controller", "fixed", {"k": request.param})


class TestEarlyExitDrafter(DrafterContract):
    covers = ("early_exit",)

    @pytest.fixture(params=[{}, {"exit_layer": 2, "head": None}])
    def make_drafter(self, request):
        return registered("drafter", "early_exit", request.param)


class TestLosslessVerifier(VerifierContract):
    covers = ("lossless",)

    @pytest.fixture
    def make_verifier(self):
        return registered("verifier", "lossless")
