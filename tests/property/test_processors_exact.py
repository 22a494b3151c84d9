"""Logits processors keep decoding lossless, exactly: with a repetition penalty, a no-repeat n-gram
rule, ``min_new_tokens`` and a processor that masks tokens by the prefix (a stand-in for a grammar),
the engine's output distribution equals plain sampling from the processed target, enumerated over
every random choice (small vocabularies, float64), for the early-exit drafter with Thompson
sampling and for prompt lookup, one sequence and a batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from eesd_core.protocols import SamplingParams
from eesd_core.sampling import process_logits
from eesd_core.testing.checks import greedy_tokens
from eesd_core.testing.kit import Setup
from eesd_core.testing.oracles import (
    assert_distributions_equal,
    autoregressive_distribution,
    engine_batch_distribution,
    engine_distribution,
    independent_rows,
)
from eesd_core.testing.toy import ToyModel

EOS = 0


class NoTwoAfterOne:
    """A grammar in miniature: token 2 may never follow token 1."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        if input_ids[0, -1] == 1:
            scores[:, 2] = -math.inf
        return scores


CASES = {
    "repetition-penalty": ({"logits_processor": [RepetitionPenaltyLogitsProcessor(1.8)]}, 0),
    "no-repeat-ngram": ({"logits_processor": [NoRepeatNGramLogitsProcessor(2)]}, 0),
    "min-new-tokens": ({}, 3),
    "grammar": ({"logits_processor": [NoTwoAfterOne()]}, 0),
    "all": (
        {
            "logits_processor": [
                RepetitionPenaltyLogitsProcessor(1.5),
                NoRepeatNGramLogitsProcessor(3),
                NoTwoAfterOne(),
            ]
        },
        2,
    ),
}
SETUPS = {
    "early-exit-thompson": dict(drafter="early_exit", controller="thompson", max_draft_tokens=2),
    "prompt-lookup": dict(
        drafter="prompt_lookup", drafter_options={"max_ngram": 1}, controller="fixed", max_draft_tokens=2
    ),
}


def processed(model: ToyModel, prompt: list[int], keywords: dict, min_new: int, sampling: SamplingParams):
    """The reference: the target's next-token distribution after the processors, at every prefix."""

    def next_probs(history: list[int]) -> torch.Tensor:
        logits = model.logits(history).to(torch.float64)[None].clone()
        if len(history) - len(prompt) < min_new:
            logits[0, EOS] = -math.inf
        ids = torch.tensor([history])
        for processor in keywords.get("logits_processor", ()):
            logits = processor(ids, logits)
        return process_logits(logits, sampling)[0]

    return next_probs


def toy(seed: int) -> ToyModel:
    torch.manual_seed(seed)
    return ToyModel(
        torch.rand(16, 3, dtype=torch.float64) + 0.05, torch.rand(16, 3, dtype=torch.float64) + 0.05, window=2
    )


@pytest.mark.parametrize("setup_name", SETUPS)
@pytest.mark.parametrize("case", CASES)
def test_one_sequence_follows_the_processed_target(case, setup_name):
    keywords, min_new = CASES[case]
    model, prompt, sampling = toy(1), [1, 2, 1], SamplingParams(1.0)
    setup = Setup(model, **SETUPS[setup_name])
    words = {**keywords, "min_new_tokens": min_new}
    actual = engine_distribution(setup, prompt, 4, sampling, (EOS,), keywords=words)
    expected = autoregressive_distribution(
        processed(model, prompt, keywords, min_new, sampling), prompt, 4, (EOS,)
    )
    assert_distributions_equal(actual, expected, what=f"{case} with {setup_name}")


