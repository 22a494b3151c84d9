"""A misbehaving plug-in fails with a PluginFault naming it, and the decoder stays usable."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from eesd_early_exit.drafter import EarlyExitDrafter
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder, hookimpl
from eesd_core.errors import NumericalError, PluginFault
from eesd_core.protocols import Draft, IndependentDrafter
from eesd_core.registry import get_manager, reset_manager


class _Controller:
    def __init__(self, decide) -> None:  # noqa: ANN001
        self.decide = decide

    def start(self, request) -> None:  # noqa: ANN001
        return None

    def begin_round(self, state, round) -> None:  # noqa: ANN001
        pass

    def should_continue(self, state, step):  # noqa: ANN001, ANN201
        return self.decide(step)

    def update(self, state, outcomes) -> None:  # noqa: ANN001
        pass


def _raise(step):  # noqa: ANN001, ANN202
    raise RuntimeError("boom")


CONTROLLERS = {
    "raises": lambda: _Controller(_raise),
    "non_bool": lambda: _Controller(lambda step: "yes"),
    "never_stops": lambda: _Controller(lambda step: True),
    "numpy_bools": lambda: _Controller(lambda step: np.bool_(step.index < 2)),
}


class _BadDrafter(EarlyExitDrafter):
    """The early-exit drafter with one planted fault, chosen by ``mode``."""

    mode = "vocab"

    def step(self, state, tokens, slot, drafting, history):  # noqa: ANN001, ANN201
        draft = super().step(state, tokens, slot, drafting, history)
        if self.mode == "vocab":
            return Draft(tokens=((self.adapter.vocab_size + 10_000,),) * len(drafting))
        if self.mode == "logits":
            return Draft(logits=draft.logits[:, :-1])
        if self.mode == "type":
            return "not a draft"
        return draft

    def finish(self, state, tokens, slot):  # noqa: ANN001, ANN201
        hidden = super().finish(state, tokens, slot)
        return hidden[:, :-1] if self.mode == "hidden" else hidden


class _GreedyVerifier:
    """Claims one token more than was drafted (but draws the prefill's token honestly)."""

    def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN201
        return [(len(d) + (len(d) > 0), 3) for d in drafts]


class _Plugin:
    @hookimpl
    def eesd_register_controllers(self, register):  # noqa: ANN001, ANN201
        for name, factory in CONTROLLERS.items():
            register.add(name, factory)

    @hookimpl
    def eesd_register_drafters(self, register):  # noqa: ANN001, ANN201
        register.add("bad_drafter", lambda: _BadDrafter())

    @hookimpl
    def eesd_register_verifiers(self, register):  # noqa: ANN001, ANN201
        register.add("overeager", _GreedyVerifier)


@pytest.fixture(autouse=True)
def faulty_plugins():
    reset_manager()
    get_manager().register(_Plugin(), "faulty-test-plugins")
    yield
    reset_manager()


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama", 1)


def _still_usable(dec: SpeculativeDecoder, model) -> None:  # noqa: ANN001
    good = SpeculativeDecoder(model, drafter=None, controller="fixed")
    assert dec.adapter is not None
    ids = torch.tensor([[4, 5, 6]])
    assert good.generate(ids, max_new_tokens=4).sequences.shape == (1, 7)


@pytest.mark.parametrize(
    "name, message",
    [
        ("raises", "controller 'raises' raised RuntimeError: boom"),
        ("non_bool", "controller 'non_bool' returned 'yes'"),
    ],
)
def test_faulty_controller_is_named(model, name: str, message: str) -> None:
    dec = SpeculativeDecoder(model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller=name)
    for _ in range(2):
        with pytest.raises(PluginFault, match=message):
            dec.generate([4, 5, 6], max_new_tokens=6)
    _still_usable(dec, model)


def test_numpy_bools_are_bools(model) -> None:
    numpy_bools = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="numpy_bools"
    )
    fixed = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 2},
    )
    got = numpy_bools.generate([4, 5, 6], max_new_tokens=8)
    assert got.stats.drafted > 0 and torch.equal(
        got.sequences, fixed.generate([4, 5, 6], max_new_tokens=8).sequences
    )


def test_controller_that_never_stops_is_capped(model) -> None:
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="never_stops",
        max_draft_tokens=5,
    )
    expected = model.generate(
        torch.tensor([[4, 5, 6]]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    out = dec.generate([4, 5, 6], max_new_tokens=20, eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    assert max(len(out.stats.drafted_by_position), 0) <= 5


@pytest.mark.parametrize(
    "mode, message",
    [
        ("vocab", "drafter 'bad_drafter' proposed tokens outside"),
        ("logits", "drafter 'bad_drafter' returned draft logits of shape"),
        ("hidden", "drafter 'bad_drafter' returned hidden states of shape"),
        ("type", "drafter 'bad_drafter' returned str from step"),
    ],
)
def test_faulty_drafter_is_named(model, mode: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_BadDrafter, "mode", mode)
    dec = SpeculativeDecoder(
        model, drafter="bad_drafter", controller="fixed", controller_options={"k": 3}, max_draft_tokens=5
    )
    # No end-of-sequence token: a sampled EOS from the prefill would end the run before any draft.
    with pytest.raises(PluginFault, match=message):
        dec.generate([4, 5, 6], max_new_tokens=10, temperature=1.0, seed=0, eos_token_id=[])
    _still_usable(dec, model)


def test_verifier_accepting_more_than_drafted_is_named(model) -> None:
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        verifier="overeager",
    )
    with pytest.raises(PluginFault, match="verifier 'overeager' accepted 5 tokens out of 4"):
        dec.generate([4, 5, 6], max_new_tokens=10)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_logits_are_reported_not_sampled(bad: float) -> None:
    model = make_tiny("llama", 2)
    with torch.no_grad():
        model.lm_head.weight[7, 0] = bad
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
    )
    with pytest.raises(NumericalError, match="NaN or \\+inf"):
        dec.generate([4, 5, 6], max_new_tokens=5, temperature=1.0, seed=0)


class _AsksForTopStates(IndependentDrafter):
    """A drafter that does not say whether it reads the target's top states."""

    reads_top_states = None

    def attach(self, adapter):  # noqa: ANN001, ANN201
        pass

    def describe(self) -> str:
        return "asks"


class _AsksPlugin:
    @hookimpl
    def eesd_register_drafters(self, register):  # noqa: ANN001, ANN201
        register.add("asks", _AsksForTopStates)


def test_drafter_missing_a_protocol_member_is_named(model) -> None:
    get_manager().register(_AsksPlugin(), "asks-plugin")
    with pytest.raises(PluginFault, match="drafter 'asks' does not declare reads_top_states"):
        SpeculativeDecoder(model, drafter="asks")


class _ShortBatchVerifier:
    """Verifies a batch round but answers one row too few."""

    def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN201
        return [(0, int(p[b, 0].argmax())) for b in range(len(drafts))][1:]


def test_verifier_answering_too_few_rows_of_a_batch_is_named(model) -> None:
    get_manager().register(
        type(
            "_Short",
            (),
            {
                "eesd_register_verifiers": hookimpl(
                    lambda self, register: register.add("short_batch", _ShortBatchVerifier)
                )
            },
        )(),
        "short-batch-verifier",
    )
    dec = SpeculativeDecoder(model, drafter=None, verifier="short_batch")
    with pytest.raises(
        PluginFault, match=r"verifier 'short_batch' returned .* from verify\(\), not an \(n, token\) per row"
    ):
        dec.generate([[4, 5, 6], [7, 8]], max_new_tokens=4)
