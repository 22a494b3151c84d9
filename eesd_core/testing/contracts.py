"""Contract tests every drafter, controller and verifier inherits: one fixture proves it lossless.

A plug-in's test suite subclasses a contract and provides one fixture returning a zero-argument
factory of fresh instances::

    from eesd_core.testing import ControllerContract

    class TestMyController(ControllerContract):
        @pytest.fixture
        def make_controller(self):
            return lambda: MyController(MyOptions())

The inherited tests run the real engine on random toy targets (:mod:`eesd_core.testing.toy`) and
compare the exact distribution of its output with plain sampling (:mod:`eesd_core.testing.oracles`),
check greedy decoding token for token, and check the bounds every round must keep. The number of
examples follows the Hypothesis profile (``EESD_HYPOTHESIS_PROFILE``), scaled from its
``max_examples``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eesd_core.protocols import Controller, Drafter, RoundStart, SamplingParams, Verifier, contract_breaches
from eesd_core.testing import strategies as es
from eesd_core.testing.checks import (
    check_bounds,
    check_exact_match,
    check_greedy,
    check_greedy_batch,
    check_lossless,
    check_lossless_batch,
    check_round,
    check_verify_batch,
)
from eesd_core.testing.controllers import ErraticController, always
from eesd_core.testing.errors import must
from eesd_core.testing.kit import TOY, Setup
from eesd_core.testing.toy import ToyModel


def examples(n: int) -> Any:
    """Settings for a test worth ``n`` examples under the default profile (100 examples).

    The factory fixtures are stateless and the contracts use no per-example setup, so the health
    checks against function-scoped fixtures and against one test run by several classes do not apply.
    """
    scaled = max(1, n * settings().max_examples // 100)
    quiet = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.differing_executors]
    return settings(max_examples=scaled, suppress_health_check=quiet)


def _follows(kind: str, protocol: type, component: Any) -> None:
    """The factory made a ``protocol``: every member, and capabilities declared as bools."""
    breaches = contract_breaches(kind, component)
    must(not breaches, f"a {kind} must follow its protocol ({'; '.join(breaches)})", component)
    members = set(getattr(protocol, "__annotations__", {}))
    members |= {name for name, value in vars(protocol).items() if callable(value) and name[0] != "_"}
    lacks = ", ".join(sorted(name for name in members if not hasattr(component, name)))
    rule = f"a {kind} must have every member of {protocol.__name__} (it lacks {lacks or 'none, yet fails'})"
    must(isinstance(component, protocol), rule, component)


_SMALL_MODELS = es.toy_models(vocab_sizes=st.integers(2, 3), windows=st.integers(0, 1))


def bigram_model(seed: int, num_layers: int = 3) -> ToyModel:
    """A fixed two-token bigram target whose draft table disagrees with it."""
    generator = torch.Generator().manual_seed(seed)
    tables = torch.rand(2, 3, 2, generator=generator, dtype=torch.float64)
    return ToyModel(tables[0], tables[1], window=1, num_layers=num_layers)


_DRAFTERS = st.sampled_from([(TOY, {}), (TOY, {"deterministic": True}), ("early_exit", {})])


class ControllerContract:
    """Tests for a controller; provide ``make_controller`` (a fixture returning a factory)."""

    plugin_kind = "controller"

    def test_is_a_controller(self, make_controller: Any) -> None:
        _follows("controller", Controller, make_controller())

    @examples(30)
    @given(
        request=es.requests(),
        steps=st.lists(es.draft_steps(), max_size=6),
        outcomes=st.lists(es.round_outcomes(), max_size=3),
        costs=es.costs(),
    )
    def test_any_step_gets_a_bool(
        self, make_controller: Any, request: Any, steps: Any, outcomes: Any, costs: Any
    ) -> None:
        controller = make_controller()
        keeps = getattr(controller, "withdraws", False) is True
        state = controller.start(request)
        for index, outcome in enumerate([None, *outcomes]):
            if outcome is not None:
                controller.update(state, [outcome])
            controller.begin_round(state, RoundStart((0,), costs, index))
            for step in steps:
                decision = controller.should_continue(state, step)
                must(decision is True or decision is False, "should_continue must return a bool", decision)
                if keeps and step.index:  # keep() is asked before the draft is drawn
                    seen = replace(step, token=None, confidence=replace(step.confidence, prob=None))
                    decision = controller.keep(state, seen)
                    must(decision is True or decision is False, "keep must return a bool", decision)

    @examples(20)
    @given(model=_SMALL_MODELS, sampling=es.sampling_params(greedy=False), drafter=_DRAFTERS, data=st.data())
    def test_lossless(self, make_controller: Any, model: Any, sampling: Any, drafter: Any, data: Any) -> None:
        name, options = drafter
        setup = Setup(
            model, drafter=name, drafter_options=options, controller=make_controller, max_draft_tokens=2
        )
        check_lossless(setup, data.draw(es.prompts(model.vocab_size, 2)), 4, sampling)

    @pytest.mark.parametrize("drafter", [TOY, "early_exit"])
    def test_lossless_over_more_rounds(self, make_controller: Any, drafter: str) -> None:
        """Five tokens (the prefill's, then rounds of up to three drafts): the controller learns
        across rounds."""
        setup = Setup(bigram_model(0), drafter=drafter, controller=make_controller, max_draft_tokens=3)
        check_lossless(setup, [1], 5, SamplingParams(1.0))

    @examples(15)
    @given(model=es.toy_models(vocab_sizes=st.integers(2, 4)), drafter=_DRAFTERS, data=st.data())
    def test_greedy_is_the_targets(self, make_controller: Any, model: Any, drafter: Any, data: Any) -> None:
        name, options = drafter
        setup = Setup(
            model, drafter=name, drafter_options=options, controller=make_controller, max_draft_tokens=4
        )
        check_greedy(setup, data.draw(es.prompts(model.vocab_size)), data.draw(st.integers(1, 8)))

    @examples(10)
    @given(model=_SMALL_MODELS, sampling=es.sampling_params(greedy=False), drafter=_DRAFTERS, data=st.data())
    def test_batch_lossless(
        self, make_controller: Any, model: Any, sampling: Any, drafter: Any, data: Any
    ) -> None:
        """Two rows decoded together, the controller asked for each in turn: jointly exact."""
        name, options = drafter
        setup = Setup(
            model, drafter=name, drafter_options=options, controller=make_controller, max_draft_tokens=2
        )
        prompts = [data.draw(es.prompts(model.vocab_size, 2)) for _ in range(2)]
        check_lossless_batch(setup, prompts, 3, sampling)

    @examples(10)
    @given(model=es.toy_models(vocab_sizes=st.integers(2, 4)), drafter=_DRAFTERS, data=st.data())
    def test_batch_greedy_is_the_targets(
        self, make_controller: Any, model: Any, drafter: Any, data: Any
    ) -> None:
        """Three rows of different lengths, one token an EOS: each row is its greedy decoding."""
        name, options = drafter
        setup = Setup(
            model, drafter=name, drafter_options=options, controller=make_controller, max_draft_tokens=3
        )
        prompts = [data.draw(es.prompts(model.vocab_size)) for _ in range(3)]
        eos = [data.draw(st.integers(0, model.vocab_size - 1))]
        check_greedy_batch(setup, prompts, data.draw(st.integers(1, 8)), eos)

    @examples(10)
    @given(model=es.toy_models(), sampling=es.sampling_params(), cap=st.integers(1, 5), data=st.data())
    def test_bounds_hold(self, make_controller: Any, model: Any, sampling: Any, cap: int, data: Any) -> None:
        setup = Setup(model, controller=make_controller, max_draft_tokens=cap)
        prompt = data.draw(es.prompts(model.vocab_size))
        check_bounds(
            setup, prompt, data.draw(st.integers(1, 12)), sampling, seed=data.draw(st.integers(0, 99))
        )


class DrafterContract:
    """Tests for a drafter on toy targets; provide ``make_drafter`` (a fixture returning a factory).

    The drafter must draft for :class:`~eesd_core.testing.toy.ToyModel` targets through their
    adapter, as it would for any model; toy targets here have ``num_layers`` from ``toy_layers``.
    """

    plugin_kind = "drafter"
    toy_layers = st.integers(3, 4)

    def test_is_a_drafter(self, make_drafter: Any) -> None:
        _follows("drafter", Drafter, make_drafter())

    @examples(20)
    @given(data=st.data(), sampling=es.sampling_params(greedy=False), controller=es.erratic_controllers())
    def test_lossless(self, make_drafter: Any, data: Any, sampling: Any, controller: Any) -> None:
        model = data.draw(es.toy_models(num_layers=self.toy_layers))
        setup = Setup(model, drafter=make_drafter, controller=lambda: replace(controller), max_draft_tokens=2)
        check_lossless(setup, data.draw(es.prompts(model.vocab_size, 2)), 4, sampling)

    @pytest.mark.parametrize(
        ("schedule", "keeps"),
        [
            ((True,), (True,)),
            ((True, True, False), (True,)),
            ((False, True), (True,)),
            ((True,), (False, True)),
        ],
    )
    def test_lossless_over_more_rounds(
        self, make_drafter: Any, schedule: tuple[bool, ...], keeps: tuple[bool, ...]
    ) -> None:
        """Five tokens (the prefill's, then rounds of up to three drafts), rounds of every length;
        drafts taken back (for a drafter that ``withdraws``)."""
        controller = ErraticController(schedule, keeps=keeps)
        setup = Setup(
            bigram_model(1, num_layers=4),
            drafter=make_drafter,
            controller=lambda: replace(controller),
            max_draft_tokens=3,
        )
        check_lossless(setup, [0], 5, SamplingParams(0.8))

    @examples(15)
    @given(data=st.data(), controller=es.erratic_controllers())
    def test_greedy_is_the_targets(self, make_drafter: Any, data: Any, controller: Any) -> None:
        model = data.draw(es.toy_models(vocab_sizes=st.integers(2, 4), num_layers=self.toy_layers))
        setup = Setup(model, drafter=make_drafter, controller=lambda: replace(controller), max_draft_tokens=4)
        check_greedy(setup, data.draw(es.prompts(model.vocab_size)), data.draw(st.integers(1, 8)))

    def _batched(self, make_drafter: Any) -> None:
        if getattr(make_drafter(), "batches", False) is not True:
            pytest.skip("this drafter drafts for one sequence at a time (batches=False)")

    @examples(10)
    @given(data=st.data(), sampling=es.sampling_params(greedy=False), controller=es.erratic_controllers())
    def test_batch_lossless(self, make_drafter: Any, data: Any, sampling: Any, controller: Any) -> None:
        """Two rows drafted together: their joint output is independent plain sampling of each."""
        self._batched(make_drafter)
        model = data.draw(es.toy_models(vocab_sizes=st.integers(2, 3), num_layers=self.toy_layers))
        setup = Setup(model, drafter=make_drafter, controller=lambda: replace(controller), max_draft_tokens=2)
        prompts = [data.draw(es.prompts(model.vocab_size, 2)) for _ in range(2)]
        check_lossless_batch(setup, prompts, 3, sampling)

    @examples(10)
    @given(data=st.data(), controller=es.erratic_controllers())
    def test_batch_greedy_is_the_targets(self, make_drafter: Any, data: Any, controller: Any) -> None:
        """Three rows of different lengths, one token an EOS: each row is its greedy decoding."""
        self._batched(make_drafter)
        model = data.draw(es.toy_models(vocab_sizes=st.integers(2, 4), num_layers=self.toy_layers))
        setup = Setup(model, drafter=make_drafter, controller=lambda: replace(controller), max_draft_tokens=4)
        prompts = [data.draw(es.prompts(model.vocab_size)) for _ in range(3)]
        eos = [data.draw(st.integers(0, model.vocab_size - 1))]
        check_greedy_batch(setup, prompts, data.draw(st.integers(1, 8)), eos)

    @examples(10)
    @given(
        data=st.data(),
        sampling=es.sampling_params(),
        cap=st.integers(1, 5),
        controller=es.erratic_controllers(),
    )
    def test_bounds_hold(
        self, make_drafter: Any, data: Any, sampling: Any, cap: int, controller: Any
    ) -> None:
        model = data.draw(es.toy_models(num_layers=self.toy_layers))
        setup = Setup(
            model, drafter=make_drafter, controller=lambda: replace(controller), max_draft_tokens=cap
        )
        prompt = data.draw(es.prompts(model.vocab_size))
        check_bounds(
            setup, prompt, data.draw(st.integers(1, 12)), sampling, seed=data.draw(st.integers(0, 99))
        )


class VerifierContract:
    """Tests for a verifier; provide ``make_verifier`` (a fixture returning a factory).

    Probabilities handed to ``rng.bernoulli`` must lie in [0, 1]; the kit's random sources refuse
    anything else.
    """

    plugin_kind = "verifier"

    def test_is_a_verifier(self, make_verifier: Any) -> None:
        _follows("verifier", Verifier, make_verifier())

    @examples(40)
    @given(
        model=es.toy_models(windows=st.integers(1, 2)),
        sampling=es.sampling_params(greedy=False),
        k=st.integers(0, 3),
        deterministic=st.booleans(),
        data=st.data(),
    )
    def test_one_round_is_lossless(
        self, make_verifier: Any, model: Any, sampling: Any, k: int, deterministic: bool, data: Any
    ) -> None:
        prompt = data.draw(es.prompts(model.vocab_size, 2))
        check_round(make_verifier(), model, prompt, k, sampling, deterministic)

    @examples(40)
    @given(vocab=st.integers(2, 5), data=st.data())
    def test_greedy_is_exact_match(self, make_verifier: Any, vocab: int, data: Any) -> None:
        k = data.draw(st.integers(0, 4))
        p = data.draw(es.one_hot_matrices(k + 1, vocab))
        drafts = data.draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
        check_exact_match(make_verifier(), drafts, p)

    @examples(40)
    @given(vocab=st.integers(2, 5), rows=st.integers(1, 4), greedy=st.booleans(), data=st.data())
    def test_a_batch_is_verified_as_row_by_row(
        self, make_verifier: Any, vocab: int, rows: int, greedy: bool, data: Any
    ) -> None:
        """Rows verified together answer as each alone, with the same draws."""
        verifier = make_verifier()
        ks = data.draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
        m = max(ks) + data.draw(st.integers(1, 2))  # a round's p may be longer than a row's k + 1
        matrices = es.one_hot_matrices if greedy else es.prob_matrices
        p = torch.stack([data.draw(matrices(m, vocab)) for _ in range(rows)])
        drafts, qs = [], []
        for k in ks:
            drafts.append(data.draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k)))
            fixed = greedy or not k or data.draw(st.booleans())
            qs.append(None if fixed else data.draw(es.prob_matrices(k, vocab)))
        uniforms = st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8)
        check_verify_batch(verifier, drafts, qs, p, [(data.draw(uniforms), data.draw(uniforms)) for _ in ks])

    @examples(20)
    @given(
        model=_SMALL_MODELS,
        sampling=es.sampling_params(greedy=False),
        controller=es.erratic_controllers(withdrawing=False),
        data=st.data(),
    )
    def test_lossless_in_the_engine(
        self, make_verifier: Any, model: Any, sampling: Any, controller: Any, data: Any
    ) -> None:
        setup = Setup(
            model, controller=lambda: replace(controller), verifier=make_verifier, max_draft_tokens=2
        )
        check_lossless(setup, data.draw(es.prompts(model.vocab_size, 2)), 4, sampling)

    def test_lossless_in_the_engine_drafting_every_round(self, make_verifier: Any) -> None:
        """Fixed cases whatever examples Hypothesis draws: two drafts every round, draft tables
        that disagree with the target, so every branch of verification is taken."""
        for seed in (0, 1):
            setup = Setup(bigram_model(seed), controller=always, verifier=make_verifier, max_draft_tokens=2)
            check_lossless(setup, [0], 4, SamplingParams(1.0))
