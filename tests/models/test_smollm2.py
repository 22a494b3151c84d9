"""On the real SmolLM2-135M-Instruct, EESD's greedy output equals transformers' token for token."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("real_checkpoint")]

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France, and why is it famous?",
    "Translate to German: The weather is nice today.",
]


@pytest.fixture(scope="module")
def smollm2():
    from eesd_models.fetch import fetch_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eesd_core.errors import ModelFetchError

    try:
        path = fetch_model(progress=False)
    except ModelFetchError as exc:
        pytest.skip(f"SmolLM2 could not be fetched here: {exc}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def assert_greedy_equal(model, tok, dec) -> list:  # noqa: ANN001
    """Decode every prompt with ``dec`` and with transformers' greedy ``generate()``; return eesd's."""
    results = []
    for prompt in PROMPTS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        expected = model.generate(ids, max_new_tokens=40, do_sample=False)
        out = dec.generate(ids, max_new_tokens=40)
        assert out.sequences.tolist() == expected.tolist(), prompt
        results.append(out)
    return results


@pytest.mark.parametrize(
    "options",
    [
        dict(drafter="early_exit", drafter_options={}, controller="thompson"),
        pytest.param(
            dict(
                drafter="early_exit",
                drafter_options={"exit_layer": 6, "head": None},
                controller="fixed",
                controller_options={"k": 3},
            ),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["default", "untrained-fixed3"],
)
def test_greedy_equals_transformers(smollm2, options: dict) -> None:
    from eesd_core import SpeculativeDecoder

    model, tok = smollm2
    dec = SpeculativeDecoder(model, tokenizer=tok, **options)
    assert_greedy_equal(model, tok, dec)


def test_the_shipped_head_is_found_accepted_and_lossless(smollm2) -> None:
    """The head committed in the repository loads for the fetched model by default, its drafts are
    accepted more often than never, and greedy output is still exactly transformers'."""
    from eesd_core import SpeculativeDecoder

    model, tok = smollm2
    dec = SpeculativeDecoder(
        model, tokenizer=tok, drafter="early_exit", controller="fixed", controller_options={"k": 3}
    )
    assert dec.drafter.head_path is not None, "no shipped head matched the fetched SmolLM2 checkpoint"
    accepted = sum(out.stats.accepted for out in assert_greedy_equal(model, tok, dec))
    # the untrained exit at N=6 accepts almost nothing; a distilled head accepts some drafts
    assert accepted >= 10


@pytest.mark.slow
def test_demo_streams_and_compares_with_plain_decoding(smollm2, capsys: pytest.CaptureFixture) -> None:
    """The README's main job, shortened: the shipped head is loaded and the texts are identical."""
    from eesd_core.cli import main

    code = main(
        ["demo", "--prompt", "Name three primary colours.", "--max-new-tokens", "24", "--repeats", "1"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "greedy outputs: identical: every method gave" in out
    assert "target layers [0, 6) + exit head smollm2-135m-instruct-n6-top.safetensors" in out
    assert "reading the target's top state" in out
    assert "plain" in out and "tokens/s" in out and "min-max" in out
    assert "transformers" in out and "x transformers" in out


def test_generate_keywords_equal_transformers(smollm2) -> None:
    """transformers' keywords on the real weights: the same greedy tokens, the same stop at a stop
    string, and log-probabilities equal plain decoding's."""
    from eesd_core import SpeculativeDecoder

    model, tok = smollm2
    keywords = dict(
        repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=12, stop_strings=[".", "\n"]
    )
    dec = SpeculativeDecoder(model, tokenizer=tok)
    plain = SpeculativeDecoder(model, tokenizer=tok, drafter=None)
    stops = []
    for prompt in PROMPTS[:2]:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        expected = model.generate(ids, max_new_tokens=40, do_sample=False, tokenizer=tok, **keywords)
        out = dec.generate(ids, max_new_tokens=40, logprobs=True, **keywords)
        assert out.sequences.tolist() == expected.tolist(), prompt
        reference = plain.generate(ids, max_new_tokens=40, logprobs=True, **keywords)
        assert out.logprobs == pytest.approx(reference.logprobs, abs=2e-3)
        stops.append(out.stats.stopped_by)
        if out.stats.stopped_by == "stop":
            text = tok.decode(out.sequences[0, ids.shape[1] :])
            assert text.endswith((".", "\n")), text
    assert "stop" in stops


def test_eesd_generate_streams_the_reply(smollm2, capsys: pytest.CaptureFixture) -> None:
    """`eesd generate` prints the reply (not the prompt) as it is decoded: transformers' greedy text."""
    from eesd_core.cli import main

    model, tok = smollm2
    prompt = "Name three primary colours."
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"]
    expected = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
    assert main(["generate", prompt, "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == tok.decode(expected, skip_special_tokens=True).strip()
