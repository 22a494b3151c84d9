"""Fixtures of the linear-products tests: a decisions folder per test, spies on the products, a
fake calibration, and decisions seeded for a model as if it had been timed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from eesd_products import products
from eesd_products.products import EXACT_ROWS, WIDE_ROWS, MatmulPlan


class Boot:
    """The machine's boot as the products see it in a test: ``boot-1`` until ``restarts`` moves on."""

    def __init__(self) -> None:
        self.restarts = 0

    def __call__(self) -> str:
        return f"boot-{self.restarts + 1}"


@pytest.fixture(autouse=True)
def own_decisions(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Each test keeps calibrations in a folder of its own, starts with no decisions in the
    process, and runs without the user's switches."""
    monkeypatch.setenv("EESD_PRODUCTS_DIR", str(tmp_path / "products"))
    monkeypatch.delenv("EESD_PRODUCTS", raising=False)
    monkeypatch.delenv("EESD_PRODUCTS_BUDGET", raising=False)
    monkeypatch.setattr(products, "_boot", Boot())
    products._DECISIONS.clear()
    yield tmp_path / "products"
    products._DECISIONS.clear()


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


@pytest.fixture
def kinds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The product ("transposed" or "onednn") of every product that ran."""
    calls: list[str] = []
    for name in ("transposed", "onednn"):
        original = getattr(products, f"{name}_linear")

        def counting(x, weight, bias=None, name=name, original=original):  # noqa: ANN001, ANN202
            calls.append(name)
            return original(x, weight, bias)

        monkeypatch.setattr(products, f"{name}_linear", counting)
    return calls


class FakeCalibration:
    """Stands for :func:`calibrate`: records the row counts asked, decides ``wins`` (row count
    -> product; the others keep F.linear) without running a pass."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []
        self.wins: dict[int, str] = {}

    def __call__(self, adapter, max_rows, *, only=None, **options) -> MatmulPlan:  # noqa: ANN001
        counts = sorted(only or range(1, max_rows + 1))
        self.asked.append(counts)
        won = {m: kind for m, kind in self.wins.items() if m in counts}
        return MatmulPlan(
            frozenset(won),
            {m: (2.0, 1.0 if m in won else 2.0) for m in counts},
            frozenset(m for m, kind in won.items() if kind == "onednn"),
        )


@pytest.fixture
def fake_calibration(monkeypatch: pytest.MonkeyPatch) -> FakeCalibration:
    """Calibrations decided without timing, and decisions read from disk trusted as they are."""
    fake = FakeCalibration()
    monkeypatch.setattr(products, "calibrate", fake)
    monkeypatch.setattr(
        products, "_still_winning", lambda adapter, chosen, deadline: dict.fromkeys(chosen, True)
    )
    return fake


@pytest.fixture
def seed() -> Callable[..., None]:
    """``seed(model, {m: product})``: every row count of ``model`` decided as if timed at this
    thread count, the listed ones (short row counts or wide buckets) for their product, the
    others for F.linear."""

    def seeding(model: torch.nn.Module, chosen: dict[int, products.Product]) -> None:
        known = {m: (m in chosen, (2.0, 1.0), chosen.get(m, "transposed")) for m in range(1, EXACT_ROWS + 1)}
        known.update({m: (m in chosen, (2.0, 1.0), chosen.get(m, "onednn")) for m in WIDE_ROWS})
        decisions = products._Decisions(known)  # type: ignore[arg-type]
        products._DECISIONS.setdefault(model, {})[torch.get_num_threads()] = decisions

    return seeding
