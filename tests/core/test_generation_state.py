"""Each call owns its state: interleaved streams on one decoder, and one record per round."""

from __future__ import annotations

import pytest
import torch
from eesd_early_exit.head import ExitHead
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder, hookimpl
from eesd_core.registry import get_manager, reset_manager

PROMPTS = ([5, 9, 4, 17, 3], [8, 1], [30, 31, 32, 33, 34, 35, 36])


def _interleaved(dec: SpeculativeDecoder, prompts, **kwargs) -> list[list[int]]:
    """Round-robin over one stream per prompt until all are done; the sequences in prompt order."""
    streams = [dec.stream(p, eos_token_id=[], **kwargs) for p in prompts]
    live = list(streams)
    while live:
        for stream in list(live):
            if next(stream, None) is None:
                live.remove(stream)
    return [s.sequence for s in streams]


def _sequential(dec: SpeculativeDecoder, prompts, **kwargs) -> list[list[int]]:
    return [dec.generate(p, eos_token_id=[], **kwargs).sequences[0].tolist() for p in prompts]


@pytest.mark.parametrize(
    "drafter, options, head_layers",
    [
        ("early_exit", {"exit_layer": 2, "head": None}, 0),
        ("early_exit", {"exit_layer": 2, "head": None}, 1),  # an exit layer with its own cache
        ("prompt_lookup", {}, 0),
    ],
)
@pytest.mark.parametrize("controller", [("fixed", {"k": 3}), ("thompson", {})])
def test_interleaved_greedy_streams_equal_sequential_runs(drafter, options, head_layers, controller) -> None:
    model = make_tiny("llama", 7, layers=4)
    dec = SpeculativeDecoder(
        model,
        drafter=drafter,
        drafter_options=options,
        controller=controller[0],
        controller_options=controller[1],
        max_draft_tokens=4,
    )
    if head_layers:
        dec.drafter.head = ExitHead(dec.adapter, exit_layer=2, num_layers=head_layers)
    expected = _sequential(dec, PROMPTS, max_new_tokens=20)
    assert _interleaved(dec, PROMPTS, max_new_tokens=20) == expected
    for prompt, sequence in zip(PROMPTS, expected, strict=True):
        reference = model.generate(
            torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence == reference[0].tolist()


def test_interleaved_sampled_streams_equal_sequential_runs() -> None:
    """With a controller that keeps no state across generations, sampled runs match too."""
    model = make_tiny("qwen2", 3, layers=4)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 1, "head": None},
        controller="fixed",
        controller_options={"k": 2},
    )
    dec.drafter.head = ExitHead(dec.adapter, exit_layer=1, num_layers=1)
    kwargs = dict(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=11)
    assert _interleaved(dec, PROMPTS, **kwargs) == _sequential(dec, PROMPTS, **kwargs)


class _Recording:
    """Records what should_continue saw and what update received."""

    def __init__(self, options: object = None) -> None:
        self.steps: list = []
        self.outcomes: list = []

    def start(self, request) -> None:  # noqa: ANN001
        return None

    def begin_round(self, state, round) -> None:  # noqa: ANN001
        pass

    def should_continue(self, state, step) -> bool:  # noqa: ANN001
        if step.index:
            self.steps.append((len(self.outcomes), step))
        return step.index < 3

    def update(self, state, outcomes) -> None:  # noqa: ANN001
        self.outcomes.extend(outcomes)


class _Observer:
    def __init__(self) -> None:
        self.seen: list = []

    @hookimpl
    def eesd_register_controllers(self, register) -> None:  # noqa: ANN001
        register.add("recording", _Recording)

    @hookimpl
    def eesd_round_end(self, outcome) -> None:  # noqa: ANN001
        self.seen.append(outcome)


@pytest.fixture
def observer():
    reset_manager()
    plugin = _Observer()
    get_manager().register(plugin, "recording-test")
    yield plugin
    reset_manager()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_record_per_round_carries_what_the_controller_saw(observer, temperature: float) -> None:
    """At temperature 0 too, the per-draft confidences of a round are those should_continue saw
    (q of the untrained exit at temperature 1), not a stand-in 1.0."""
    model = make_tiny("llama", 4, layers=4)
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2, "head": None}, controller="recording"
    )
    dec.generate([3, 4, 5], max_new_tokens=24, temperature=temperature, seed=0, eos_token_id=[])
    controller = dec.controller
    assert controller.outcomes == observer.seen  # the same records, in the same order
    assert len(controller.steps) > 10
    for round_, step in controller.steps:
        o = controller.outcomes[round_]
        assert o.confidences[step.index - 1] == step.confidence
    assert all(len(o.confidences) == o.drafted for o in controller.outcomes)
    probs = [c.prob for o in controller.outcomes for c in o.confidences]
    assert probs and all(0.0 < p <= 1.0 for p in probs) and min(probs) < 0.99
