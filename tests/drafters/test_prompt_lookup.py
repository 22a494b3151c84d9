"""The prompt-lookup drafter: n-gram matching, controller protocol, and losslessness."""

from __future__ import annotations

import pytest
import torch
from eesd_prompt_lookup import PromptLookupOptions, find_continuation

from eesd_core import SpeculativeDecoder
from eesd_core.errors import EESDError
from eesd_core.protocols import Confidence, DraftStep
from eesd_core.testing import DrafterContract, Setup, ToyModel, installed, registered


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
    """A controller that answers from a list (then yes) and records the steps of each round."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = list(answers)
        self.rounds: list[list[DraftStep]] = []

    def start(self, request: object) -> None:
        return None

    def begin_round(self, state: None, round: object) -> None:
        self.rounds.append([])

    def should_continue(self, state: None, step: DraftStep) -> bool:
        self.rounds[-1].append(step)
        return self.answers.pop(0) if self.answers else True

    def update(self, state: None, outcomes: object) -> None:
        pass


class _Recorder:
    """The lossless verifier, recording the drafts and q of every round."""

    def __init__(self) -> None:
        self.inner = registered("verifier", "lossless")()
        self.seen: list[tuple[list[int], object]] = []

    def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN201
        self.seen.extend((d.tolist(), q) for d, q in zip(drafts, qs, strict=True))
        return self.inner.verify(drafts, qs, p, rngs)


def _first_round(history: list[int], answers: list[bool], cap: int = 8) -> tuple[list[int], list[DraftStep]]:
    """The drafts of the engine's first round after ``history`` and the steps the controller saw.

    The prompt is ``history`` but its last token, which the target (greedy, always that token)
    then commits in the prefill, so the first round looks up ``history``."""
    script, recorder = _Script(answers), _Recorder()
    model = ToyModel((torch.eye(12)[history[-1]] + 0.5)[None], window=0)
    setup = Setup(
        model,
        drafter="prompt_lookup",
        controller=lambda: script,
        verifier=lambda: recorder,
        max_draft_tokens=cap,
    )
    with installed(setup.subjects()) as kit:
        out = setup.build().generate(history[:-1], max_new_tokens=cap + 2, eos_token_id=[])
    assert out.sequences[0, : len(history)].tolist() == history
    steps = script.rounds[0]
    first = kit.rounds[0]
    assert recorder.seen[0] == ([], None)  # the prefill's draw
    drafts, q = recorder.seen[1]
    assert q is None and [s.token for s in steps[1:]] == drafts[: len(steps) - 1]
    assert first.drafted == len(drafts) and first.confidences == (Confidence(1.0, 1.0, 0.0),) * len(drafts)
    return drafts, steps


def test_asks_before_the_first_draft_and_after_each() -> None:
    drafts, steps = _first_round([5, 6, 7, 8, 9, 5, 6, 7], [True, True, False])
    assert drafts == [8, 9]
    assert [s.index for s in steps] == [0, 1, 2]
    assert steps[1].token == 8 and steps[1].confidence == Confidence(1.0, 1.0, 0.0)


def test_a_plain_step_when_the_controller_declines() -> None:
    drafts, steps = _first_round([5, 6, 7, 8, 9, 5, 6, 7], [False])
    assert drafts == [] and len(steps) == 1


def test_stops_at_the_cap_and_looks_again_when_a_continuation_ends() -> None:
    drafts, _ = _first_round([5, 6, 7, 8, 9, 5, 6, 7], [], cap=3)
    assert drafts == [8, 9, 5]
    # 2 3 2 recurs; once its continuation 3 2 is drafted, the suffix 2 3 2 is found again
    drafts, _ = _first_round([1, 2, 9, 4, 2, 3, 2], [], cap=6)
    assert drafts == [3, 2, 3, 2, 3, 2]
    drafts, steps = _first_round([1, 2, 3, 4], [])
    assert drafts == [] and len(steps) == 1


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
    out = dec.generate(_repetitive_prompt(23, 1), max_new_tokens=30, eos_token_id=[])
    assert 0 < len(out.stats.drafted_by_position) <= 2


class TestPromptLookupContract(DrafterContract):
    covers = ("prompt_lookup",)

    @pytest.fixture(params=[{}, {"max_ngram": 1}, {"max_ngram": 4, "min_ngram": 2}])
    def make_drafter(self, request):
        return registered("drafter", "prompt_lookup", request.param)
