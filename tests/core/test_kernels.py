"""The transposed product of short passes: same numbers as F.linear, used only where planned."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder, kernels
from eesd_core.kernels import MatmulPlan, calibrate, fixed_plan, plan_for, transposed_linear
from eesd_core.models import find_adapter


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_transposed_linear_equals_linear(rows: int, batched: bool, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(37, 11, generator=gen, dtype=torch.float64)
    bias = torch.randn(37, generator=gen, dtype=torch.float64) if with_bias else None
    shape = (1, rows, 11) if batched else (rows, 11)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    out = transposed_linear(x, weight, bias)
    assert out.shape == F.linear(x, weight, bias).shape
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-12, atol=1e-12)


def test_the_plan_transposes_only_its_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = kernels.transposed_linear

    def spy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        calls.append(x.numel() // x.shape[-1])
        return original(x, weight, bias)

    monkeypatch.setattr(kernels, "transposed_linear", spy)
    layer = torch.nn.Linear(8, 4)
    with fixed_plan([1, 3]).active():
        for rows in (1, 2, 3, 4):
            layer(torch.randn(1, rows, 8))
        torch.relu(torch.randn(3, 8))  # anything else passes through untouched
    assert calls == [1, 3]
    with MatmulPlan().active():
        layer(torch.randn(1, 3, 8))
    assert calls == [1, 3]


def test_plans_by_mode() -> None:
    adapter = find_adapter(make_tiny("llama", 0))  # float64: a reference model
    assert plan_for(adapter, "standard", 9).rows == frozenset()
    assert plan_for(adapter, "transposed", 4).rows == frozenset({1, 2, 3, 4})
    assert plan_for(adapter, "auto", 9).rows == frozenset(), "float64 models keep F.linear"


def test_auto_calibrates_once_per_model_and_threads() -> None:
    adapter = find_adapter(make_tiny("llama", 0, dtype=torch.float32))
    plan = plan_for(adapter, "auto", 3)
    assert set(plan.timings) == {1, 2, 3}
    assert plan.rows <= {1, 2, 3}
    for m, (standard, transposed) in plan.timings.items():
        assert standard > 0 and transposed > 0
        assert (m in plan.rows) == (transposed < kernels.MARGIN * standard)
    assert plan_for(adapter, "auto", 3) is plan
    smaller = plan_for(adapter, "auto", 1)  # served from the same measurements
    assert smaller.timings == {1: plan.timings[1]} and smaller.rows == plan.rows & {1}


def test_calibration_keeps_the_faster_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a clock under which the transposed passes take half the time, every m takes them."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    now = [0.0]
    transposed = [False]
    original = kernels.transposed_linear

    def spy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        transposed[0] = True
        return original(x, weight, bias)

    def clock() -> float:
        """Each pass costs 1 if it used the transposed product, else 2."""
        now[0] += 1.0 if transposed[0] else 2.0
        transposed[0] = False
        return now[0]

    monkeypatch.setattr(kernels, "transposed_linear", spy)
    plan = calibrate(adapter, 4, context=5, repeats=2, clock=clock)
    assert plan.rows == frozenset({1, 2, 3, 4})
    assert all(t == (2.0, 1.0) for t in plan.timings.values())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_transposed_decoding_matches_transformers(family: str, dtype: torch.dtype) -> None:
    model = make_tiny(family, 3, dtype=dtype)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for drafter, k in ((None, 0), ("early_exit", 1), ("early_exit", 3), ("early_exit", 8)):
        dec = SpeculativeDecoder(
            model,
            drafter=drafter,
            drafter_options={"exit_layer": 2} if drafter else None,
            controller="fixed",
            controller_options={"k": k} if drafter else None,
            matmul="transposed",
        )
        out = dec.generate(ids, max_new_tokens=24, eos_token_id=[])
        assert dec.matmul_plan is not None and 1 in dec.matmul_plan.rows
        assert torch.equal(out.sequences, expected), (family, dtype, drafter, k)


def test_unknown_matmul_is_a_config_error() -> None:
    from eesd_core.errors import ConfigError

    with pytest.raises(ConfigError, match="matmul"):
        SpeculativeDecoder(make_tiny("llama", 0), matmul="fastest")
