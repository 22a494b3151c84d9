"""Tiny random Hugging Face models, and the exact next-token distributions a test compares with.

Built in process (no download), in float64, with a small vocabulary so that the distribution of the
first tokens can be written down exactly from the model's own forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eesd_core.protocols import SamplingParams
from eesd_core.sampling import process_logits


def tiny_llama(
    vocab_size: int = 16, num_layers: int = 2, seed: int = 0, scale: float = 4.0, **overrides: Any
) -> Any:
    """A random ``LlamaForCausalLM`` in float64, without an EOS token (generation never stops early).

    The defaults give peaked next-token distributions (entropy about 1.8 nats over 16 tokens) and an
    early exit after layer 1 whose q is far from p (total variation about 0.7), so top-k and top-p
    cut real mass and many drafts are rejected.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    settings.update(overrides)
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        model: Any = LlamaForCausalLM(LlamaConfig(**settings))
    finally:
        torch.set_rng_state(generator_state)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.to(torch.float64).eval()


@torch.no_grad()
def next_token_probs(model: Any, tokens: Sequence[int], sampling: SamplingParams) -> torch.Tensor:
    """p after ``tokens``: one plain forward pass, then the engine's own logits processing. # [V]"""
    logits = model(torch.tensor([list(tokens)], dtype=torch.long)).logits[0, -1]
    return process_logits(logits[None].to(torch.float64), sampling)[0]


def first_tokens_distribution(
    model: Any, prompt: Sequence[int], count: int, sampling: SamplingParams
) -> dict[tuple[int, ...], float]:
    """Exact P(first ``count`` new tokens) under plain sampling from ``model`` (it enumerates every
    sequence: keep ``count`` small)."""
    from eesd_core.testing.oracles import autoregressive_distribution

    return autoregressive_distribution(lambda h: next_token_probs(model, h, sampling), prompt, count)
