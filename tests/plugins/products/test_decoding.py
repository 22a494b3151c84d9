"""Decoding through the products: the tokens transformers gives, a model left as it was, and the
options that choose them."""

from __future__ import annotations

from types import SimpleNamespace

import eesd_products
import pytest
import torch
from eesd_products import products
from eesd_products.products import CpuProducts, linear_of, onednn_serves
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter

ONEDNN = onednn_serves(torch.float32, torch.device("cpu"))
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear for float32 on the CPU")
# Seeded decisions of "auto": a product per row count, the per-shape one included, and wide passes
# (the prompts' prefills) through oneDNN.
MIXED_SEED = {1: "transposed", 2: "onednn", 9: "onednn", 32: "onednn"}


def _seeded(model: torch.nn.Module, seed) -> None:  # noqa: ANN001
    layer = model.model.layers[0]
    tall = max(tuple(m.weight.shape) for m in layer.modules() if type(m) is torch.nn.Linear)
    table = ((tall, "transposed"), (None, "onednn"))
    seed(model, {**MIXED_SEED, 3: table, 4: table, 6: table})


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma3"]


def _case(family: str, dtype: torch.dtype, choice: str) -> object:
    marks = needs_onednn if choice != "transposed" else ()
    return pytest.param(family, dtype, choice, marks=marks, id=f"{family}-{str(dtype)[6:]}-{choice}")


CASES = [
    *[_case(family, torch.float64, "transposed") for family in FAMILIES],
    # decisions seeded per row count: each product, the per-shape one included
    *[_case(family, torch.float32, "auto") for family in FAMILIES],
    *[_case(family, torch.float32, "transposed") for family in ("qwen2", "gemma3")],
    *[_case(family, torch.float32, "onednn") for family in ("llama", "gemma3")],
]


@pytest.mark.parametrize(("family", "dtype", "choice"), CASES)
def test_products_decode_like_transformers(family: str, dtype: torch.dtype, choice: str, seed) -> None:  # noqa: ANN001
    """Every pass through the products (plain, early exit with k = 1 and 8), and a ragged batch."""
    model = make_tiny(family, 3, dtype=dtype)
    if choice == "auto":
        _seeded(model, seed)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    for drafter, k in ((None, 0), ("early_exit", 1), ("early_exit", 8)):
        dec = SpeculativeDecoder(
            model,
            drafter=drafter,
            drafter_options={"exit_layer": 2} if drafter else None,
            controller="fixed",
            controller_options={"k": k} if drafter else None,
            adapter_options={"products": choice},
        )
        out = dec.generate(ids, max_new_tokens=24, eos_token_id=[])
        fixed = choice if choice != "auto" else "transposed"
        assert dec.adapter.products.product(1) is linear_of(fixed)
        assert torch.equal(out.sequences, expected), (family, dtype, drafter, k)
    batch = SpeculativeDecoder(
        model,
        controller="fixed",
        controller_options={"k": 2},
        drafter_options={"exit_layer": 2},
        adapter_options={"products": choice},
    )
    rows = [ids[0].tolist(), ids[0, 3:].tolist()]
    out = batch.generate(rows, max_new_tokens=16, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences, strict=True):
        solo = model.generate(
            torch.tensor([row]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence.tolist() == solo[0].tolist()


def _tree(model: torch.nn.Module) -> list[tuple[str, int, type]]:
    return [(name, id(module), type(module)) for name, module in model.named_modules()]


def _untouched(model: torch.nn.Module) -> None:
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            assert "forward" not in vars(module) and type(module).forward is torch.nn.Linear.forward


@needs_onednn
def test_decoding_with_products_never_modifies_the_model(monkeypatch: pytest.MonkeyPatch, seed) -> None:  # noqa: ANN001
    """Not during a pass (looked at from inside every product), not after: every ``nn.Linear``
    keeps its class's ``forward``, and the module tree is the same objects."""
    model = make_tiny("qwen2", 4, dtype=torch.float32)
    _seeded(model, seed)
    tree = _tree(model)
    inside: list[int] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def looking(x, weight, bias=None, original=original):  # noqa: ANN001, ANN202
            _untouched(model)
            inside.append(1)
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", looking)
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
    )
    dec.generate(torch.arange(3, 12).view(1, -1), max_new_tokens=12, eos_token_id=[])
    assert inside, "the products ran"
    _untouched(model)
    assert _tree(model) == tree


# -- which products, by option and environment -------------------------------------------------------


def test_the_adapter_option_chooses_the_products(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny("qwen2", 0, dtype=torch.float32)
    fixed = find_adapter(model, {"products": "transposed"}).products
    assert isinstance(fixed, CpuProducts) and fixed.describe() == "transposed product for every pass"
    assert fixed.product(1) is fixed.product(300) is linear_of("transposed")
    assert find_adapter(model, {"products": "standard"}).products is None
    auto = find_adapter(model).products
    assert isinstance(auto, CpuProducts) and auto.fixed is None
    assert auto.describe().startswith("timed at the first pass")
    monkeypatch.setenv("EESD_PRODUCTS", "standard")
    assert find_adapter(model).products is None
    assert find_adapter(model, {"products": "transposed"}).products is not None, "an explicit choice stands"


def test_auto_keeps_f_linear_for_float64_models() -> None:
    """float64 models are reference computations (the test oracles): no timing decides them."""
    assert find_adapter(make_tiny("llama", 0)).products is None


@pytest.mark.parametrize("options", [{"products": "nonsense"}, {"productss": "auto"}])
def test_bad_adapter_options_are_config_errors(options: dict) -> None:
    with pytest.raises(ConfigError, match="products"):
        SpeculativeDecoder(make_tiny("llama", 0), adapter_options=options)


def test_a_bad_environment_switch_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EESD_PRODUCTS", "fast")
    with pytest.raises(ConfigError, match="EESD_PRODUCTS=standard"):
        find_adapter(make_tiny("llama", 0, dtype=torch.float32))


def test_onednn_needs_a_model_it_serves() -> None:
    with pytest.raises(ConfigError, match="products='onednn'.*products='transposed'"):
        find_adapter(make_tiny("llama", 0), {"products": "onednn"})  # float64


class _StandIn:
    """An adapter as the hook sees it, on ``device``."""

    def __init__(self, device: str, dtype: torch.dtype = torch.float32) -> None:
        self.model = SimpleNamespace(model=SimpleNamespace(layers=[]), lm_head=None)
        self.device, self.dtype = torch.device(device), dtype


def _stand_in(device: str, dtype: torch.dtype = torch.float32) -> _StandIn:
    return _StandIn(device, dtype)


@pytest.mark.parametrize("choice", ["transposed", "onednn"])
def test_a_cpu_product_on_another_device_is_a_config_error(choice: str) -> None:
    with pytest.raises(ConfigError, match="use products='auto'"):
        eesd_products.eesd_linear_products(adapter=_stand_in("meta"), choice=choice)


def test_the_hook_leaves_what_it_does_not_serve_to_others() -> None:
    hook = eesd_products.eesd_linear_products
    assert hook(adapter=_stand_in("meta"), choice="auto") is None
    assert hook(adapter=_stand_in("cpu", torch.float16), choice="auto") is None
    assert hook(adapter=_stand_in("cpu"), choice="nonsense") is None
    assert hook(adapter=SimpleNamespace(model=SimpleNamespace()), choice="transposed") is None
    assert isinstance(hook(adapter=_stand_in("cpu", torch.bfloat16), choice="auto"), CpuProducts)
