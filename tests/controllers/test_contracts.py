"""The shipped controller contract, applied to option settings the registry walk does not reach."""

from __future__ import annotations

import pytest

from eesd_core.testing import ControllerContract, registered

SLOW = pytest.mark.slow  # the suite under its time budget: these settings in the slow suite
SETTINGS = [
    ("thompson", {"variant": "beta", "stop_rule": "bernoulli", "resample": "step", "scope": "request"}),
    pytest.param(
        ("thompson", {"failures": "all", "probe_tokens": None, "signal": "entropy", "max_draft_tokens": 1}),
        marks=SLOW,
    ),
    pytest.param(("confidence", {"adaptive": True, "signal": "top1"}), marks=SLOW),
    pytest.param(("ema", {"warmup": 0, "interval": 1, "min_steps": 0}), marks=SLOW),
]


class TestControllerSettings(ControllerContract):
    covers = ("thompson", "confidence", "ema")

    @pytest.fixture(params=SETTINGS, ids=lambda s: f"{s[0]}-{'-'.join(map(str, s[1].values()))}")
    def make_controller(self, request):
        name, options = request.param
        return registered("controller", name, options)
