"""Tests of the conversion's own parts on tiny random models built in memory: the saveable copy,
the fingerprint that outlives the GGUF model, and the check of the saved checkpoint against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eesd_models import convert
from safetensors.torch import load_file, save_file

from eesd_core.errors import ModelFetchError


def _tokenizer():
    """A word-level tokenizer with a chat template, built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "def", "is_prime(n):", "return"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def _tiny(model_type: str = "llama", *, tied: bool = True):
    """A tiny random model; tied embeddings as in SmolLM2, or a separate output matrix as in the
    Qwen2.5-Coder GGUF files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def _save_copy(source, tmp_path: Path, dtype: torch.dtype = torch.float32) -> convert.Fingerprint:  # noqa: ANN001
    tokenizer = _tokenizer()
    source.config.quantization_config = {"quant_method": "gguf"}
    expected = convert.fingerprint(source, tokenizer, dtype)
    copy = convert.plain_copy(source, dtype)
    assert getattr(copy.config, "quantization_config", None) is None
    copy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return expected


def test_plain_copy_saves_a_checkpoint_that_passes_the_check(tmp_path: Path) -> None:
    expected = _save_copy(_tiny(), tmp_path)
    convert.check_checkpoint(expected, tmp_path, torch.float32)

    weights = load_file(tmp_path / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1e-3
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFetchError, match="model.norm.weight differs"):
        convert.check_checkpoint(expected, tmp_path, torch.float32)


def test_a_separate_output_matrix_stays_separate(tmp_path: Path) -> None:
    expected = _save_copy(_tiny(tied=False), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")
    convert.check_checkpoint(expected, tmp_path, torch.float32)

    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(ModelFetchError, match="tie_word_embeddings is True, expected False"):
        convert.check_checkpoint(expected, tmp_path, torch.float32)


def test_a_bfloat16_copy_is_checked_weight_for_weight(tmp_path: Path) -> None:
    expected = _save_copy(_tiny(tied=False), tmp_path, torch.bfloat16)
    assert expected.logits is None
    convert.check_checkpoint(expected, tmp_path, torch.bfloat16)
    with pytest.raises(ModelFetchError, match="weight .* differs"):
        convert.check_checkpoint(expected, tmp_path, torch.float32)


def test_the_fingerprint_notices_the_tokenizer_and_the_logits(tmp_path: Path) -> None:
    expected = _save_copy(_tiny(tied=False), tmp_path)
    other = convert.Fingerprint(
        ids=[0],
        chat_template=None,
        tied=False,
        weights=expected.weights,
        logits=expected.logits + 1,
    )
    assert expected.differences(other) == [
        "the tokenizer encodes differently",
        "the chat template differs",
        "the logits differ from those of the GGUF model",
    ]
    assert expected.differences(expected) == []


def test_a_tokenizer_that_reloads_differently_is_reported(tmp_path: Path) -> None:
    """transformers reloads any tokenizer saved beside a qwen2 config as a Qwen2Tokenizer, which
    encodes the word-level test tokenizer's text to nothing: the check must say so, not crash."""
    expected = _save_copy(_tiny("qwen2", tied=False), tmp_path)
    with pytest.raises(ModelFetchError, match="the tokenizer encodes differently$"):
        convert.check_checkpoint(expected, tmp_path, torch.float32)
