"""On a CUDA GPU: greedy agreement with transformers, batches, seeded sampling, results on the host,
and distilling an exit head there.

Skipped where torch sees no CUDA device. float64 on the GPU must match transformers token for token;
float32 too (TF32 is off in torch by default); bfloat16 up to a tie of transformers' own top-2
logits (:mod:`eesd_core.testing.agreement`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tinymodels import GREEDY_SETUPS, greedy_reference, make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.testing.agreement import compare_greedy

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _on_gpu(family: str, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    return make_tiny(family, seed, dtype=dtype).to("cuda")


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(3, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma3"])
def test_greedy_on_the_gpu_agrees_with_transformers(family: str, dtype: torch.dtype) -> None:
    for seed in range(2):
        model = _on_gpu(family, seed, dtype)
        prompt = _prompt(seed, 5 + 4 * seed)
        expected, logits = greedy_reference(model, prompt, 30)
        for name, options in GREEDY_SETUPS.items():
            result = SpeculativeDecoder(model, **options).generate(prompt, max_new_tokens=30, eos_token_id=[])
            assert result.sequences.device.type == "cpu"  # results come back in host memory
            tokens = result.sequences[0, len(prompt) :].tolist()
            agreement = compare_greedy(expected, tokens, dtype, logits)
            assert agreement.ok, (family, seed, name, str(dtype), agreement.describe())
            if dtype != torch.bfloat16:
                assert agreement.equal, (family, seed, name, agreement.describe())


@pytest.mark.parametrize("skip", ["auto", True], ids=["dense", "skip-padding"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("drafter", ["early_exit", "prompt_lookup", None])
def test_a_batch_on_the_gpu_agrees_row_by_row(drafter: str | None, dtype: torch.dtype, skip: object) -> None:
    """Both ways of running a batch's padding on a GPU: computed (``"auto"`` there) and skipped."""
    model = _on_gpu("llama", 1, dtype)
    prompts = [_prompt(n, n) for n in (3, 9, 5, 12)]
    options = {"exit_layer": 2} if drafter == "early_exit" else {}
    padding = {"skip_padding": skip}
    dec = SpeculativeDecoder(model, drafter=drafter, drafter_options=options, adapter_options=padding)
    assert dec.adapter.skips_padding is (skip is True)
    rows = dec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    for prompt, row in zip(prompts, rows, strict=True):
        assert row.device.type == "cpu"
        expected, logits = greedy_reference(model, prompt, 24)
        agreement = compare_greedy(expected, row[len(prompt) :].tolist(), dtype, logits)
        assert agreement.ok, agreement.describe()
        if dtype == torch.float32:
            assert agreement.equal, agreement.describe()


@pytest.mark.parametrize("drafter", ["early_exit", None])
def test_one_seed_samples_one_text_on_the_gpu_and_the_cpu(drafter: str | None) -> None:
    """Sampling draws from a host generator, so a seed gives the same tokens wherever the model runs
    (float64, so that the two devices' probabilities agree far below any draw's margin). A fixed k:
    the Thompson controller's own draws decide how many drafts a round makes, and with them which
    random numbers the round's tokens use."""
    cpu = make_tiny("qwen2", 5, dtype=torch.float64)
    gpu = make_tiny("qwen2", 5, dtype=torch.float64).to("cuda")
    options = {"exit_layer": 2} if drafter == "early_exit" else {}
    prompt = _prompt(11, 6)
    texts = []
    for model in (cpu, gpu):
        dec = SpeculativeDecoder(
            model, drafter=drafter, drafter_options=options, controller="fixed", controller_options={"k": 3}
        )
        out = dec.generate(prompt, max_new_tokens=40, temperature=0.8, seed=123, eos_token_id=[])
        texts.append(out.sequences[0].tolist())
    assert texts[0] == texts[1]


def test_an_exit_head_distils_on_the_gpu_and_drafts_there(tmp_path: Path) -> None:
    from eesd_early_exit.distill import DistillConfig, distill
    from eesd_early_exit.train import TrainSettings

    model = make_tiny(dtype=torch.float32, seed=3)
    model.lm_head.weight.data *= 6  # peaked next-token distributions, like a trained model's
    model = model.to("cuda")
    config = DistillConfig(
        exit_layer=2,
        out=tmp_path / "head.safetensors",
        max_new_tokens=16,
        top_k=8,
        generate_batch=4,
        train=TrainSettings(epochs=2, lr=3e-3, batch_tokens=64, checkpoint_every=2),
        eval_prompts=3,
        eval_max_new_tokens=20,
    )
    prompts, heldout = [_prompt(s, 4 + s % 5) for s in range(10)], [_prompt(50 + s, 6) for s in range(3)]
    report = distill(model, config, prompts, heldout, progress=False)
    assert report["eval"]["decoding"]["rounds"] > 0
    dec = SpeculativeDecoder(
        model, drafter_options={"head": str(config.out)}, controller="fixed", controller_options={"k": 4}
    )
    for prompt in heldout:
        ours = dec.generate(prompt, max_new_tokens=20, eos_token_id=[]).sequences[0].tolist()
        assert ours[len(prompt) :] == greedy_reference(model, prompt, 20)[0]
