"""transformers' generate() keywords: the same greedy tokens as transformers under the same
keywords, on every family, for every kind of decoder, one sequence and batches; clear refusals;
log-probabilities as plain decoding reports them; streamers; GenerationConfig."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinymodels import FAMILIES, GREEDY_SETUPS, make_tiny
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import LogitsProcessor
from transformers.generation.streamers import BaseStreamer

from eesd_core.engine import SpeculativeDecoder
from eesd_core.errors import EESDError, InputError

PROMPTS = [[1, 5, 7, 9, 5, 7, 9, 11, 5], [1, 30, 31], [1, 40, 41, 42, 43, 40, 41]]
KEYWORDS = dict(
    repetition_penalty=1.3,
    no_repeat_ngram_size=2,
    min_new_tokens=10,
    bad_words_ids=[[3], [4, 6]],
    suppress_tokens=[8],
)


class EvenAfterOdd(LogitsProcessor):
    """A user's processor that reads the prefix: after an odd token only even ones may follow."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        odd = (input_ids[:, -1] % 2 == 1)[:, None]
        banned = (torch.arange(scores.shape[-1], device=scores.device) % 2 == 1)[None]
        return scores.masked_fill(odd & banned, -math.inf)


def reference(model, prompt, n, **keywords):  # noqa: ANN001
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, **keywords)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):  # noqa: ANN001
    return make_tiny(request.param, vocab=97)


@pytest.mark.parametrize("setup", GREEDY_SETUPS)
def test_greedy_tokens_equal_transformers_under_keywords(model, setup):
    user = LogitsProcessorList([EvenAfterOdd()])
    expected = [reference(model, p, 16, logits_processor=user, **KEYWORDS) for p in PROMPTS]
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS[setup])
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        out = dec.generate(prompt, max_new_tokens=16, logits_processor=user, **KEYWORDS)
        assert out.sequences[0, len(prompt) :].tolist() == tokens
    batch = dec.generate(PROMPTS, max_new_tokens=16, logits_processor=user, **KEYWORDS)
    assert [row[len(p) :].tolist() for row, p in zip(batch.sequences, PROMPTS, strict=True)] == expected


def test_a_padded_tensor_batch_equals_each_row_alone():
    model = make_tiny("llama", vocab=97)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS["early-exit-k3"])
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[], **KEYWORDS)
    expected = [reference(model, p, 12, eos_token_id=None, **KEYWORDS) for p in PROMPTS]
    assert out.sequences[:, width:].tolist() == expected


def test_generation_config_is_read_as_transformers_reads_it():
    model = make_tiny("qwen2", vocab=97)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=14, repetition_penalty=1.5, no_repeat_ngram_size=3
    )
    expected = model.generate(torch.tensor([PROMPTS[0]]), generation_config=config, pad_token_id=0)
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS["early-exit-k3"])
    out = dec.generate(PROMPTS[0], generation_config=config)
    assert out.sequences.tolist() == expected.tolist()
    shorter = dec.generate(PROMPTS[0], generation_config=config, max_new_tokens=5)  # keywords win
    assert shorter.sequences.shape[1] == len(PROMPTS[0]) + 5


