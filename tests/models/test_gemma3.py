"""Gemma 3 (a second model family): sliding and global layers, two rotary embeddings, scaled
embeddings, (1 + w) norms and soft-capped logits, checked against transformers' own model."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import load_head, save_head
from eesd_gemma3.adapter import Gemma3Adapter
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import UnsupportedModelError
from eesd_core.models import find_adapter
from eesd_core.protocols import SamplingParams
from eesd_core.testing.hf import first_tokens_distribution
from eesd_core.testing.kit import Setup
from eesd_core.testing.oracles import assert_distributions_equal, engine_distribution

# the real models tie the LM head to the embeddings; soft-capping as in Gemma 2
REAL_LIKE = {"tie_word_embeddings": True, "final_logit_softcapping": 3.0}


def _prompt(length: int, seed: int, vocab: int = 97) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def test_the_adapter_is_registered_and_found() -> None:
    assert "gemma3" in {ep.name for ep in metadata.entry_points(group="eesd")}
    adapter = find_adapter(make_tiny("gemma3", 0))
    assert isinstance(adapter, Gemma3Adapter) and adapter.model_type == "gemma3_text"
    assert adapter.num_layers == 4 and adapter.vocab_size == 97 and adapter.hidden_size == 32


def test_bidirectional_models_are_refused() -> None:
    model = make_tiny("gemma3", 0, use_bidirectional_attention=True)
    with pytest.raises(UnsupportedModelError, match="bidirectional"):
        find_adapter(model)


@pytest.mark.parametrize("overrides", [{}, REAL_LIKE], ids=["untied", "tied-softcapped"])
def test_a_pass_equals_the_models_forward(overrides: dict) -> None:
    model = make_tiny("gemma3", 1, **overrides)
    adapter = find_adapter(model)
    ids = _prompt(11, 1)
    x = adapter.embed(ids[0])
    rotary = adapter.rotary(x, 0)
    assert set(rotary) == {"sliding_attention", "full_attention"}
    assert not torch.equal(rotary["sliding_attention"][0], rotary["full_attention"][0])
    with torch.no_grad():
        cache = adapter.new_cache()
        low = adapter.run(x[:, :6], 0, 2, cache, 0, None, adapter.rotary(x[:, :6], 0))
        first = adapter.logits(adapter.norm(adapter.run(low, 2, 4, cache, 0)))[0]
        rest = adapter.logits(adapter.norm(adapter.run(x[:, 6:], 0, 4, cache, 6)))[0]
        expected = model(ids).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), expected, rtol=0, atol=1e-12)
    if overrides:
        assert float(expected.abs().max()) < 3.0


@pytest.mark.parametrize("overrides", [{}, REAL_LIKE], ids=["untied", "tied-softcapped"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_transformers(seed: int, overrides: dict) -> None:
    model = make_tiny("gemma3", seed, **overrides)
    ids = _prompt(2 + 6 * seed, seed)  # 2, 8 and 14 tokens: shorter and longer than the window of 4
    expected = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    plain = SpeculativeDecoder(model, drafter=None, controller="fixed")
    assert torch.equal(plain.generate(ids, max_new_tokens=30, eos_token_id=[]).sequences, expected)
    for exit_layer in (1, 2, 3):
        for k in (1, 3, 8):
            dec = SpeculativeDecoder(
                model,
                drafter="early_exit",
                drafter_options={"exit_layer": exit_layer, "head": None},
                controller="fixed",
                controller_options={"k": k},
            )
            out = dec.generate(ids, max_new_tokens=30, eos_token_id=[])
            assert torch.equal(out.sequences, expected), (seed, exit_layer, k)
            assert out.stats.drafted > 0


@pytest.mark.slow
def test_sampled_generations_follow_the_target_exactly() -> None:
    """Every random choice enumerated: the engine's distribution of three tokens equals plain
    sampling from the model, with a window of 2 that the prompt already fills."""
    model = make_tiny("gemma3", 5, vocab=8, layers=2, sliding_window=2, **REAL_LIKE)
    prompt = [3, 1, 4]
    setup = Setup(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 1, "head": None},
        controller="fixed",
        max_draft_tokens=2,
    )
    sampling = SamplingParams(1.0, top_k=3)
    actual = engine_distribution(setup, prompt, 4, sampling)
    assert_distributions_equal(actual, first_tokens_distribution(model, prompt, 4, sampling))


def _truncated(adapter, tokens: torch.Tensor, layers: int) -> torch.Tensor:  # noqa: ANN001
    """Logits of the target cut after ``layers`` layers, its own norm and head on top. # [T, V]"""
    cache = adapter.new_cache()
    return adapter.logits(adapter.norm(adapter.run(adapter.embed(tokens), 0, layers, cache, 0)))[0]


@pytest.mark.parametrize("source", [2, 3], ids=["sliding", "global"])
def test_an_exit_head_copied_from_a_layer_runs_as_that_layer(source: int) -> None:
    """A head at exit layer N whose layer is a copy of layer N is the target cut after N + 1
    layers: the copy keeps its window and rotary embedding, in one pass and token by token."""
    adapter = find_adapter(make_tiny("gemma3", 3, **REAL_LIKE))
    head = ExitHead(adapter, source, init_layer=source)
    tokens = _prompt(9, 3)[0]
    expected = _truncated(adapter, tokens, source + 1)
    with torch.no_grad():
        lower = adapter.run(adapter.embed(tokens), 0, source, adapter.new_cache(), 0)
        whole = head.logits(head.hidden(lower, 0, head.new_cache(), None))[0]
        cache = head.new_cache()
        steps = [head.logits(head.hidden(lower[:, t : t + 1], t, cache, None))[0] for t in range(len(tokens))]
    torch.testing.assert_close(whole, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(steps), expected, rtol=0, atol=1e-12)


def test_a_head_file_keeps_its_layers_kind_and_decodes_losslessly(tmp_path) -> None:  # noqa: ANN001
    model = make_tiny("gemma3", 4)
    adapter = find_adapter(model)
    head = ExitHead(adapter, 2, init_layer=2)  # a copy of a sliding layer
    head.init_layer = 2
    with torch.no_grad():
        for p in head.layers.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = save_head(head, adapter, tmp_path / "gemma-n2.safetensors", dtype=torch.float64)
    loaded = load_head(path, adapter)
    h = torch.randn(1, 7, adapter.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.logits(loaded.hidden(h, 0, loaded.new_cache(), None)),
            head.logits(head.hidden(h, 0, head.new_cache(), None)),
            rtol=0,
            atol=1e-12,
        )
    ids = _prompt(8, 4)
    expected = model.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"head": str(path)},
        controller="fixed",
        controller_options={"k": 3},
    )
    assert torch.equal(dec.generate(ids, max_new_tokens=20, eos_token_id=[]).sequences, expected)
