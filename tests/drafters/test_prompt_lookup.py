"""The prompt-lookup drafter: n-gram matching, controller protocol, and losslessness."""

from __future__ import annotations

import pytest
import torch
from eesd_prompt_lookup import PromptLookupDrafter, PromptLookupOptions, find_continuation

from eesd_core import SpeculativeDecoder
from eesd_core.errors import EESDError
from eesd_core.protocols import Costs, DraftContext, DraftStep, SamplingParams
from eesd_core.testing import DrafterContract, registered


def _find(tokens: list[int], max_ngram: int = 3, min_ngram: int = 1, limit: int = 8) -> list[int]:
    return find_continuation(torch.tensor(tokens), max_ngram, min_ngram, limit)


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([5, 6, 7, 8, 9, 5, 6, 7], [8, 9, 5, 6, 7]),  # longest suffix 5 6 7
        ([1, 2, 9, 4, 2, 3, 2], [3, 2]),  # only the unigram 2 recurs; most recent earlier is at 4
        ([4, 5, 1, 4, 5, 2, 3, 5], [2, 3, 5]),  # 5 recurs at 1 and 4: the most recent wins
        ([1, 2, 3, 4], []),  # nothing recurs
        ([7], []),
        ([3, 3, 3, 3], [3]),  # 3 3 3 recurs overlapping the suffix
    ],
)
def test_longest_most_recent_match(history: list[int], expected: list[int]) -> None:
    assert _find(history) == expected


def test_longer_ngram_wins_over_a_more_recent_shorter_one() -> None:
    history = [1, 2, 3, 50, 51, 9, 3, 60, 1, 2, 3]
    assert _find(history, max_ngram=3) == [50, 51, 9, 3, 60, 1, 2, 3]
    assert _find(history, max_ngram=1) == [60, 1, 2, 3]


def test_min_ngram_and_limit() -> None:
    history = [1, 2, 9, 4, 2, 3, 2]
    assert _find(history, min_ngram=2) == []
    assert _find([5, 6, 7, 8, 9, 5, 6, 7], limit=2) == [8, 9]
    assert _find([5, 6, 7, 8, 9, 5, 6, 7], limit=0) == []


def test_options_are_checked(tiny) -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupOptions(max_ngram=1, min_ngram=2)
    with pytest.raises(EESDError):
        SpeculativeDecoder(tiny(), drafter="prompt_lookup", drafter_options={"ngram": 2})


class _Script:
    """A controller that answers from a list and records the steps it was shown."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = list(answers)
        self.steps: list[DraftStep] = []

    def __call__(self, step: DraftStep) -> bool:
        self.steps.append(step)
        return self.answers.pop(0) if self.answers else True


def _propose(history: list[int], answers: list[bool], max_tokens: int = 8) -> tuple[list[int], _Script]:
    script = _Script(answers)
    ctx = DraftContext(
        len(history) - 1, max_tokens, SamplingParams(), None, script, Costs(), None, torch.tensor(history)
    )
    proposal = PromptLookupDrafter().propose(history[-1], ctx)
    assert proposal.q is None and proposal.hidden is None and proposal.layers_done == 0
    assert proposal.top1 == (1.0,) * proposal.k and proposal.entropies == (0.0,) * proposal.k
    return proposal.tokens.tolist(), script


def test_asks_before_the_first_draft_and_after_each() -> None:
    history = [5, 6, 7, 8, 9, 5, 6, 7]
    tokens, script = _propose(history, [True, True, False])
    assert tokens == [8, 9]
    assert [s.index for s in script.steps] == [0, 1, 2]
    assert script.steps[1].token == 8 and script.steps[1].prob == 1.0 and script.steps[1].entropy == 0.0


def test_a_plain_step_when_the_controller_declines() -> None:
    tokens, script = _propose([5, 6, 7, 8, 9, 5, 6, 7], [False])
    assert tokens == [] and len(script.steps) == 1


def test_stops_at_max_tokens_and_when_the_continuation_ends() -> None:
    tokens, _ = _propose([5, 6, 7, 8, 9, 5, 6, 7], [], max_tokens=3)
    assert tokens == [8, 9, 5]
    tokens, script = _propose([1, 2, 9, 4, 2, 3, 2], [])
    assert tokens == [3, 2] and len(script.steps) == 2
    tokens, _ = _propose([1, 2, 3, 4], [])
    assert tokens == []


def _repetitive_prompt(vocab: int, seed: int) -> torch.Tensor:
    phrase = torch.randint(3, vocab, (6,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([phrase, phrase[:4], phrase, phrase[:3]]).view(1, -1)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("controller", [("fixed", {"k": 4}), ("thompson", {}), ("fixed", {"k": 0})])
def test_greedy_matches_transformers(tiny, family: str, controller: tuple[str, dict]) -> None:
    model = tiny(family, seed=3, vocab=23)
    ids = _repetitive_prompt(23, 3)
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    dec = SpeculativeDecoder(
        model, drafter="prompt_lookup", controller=controller[0], controller_options=controller[1]
    )
    out = dec.generate(ids, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    if controller[1].get("k"):
        assert out.stats.drafted > 0 and out.stats.accepted > 0


def test_drafts_respect_the_engine_cap(tiny) -> None:
    model = tiny("llama", seed=1, vocab=23)
    dec = SpeculativeDecoder(
        model, drafter="prompt_lookup", controller="fixed", controller_options={"k": 8}, max_draft_tokens=2
    )
    dec.generate(_repetitive_prompt(23, 1), max_new_tokens=30, eos_token_id=[])
    assert len(dec.last_stats.drafted_by_position) <= 2


class TestPromptLookupContract(DrafterContract):
    covers = ("prompt_lookup",)

    @pytest.fixture(params=[{}, {"max_ngram": 1}, {"max_ngram": 4, "min_ngram": 2}])
    def make_drafter(self, request):
        return registered("drafter", "prompt_lookup", request.param)
