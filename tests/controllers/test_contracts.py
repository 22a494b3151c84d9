"""The shipped controller contract, applied to option settings the registry walk does not reach."""

from __future__ import annotations

import pytest

from eesd_core.testing import ControllerContract, registered

SETTINGS = [
    ("thompson", {"variant": "beta", "stop_rule": "bernoulli", "resample": "step", "scope": "request"}),
    ("thompson", {"failures": "all", "probe_tokens": None, "signal": "entropy", "max_draft_tokens": 1}),
    ("confidence", {"adaptive": True, "signal": "top1"}),
    ("ema", {"warmup": 0, "interval": 1, "min_steps": 0}),
]


class TestControllerSettings(ControllerContract):
    covers = ("thompson", "confidence", "ema")

    @pytest.fixture(params=SETTINGS, ids=lambda s: f"{s[0]}-{'-'.join(map(str, s[1].values()))}")
    def make_controller(self, request):
        name, options = request.param
        return registered("controller", name, options)