@pytest.mark.parametrize("setup_name", SETUPS)
def test_a_batch_follows_the_processed_target(setup_name):
    keywords, min_new = CASES["all"]
    model, prompts, sampling = toy(2), [[1, 2, 1], [2]], SamplingParams(0.9, top_k=2)
    setup = Setup(model, **SETUPS[setup_name])
    words = {**keywords, "min_new_tokens": min_new}
    actual = engine_batch_distribution(setup, prompts, 3, sampling, (EOS,), keywords=words)
    rows = [
        autoregressive_distribution(processed(model, p, keywords, min_new, sampling), p, 3, (EOS,))
        for p in prompts
    ]
    assert_distributions_equal(actual, independent_rows(rows), what=f"a batch with {setup_name}")


def test_a_processor_that_sees_the_wrong_prefix_is_caught(monkeypatch):
    """If the positions of a round were processed with the committed prefix alone (not the drafts
    before them), p and q would not be the target's there: the oracle must notice."""
    from eesd_core.round import Generation

    shape = Generation._shape

    def stale(self, logits, at):
        return shape(self, logits, [(row, 0) for row, _ in at])

    monkeypatch.setattr(Generation, "_shape", stale)
    keywords, min_new = CASES["grammar"]
    model, prompt, sampling = toy(1), [2], SamplingParams(1.0)
    setup = Setup(model, drafter="early_exit", controller="fixed", controller_options={"k": 2})
    actual = engine_distribution(setup, prompt, 4, sampling, keywords=keywords)
    expected = autoregressive_distribution(processed(model, prompt, keywords, 0, sampling), prompt, 4)
    with pytest.raises(AssertionError, match="not lossless"):
        assert_distributions_equal(actual, expected)


def test_greedy_with_processors_is_the_processed_argmax():
    model, prompt = toy(3), [1, 2]
    keywords = {"logits_processor": [RepetitionPenaltyLogitsProcessor(2.0), NoTwoAfterOne()]}
    history = list(prompt)
    reference = processed(model, prompt, keywords, 0, SamplingParams(1.0))
    for _ in range(6):
        history.append(int(reference(history).argmax()))
    for name, options in SETUPS.items():
        setup = Setup(model, **options)
        actual = engine_distribution(setup, prompt, 6, SamplingParams(0.0), keywords=keywords)
        assert actual == {tuple(history[len(prompt) :]): 1.0}, name
    assert tuple(history[len(prompt) :]) != greedy_tokens(model, prompt, 6)  # the processors matter here


class NothingAfterOneTwo:
    """Allows no token at all after 1, 2 (which :class:`NoTwoAfterOne` never lets happen)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.full_like(scores, -math.inf) if input_ids[0, -2:].tolist() == [1, 2] else scores


def test_a_prefix_only_a_rejected_draft_reaches_is_no_error():
    """Prompt lookup proposes 2 after 1 (the prompt has 1, 2), which the grammar rules out; the
    position after that draft allows no token, but verification never reaches it."""
    model, prompt, sampling = toy(4), [1, 2, 0, 1], SamplingParams(1.0)
    keywords = {"logits_processor": [NoTwoAfterOne(), NothingAfterOneTwo()]}
    setup = Setup(model, **SETUPS["prompt-lookup"])
    actual = engine_distribution(setup, prompt, 3, sampling, keywords=keywords)
    expected = autoregressive_distribution(processed(model, prompt, keywords, 0, sampling), prompt, 3)
    assert_distributions_equal(actual, expected, what="drafts past a ruled-out token")


@pytest.mark.parametrize("setup_name", [None, *SETUPS])
def test_a_prefix_that_allows_no_token_is_an_error_once_reached(setup_name):
    from eesd_core.engine import SpeculativeDecoder
    from eesd_core.errors import NumericalError
    from eesd_core.testing.kit import installed

    model = toy(5)
    options = SETUPS[setup_name] if setup_name else {"drafter": None}
    setup = Setup(model, **options)
    with installed(setup.subjects()), pytest.raises(NumericalError, match="allow no token after"):
        decoder = setup.build()
        assert isinstance(decoder, SpeculativeDecoder)
        decoder.generate(
            [0, 1],
            max_new_tokens=3,
            temperature=1.0,
            seed=0,
            logits_processor=[NothingAfterOneTwo()],
            bad_words_ids=[[0]],
            suppress_tokens=[1],
        )
