"""The products themselves, the passes that take them, and calibration under fake clocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from eesd_products import products
from eesd_products.products import (
    MatmulPlan,
    calibrate,
    linear_of,
    onednn_linear,
    onednn_serves,
    transposed_linear,
)
from tinymodels import make_tiny

from eesd_core.models import find_adapter

ONEDNN = onednn_serves(torch.float32, torch.device("cpu"))
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear for float32 on the CPU")
PER_LAYER = 7  # q, k, v, o, gate, up, down


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


@pytest.mark.parametrize("rows", [2, 3, 8])
def test_transposed_linear_hands_on_rows_laid_out_row_by_row(rows: int) -> None:
    """A product's result feeds the next product (an MLP's down matrix reads ``act(gate(x)) *
    up(x)``). ``(W @ x.T).T`` alone is a column-major view, and a product over column-major rows
    takes a slow GEMM path on CPUs, so the result, and the rows a product reads, are row-major."""
    gen = torch.Generator().manual_seed(rows)
    gate, down = (torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in ((29, 11), (13, 29)))
    x = torch.randn(11, rows, generator=gen, dtype=torch.float64).t()  # rows in column-major order
    hidden = transposed_linear(x, gate)
    assert hidden.is_contiguous()
    torch.testing.assert_close(hidden, F.linear(x, gate), rtol=1e-12, atol=1e-12)
    read: list[torch.Tensor] = []
    original = torch.Tensor.__matmul__

    def spy_matmul(weight: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        read.append(other)
        return original(weight, other)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "__matmul__", spy_matmul)
        out = transposed_linear(hidden.t().contiguous().t() * 2.0, down)  # column-major again
    assert out.is_contiguous() and [t.t().is_contiguous() for t in read] == [True]
    torch.testing.assert_close(out, F.linear(hidden * 2.0, down), rtol=1e-12, atol=1e-12)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_linear_equals_linear_in_float32(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(37, 11, generator=gen)
    bias = torch.randn(37, generator=gen) if with_bias else None
    x = torch.randn(1, rows, 11, generator=gen)
    out = onednn_linear(x, weight, bias)
    assert out.shape == (1, rows, 37)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_onednn_serves_float32_and_bfloat16_on_cpus_only() -> None:
    assert not onednn_serves(torch.float64, torch.device("cpu"))
    assert not onednn_serves(torch.float32, torch.device("meta"))


@needs_onednn
def test_a_per_shape_product_equals_linear_and_is_made_once() -> None:
    gen = torch.Generator().manual_seed(0)
    tall, wide = torch.randn(37, 11, generator=gen), torch.randn(11, 37, generator=gen)
    product = (((37, 11), "transposed"), (None, "onednn"))
    linear = linear_of(product)
    assert linear_of(product) is linear and linear_of("onednn") is linear_of("onednn")
    x = torch.randn(1, 3, 11, generator=gen)
    torch.testing.assert_close(linear(x, tall), F.linear(x, tall), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear(linear(x, tall), wide), F.linear(F.linear(x, tall), wide))


# -- passes take the product decided for their row count ------------------------------------------


def _pass(adapter, m: int, position: int, cache, layers: int | None = None) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():  # a decoding pass (under autograd every pass keeps F.linear)
        hidden = adapter.run(adapter.embed(torch.arange(m)), 0, layers or adapter.num_layers, cache, position)
        return adapter.logits(adapter.norm(hidden))


def test_the_adapter_uses_a_product_only_for_its_row_counts(spy: list[int], seed) -> None:  # noqa: ANN001
    model = make_tiny("gemma3", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    seed(model, {1: "transposed", 3: "transposed"})
    cache = adapter.new_cache()
    for position, m in ((0, 2), (2, 1), (3, 3), (6, 4)):
        spy.clear()
        _pass(adapter, m, position, cache)
        assert spy == ([m] * (PER_LAYER * adapter.num_layers + 1) if m in (1, 3) else []), m


def test_passes_under_autograd_keep_f_linear(spy: list[int], seed) -> None:  # noqa: ANN001
    """oneDNN's linear has no backward (its gradients would be silently wrong): a pass that
    records gradients keeps ``F.linear`` whatever was decided."""
    model = make_tiny("llama", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    seed(model, {2: "transposed"})
    hidden = adapter.run(adapter.embed(torch.arange(2)), 0, adapter.num_layers, adapter.new_cache(), 0)
    adapter.logits(adapter.norm(hidden)).sum().backward()
    assert spy == []
    with torch.no_grad():
        adapter.run(adapter.embed(torch.arange(2)), 0, adapter.num_layers, adapter.new_cache(), 0)
    assert spy == [2] * (PER_LAYER * adapter.num_layers)


@needs_onednn
def test_a_decided_row_count_runs_its_product(kinds: list[str], seed) -> None:  # noqa: ANN001
    model = make_tiny("qwen2", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    seed(model, {1: "transposed", 3: "onednn"})
    cache = adapter.new_cache()
    for position, m, expected in ((0, 3, "onednn"), (3, 1, "transposed"), (4, 2, None)):
        kinds.clear()
        _pass(adapter, m, position, cache)
        assert set(kinds) == ({expected} if expected else set()), m


def test_an_exit_head_runs_its_copies_and_rows_through_the_product(spy: list[int], seed) -> None:  # noqa: ANN001
    """A draft step's head (copied layers, a vocabulary subset's rows) uses the product decided
    for its row count, as the target's layers do; training (gradients on) keeps F.linear."""
    model = make_tiny("qwen2", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    seed(model, {1: "transposed", 2: "transposed"})
    copies = [adapter.copy_layer(adapter.num_layers - 1, 0)]
    rows = adapter.lm_head_weight[:16]
    for m, planned in ((1, True), (2, True), (3, False)):
        hidden = adapter.embed(torch.arange(m))
        with torch.no_grad():
            expected = F.linear(adapter.norm(hidden), rows)
            spy.clear()
            out = adapter.run_copies(copies, hidden, adapter.new_cache(1), 0)
            logits = adapter.logits(adapter.norm(out), rows)
            routed = list(spy)
            torch.testing.assert_close(adapter.logits(adapter.norm(hidden), rows), expected)
        assert routed == ([m] * (PER_LAYER + 1) if planned else []), m
        assert logits.shape == (1, m, 16)
    spy.clear()
    out = adapter.run_copies(copies, adapter.embed(torch.arange(1)), adapter.new_cache(1), 0)
    adapter.logits(adapter.norm(out), rows).sum().backward()
    assert spy == [] and copies[0].mlp.up_proj.weight.grad is not None


@needs_onednn
def test_a_per_shape_product_sends_each_matrix_to_its_own(monkeypatch: pytest.MonkeyPatch, seed) -> None:  # noqa: ANN001
    model = make_tiny("qwen2", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    layer = adapter.model.model.layers[0]
    shapes = {tuple(m.weight.shape) for m in layer.modules() if type(m) is torch.nn.Linear}
    tall = max(shapes)  # one shape transposed, every other (and the LM head) through oneDNN
    seed(model, {2: ((tall, "transposed"), (None, "onednn"))})
    seen: list[tuple[str, tuple[int, ...]]] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def counting(x, weight, bias=None, name=name, original=original):  # noqa: ANN001, ANN202
            seen.append((name, tuple(weight.shape)))
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", counting)
    hidden = adapter.embed(torch.arange(2))
    expected = F.linear(
        adapter.norm(adapter.run(hidden, 0, 4, adapter.new_cache(), 0)), adapter.lm_head_weight
    )
    seen.clear()
    out = _pass(adapter, 2, 0, adapter.new_cache(), 4)
    assert seen and all((name == "transposed") == (shape == tall) for name, shape in seen)
    assert {name for name, _ in seen} == {"transposed", "onednn"}
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert "the faster of the two for each matrix shape for passes over m = 2" in adapter.products.describe()


@needs_onednn
def test_a_wide_pass_runs_its_buckets_product(kinds: list[str], seed) -> None:  # noqa: ANN001
    model = make_tiny("qwen2", 0, dtype=torch.float32)
    adapter = find_adapter(model)
    seed(model, {32: "onednn"})
    cache = adapter.new_cache(capacity=80)
    for position, m, expected in ((0, 20, {"onednn"}), (20, 3, set()), (23, 40, set())):
        kinds.clear()
        _pass(adapter, m, position, cache, 4)
        assert set(kinds) == expected, m


def test_wider_passes_take_the_decision_of_their_bucket() -> None:
    """Past EXACT_ROWS a pass over m positions takes the first bucket at or above m (the last
    beyond it); row counts planned one by one keep their own decision."""
    plan = MatmulPlan(frozenset({1, 20}), wide={32: "onednn", 512: "onednn"})
    assert [m in plan for m in (1, 2, 16, 17, 20, 32, 33, 64, 300, 512, 4096)] == [
        True, False, False, True, True, True, False, False, True, True, True,
    ]  # fmt: skip
    assert plan.product(17) == plan.product(4096) == "onednn" and plan.product(20) == "transposed"
    assert "oneDNN's for wider passes over m = 17-32, 257-512 and more" in plan.describe()
    assert 17 not in MatmulPlan(frozenset({1})), "no wide decisions: wide passes keep F.linear"
    assert MatmulPlan(wide={64: "onednn"}).describe() == "oneDNN's for wider passes over m = 33-64"


# -- calibration under fake clocks ---------------------------------------------------------------


class _Clock:
    """A clock under which the time since the last reading costs ``cost(transposed)``, where
    ``transposed`` says whether the transposed product ran meanwhile."""

    def __init__(self, cost, spy: list[int]) -> None:  # noqa: ANN001
        self.cost, self.spy, self.now = cost, spy, 0.0

    def __call__(self) -> float:
        self.now += self.cost(bool(self.spy))
        self.spy.clear()
        return self.now


def _calibrate(cost, spy: list[int], **options) -> MatmulPlan:  # noqa: ANN001
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    options = {"context": 5, "repeats": 3, "candidates": ["transposed"], **options}
    return calibrate(adapter, 4, clock=_Clock(cost, spy), **options)


def test_calibration_keeps_the_faster_path(spy: list[int]) -> None:
    plan = _calibrate(lambda transposed: 1.0 if transposed else 2.0, spy)
    assert plan.rows == frozenset({1, 2, 3, 4})
    assert all(t == (2.0, 1.0) for t in plan.timings.values())


def test_calibration_keeps_f_linear_on_a_small_win(spy: list[int]) -> None:
    plan = _calibrate(lambda transposed: 1.85 if transposed else 2.0, spy)  # under MARGIN
    assert plan.rows == frozenset() and set(plan.timings) == {1, 2, 3, 4}


def test_calibration_keeps_f_linear_when_passes_vary_too_much(spy: list[int]) -> None:
    """The transposed passes win on medians, but one in three is slow: too noisy to trust."""
    passes = [0]

    def cost(transposed: bool) -> float:
        if not transposed:
            return 2.0
        passes[0] += 1
        return 5.0 if passes[0] % 3 == 0 else 1.0

    plan = _calibrate(cost, spy)
    assert plan.rows == frozenset()
    assert all(t == (2.0, 1.0) for t in plan.timings.values())


def test_calibration_keeps_f_linear_when_a_win_does_not_repeat(
    spy: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transposed passes win the first measurement only (the second warms nothing up)."""
    second: list[bool] = []
    measure = products._measure

    def measuring(run, counts, repeats, kinds, warm=True):  # noqa: ANN001, ANN202
        second.append(not warm)
        return measure(run, counts, repeats, kinds, warm)

    monkeypatch.setattr(products, "_measure", measuring)
    plan = _calibrate(lambda transposed: 1.0 if transposed and not second[-1] else 2.0, spy)
    assert plan.rows == frozenset() and second.count(True) == 4
    assert all(t == (2.0, 2.0) for t in plan.timings.values())


def test_calibration_needs_two_repeats_each_time() -> None:
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    for options in ({"repeats": 1}, {"screen": 1}):
        with pytest.raises(ValueError, match="two repeats"):
            calibrate(adapter, 2, **options)  # type: ignore[arg-type]


def test_a_large_model_calibrates_on_a_sample_of_its_layers(spy: list[int]) -> None:
    """Past ``sample_bytes`` of layer weights a pass runs fewer layers and scales their time up:
    the clock is read three times a pass, and a pass costs ``layers / sampled`` layer times plus
    the head's."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    assert products.sampled_layers(adapter, 1 << 40) == adapter.num_layers
    assert products.sampled_layers(adapter, 1) == 1
    scale = adapter.num_layers
    plan = _calibrate(lambda transposed: 1.0 if transposed else 2.0, spy, sample_bytes=1)
    assert plan.rows == frozenset({1, 2, 3, 4})
    assert all(t == (2.0 * scale + 2.0, 1.0 * scale + 1.0) for t in plan.timings.values())


def test_a_budget_leaves_the_row_counts_it_cannot_fit_undecided(
    spy: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time runs on the passes' clock; a row count costs 8 passes (2 untimed, 2 x 3 timed) of 2
    readings, 16 seconds: a budget of 40 fits two, as a third would end past it."""
    clock = _Clock(lambda transposed: 1.0, spy)
    monkeypatch.setattr(products, "_now", lambda: clock.now)
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    plan = calibrate(adapter, 4, context=5, candidates=["transposed"], clock=clock, budget=40.0)
    assert set(plan.timings) == {1, 2} and plan.rows == frozenset()
    assert set(calibrate(adapter, 4, context=5, candidates=["transposed"], budget=0.0).timings) == set()


def _costing(monkeypatch: pytest.MonkeyPatch, cost) -> Callable[[], float]:  # noqa: ANN001
    """A clock under which the time since the last reading is the sum of ``cost(name, rows,
    weight)`` over the products that ran meanwhile, or 100 if only F.linear did."""
    calls: list[float] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def costing(x, weight, bias=None, name=name, original=original):  # noqa: ANN001, ANN202
            calls.append(cost(name, x.numel() // x.shape[-1], weight))
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", costing)
    now = [0.0]

    def clock() -> float:
        now[0] += sum(calls) if calls else 100.0
        calls.clear()
        return now[0]

    return clock


@needs_onednn
def test_calibration_keeps_the_fastest_product_for_each_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matrix costs 2.5 through F.linear (100 a pass), 1 through the transposed product for one
    row and 3 for more, 1.5 through oneDNN's: shape by shape the faster is the same product."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    costs = {"transposed": lambda rows: 1.0 if rows == 1 else 3.0, "onednn": lambda rows: 1.5}
    clock = _costing(monkeypatch, lambda name, rows, weight: costs[name](rows))
    plan = calibrate(adapter, 4, context=5, repeats=3, clock=clock)
    assert plan.rows == frozenset({1, 2, 3, 4}) and plan.onednn == frozenset({2, 3, 4}) and not plan.shapes
    assert plan.product(1) == "transposed" and plan.product(3) == "onednn"
    assert "oneDNN's for passes over m = 2, 3, 4" in plan.describe()


@needs_onednn
@pytest.mark.parametrize("candidates", [None, ["transposed", "onednn", "mixed"]])
def test_calibration_takes_a_product_per_shape_where_that_is_fastest(
    monkeypatch: pytest.MonkeyPatch, candidates: list[str] | None
) -> None:
    """The transposed product is the faster for tall matrices only: a pass through the per-shape
    product beats both (and F.linear), and is chosen with or without them as candidates."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))

    def cost(name: str, rows: int, weight: torch.Tensor) -> float:
        return (1.0 if weight.shape[0] > weight.shape[1] else 3.0) if name == "transposed" else 2.0

    plan = calibrate(adapter, 2, context=5, clock=_costing(monkeypatch, cost), candidates=candidates)
    assert plan.rows == frozenset({1, 2}) and set(plan.shapes) == {1, 2}
    table = dict(plan.shapes[1])  # type: ignore[arg-type]
    assert table.pop(None) == "onednn" and table[tuple(adapter.lm_head_weight.shape)] == "transposed"
    assert all(kind == ("transposed" if r > c else "onednn") for (r, c), kind in table.items())
    assert plan.describe() == "the faster of the two for each matrix shape for passes over m = 1, 2"


@needs_onednn
def test_each_shape_gets_the_product_that_is_faster_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a clock where the transposed product is the faster for wide-output matrices only,
    the product for every such shape is the transposed one, for every other oneDNN's."""
    now = [0.0]
    costs = {"transposed": lambda w: 1.0 if w.shape[0] > w.shape[1] else 3.0, "onednn": lambda w: 2.0}
    for name, cost in costs.items():

        def timed(x, weight, bias=None, cost=cost):  # noqa: ANN001, ANN202
            now[0] += cost(weight)
            return F.linear(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", timed)
    adapter = find_adapter(make_tiny("qwen2", 0, dtype=torch.float32))
    chosen = products._shape_products(adapter, adapter.num_layers, [1, 3], 3, lambda: now[0])
    for m in (1, 3):
        table = dict(chosen[m])
        assert table.pop(None) == "onednn"
        assert tuple(adapter.lm_head_weight.shape) in table
        assert table and all(kind == ("transposed" if r > c else "onednn") for (r, c), kind in table.items())


@needs_onednn
@pytest.mark.parametrize(
    ("candidates", "table", "timed"),
    [
        (None, ((None, "onednn"),), ["standard", "transposed", "onednn"]),
        (None, (((8, 8), "transposed"), (None, "onednn")), ["standard", "transposed"]),
        (["transposed", "onednn", "mixed"], ((None, "onednn"),), ["standard", "transposed", "onednn"]),
    ],
)
def test_a_per_shape_product_that_picks_one_product_is_timed_once_under_its_name(
    monkeypatch: pytest.MonkeyPatch,
    spy: list[int],
    candidates,
    table,
    timed,  # noqa: ANN001
) -> None:
    measured: list[list[str]] = []
    measure = products._measure

    def measuring(run, counts, repeats, kinds, warm=True):  # noqa: ANN001, ANN202
        measured.append(list(kinds))
        return measure(run, counts, repeats, kinds, warm)

    monkeypatch.setattr(products, "_measure", measuring)
    monkeypatch.setattr(
        products, "_shape_products", lambda adapter, layers, counts, repeats, clock: {counts[0]: table}
    )
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    calibrate(adapter, 1, context=5, clock=_Clock(lambda transposed: 2.0, spy), candidates=candidates)
    assert measured == [timed]


@needs_onednn
def test_a_calibration_without_the_head_runs_no_lm_head(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    monkeypatch.setattr(adapter, "logits", lambda hidden: pytest.fail("the LM head ran"))
    plan = calibrate(adapter, 40, only=[20, 40], repeats=2, screen=2, candidates=["onednn"], head=False)
    assert set(plan.timings) == {20, 40} and all(a > 0 and b > 0 for a, b in plan.timings.values())
