"""One engine for every batch size, a model that is never touched, and calls in several threads.

A single sequence is a batch of one row: it runs the very same round as a one-row batch. Nothing
of the model changes while decoding (no module's ``forward`` replaced, not even for one pass), so
decoders and threads may share it: concurrent calls give each what it gives alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from eesd_early_exit.head import ExitHead
from tinymodels import make_tiny
from torch import nn

from eesd_core import SpeculativeDecoder, hookimpl
from eesd_core.errors import ConfigError, EESDError, PluginFault
from eesd_core.protocols import IndependentDrafter
from eesd_core.registry import Manager, get_manager, reset_manager
from eesd_core.round import Generation

PROMPTS = ([5, 9, 4, 17, 3], [8, 1], [30, 31, 32, 33, 34, 35, 36], [12, 13, 14])


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return make_tiny("llama", 7, layers=4)


def _decoder(model: nn.Module, **options: Any) -> SpeculativeDecoder:
    options = {"drafter_options": {"exit_layer": 2, "head": None}, "max_draft_tokens": 4} | options
    dec = SpeculativeDecoder(model, **options)
    if dec.drafter is not None and dec.drafter.shared_layers:
        dec.drafter.head = ExitHead(dec.adapter, exit_layer=2, num_layers=1)  # an exit layer with a cache
    return dec


def test_a_single_sequence_and_a_one_row_batch_run_the_same_round(model, monkeypatch) -> None:
    rounds: list[int] = []
    original = Generation._round

    def counted(self: Generation) -> Any:
        rounds.append(len(self.ids))
        return original(self)

    monkeypatch.setattr(Generation, "_round", counted)
    dec = _decoder(model, controller="fixed", controller_options={"k": 3})
    alone = dec.generate(PROMPTS[0], max_new_tokens=20, eos_token_id=[])
    solo_rounds, rounds[:] = list(rounds), []
    batch = dec.generate([PROMPTS[0]], max_new_tokens=20, eos_token_id=[])
    assert type(dec.stream(PROMPTS[0])) is type(dec.stream([PROMPTS[0]])) is Generation
    assert rounds == solo_rounds and set(rounds) == {1} and len(rounds) == alone.stats.rounds - 1
    assert batch.sequences[0].tolist() == alone.sequences[0].tolist()
    row = batch.stats.rows[0]
    assert (row.rounds, row.drafted, row.accepted) == (
        alone.stats.rounds,
        alone.stats.drafted,
        alone.stats.accepted,
    )


def _untouched(model: nn.Module) -> Callable[[], list[str]]:
    """A check that the model's modules are the same objects, with the same attributes and the
    same parameters, and that no module's ``forward`` is shadowed on the instance."""
    modules = {name: (module, dict(vars(module))) for name, module in model.named_modules()}
    parameters = {name: (p, p.data_ptr()) for name, p in model.named_parameters()}

    def changes() -> list[str]:
        found = [f"{name}.forward is replaced" for name, m in model.named_modules() if "forward" in vars(m)]
        now = dict(model.named_modules())
        found += [f"module {name} changed" for name, (m, _) in modules.items() if now.get(name) is not m]
        for name, (module, attributes) in modules.items():
            changed = [
                k for k in set(attributes) | set(vars(module)) if vars(module).get(k) is not attributes.get(k)
            ]
            found += [f"{name}.{key} changed" for key in changed]
        params = dict(model.named_parameters())
        found += [
            f"parameter {n} changed"
            for n, (p, ptr) in parameters.items()
            if params[n] is not p or p.data_ptr() != ptr
        ]
        return found

    return changes


class _Watching:
    """A controller that checks the model during decoding, in the middle of every round."""

    def __init__(self, check: Callable[[], list[str]]) -> None:
        self.check, self.seen = check, []

    def start(self, request: Any) -> None:
        return None

    def begin_round(self, state: None, round: Any) -> None:
        pass

    def should_continue(self, state: None, step: Any) -> bool:
        self.seen.extend(self.check())
        return step.index < 2

    def update(self, state: None, outcomes: Any) -> None:
        self.seen.extend(self.check())


@pytest.mark.parametrize("products", ["standard", "transposed"])
def test_decoding_never_changes_the_model(model, products: str) -> None:
    """Alone and in ragged batches that skip their padding, through another product than
    ``F.linear``: the model's modules, attributes and parameters stay as they were."""
    check = _untouched(model)
    dec = _decoder(model, adapter_options={"products": products, "skip_padding": True})
    watcher = dec.controller = _Watching(check)
    dec.generate(PROMPTS[0], max_new_tokens=12, eos_token_id=[])
    dec.generate(list(PROMPTS), max_new_tokens=12, eos_token_id=[])
    assert watcher.seen == [] and check() == []


def _calls(greedy: SpeculativeDecoder, sampled: SpeculativeDecoder) -> list[Callable[[], Any]]:
    """A single sequence and a ragged batch on each decoder: greedy on the default decoder,
    sampled with seeds on one whose controller drafts a fixed number of tokens."""
    kwargs: dict[str, Any] = dict(max_new_tokens=8, eos_token_id=[])

    def one(dec: SpeculativeDecoder, prompt: list[int], **more: Any) -> Callable[[], Any]:
        return lambda: dec.generate(prompt, **kwargs, **more).sequences[0].tolist()

    def batch(dec: SpeculativeDecoder, prompts: list[list[int]], **more: Any) -> Callable[[], Any]:
        return lambda: [s.tolist() for s in dec.generate(prompts, **kwargs, **more).sequences]

    draw = dict(temperature=1.0, top_p=0.9)
    return [
        one(greedy, PROMPTS[0]),
        batch(greedy, list(PROMPTS[1:])),
        one(sampled, PROMPTS[2], seed=3, **draw),
        batch(sampled, list(PROMPTS[:2]), seed=4, **draw),
    ]


