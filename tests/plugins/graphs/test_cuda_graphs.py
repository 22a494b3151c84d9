"""On a CUDA GPU, passes captured into CUDA graphs (``compile="graphs"``): greedy agreement with
transformers on four families, batches row by row, one seed giving one text graphed and eager, and
replays that really happen. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch
from eesd_graphs.static import Captured, CudaGraph, StaticCache
from tinymodels import GREEDY_SETUPS, greedy_reference, make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.testing.agreement import compare_greedy

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GRAPHS = {"compile": "graphs"}


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(3, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma3"])
def test_graphed_greedy_agrees_with_transformers(family: str, dtype: torch.dtype) -> None:
    model = make_tiny(family, 1, dtype=dtype).to("cuda")
    prompt = _prompt(1, 9)
    expected, logits = greedy_reference(model, prompt, 40)
    for name, options in GREEDY_SETUPS.items():
        dec = SpeculativeDecoder(model, **options, adapter_options=GRAPHS)
        generation = dec.stream(prompt, max_new_tokens=40, eos_token_id=[])
        tokens = [token for step in generation for token in step]
        replayed = [entry for entry in generation.cache.captured.values() if isinstance(entry, Captured)]
        assert isinstance(generation.cache, StaticCache) and replayed, (family, name)
        assert all(isinstance(entry.graph, CudaGraph) for entry in replayed)
        agreement = compare_greedy(expected, tokens, dtype, logits)
        assert agreement.ok, (family, name, str(dtype), agreement.describe())
        if dtype == torch.float32:
            assert agreement.equal, (family, name, agreement.describe())


@pytest.mark.parametrize("drafter", ["early_exit", None])
def test_a_graphed_batch_agrees_row_by_row(drafter: str | None) -> None:
    model = make_tiny("llama", 1, dtype=torch.float32).to("cuda")
    prompts = [_prompt(n, n) for n in (3, 9, 5, 12)]
    options = {"exit_layer": 2} if drafter else {}
    dec = SpeculativeDecoder(model, drafter=drafter, drafter_options=options, adapter_options=GRAPHS)
    rows = dec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    for prompt, row in zip(prompts, rows, strict=True):
        expected, logits = greedy_reference(model, prompt, 24)
        agreement = compare_greedy(expected, row[len(prompt) :].tolist(), torch.float32, logits)
        assert agreement.equal, agreement.describe()


def test_one_seed_samples_one_text_graphed_and_eager() -> None:
    model = make_tiny("qwen2", 5, dtype=torch.float32).to("cuda")
    prompt = _prompt(5, 7)
    texts = []
    for compile_ in ("off", "graphs"):
        dec = SpeculativeDecoder(
            model,
            drafter="early_exit",
            drafter_options={"exit_layer": 2},
            controller="fixed",
            controller_options={"k": 3},
            adapter_options={"compile": compile_},
        )
        texts.append(dec.generate(prompt, max_new_tokens=32, temperature=0.9, seed=11).sequences.tolist())
    assert texts[0] == texts[1]
