"""End to end on a real (tiny, random) LlamaForCausalLM: early-exit drafts, sampled generations.

The exact test enumerates every random choice of the engine over an 8-token vocabulary; the
sampling tests draw generations with fresh seeds and compare the first tokens with the exact
distribution from the model's own forward passes, at a false-fail rate of 1e-9 per test.
"""

from __future__ import annotations

import pytest
import torch

from eesd_core.engine import SpeculativeDecoder
from eesd_core.protocols import SamplingParams
from eesd_core.testing.hf import first_tokens_distribution, tiny_llama
from eesd_core.testing.kit import Setup
from eesd_core.testing.oracles import assert_distributions_equal, engine_distribution
from eesd_core.testing.statistical import assert_same_distribution

PROMPT = [3, 1, 4]
FALSE_FAIL_RATE = 1e-9
EARLY_EXIT = {"exit_layer": 1, "head": None}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def first_tokens(decoder, sampling, runs):
    """The first three new tokens of ``runs`` generations with seeds 0, 1, ...: the prefill draws
    the first, the first round (one draft at most) the next two."""
    out = []
    for seed in range(runs):
        result = decoder.generate(
            PROMPT,
            max_new_tokens=3,
            seed=seed,
            eos_token_id=[],
            top_p=sampling.top_p,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
        )
        out.append(tuple(result.sequences[0, len(PROMPT) :].tolist()))
    return out


def assert_follows_the_target(samples, model, sampling):
    """The second token (the first the drafts decide) and the first pair, each at half the test's
    false-fail rate."""
    triples = first_tokens_distribution(model, PROMPT, 3, sampling)
    second: dict[tuple[int, ...], float] = {}
    pairs: dict[tuple[int, ...], float] = {}
    for (a, b, _), prob in triples.items():
        second[(b,)] = second.get((b,), 0.0) + prob
        pairs[(a, b)] = pairs.get((a, b), 0.0) + prob
    assert_same_distribution([s[1:2] for s in samples], second, FALSE_FAIL_RATE / 2, what="second token")
    assert_same_distribution([s[:2] for s in samples], pairs, FALSE_FAIL_RATE / 2, what="first pair")


@pytest.mark.parametrize("products", ["standard", pytest.param("transposed", marks=pytest.mark.slow)])
def test_exact_on_a_tiny_llama(products):
    model = tiny_llama(vocab_size=8)
    setup = Setup(
        model,
        drafter="early_exit",
        drafter_options=EARLY_EXIT,
        controller="fixed",
        max_draft_tokens=2,
        adapter_options={"products": products},
    )
    sampling = SamplingParams(1.0, top_k=3)
    actual = engine_distribution(setup, PROMPT, 4, sampling)
    assert_distributions_equal(actual, first_tokens_distribution(model, PROMPT, 4, sampling))


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("sampling", "controller"),
    [
        pytest.param(SamplingParams(1.0), "fixed", marks=pytest.mark.slow),
        (SamplingParams(0.8, top_k=6, top_p=0.9), "thompson"),
    ],
    ids=["plain", "top-k-top-p"],
)
def test_first_tokens_follow_the_target(sampling, controller):
    model = tiny_llama()
    decoder = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options=EARLY_EXIT, controller=controller, max_draft_tokens=2
    )
    samples = first_tokens(decoder, sampling, runs=1200)
    assert_follows_the_target(samples, model, sampling)


@pytest.mark.slow
@pytest.mark.statistical
def test_the_sampling_test_sees_a_lossy_verifier(monkeypatch):
    """With the residual replaced by p, the second token (the first round's) drifts towards q;
    the test must notice."""
    from eesd_lossless import LosslessVerifier

    def lossy_row(draft_tokens, q, p, rng):
        for i, draft in enumerate(draft_tokens.tolist()):
            if not rng.bernoulli(min(1.0, float(p[i, draft] / q[i, draft]))):
                return i, rng.categorical(p[i])
        return len(draft_tokens), rng.categorical(p[len(draft_tokens)])

    def lossy(self, drafts, qs, p, rngs):
        return [
            lossy_row(d, q, p[b], rng) for b, (d, q, rng) in enumerate(zip(drafts, qs, rngs, strict=True))
        ]

    monkeypatch.setattr(LosslessVerifier, "verify", lossy)
    model = tiny_llama()
    decoder = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options=EARLY_EXIT, controller="fixed", max_draft_tokens=2
    )
    samples = first_tokens(decoder, SamplingParams(1.0), runs=1500)
    with pytest.raises(AssertionError, match="second token"):
        assert_follows_the_target(samples, model, SamplingParams(1.0))