def _concurrently(calls: list[Callable[[], Any]], threads: int) -> list[Any]:
    """The calls in ``threads`` threads at once, started together, each taking calls in turn."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work(worker: int) -> None:
        barrier.wait()
        for index in range(worker, len(calls), threads):
            try:
                results[index] = calls[index]()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    return results


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 4])
def test_concurrent_calls_give_what_each_gives_alone(model, threads: int) -> None:
    """Single sequences and ragged batches at once, on one decoder from several threads and on
    two decoders sharing the model, 50 repetitions: every output equals the same call made alone,
    greedy and sampled with a seed. (A seeded sampled call is reproducible where the controller's
    decisions depend neither on other calls nor on time, as a fixed number of drafts; the default
    controller's depend on both, which changes how fast, never what, it decodes greedily.)"""
    torch.set_num_threads(1)
    greedy, sampled = _decoder(model), _decoder(model, controller="fixed", controller_options={"k": 3})
    calls = _calls(greedy, sampled)
    expected = [call() for call in calls]
    for _ in range(50):
        assert _concurrently(calls, threads) == expected


def test_interleaved_streams_in_threads_keep_their_own_state(model) -> None:
    """Two streams of one decoder advanced by two threads in turn, round by round."""
    dec = _decoder(model)
    expected = [
        dec.generate(p, max_new_tokens=24, eos_token_id=[]).sequences[0].tolist() for p in PROMPTS[:2]
    ]
    streams = [dec.stream(p, max_new_tokens=24, eos_token_id=[]) for p in PROMPTS[:2]]
    for _ in range(30):
        _concurrently([lambda s=s: next(s, None) for s in streams], 2)
    assert [s.sequence for s in streams] == expected


class _NoUpdate:
    def start(self, request: Any) -> None:
        return None

    def begin_round(self, state: None, round: Any) -> None:
        pass

    def should_continue(self, state: None, step: Any) -> bool:
        return False


class _KeepsNothing(_NoUpdate):
    withdraws = True

    def update(self, state: None, outcomes: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("component", "message"),
    [
        (_NoUpdate, r"_NoUpdate breaks the protocol: no update\(\)"),
        (_KeepsNothing, r"_KeepsNothing breaks the protocol: declares withdraws but has no keep\(\)"),
    ],
)
def test_a_controller_breaking_its_protocol_is_refused_at_registration(
    component: type, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Plugin:
        @hookimpl
        def eesd_register_controllers(self, register: Any) -> None:
            register.add("broken", component)

    said = f"plug-in 'broken-plugin' registering controller 'broken': {message}"
    manager = Manager()
    manager.register(Plugin(), "broken-plugin")
    with pytest.warns(RuntimeWarning, match=said):  # left out, the other plug-ins kept
        assert "broken" not in manager.registry("controller").names()
    monkeypatch.setenv("EESD_STRICT_PLUGINS", "1")
    strict = Manager()
    strict.register(Plugin(), "broken-plugin")
    with pytest.raises(PluginFault, match=said):
        strict.registry("controller")


class _OneRowOnly(IndependentDrafter):
    batches = False

    def attach(self, adapter: Any) -> None:
        pass

    def describe(self) -> str:
        return "one row only"

    def propose(self, history: torch.Tensor) -> Any:
        return (int(history[-1]),)


def test_a_drafter_for_one_row_decodes_alone_and_refuses_batches(model) -> None:
    class Plugin:
        @hookimpl
        def eesd_register_drafters(self, register: Any) -> None:
            register.add("one_row", _OneRowOnly)

    reset_manager()
    try:
        get_manager().register(Plugin(), "one-row-plugin")
        dec = SpeculativeDecoder(model, drafter="one_row", controller="fixed")
        assert len(dec.generate(PROMPTS[0], max_new_tokens=6).sequences[0]) == len(PROMPTS[0]) + 6
        assert len(dec.generate([PROMPTS[0]], max_new_tokens=6).sequences) == 1
        with pytest.raises(ConfigError, match="drafts for one sequence at a time"):
            dec.generate(list(PROMPTS[:2]), max_new_tokens=6)
    finally:
        reset_manager()


class _Interrupts:
    def __init__(self) -> None:
        self.asked = 0

    def start(self, request: Any) -> None:
        return None

    def begin_round(self, state: None, round: Any) -> None:
        pass

    def should_continue(self, state: None, step: Any) -> bool:
        self.asked += 1
        if self.asked == 5:
            raise KeyboardInterrupt
        return step.index < 2

    def update(self, state: None, outcomes: Any) -> None:
        pass


def test_a_generation_interrupted_mid_round_refuses_to_go_on(model) -> None:
    """Ctrl-C in the middle of a round leaves caches half-written: iterating the generation again
    is refused with the engine's own error (no plug-in is blamed), and the decoder stays usable."""
    dec = _decoder(model)
    dec.controller = _Interrupts()
    generation = dec.stream(PROMPTS[0], max_new_tokens=30, eos_token_id=[])
    with pytest.raises(KeyboardInterrupt):
        for _ in generation:
            pass
    with pytest.raises(EESDError, match="interrupted in the middle of a round") as raised:
        next(generation)
    assert not isinstance(raised.value, PluginFault)
    assert len(dec.generate(PROMPTS[0], max_new_tokens=8).sequences[0]) == len(PROMPTS[0]) + 8
