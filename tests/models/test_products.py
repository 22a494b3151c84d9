"""The transposed product of short passes: same numbers as F.linear, used only where planned."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter, products
from eesd_core.models.products import (
    LinearRouter,
    MatmulPlan,
    calibrate,
    fixed_plan,
    onednn_linear,
    onednn_serves,
    plan_for,
    transposed_linear,
)

ONEDNN = onednn_serves(torch.float32, torch.device("cpu"))
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear for float32 on the CPU")


@pytest.fixture(autouse=True)
def own_decisions(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Each test keeps calibrations in a folder of its own, so none reads another's."""
    monkeypatch.setenv("EESD_PRODUCTS_DIR", str(tmp_path / "products"))
    return tmp_path / "products"


def calibrations(monkeypatch: pytest.MonkeyPatch, wide: bool = False) -> list[list[int]]:
    """The row counts of every calibration from now on: of short passes, or of wide ones."""
    measured: list[list[int]] = []
    real = products.calibrate

    def spy(adapter, max_rows, **kwargs):  # noqa: ANN001, ANN202
        if kwargs.get("head", True) != wide:
            measured.append(sorted(kwargs.get("only") or range(1, max_rows + 1)))
        return real(adapter, max_rows, **kwargs)

    monkeypatch.setattr(products, "calibrate", spy)
    return measured


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


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row count of every product that went through :func:`transposed_linear`."""
    calls: list[int] = []
    original = products.transposed_linear

    def counting(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        calls.append(x.numel() // x.shape[-1])
        return original(x, weight, bias)

    monkeypatch.setattr(products, "transposed_linear", counting)
    return calls


def test_the_router_sends_plain_linears_only_and_restores_them(spy: list[int]) -> None:
    class Quantized(torch.nn.Linear):
        pass

    hooked = torch.nn.Linear(8, 8)
    hooked.forward = lambda x: x  # an offloading hook, say: kept as it is
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Quantized(8, 8), hooked, torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    expected = model(x)
    with LinearRouter([model]):
        torch.testing.assert_close(model(x), expected)
    assert spy == [3, 3]
    assert "forward" not in vars(model[0]) and vars(hooked)["forward"] is not None
    model(x)
    assert spy == [3, 3]


def test_the_adapter_transposes_only_passes_of_planned_row_counts(spy: list[int]) -> None:
    adapter = find_adapter(make_tiny("gemma3", 0))
    adapter.products = fixed_plan([1, 3])
    cache = adapter.new_cache()
    per_pass = 7 * adapter.num_layers  # q, k, v, o, gate, up, down
    for position, m in ((0, 2), (2, 1), (3, 3), (6, 4)):
        spy.clear()
        with torch.no_grad():
            ids = adapter.embed(torch.arange(m))
            adapter.logits(adapter.norm(adapter.run_layers(ids, 0, adapter.num_layers, cache, position)))
        assert spy == ([m] * (per_pass + 1) if m in (1, 3) else []), m


def test_passes_under_autograd_keep_f_linear(spy: list[int]) -> None:
    """oneDNN's linear has no backward (its gradients would be silently wrong): a pass that
    records gradients keeps ``F.linear`` whatever the plan says."""
    adapter = find_adapter(make_tiny("llama", 0))
    adapter.products = fixed_plan([2])
    hidden = adapter.run_layers(adapter.embed(torch.arange(2)), 0, adapter.num_layers, adapter.new_cache(), 0)
    adapter.logits(adapter.norm(hidden)).sum().backward()
    assert spy == []
    with torch.no_grad():
        adapter.run_layers(adapter.embed(torch.arange(2)), 0, adapter.num_layers, adapter.new_cache(), 0)
    assert spy == [2] * (7 * adapter.num_layers)


def test_a_pass_outside_the_plan_enters_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not even the router: such a pass costs exactly what it costs without a plan."""
    entered: list[int] = []
    monkeypatch.setattr(LinearRouter, "__enter__", lambda self: entered.append(1) or self)
    adapter = find_adapter(make_tiny("llama", 0))
    adapter.products = fixed_plan([2])
    cache = adapter.new_cache()
    adapter.logits(adapter.norm(adapter.run_layers(adapter.embed(torch.arange(3)), 0, 4, cache, 0)))
    assert entered == []


