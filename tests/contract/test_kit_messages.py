"""A plug-in that breaks the contract kit's rules hears which rule and with what value."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

from eesd_core.protocols import Confidence, Costs, DraftStep, Request, SamplingParams
from eesd_core.testing import ControllerContract, DrafterContract, VerifierContract
from eesd_core.testing.checks import check_exact_match, check_verify_batch
from eesd_core.testing.controllers import ErraticController
from eesd_core.testing.errors import ContractBreach, KitError


@dataclass
class ReturnsOne(ErraticController):
    def should_continue(self, state, step):
        super().should_continue(state, step)
        return 1


@dataclass
class KeepsNone(ErraticController):
    def keep(self, state, step):
        return None


class NoUpdate:
    def start(self, request):
        return None

    def begin_round(self, state, round):
        pass

    def should_continue(self, state, step):
        return False


class Answers:
    """A verifier that answers ``answer`` whatever it is asked."""

    def __init__(self, answer):
        self.answer = answer

    def verify(self, drafts, qs, p, rngs):
        return self.answer


def any_step(make_controller) -> None:
    """``test_any_step_gets_a_bool`` on one fixed example: the first failure is all these tests
    need, and Hypothesis would spend its time shrinking it."""
    request = Request(4, 8, 4, SamplingParams(0.0), Costs(), withdraws=True)
    steps = [DraftStep(0, 4), DraftStep(1, 4, 0, 5, Confidence(0.5, 0.5, 1.0))]
    test = ControllerContract.test_any_step_gets_a_bool.hypothesis.inner_test
    test(ControllerContract(), make_controller, request, steps, [], Costs())


def test_a_controller_returning_one_is_told_should_continue_must_return_a_bool() -> None:
    with pytest.raises(ContractBreach, match=re.escape("should_continue must return a bool, got 1 (int)")):
        any_step(ReturnsOne)


def test_a_withdrawing_controller_whose_keep_returns_none_is_told() -> None:
    with pytest.raises(ContractBreach, match=re.escape("keep must return a bool, got None (NoneType)")):
        any_step(KeepsNone)


def test_a_controller_without_update_is_told_what_it_lacks() -> None:
    with pytest.raises(
        ContractBreach, match=r"a controller must follow its protocol \(no update\(\)\), got <"
    ):
        ControllerContract().test_is_a_controller(make_controller=NoUpdate)


def test_a_drafter_that_is_not_one_is_told_what_it_lacks() -> None:
    with pytest.raises(
        ContractBreach, match=r"a drafter must follow its protocol \(no attach\(\); .*got 3 \(int\)"
    ):
        DrafterContract().test_is_a_drafter(make_drafter=lambda: 3)


def test_a_verifier_without_verify_is_told() -> None:
    with pytest.raises(
        ContractBreach, match=r"a verifier must follow its protocol \(no verify\(\)\), got 'x' \(str\)"
    ):
        VerifierContract().test_is_a_verifier(make_verifier=lambda: "x")


P = torch.eye(3, dtype=torch.float64)[[0, 1]]  # [2, 3]: argmax 0, then 1


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (None, "verify must return 1 (n, token), got None (NoneType)"),
        ([(0, 1), (0, 1)], "verify must return 1 (n, token), got [(0, 1), (0, 1)] (list)"),
        (["ab"], "verify must return an (n, token) pair of ints per row, got 'ab' (str)"),
        ([(2, 1)], "verify's n must lie in [0, 1], the row's drafts, got 2 (int)"),
        ([(1, 3)], "verify's token must lie in [0, 3), the vocabulary, got 3 (int)"),
    ],
)
def test_a_verifier_answering_garbage_is_told_the_rule_and_the_value(answer, says) -> None:
    with pytest.raises(ContractBreach, match=re.escape(says)):
        check_exact_match(Answers(answer), [0], P)


def test_a_batch_verifier_answering_too_few_rows_is_told() -> None:
    with pytest.raises(
        ContractBreach, match=re.escape("verify must return 2 (n, token), got [(0, 0)] (list)")
    ):
        check_verify_batch(
            Answers([(0, 0)]), [[], []], [None, None], torch.stack([P, P]), [([], []), ([], [])]
        )


def test_a_breach_is_a_failed_assertion_and_a_kit_error() -> None:
    assert issubclass(ContractBreach, AssertionError) and issubclass(ContractBreach, KitError)
