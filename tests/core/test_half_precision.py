"""bfloat16 and float16: greedy agreement with transformers under the tie rule, and the rule itself.

In half precision eesd's tokens must equal transformers' greedy ``generate()`` up to the first
difference, and that difference must sit where transformers' own top-2 logits are within
``TIE_ULPS`` units in the last place (:mod:`eesd_core.testing.agreement`). In float32/float64 nothing but
exact equality passes.
"""

from __future__ import annotations

import pytest
import torch
from tinymodels import GREEDY_SETUPS, greedy_reference, make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError
from eesd_core.testing.agreement import compare_greedy, logits_after, tie_tolerance

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
def test_half_precision_agrees_with_transformers_up_to_ties(family: str, dtype: torch.dtype) -> None:
    """How many runs are exact depends on the CPU's arithmetic; that each one is exact up to a
    tie within the rule holds on any machine."""
    for seed in range(3):
        model = make_tiny(family, seed, dtype=dtype)
        ids = torch.randint(3, 97, (1, 5 + 3 * seed), generator=torch.Generator().manual_seed(seed))
        expected, logits = greedy_reference(model, ids[0].tolist(), 30)
        for name, options in GREEDY_SETUPS.items():
            dec = SpeculativeDecoder(model, **options)
            tokens = (
                dec.generate(ids, max_new_tokens=30, eos_token_id=[]).sequences[0, ids.shape[1] :].tolist()
            )
            agreement = compare_greedy(expected, tokens, dtype, logits)
            assert agreement.ok, (family, seed, name, agreement.describe())


def test_a_half_precision_batch_agrees_row_by_row() -> None:
    model = make_tiny("llama", 1, dtype=torch.bfloat16)
    prompts = [
        torch.randint(3, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (3, 7, 5)
    ]
    dec = SpeculativeDecoder(model, drafter="early_exit", drafter_options={"exit_layer": 2})
    rows = dec.generate(prompts, max_new_tokens=20, eos_token_id=[]).sequences
    for prompt, row in zip(prompts, rows, strict=True):
        expected, logits = greedy_reference(model, prompt, 20)
        agreement = compare_greedy(expected, row[len(prompt) :].tolist(), torch.bfloat16, logits)
        assert agreement.ok, agreement.describe()


def test_float32_and_float64_allow_no_tie() -> None:
    logits = torch.tensor([[5.0, 5.0, 1.0]])  # an exact tie in the reference
    for dtype in (torch.float32, torch.float64):
        agreement = compare_greedy([0], [1], dtype, logits)
        assert not agreement.ok and not agreement.tie and agreement.matched == 0
    assert compare_greedy([0], [1], torch.bfloat16, logits).tie


def test_a_clear_winner_is_a_mismatch_in_half_precision() -> None:
    top = 12.0
    ulp = torch.finfo(torch.bfloat16).eps * top
    near = torch.tensor([[top, top - ulp, 0.0]])
    far = torch.tensor([[top, top - 40 * ulp, 0.0]])
    assert compare_greedy([0, 0], [0, 1], torch.bfloat16, torch.cat([near, near])).tie
    wrong = compare_greedy([0, 0], [0, 1], torch.bfloat16, torch.cat([near, far]))
    assert not wrong.ok and wrong.matched == 1 and wrong.gap is not None and wrong.gap > wrong.tolerance
    assert "MISMATCH" in wrong.describe()


def test_without_the_reference_logits_a_difference_is_a_mismatch() -> None:
    assert not compare_greedy([1, 2], [1, 3], torch.bfloat16).ok
    assert compare_greedy([1, 2], [1, 2], torch.float32).equal
    shorter = compare_greedy([1, 2, 3], [1, 2], torch.bfloat16, torch.zeros(3, 4))
    assert not shorter.ok and shorter.matched == 2


def test_tolerance_scales_with_the_logit_and_the_dtype() -> None:
    assert tie_tolerance(10.0, torch.float32) == 0.0
    assert tie_tolerance(0.1, torch.bfloat16) == tie_tolerance(1.0, torch.bfloat16)
    assert tie_tolerance(20.0, torch.bfloat16) == pytest.approx(20 * tie_tolerance(1.0, torch.bfloat16))
    assert tie_tolerance(20.0, torch.float16) < tie_tolerance(20.0, torch.bfloat16)


def test_logits_after_is_the_reference_row() -> None:
    model = make_tiny("qwen2", 4, dtype=torch.bfloat16)
    ids = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(4))
    expected, logits = greedy_reference(model, ids[0].tolist(), 5)
    row = logits_after(model, ids[0].tolist() + expected[:3])
    assert int(row.argmax()) == expected[3]
    assert torch.allclose(row, logits[3].float(), atol=0.1)
    lazy = compare_greedy(expected, expected[:3] + [expected[3] + 1, 0], torch.bfloat16, lambda i: logits[i])
    assert not lazy.equal and lazy.matched == 3