def test_plans_by_mode() -> None:
    adapter = find_adapter(make_tiny("llama", 0))  # float64: a reference model
    assert plan_for(adapter, "standard", 9).rows == frozenset()
    assert plan_for(adapter, "transposed", 4).rows == frozenset({1, 2, 3, 4})
    assert plan_for(adapter, "auto", 9).rows == frozenset(), "float64 models keep F.linear"


def test_prepare_follows_the_options() -> None:
    model = make_tiny("qwen2", 0)
    adapter = find_adapter(model, {"matmul": "transposed"})
    assert adapter.products.describe() == "standard F.linear for every pass"
    adapter.prepare(3)
    assert adapter.products.rows == frozenset({1, 2, 3})
    assert "m = 1, 2, 3" in adapter.products.describe()
    standard = find_adapter(model, {"matmul": "standard"})
    standard.prepare(3)
    assert standard.products.rows == frozenset()


def test_auto_calibrates_once_per_model_and_threads() -> None:
    adapter = find_adapter(make_tiny("llama", 0, dtype=torch.float32))
    adapter.prepare(3)
    plan = adapter.products
    assert set(plan.timings) == {1, 2, 3}
    assert plan.rows <= {1, 2, 3}
    for m, (standard, transposed) in plan.timings.items():
        assert standard > 0 and transposed > 0
        assert m not in plan.rows or transposed < products.MARGIN * standard
    other = find_adapter(adapter.model)  # another decoder of the same model
    other.prepare(3)
    assert other.products == plan
    smaller = plan_for(adapter, "auto", 1)  # served from the same measurements
    assert smaller.timings == {1: plan.timings[1]} and smaller.rows == plan.rows & {1}


def test_a_longer_plan_measures_only_the_row_counts_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain decoder (m = 1) and a drafting one (m = 1..4) on one model decide m = 1 once."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    measured = calibrations(monkeypatch)
    one = plan_for(adapter, "auto", 1)
    four = plan_for(adapter, "auto", 4)
    assert measured == [[1], [2, 3, 4]]
    assert four.timings[1] == one.timings[1] and (1 in four.rows) == (1 in one.rows)


def test_a_new_process_reads_the_decisions_instead_of_measuring(monkeypatch, own_decisions) -> None:  # noqa: ANN001
    """Calibrations are kept on disk: a process that has not measured a model reads them, and
    measures only the row counts they lack."""
    model = make_tiny("llama", 2, dtype=torch.float32)
    measured = calibrations(monkeypatch)
    first = plan_for(find_adapter(model), "auto", 3)
    assert measured == [[1, 2, 3]] and len(list(own_decisions.glob("*.json"))) == 1
    products._DECISIONS.clear()  # what a new process starts with
    again = plan_for(find_adapter(model), "auto", 4)
    assert measured == [[1, 2, 3], [4]]
    assert {m: again.timings[m] for m in (1, 2, 3)} == first.timings and again.rows & {1, 2, 3} == first.rows
    products._DECISIONS.clear()
    assert plan_for(find_adapter(model), "auto", 4) == again and measured == [[1, 2, 3], [4]]