def test_do_sample_as_transformers_reads_it():
    from eesd_hf.keywords import translate

    dec = SpeculativeDecoder(make_tiny("llama", vocab=97), drafter=None)
    words = {"do_sample": True}
    translate(dec, words)
    assert words == {"temperature": 1.0, "top_k": 50}
    words = {"do_sample": False, "temperature": 0.7, "top_p": 0.5}
    translate(dec, words)
    assert words == {"temperature": 0.0}
    with pytest.raises(InputError, match="temperature above 0"):
        translate(dec, {"do_sample": True, "temperature": 0})


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        (dict(num_beams=2), "num_beams=2.*beam search"),
        (dict(output_scores=True), "logprobs=True"),
        (dict(return_dict_in_generate=True), "logprobs=True"),
        (dict(min_p=0.1), "min_p"),
        (dict(assistant_model=object()), "drafts itself"),
        (dict(max_length=30, max_new_tokens=None), "max_new_tokens instead"),
        (dict(begin_suppress_tokens=[3]), "prompt's length"),
        (dict(num_return_sequences=2), "repeat the prompt"),
        (dict(repetition_penaltyy=1.2), "unknown option 'repetition_penaltyy'.*repetition_penalty"),
        (dict(generation_config={"do_sample": False}), "transformers GenerationConfig"),
        (dict(stop_strings=["\n"]), "needs the tokenizer"),
        (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(keywords, match):
    dec = SpeculativeDecoder(make_tiny("llama", vocab=97), drafter=None)
    with pytest.raises(InputError, match=match):
        dec.generate([1, 2, 3], **{"max_new_tokens": 4, **keywords})


def test_neutral_values_and_computation_settings_are_taken():
    model = make_tiny("llama", vocab=97)
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS["early-exit-k3"])
    plain = dec.generate(PROMPTS[0], max_new_tokens=8).sequences
    same = dec.generate(
        PROMPTS[0], max_new_tokens=8, num_beams=1, output_scores=False, use_cache=True, max_length=None
    )
    assert same.sequences.tolist() == plain.tolist()


def test_a_stateful_processor_is_refused():
    from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

    model = make_tiny("llama", vocab=97)
    processor = UnbatchedClassifierFreeGuidanceLogitsProcessor(2.0, model)
    dec = SpeculativeDecoder(model, drafter=None)
    with pytest.raises(InputError, match="keeps state"):
        dec.generate([1, 2], max_new_tokens=3, logits_processor=[processor])


def test_logprobs_are_those_plain_decoding_reports():
    """Each token's log p, and the top alternatives, equal plain decoding's and transformers'
    processed scores (greedy: log-softmax of the processed logits)."""
    model = make_tiny("mistral", vocab=97)
    ids = torch.tensor([PROMPTS[2]])
    out = model.generate(
        ids, max_new_tokens=12, do_sample=False, pad_token_id=0, output_scores=True,
        return_dict_in_generate=True, **KEYWORDS,
    )  # fmt: skip
    tokens = out.sequences[0, ids.shape[1] :].tolist()
    expected = [
        torch.log_softmax(s[0].double(), -1)[t].item() for s, t in zip(out.scores, tokens, strict=True)
    ]
    plain = SpeculativeDecoder(model, drafter=None).generate(
        PROMPTS[2], max_new_tokens=12, logprobs=True, **KEYWORDS
    )
    for setup in GREEDY_SETUPS.values():
        res = SpeculativeDecoder(model, **setup).generate(
            PROMPTS[2], max_new_tokens=12, top_logprobs=3, **KEYWORDS
        )
        assert res.sequences[0, ids.shape[1] :].tolist() == tokens
        assert res.logprobs == pytest.approx(plain.logprobs, abs=1e-9)
        assert res.logprobs == pytest.approx(expected, abs=1e-5)
        for logprob, top, token in zip(res.logprobs, res.top_logprobs, tokens, strict=True):
            assert len(top) == 3 and top[0] == (token, pytest.approx(logprob))
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_sampled_logprobs_are_under_the_processed_distribution():
    """At temperature 0.7 with top-k 5, log p of each drawn token is finite, and exp of the top
    five sums to one (the rest of the vocabulary has no mass)."""
    model = make_tiny("llama", vocab=97)
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS["early-exit-k3"])
    res = dec.generate(PROMPTS[1], max_new_tokens=10, temperature=0.7, top_k=5, seed=3, top_logprobs=5)
    assert all(math.isfinite(v) for v in res.logprobs)
    for top in res.top_logprobs:
        assert sum(math.exp(v) for _, v in top) == pytest.approx(1.0, abs=1e-5)
    batch = dec.generate(
        [PROMPTS[1], PROMPTS[0]], max_new_tokens=10, temperature=0.7, top_k=5, seed=3, logprobs=True
    )
    assert batch.logprobs[0] == pytest.approx(res.logprobs, abs=1e-6)  # row 0 draws from seed + 0
    assert batch.top_logprobs is None and len(batch.logprobs[1]) == batch.stats.rows[1].new_tokens


