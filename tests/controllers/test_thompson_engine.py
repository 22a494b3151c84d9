"""The Thompson controller inside the engine: lossless whatever it decides."""

from __future__ import annotations

import pytest
import torch

from eesd_core import SpeculativeDecoder

VARIANTS = [
    {},
    {"variant": "calibration"},
    {"stop_rule": "bernoulli"},
    {"stop_rule": "bernoulli", "variant": "calibration", "resample": "step", "scope": "request"},
]


@pytest.mark.parametrize("options", VARIANTS)
def test_greedy_output_equals_plain_decoding(tiny, options):
    model = tiny()
    prompt = [1, 5, 7, 9]
    plain = SpeculativeDecoder(model, drafter=None).generate(prompt, max_new_tokens=40, eos_token_id=[])
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="thompson",
        controller_options=options,
    )
    for _ in range(2):
        out = dec.generate(prompt, max_new_tokens=40, eos_token_id=[])
        assert torch.equal(out.sequences, plain.sequences)


def test_is_the_default_controller(tiny):
    dec = SpeculativeDecoder(tiny(), drafter_options={"exit_layer": 2})
    assert type(dec.controller).__name__ == "ThompsonController"