def test_from_pretrained_checks_dtype_and_device_before_loading(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="not one eesd decodes in"):
        SpeculativeDecoder.from_pretrained(str(tmp_path), dtype="float8")
    with pytest.raises(ConfigError, match="Unknown device"):
        SpeculativeDecoder.from_pretrained(str(tmp_path), device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no CUDA GPU"):
            SpeculativeDecoder.from_pretrained(str(tmp_path), device="cuda")
    with pytest.raises(ConfigError, match="cannot decode on device 'meta'"):
        SpeculativeDecoder.from_pretrained(str(tmp_path), device="meta")


def test_from_pretrained_loads_in_the_dtype_asked(tmp_path) -> None:  # noqa: ANN001
    make_tiny("llama", 2, dtype=torch.float32).save_pretrained(tmp_path)
    dec = SpeculativeDecoder.from_pretrained(str(tmp_path), dtype="bfloat16", device="cpu", drafter=None)
    assert next(dec.model.parameters()).dtype == torch.bfloat16
    assert dec.adapter.device == torch.device("cpu")


def test_generate_command_takes_device_and_dtype(tmp_path, capsys) -> None:  # noqa: ANN001
    from eesd_core.cli import main

    make_tiny("llama", 2, dtype=torch.float32).save_pretrained(tmp_path)
    common = ["generate", "--model", str(tmp_path), "--drafter", "none", "--no-chat", "--stats"]
    if not torch.cuda.is_available():
        assert main([*common, "--device", "cuda", "hello"]) == 1
        assert "sees no CUDA GPU" in capsys.readouterr().err
    # no tokenizer in the directory: the dtype and device were accepted and the weights loaded
    assert main([*common, "--dtype", "bfloat16", "--device", "cpu", "hello"]) == 1
    assert "has no tokenizer" in capsys.readouterr().err


def test_bench_marks_a_half_precision_tie_apart_from_mismatches(monkeypatch) -> None:  # noqa: ANN001
    from types import SimpleNamespace

    from eesd_bench.report import mismatches, ties
    from eesd_bench.run import _check

    from eesd_core.testing import agreement

    row = {"value": torch.tensor([10.0, 10.0 - 0.04, 0.0])}  # top-2 within 4 ulps of bfloat16 at 10
    monkeypatch.setattr(agreement, "logits_after", lambda model, prefix: row["value"])

    def checked(dtype: torch.dtype) -> list[dict]:
        samples = [{"method": m, "run": 0, "question_id": 1, "new_tokens": 3} for m in ("hf", "eesd")]
        _check(samples, {"hf": [0, 0, 0], "eesd": [0, 1, 2]}, "hf", True, SimpleNamespace(dtype=dtype), [5])
        return samples

    tied = checked(torch.bfloat16)
    assert tied[1]["equal"] is False and tied[1]["tie"] is True
    assert not mismatches(tied) and ties(tied)[0]["first_diff"] == 1
    row["value"] = torch.tensor([10.0, 8.0, 0.0])
    assert mismatches(checked(torch.bfloat16))[0]["first_diff"] == 1
    row["value"] = torch.tensor([10.0, 10.0, 0.0])
    assert mismatches(checked(torch.float32)), "float32 admits no tie"