class Recording(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended = True


def test_a_streamer_gets_the_prompt_then_each_rounds_tokens():
    model = make_tiny("llama", vocab=97)
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS["early-exit-k3"])
    streamer = Recording()
    out = dec.generate(PROMPTS[0], max_new_tokens=12, streamer=streamer)
    assert streamer.ended and streamer.puts[0] == PROMPTS[0]
    assert sum(streamer.puts, []) == out.sequences[0].tolist()
    assert len(streamer.puts) - 1 == out.stats.rounds
    with pytest.raises(InputError, match="one sequence"):
        dec.generate(PROMPTS, max_new_tokens=4, streamer=Recording())


def test_stopping_criteria_end_generation_where_they_hold():
    class AfterSeven:
        def __call__(self, input_ids: torch.Tensor, scores: object) -> torch.Tensor:
            return torch.tensor([len(input_ids[0]) >= 7 and int(input_ids[0, -1]) % 3 == 0])

    model = make_tiny("llama", vocab=97)
    full = reference(model, PROMPTS[1], 20, eos_token_id=None)
    cut = next(i for i, t in enumerate(full) if len(PROMPTS[1]) + i + 1 >= 7 and t % 3 == 0)
    for setup in GREEDY_SETUPS.values():
        out = SpeculativeDecoder(model, **setup).generate(
            PROMPTS[1], max_new_tokens=20, eos_token_id=[], stopping_criteria=[AfterSeven()]
        )
        assert out.sequences[0, len(PROMPTS[1]) :].tolist() == full[: cut + 1]
        assert out.stats.stopped_by == "stop"


KEYWORD_SETS = st.fixed_dictionaries(
    {},
    optional={
        "repetition_penalty": st.sampled_from([0.8, 1.0, 1.2, 2.0]),
        "no_repeat_ngram_size": st.integers(0, 3),
        "min_new_tokens": st.integers(0, 8),
        "min_length": st.integers(0, 12),
        "bad_words_ids": st.lists(
            st.lists(st.integers(3, 96), min_size=1, max_size=2), min_size=1, max_size=3
        ),
        "suppress_tokens": st.lists(st.integers(3, 96), max_size=4),
        "sequence_bias": st.dictionaries(
            st.tuples(st.integers(3, 96)), st.floats(-5, 5, allow_nan=False), min_size=1, max_size=3
        ),
        "num_beams": st.sampled_from([1, 2]),
        "typical_p": st.sampled_from([1.0, 0.9]),
        "output_scores": st.booleans(),
        "max_length": st.sampled_from([None, 40]),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keywords=KEYWORD_SETS,
    family=st.sampled_from(sorted(FAMILIES)),
    setup=st.sampled_from(sorted(GREEDY_SETUPS)),
)
def test_drawn_keyword_sets_give_transformers_tokens_or_a_clear_refusal(keywords, family, setup):
    model = make_tiny(family, vocab=97)
    prompt = PROMPTS[0]
    dec = SpeculativeDecoder(model, **GREEDY_SETUPS[setup])
    try:
        out = dec.generate(prompt, max_new_tokens=10, **keywords)
    except EESDError as exc:
        refusable = {"num_beams": 1, "typical_p": 1.0, "output_scores": False, "max_length": None}
        assert any(keywords.get(k, v) != v for k, v in refusable.items()), exc
        return
    expected = reference(model, prompt, 10, **keywords)
    assert out.sequences[0, len(prompt) :].tolist() == expected