def test_decisions_are_kept_per_shape_and_thread_count(monkeypatch, own_decisions) -> None:  # noqa: ANN001
    measured = calibrations(monkeypatch)
    plan_for(find_adapter(make_tiny("llama", 3, dtype=torch.float32)), "auto", 1)
    plan_for(find_adapter(make_tiny("llama", 3, dtype=torch.float32, intermediate_size=96)), "auto", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        plan_for(find_adapter(make_tiny("llama", 3, dtype=torch.float32)), "auto", 1)
    finally:
        torch.set_num_threads(threads)
    assert measured == [[1], [1], [1]] and len(list(own_decisions.glob("*.json"))) == 3


def test_decisions_for_other_products_are_not_read(monkeypatch, own_decisions) -> None:  # noqa: ANN001
    """Decisions kept before the products changed timed other products: a new version of them
    measures again, in a file of its own."""
    model = make_tiny("llama", 3, dtype=torch.float32)
    measured = calibrations(monkeypatch)
    plan_for(find_adapter(model), "auto", 1)
    products._DECISIONS.clear()
    monkeypatch.setattr(products, "PRODUCTS_VERSION", products.PRODUCTS_VERSION + 1)
    plan_for(find_adapter(model), "auto", 1)
    assert measured == [[1], [1]] and len(list(own_decisions.glob("*.json"))) == 2


def test_an_unreadable_file_is_measured_again_and_replaced(monkeypatch, own_decisions) -> None:  # noqa: ANN001
    model = make_tiny("llama", 4, dtype=torch.float32)
    measured = calibrations(monkeypatch)
    plan_for(find_adapter(model), "auto", 2)
    (kept,) = own_decisions.glob("*.json")
    kept.write_text('{"1": [true, ')  # cut short
    products._DECISIONS.clear()
    plan = plan_for(find_adapter(model), "auto", 2)
    assert measured == [[1, 2], [1, 2]]
    assert json.loads(kept.read_text()).keys() == {str(m) for m in (1, 2, *products.WIDE_ROWS)}
    assert set(plan.timings) == {1, 2}
    assert [p.name for p in own_decisions.iterdir()] == [kept.name], "no temporary file is left"


def test_decisions_stay_in_the_process_when_asked_or_when_the_folder_is_not_writable(
    monkeypatch, tmp_path  # noqa: ANN001
) -> None:
    model = make_tiny("llama", 5, dtype=torch.float32)
    monkeypatch.setenv("EESD_PRODUCTS_DIR", "off")
    assert products.decisions_dir() is None
    plan_for(find_adapter(model), "auto", 1)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("EESD_PRODUCTS_DIR", str(blocked / "products"))
    products._DECISIONS.clear()
    assert set(plan_for(find_adapter(model), "auto", 2).timings) == {1, 2}
    assert list(tmp_path.iterdir()) == [blocked]


def test_the_default_folder_is_in_eesds_cache(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.delenv("EESD_PRODUCTS_DIR")
    monkeypatch.setenv("EESD_CACHE_DIR", str(tmp_path / "cache"))
    assert products.decisions_dir() == tmp_path / "cache" / "products"
    monkeypatch.delenv("EESD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert products.decisions_dir() == tmp_path / "xdg" / "eesd" / "products"


class _Clock:
    """A clock under which a pass costs ``cost(transposed, passes so far)`` and nothing else."""

    def __init__(self, cost, spy: list[int]) -> None:  # noqa: ANN001
        self.cost, self.spy, self.now, self.passes = cost, spy, 0.0, 0

    def __call__(self) -> float:
        self.now += self.cost(bool(self.spy), self.passes)
        self.passes += 1
        self.spy.clear()
        return self.now


def _calibrate(cost, spy: list[int]) -> MatmulPlan:  # noqa: ANN001
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    saved = adapter.products = fixed_plan([7])
    plan = calibrate(adapter, 4, context=5, repeats=3, clock=_Clock(cost, spy), candidates=["transposed"])
    assert adapter.products is saved
    return plan


def test_calibration_keeps_the_faster_path(spy: list[int]) -> None:
    plan = _calibrate(lambda transposed, n: 1.0 if transposed else 2.0, spy)
    assert plan.rows == frozenset({1, 2, 3, 4})
    assert all(t == (2.0, 1.0) for t in plan.timings.values())


def test_calibration_keeps_f_linear_on_a_small_win(spy: list[int]) -> None:
    plan = _calibrate(lambda transposed, n: 1.8 if transposed else 2.0, spy)
    assert plan.rows == frozenset()


def test_calibration_keeps_f_linear_when_passes_vary_too_much(spy: list[int]) -> None:
    """The transposed passes win on medians, but one repeat in three is slow: too noisy to trust.
    Each repeat of 4 row counts both ways reads the clock 16 times."""
    plan = _calibrate(lambda transposed, n: (5.0 if n // 16 == 2 else 1.0) if transposed else 2.0, spy)
    assert plan.rows == frozenset()
    assert all(t == (2.0, 1.0) for t in plan.timings.values())


def test_calibration_keeps_f_linear_when_a_win_does_not_repeat(spy: list[int]) -> None:
    """The transposed passes win the first measurement only: its 3 repeats of 4 row counts both
    ways read the clock twice a pass."""
    first = 2 * (3 * 4 * 2)
    plan = _calibrate(lambda transposed, n: 1.0 if transposed and n < first else 2.0, spy)
    assert plan.rows == frozenset()
    assert all(t == (2.0, 2.0) for t in plan.timings.values())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
@pytest.mark.parametrize(
    ("dtype", "matmul"),
    [
        (torch.float64, "transposed"),
        (torch.float32, "transposed"),
        pytest.param(torch.float32, "onednn", marks=needs_onednn),  # it serves no float64
    ],
)
def test_short_pass_products_decode_like_transformers(family: str, dtype: torch.dtype, matmul: str) -> None:
    """Every pass through the product (plain, early exit with k = 1, 3, 8), and a ragged batch."""
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
            adapter_options={"matmul": matmul},
        )
        out = dec.generate(ids, max_new_tokens=24, eos_token_id=[])
        assert 1 in dec.adapter.products.rows and dec.adapter.products.product(k + 1) == matmul
        assert torch.equal(out.sequences, expected), (family, dtype, drafter, k)
    batch = SpeculativeDecoder(
        model,
        controller="fixed",
        controller_options={"k": 2},
        drafter_options={"exit_layer": 2},
        adapter_options={"matmul": matmul},
    )
    rows = [ids[0].tolist(), ids[0, 3:].tolist()]
    out = batch.generate(rows, max_new_tokens=16, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences, strict=True):
        solo = model.generate(
            torch.tensor([row]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence.tolist() == solo[0].tolist()


@pytest.mark.parametrize("options", [{"matmul": "fastest"}, {"matmull": "auto"}])
def test_bad_adapter_options_are_config_errors(options: dict) -> None:
    with pytest.raises(ConfigError, match="matmul"):
        SpeculativeDecoder(make_tiny("llama", 0), adapter_options=options)


def test_a_large_model_calibrates_on_a_sample_of_its_layers(spy: list[int]) -> None:
    """Past ``sample_bytes`` of layer weights a pass runs fewer layers and scales their time up:
    the clock is read three times a pass, and a pass costs ``layers / sampled`` layer times plus
    the head's."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    assert products.sampled_layers(adapter, 1 << 40) == adapter.num_layers
    assert products.sampled_layers(adapter, 1) == 1
    scale = adapter.num_layers
    plan = calibrate(
        adapter,
        3,
        context=5,
        repeats=3,
        sample_bytes=1,
        candidates=["transposed"],
        clock=_Clock(lambda transposed, n: 1.0 if transposed else 2.0, spy),
    )
    assert plan.rows == frozenset({1, 2, 3})
    assert all(t == (2.0 * scale + 2.0, 1.0 * scale + 1.0) for t in plan.timings.values())


# -- oneDNN's product ----------------------------------------------------------------------------


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
    with pytest.raises(ConfigError, match="onednn"):
        plan_for(find_adapter(make_tiny("llama", 0)), "onednn", 3)  # float64


@pytest.fixture
def kinds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The product ("transposed" or "onednn") of every routed product."""
    calls: list[str] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def counting(x, weight, bias=None, name=name, original=original):  # noqa: ANN001, ANN202
            calls.append(name)
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", counting)
    return calls


@needs_onednn
def test_calibration_keeps_the_fastest_product_for_each_row_count(kinds: list[str]) -> None:
    """F.linear costs 2, the transposed product 1 for one row and 3 for more, oneDNN's 1.5."""
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    state = {"now": 0.0, "m": 1}
    forward = adapter.run_layers

    def run_layers(hidden, *args, **kwargs):  # noqa: ANN001, ANN202
        state["m"] = hidden.shape[1]
        return forward(hidden, *args, **kwargs)

    adapter.run_layers = run_layers  # type: ignore[method-assign]

    def clock() -> float:
        used = set(kinds)
        kinds.clear()
        if "onednn" in used:
            cost = 1.5
        elif "transposed" in used:
            cost = 1.0 if state["m"] == 1 else 3.0
        else:
            cost = 2.0
        state["now"] += cost
        return state["now"]

    plan = calibrate(adapter, 4, context=5, repeats=3, clock=clock)
    assert plan.rows == frozenset({1, 2, 3, 4}) and plan.onednn == frozenset({2, 3, 4})
    assert plan.product(1) == "transposed" and plan.product(3) == "onednn"
    assert "oneDNN's for passes over m = 2, 3, 4" in plan.describe()


@needs_onednn
def test_a_planned_row_count_runs_its_product(kinds: list[str]) -> None:
    adapter = find_adapter(make_tiny("qwen2", 0, dtype=torch.float32))
    adapter.products = MatmulPlan(frozenset({1, 3}), onednn=frozenset({3}))
    cache = adapter.new_cache()
    for position, m, expected in ((0, 3, "onednn"), (3, 1, "transposed"), (4, 2, None)):
        kinds.clear()
        with torch.no_grad():  # a decoding pass (under autograd every pass keeps F.linear)
            adapter.logits(
                adapter.norm(adapter.run_layers(adapter.embed(torch.arange(m)), 0, 4, cache, position))
            )
        assert set(kinds) == ({expected} if expected else set()), m


def test_an_exit_head_runs_its_copies_and_rows_through_the_plan(spy: list[int]) -> None:
    """A draft step's head (copied layers, a vocabulary subset's rows) uses the product its row
    count is planned for, as the target's layers do; training (gradients on) keeps F.linear."""
    adapter = find_adapter(make_tiny("qwen2", 0, dtype=torch.float32))
    adapter.products = fixed_plan([1, 2])
    copies = [adapter.copy_layer(adapter.num_layers - 1, 0)]
    rows = adapter.lm_head_weight[:16]
    per_layer = 7  # q, k, v, o, gate, up, down
    for m, planned in ((1, True), (2, True), (3, False)):
        hidden = adapter.embed(torch.arange(m))
        with torch.no_grad():
            expected = [F.linear(adapter.norm(hidden), rows)]
            spy.clear()
            out = adapter.run_copies(copies, hidden, adapter.new_cache(1), 0)
            logits = adapter.lm_logits(adapter.norm(out), rows)
            routed = list(spy)
            torch.testing.assert_close(adapter.lm_logits(adapter.norm(hidden), rows), expected[0])
        assert routed == ([m] * (per_layer + 1) if planned else []), m
        assert logits.shape == (1, m, 16)
    spy.clear()
    out = adapter.run_copies(copies, adapter.embed(torch.arange(1)), adapter.new_cache(1), 0)
    adapter.lm_logits(adapter.norm(out), rows).sum().backward()
    assert spy == [] and copies[0].mlp.up_proj.weight.grad is not None


@needs_onednn
def test_a_per_shape_product_sends_each_matrix_to_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = find_adapter(make_tiny("qwen2", 0, dtype=torch.float32))
    shapes = {tuple(m.weight.shape) for m in adapter._layers[0].modules() if type(m) is torch.nn.Linear}
    tall = max(shapes)  # one shape transposed, every other (and the LM head) through oneDNN
    adapter.products = MatmulPlan(frozenset({2}), shapes={2: ((tall, "transposed"), (None, "onednn"))})
    seen: list[tuple[str, tuple[int, ...]]] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def counting(x, weight, bias=None, name=name, original=original):  # noqa: ANN001, ANN202
            seen.append((name, tuple(weight.shape)))
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", counting)
    cache = adapter.new_cache()
    hidden = adapter.embed(torch.arange(2))
    expected = F.linear(
        adapter.norm(adapter.run_layers(hidden, 0, 4, adapter.new_cache(), 0)), adapter.lm_head_weight
    )
    seen.clear()
    with torch.no_grad():
        out = adapter.logits(adapter.norm(adapter.run_layers(hidden, 0, 4, cache, 0)))
    assert seen and all((name == "transposed") == (shape == tall) for name, shape in seen)
    assert {name for name, _ in seen} == {"transposed", "onednn"}
    torch.testing.assert_close(out, expected[0], atol=1e-5, rtol=1e-4)
    assert "the faster of the two for each matrix shape for passes over m = 2" in adapter.products.describe()


@needs_onednn
def test_each_shape_gets_the_product_that_is_faster_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a clock where the transposed product is the faster for wide-output matrices only,
    and the plan for every such shape is the transposed one, for every other oneDNN's."""
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


@needs_onednn
def test_a_wide_pass_runs_its_buckets_product(kinds: list[str]) -> None:
    adapter = find_adapter(make_tiny("qwen2", 0, dtype=torch.float32))
    adapter.products = MatmulPlan(wide={32: "onednn"})
    cache = adapter.new_cache(capacity=80)
    for position, m, expected in ((0, 20, {"onednn"}), (20, 3, set()), (23, 40, set())):
        kinds.clear()
        with torch.no_grad():
            hidden = adapter.run_layers(adapter.embed(torch.arange(m)), 0, 4, cache, position)
            adapter.logits(adapter.norm(hidden))
        assert set(kinds) == expected, m


@needs_onednn
def test_wide_buckets_are_measured_once_and_kept(monkeypatch, own_decisions) -> None:  # noqa: ANN001
    """``auto`` times the wide buckets with the first plan of a model, whatever its ``max_rows``,
    keeps them on disk with the rest, and a new process reads them."""
    model = make_tiny("llama", 6, dtype=torch.float32)
    measured = calibrations(monkeypatch, wide=True)
    first = plan_for(find_adapter(model), "auto", 2)
    plan_for(find_adapter(model), "auto", 4)
    assert measured == [list(products.WIDE_ROWS)]
    (kept,) = own_decisions.glob("*.json")
    decisions = json.loads(kept.read_text())
    for m in products.WIDE_ROWS:
        planned, (standard, onednn), product = decisions[str(m)]
        assert standard > 0 and onednn > 0 and planned == (m in first.wide)
        assert not planned or (product == "onednn" and onednn < products.MARGIN * standard)
    products._DECISIONS.clear()
    assert plan_for(find_adapter(model), "auto", 2).wide == first.wide and len(measured) == 1


def test_wide_passes_keep_f_linear_where_onednn_does_not_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "onednn_serves", lambda dtype, device: False)
    measured = calibrations(monkeypatch, wide=True)
    plan = plan_for(find_adapter(make_tiny("llama", 7, dtype=torch.float32)), "auto", 2)
    assert plan.wide == {} and measured == [] and 40 not in plan


@needs_onednn
def test_a_calibration_without_the_head_runs_no_lm_head(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = find_adapter(make_tiny("llama", 1, dtype=torch.float32))
    monkeypatch.setattr(adapter, "logits", lambda hidden: pytest.fail("the LM head ran"))
    plan = calibrate(adapter, 40, only=[20, 40], repeats=2, candidates=["onednn"], head=False)
    assert set(plan.timings) == {20, 40} and all(a > 0 and b > 0 for a, b in plan.timings.values())
