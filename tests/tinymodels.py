"""Tiny random models of each supported family, built in-process (no downloads)."""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# Tiny models gain nothing from threads, and on a busy machine spinning threads cost 10-100x.
torch.set_num_threads(1)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
}

# Gemma 3 with both layer kinds, windows short enough to cut into a test's prompt, and distinct
# rotary bases per kind (10,000 local, 1,000,000 global, as in the real models). Untied and with
# larger weights than the default: a tiny tied Gemma mostly repeats its last token.
GEMMA3 = dict(
    head_dim=8,
    query_pre_attn_scalar=8,
    sliding_window=4,
    layer_types=None,
    sliding_window_pattern=2,
    initializer_range=0.2,
    tie_word_embeddings=False,
)


def make_tiny(
    family: str = "llama",
    seed: int = 0,
    vocab: int = 97,
    layers: int = 4,
    dtype: torch.dtype = torch.float64,
    **overrides: object,
) -> torch.nn.Module:
    """A random model of ``family`` small enough to run hundreds of rounds in a second."""
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "qwen3":
        settings["head_dim"] = 8
    if family == "gemma3":
        settings.update(GEMMA3)
    settings.update(overrides)
    return model_cls(config_cls(**settings)).to(dtype).eval()


#: decoders whose greedy tokens the half-precision and GPU tests compare with transformers'
GREEDY_SETUPS: dict[str, dict] = {
    "plain": dict(drafter=None, controller="fixed"),
    "early-exit-k3": dict(
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="fixed",
        controller_options={"k": 3},
    ),
    "early-exit-thompson": dict(drafter="early_exit", drafter_options={"exit_layer": 2}),
    "prompt-lookup": dict(drafter="prompt_lookup", controller="fixed", controller_options={"k": 4}),
}


def greedy_reference(model: torch.nn.Module, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy ``n`` tokens after ``prompt`` (no EOS stop), and the logits it chose
    them by, ``[n, V]`` in float32 on the host."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, ids.shape[1] :].tolist(), torch.stack(out.logits, 1)[0].float().cpu()
