"""At temperature 0 eesd returns exactly transformers' greedy tokens, whatever k and drafter."""

from __future__ import annotations

import pytest
import torch
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder


def _prompt(length: int, seed: int, vocab: int = 97) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_transformers(family: str, seed: int) -> None:
    model = make_tiny(family, seed)
    ids = _prompt(1 + 7 * seed, seed)
    expected = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    for k in (0, 2, 8):
        dec = SpeculativeDecoder(
            model,
            drafter="early_exit",
            drafter_options={"exit_layer": 1 + seed % 3},
            controller="fixed",
            controller_options={"k": k},
        )
        out = dec.generate(ids, max_new_tokens=30, eos_token_id=[])
        assert torch.equal(out.sequences, expected), (family, seed, k)
        assert out.stats.new_tokens == 30


def test_plain_mode_matches_transformers() -> None:
    model = make_tiny("llama", 5)
    ids = _prompt(6, 5)
    expected = model.generate(ids, max_new_tokens=25, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = SpeculativeDecoder(model, drafter=None, controller="fixed").generate(
        ids, max_new_tokens=25, eos_token_id=[]
    )
    assert torch.equal(out.sequences, expected)
    assert out.stats.rounds == 25 and out.stats.drafted == 0


def _eos_case() -> tuple[torch.nn.Module, torch.Tensor, int, torch.Tensor]:
    """A model, prompt and EOS id such that greedy decoding emits the EOS after a few tokens."""
    for seed in range(50):
        model = make_tiny("llama", seed, vocab=23)
        ids = _prompt(4, seed, vocab=23)
        free = model.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        new = free[0, ids.shape[1] :].tolist()
        for position in range(3, 12):
            if new[position] not in new[:position]:
                return model, ids, new[position], free[:, : ids.shape[1] + position + 1]
    raise AssertionError("no seed gives an EOS mid-generation")


def test_eos_mid_round_stops_like_transformers() -> None:
    model, ids, eos, expected = _eos_case()
    reference = model.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(reference, expected)
    for k in (2, 5, 8):
        dec = SpeculativeDecoder(
            model,
            drafter="early_exit",
            drafter_options={"exit_layer": 3},
            controller="fixed",
            controller_options={"k": k},
        )
        out = dec.generate(ids, max_new_tokens=20, eos_token_id=eos)
        assert torch.equal(out.sequences, expected), k
        assert out.stats.stopped_by == "eos"


def test_model_eos_is_the_default() -> None:
    model, ids, eos, expected = _eos_case()
    model.generation_config.eos_token_id = eos
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 4},
    )
    assert torch.equal(dec.generate(ids, max_new_tokens=20).sequences, expected)


def test_stream_yields_what_generate_returns() -> None:
    model = make_tiny("qwen2", 3)
    ids = _prompt(5, 3)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 3},
    )
    chunks = list(dec.stream(ids, max_new_tokens=17, eos_token_id=[]))
    assert all(chunks) and sum(len(c) for c in chunks) == 17
    full = dec.generate(ids, max_new_tokens=17, eos_token_id=[]).sequences[0, 5:].tolist()
    assert [t for c in chunks for t in c] == full


def test_sliding_window_layers_are_masked_like_transformers() -> None:
    model = make_tiny("mistral", 4, sliding_window=6)
    ids = _prompt(9, 4)
    expected = model.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 4},
    )
    assert torch.equal(dec.generate(ids, max_new_tokens=20, eos_token_id=[]).sequences, expected)
