"""Faster products for the linear layers of short passes (decoding steps, verification) on CPUs.

Several CPU BLAS back-ends multiply a few rows by a matrix row by row. ``(W @ x.T).T``
(:func:`transposed_linear`), oneDNN's linear (:func:`onednn_linear`) and, shape by shape, the
faster of the two read the weights once a pass instead. Which wins depends on the CPU, the thread
count, the shapes and the row count, so :class:`CpuProducts` times passes of the model itself at
its first pass (a prefill, whose time is no round's cost), within a budget, keeps a product only
where it beats ``F.linear`` clearly twice, and keeps the decisions on disk, re-checked by the
first process of each boot that reads them.
Only the order of floating-point sums changes, and the verifier judges whatever p the target
computes: decoding stays lossless.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eesd_core.errors import ConfigError

PRODUCTS = ("transposed", "onednn")  # the products other than F.linear, by name
# Another product must beat F.linear by this much, pass for pass and in two measurements, to be
# used: F.linear is the product transformers itself uses, and a shared machine's passes vary.
MARGIN = 0.9
PRODUCTS_VERSION = 4  # changes with the products or their timing, so that older decisions are not read
EXACT_ROWS = 16  # passes over up to this many positions are decided row count by row count
FIRST_ROWS = 9  # the first pass decides the row counts 1 .. FIRST_ROWS (and its own, if short)
# Wider passes (prefills, large batches) take the decision of the first of these at or above their
# row count (the last beyond it): oneDNN's product or F.linear, timed without the LM head (a
# prefill's reads one position) on a smaller sample of layers: with 32 rows or more a product is
# bound by its arithmetic more than by reading the weights, so a layer times alike from the cache.
WIDE_ROWS = (32, 64, 128, 256, 512)
WIDE_SAMPLE_BYTES = 16 << 20
WIDE = {"candidates": ["onednn"], "sample_bytes": WIDE_SAMPLE_BYTES, "head": False, "repeats": 3}
BUDGET = 6.0  # seconds a first pass may spend deciding (EESD_PRODUCTS_BUDGET); the rest waits for later
RECHECK_REPEATS = 3  # timed repeats of the sweep that re-checks the decisions read from disk
NAMES = {"transposed": "transposed product", "onednn": "oneDNN's product"}

Linear = Callable[..., torch.Tensor]  # (x, weight, bias) -> F.linear(x, weight, bias)


def _last_level_cache() -> int:
    """Bytes of the CPU's last-level cache as Linux reports it (0 where it does not)."""
    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            size = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            sizes[int((index / "level").read_text())] = int(size.rstrip("KMG")) * scale
    return sizes[max(sizes)] if sizes else 0


# Decoder-layer weights a calibration pass reads at most (the rest of the layers are extrapolated):
# enough that they come from memory, as a whole pass's do; a sample that stays in the cache hides
# what reading each weight once saves.
SAMPLE_BYTES = max(128 << 20, 4 * _last_level_cache())


def transposed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T`` (weights read once).

    A single row is padded with a row of zeros, which keeps it on the GEMM path. Several rows, and
    their result, are row-major: a GEMM over column-major rows (``.T`` of a result, kept by an MLP's
    ``act(gate(x)) * up(x)``) reads the weights slowly.
    """
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1:
        padded = rows.new_zeros(2, rows.shape[1])
        padded[0] = rows[0]
        out = (weight @ padded.t()).t()[:1]
    else:
        out = (weight @ rows.contiguous().t()).t().contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN's matmul on the weights as they are (nothing is
    packed or copied ahead of time, so it costs no memory)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])


def onednn_serves(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`onednn_linear` runs here, for weights of ``dtype`` on ``device``, and agrees
    with ``F.linear`` on a small product (a torch built without it, or a later torch that renamed
    the operator, keeps to the other products)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(24, 16, generator=gen, device=device).to(dtype)
    x = torch.randn(3, 16, generator=gen, device=device).to(dtype)
    try:
        out = onednn_linear(x, weight)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    expected = torch.nn.functional.linear(x, weight)
    return bool(torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=2e-2))


# A product: "transposed", "onednn", or per matrix shape ((rows, cols), product) pairs, with
# (None, product) for shapes not listed (``MatmulPlan.shapes``).
Product = str | tuple[tuple[tuple[int, int] | None, str], ...]


def _for_weight(product: Product, weight: torch.Tensor) -> str:
    if isinstance(product, str):
        return product
    chosen = dict(product)
    return chosen.get(tuple(weight.shape), chosen[None])  # type: ignore[call-overload, arg-type]


def product_linear(product: Product, x: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``product`` (for this weight's shape)."""
    multiply = transposed_linear if _for_weight(product, weight) == "transposed" else onednn_linear
    return multiply(x, weight, bias)


class _ByShape:
    """A per-shape product as a function of ``(x, weight, bias)``: one dict lookup a matrix."""

    __slots__ = ("default", "table")

    def __init__(self, product: tuple[tuple[tuple[int, int] | None, str], ...]) -> None:
        table = dict(product)
        self.default = table.pop(None, "onednn")
        self.table = table

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> torch.Tensor:
        name = self.table.get(weight.shape, self.default)  # type: ignore[call-overload, arg-type]
        return (transposed_linear if name == "transposed" else onednn_linear)(x, weight, bias)


_LINEARS: dict[Product, Linear] = {}


def linear_of(product: Product) -> Linear:
    """The ``(x, weight, bias)`` function of ``product``, made once per product and reused."""
    found = _LINEARS.get(product)
    if found is None:
        found = partial(product_linear, product) if isinstance(product, str) else _ByShape(product)
        found = _LINEARS.setdefault(product, found)
    return found


@dataclass(frozen=True)
class MatmulPlan:
    """Which row counts m leave ``F.linear``, for which product, and the timings that chose them.

    ``rows`` are the row counts that use another product: oneDNN's for those in ``onednn``, the
    transposed product for the rest. ``timings[m]`` is (standard, other) median seconds of a
    whole pass over m positions, the other being the fastest of the rest; for a row count that won
    the first measurement, those of the second, which decided.
    """

    rows: frozenset[int] = frozenset()
    timings: dict[int, tuple[float, float]] = field(default_factory=dict)
    onednn: frozenset[int] = frozenset()
    shapes: dict[int, Product] = field(default_factory=dict)  # m -> a product per matrix shape
    wide: dict[int, Product] = field(default_factory=dict)  # a WIDE_ROWS bucket -> its product

    def _bucket(self, m: int) -> int | None:
        """The bucket that decides a pass over m positions, past ``EXACT_ROWS`` and not in ``rows``."""
        if m in self.rows or m <= EXACT_ROWS or not self.wide:
            return None
        return _bucket(m)

    def __contains__(self, m: int) -> bool:
        return m in self.rows or self._bucket(m) in self.wide

    def product(self, m: int) -> Product:
        """The product of passes over m positions (planned ones: :meth:`__contains__`)."""
        bucket = self._bucket(m)
        if bucket in self.wide:
            return self.wide[bucket]  # type: ignore[index]
        return self.shapes.get(m) or ("onednn" if m in self.onednn else "transposed")

    def describe(self) -> str:
        if not self.rows and not self.wide:
            return "standard F.linear for every pass"
        parts, alone = [], self.rows - set(self.shapes)
        for name, rows in (
            ("transposed product", alone - self.onednn),
            ("oneDNN's", alone & self.onednn),
            ("the faster of the two for each matrix shape", set(self.shapes)),
        ):
            if rows:
                parts.append(f"{name} for passes over m = " + ", ".join(str(m) for m in sorted(rows)))
        if self.wide:
            name = "oneDNN's" if set(self.wide.values()) == {"onednn"} else "the measured product"
            parts.append(f"{name} for wider passes over m = " + _wide_spans(sorted(self.wide), merge=False))
        return "; ".join(parts)


def _bucket(m: int) -> int:
    return next((bucket for bucket in WIDE_ROWS if bucket >= m), WIDE_ROWS[-1])


def _wide_spans(buckets: Sequence[int], merge: bool = True) -> str:
    """The row counts the buckets decide, ``17-32, 257-512 and more`` (adjacent ones merged)."""
    edges = dict(zip(WIDE_ROWS, [EXACT_ROWS, *WIDE_ROWS], strict=False))
    spans: list[list[int]] = []
    for bucket in buckets:
        if merge and spans and spans[-1][1] == edges[bucket]:
            spans[-1][1] = bucket
        else:
            spans.append([edges[bucket] + 1, bucket])
    return ", ".join(f"{lo}-{hi}" + " and more" * (hi == WIDE_ROWS[-1]) for lo, hi in spans)


def _passes_over(counts: Sequence[int]) -> str:
    """``passes over 1-3, 5 positions``; wide buckets as the row counts they decide."""
    spans: list[list[int]] = []
    for m in (m for m in counts if m <= EXACT_ROWS):
        if spans and spans[-1][1] == m - 1:
            spans[-1][1] = m
        else:
            spans.append([m, m])
    parts = [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans]
    wide = [m for m in counts if m > EXACT_ROWS]
    text = ", ".join([*parts, *([_wide_spans(wide)] if wide else [])])
    return f"passes over {text} position" + "s" * (text != "1")


Samples = dict[int, dict[str, list[float]]]  # m -> product ("standard" too) -> seconds


def _measure(
    run: Callable[[int, str], float], counts: list[int], repeats: int, kinds: list[str], warm: bool = True
) -> Samples:
    """The times ``run(m, kind)`` returns, ``repeats`` each, for each m and each product in ``kinds``,
    after one untimed run of each (unless ``warm`` is false: they ran just before).

    Repeats sweep all row counts, up and down in turn, and reverse the order of the products, so a
    drift of the machine's speed falls on every product and on every m alike.
    """
    for m in counts if warm else ():
        for kind in kinds:
            run(m, kind)
    times: Samples = {m: {kind: [] for kind in kinds} for m in counts}
    for r in range(repeats):
        for m in counts if r % 2 == 0 else reversed(counts):
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                times[m][kind].append(run(m, kind))
    return times


def _wins(standard: list[float], other: list[float]) -> bool:
    """Clearly faster: each pass paired with the F.linear pass timed next to it (so that a drift of
    the machine's speed falls on both), a median ratio below ``MARGIN`` and a mean ratio below 1
    (passes that are now and then much slower lose). Otherwise F.linear."""
    ratios = [o / s for s, o in zip(standard, other, strict=True)]
    return statistics.median(ratios) < MARGIN and statistics.fmean(ratios) < 1.0


def _apart(standard: list[float], other: list[float]) -> bool:
    """Passes clearly apart: every one of the other product's below ``MARGIN`` of F.linear's
    fastest (a clear win, which more repeats would not change), or slower than its slowest."""
    return max(other) < MARGIN * min(standard) or min(other) > max(standard)


def _holds(standard: list[float], other: list[float]) -> bool:
    """Still faster at a re-check: a median below F.linear's. A looser bar than :func:`_wins`, so
    that a product adopted by a narrow margin is not dropped and timed again by every process."""
    return statistics.median(other) < statistics.median(standard)


def _choice(samples: dict[str, list[float]]) -> str | None:
    """Of the products that beat F.linear clearly, the one with the lowest median; or None."""
    winners = [k for k in samples if k != "standard" and _wins(samples["standard"], samples[k])]
    return min(winners, key=lambda k: statistics.median(samples[k])) if winners else None


# -- timing passes of the model ------------------------------------------------------------------

_FREE = object()
# The product every pass of this context takes, whatever its row count, while a calibration or a
# re-check times one (None: F.linear); _FREE otherwise. Being the plug-in's own, it reaches the
# adapter's passes through CpuProducts.product, so those passes never start a calibration.
_FORCED: ContextVar[Any] = ContextVar("eesd_products_forced", default=_FREE)


def _clock() -> float:
    """The clock that times the passes of :class:`CpuProducts`' calibrations."""
    return time.perf_counter()


def _now() -> float:
    """The clock of calibration budgets and of the seconds they report."""
    return time.monotonic()


def _model_layers(adapter: Any) -> Sequence[nn.Module]:
    """The model's own decoder layers (an adapter's shadow layers register no linear weights)."""
    return adapter.model.model.layers  # type: ignore[no-any-return]


class _Passes:
    """Timed passes of the first ``layers`` decoder layers of an adapter's model (and, with
    ``head``, its final norm and LM head) over m positions after ``context`` cached ones, on a
    scratch cache, each through the product it is given. The sampled layers stand for all: their
    time is scaled to the model's layer count. Run inside ``inference_mode`` with ``_FORCED`` set."""

    def __init__(
        self, adapter: Any, layers: int, head: bool, context: int, clock: Callable[[], float], rows: int
    ) -> None:
        self.adapter, self.layers, self.head, self.context, self.clock = adapter, layers, head, context, clock
        self.scale = adapter.num_layers / layers
        self.whole = head and layers == adapter.num_layers
        self.cache = adapter.new_cache(capacity=context + rows)
        self.inputs: dict[int, torch.Tensor] = {}
        adapter.run(self._input(context), 0, layers, self.cache, 0)

    def _input(self, m: int) -> torch.Tensor:
        if m not in self.inputs:
            ids = torch.zeros(m, dtype=torch.long, device=self.adapter.device)
            self.inputs[m] = self.adapter.embed(ids)
        return self.inputs[m]

    def __call__(self, m: int, linear: Linear | None) -> float:
        adapter, clock, hidden = self.adapter, self.clock, self._input(m)
        token = _FORCED.set(linear)
        try:
            start = clock()
            hidden = adapter.run(hidden, 0, self.layers, self.cache, self.context)
            if self.whole:
                adapter.logits(adapter.norm(hidden))
                return clock() - start
            middle = clock()
            if self.head:
                adapter.logits(adapter.norm(hidden))
            return self.scale * (middle - start) + (clock() - middle if self.head else 0.0)
        finally:
            _FORCED.reset(token)
            self.cache.crop(self.context)


def calibrate(
    adapter: Any,
    max_rows: int,
    *,
    context: int = 64,
    repeats: int = 5,
    screen: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    only: Iterable[int] | None = None,
    sample_bytes: int = SAMPLE_BYTES,
    candidates: Iterable[str] | None = None,
    head: bool = True,
    budget: float | None = None,
) -> MatmulPlan:
    """Time passes of the adapter's model over m = 1 .. ``max_rows`` positions (or the row counts
    in ``only``), in that order, with ``F.linear`` and with each of ``candidates``: "transposed",
    "onednn", or "mixed", for each matrix shape the faster of the two in a timing of the model's
    matrices of that shape (:func:`_shape_products`). By default the transposed product, and "mixed"
    too where oneDNN serves the model (a table timed on a few matrices can miss what a whole pass
    shows, so the transposed product alone is timed beside it).

    Each pass runs the decoder layers (as many as fit in ``sample_bytes``, at least one, their time
    scaled to all), the final norm and the LM head (unless ``head`` is false) after ``context``
    cached positions, on a scratch cache; the model's weights are only read. A first measurement
    (``screen`` repeats) looks for products that win clearly (:func:`_wins`); where one does, all
    are measured again (``repeats``), and the fastest that wins again is planned (a product whose
    passes vary then yields to a steadier one rather than to ``F.linear``). A per-shape product
    that picks one product for every shape is that product, timed once under its name. The adapter's
    passes must take their products from :class:`CpuProducts` (which consults ``_FORCED`` first).

    With a ``budget`` (seconds, read on :func:`_now`), no row count starts once it is spent, or
    where the longest one so far would overrun it: the plan's ``timings`` hold those decided. Only
    layers on the adapter's device run (:func:`runnable_layers`); with none, nothing is timed.
    """
    if min(repeats, screen) < 2:
        raise ValueError("calibration needs at least two repeats to see how much passes vary")
    if candidates is None:
        serves = onednn_serves(adapter.dtype, adapter.device)
        candidates = ["transposed", "mixed"] if serves else ["transposed"]
    others = list(candidates)
    counts = sorted(set(only)) if only is not None else list(range(1, max_rows + 1))
    deadline = None if budget is None else _now() + budget
    layers = min(sampled_layers(adapter, sample_bytes), runnable_layers(adapter))
    if not layers or not counts:
        return MatmulPlan()
    mixed: dict[int, Product] = {}
    first: Samples = {}
    again: Samples = {}

    def run(m: int, kind: str) -> float:
        product = mixed[m] if kind == "mixed" else kind
        return passes(m, None if kind == "standard" else linear_of(product))

    token = _FORCED.set(None)
    try:
        with torch.inference_mode():
            passes = _Passes(adapter, layers, head, context, clock, max(counts, default=1))
            longest = 0.0  # seconds the longest row count so far took
            for m in counts:
                began = 0.0 if deadline is None else _now()
                if deadline is not None and (began >= deadline or began + longest > deadline):
                    break
                kinds = ["standard", *others]
                if "mixed" in others:
                    table = mixed[m] = _shape_products(adapter, layers, [m], 2, clock)[m]
                    alone = {kind for shape, kind in table if shape} if isinstance(table, tuple) else {table}
                    if len(alone) <= 1:  # one product for every shape: that product, timed once
                        pure = alone.pop() if alone else "onednn"
                        kinds = list(dict.fromkeys(pure if kind == "mixed" else kind for kind in kinds))
                first.update(_measure(run, [m], screen, kinds))
                if _choice(first[m]):
                    again.update(_measure(run, [m], repeats, kinds, warm=False))
                longest = 0.0 if deadline is None else max(longest, _now() - began)
    finally:
        _FORCED.reset(token)
    chosen = {m: _choice(samples) for m, samples in again.items()}
    timings = {}
    for m, samples in (first | again).items():
        rest = [k for k in samples if k != "standard"]
        other = chosen.get(m) or min(rest, key=lambda k: statistics.median(samples[k]))
        timings[m] = (statistics.median(samples["standard"]), statistics.median(samples[other]))
    rows = frozenset(m for m, kind in chosen.items() if kind)
    onednn = frozenset(m for m, kind in chosen.items() if kind == "onednn")
    return MatmulPlan(rows, timings, onednn, {m: mixed[m] for m, kind in chosen.items() if kind == "mixed"})


def _shape_products(
    adapter: Any, layers: int, counts: list[int], repeats: int, clock: Callable[[], float]
) -> dict[int, Product]:
    """For each m, the faster of the transposed and oneDNN's product for each shape of matrix in
    the first ``layers`` decoder layers and the LM head, timed over all the matrices of that shape
    (so that they come from memory, as in a pass); unlisted shapes take oneDNN's."""
    weights: dict[tuple[int, int], list[torch.Tensor]] = {}
    for root in [*_model_layers(adapter)[:layers], adapter.model.lm_head]:
        for module in root.modules():
            if type(module) is nn.Linear:
                weights.setdefault(tuple(module.weight.shape), []).append(module.weight)  # type: ignore[arg-type]

    def sweep(shape: tuple[int, int], m: int, kind: str) -> float:
        x = torch.zeros(m, shape[1], dtype=adapter.dtype, device=adapter.device)
        start = clock()
        for weight in weights[shape]:
            product_linear(kind, x, weight)
        return clock() - start

    chosen: dict[int, Product] = {}
    with torch.inference_mode():
        for m in counts:
            best = []
            for shape in weights:
                times = _measure(partial(sweep, shape), [m], repeats, list(PRODUCTS))
                best.append((shape, min(PRODUCTS, key=lambda kind: statistics.median(times[m][kind]))))
            chosen[m] = (*sorted(best), (None, "onednn"))
    return chosen


def sampled_layers(adapter: Any, sample_bytes: int) -> int:
    """How many of the adapter's decoder layers a calibration pass runs: all of them if their
    weights fit in ``sample_bytes``, else as many as fit, and at least one."""
    stack = _model_layers(adapter)
    if not len(stack):
        return int(adapter.num_layers)
    per_layer = sum(p.numel() * p.element_size() for p in stack[0].parameters())
    if per_layer * adapter.num_layers <= sample_bytes:
        return int(adapter.num_layers)
    return max(1, min(int(adapter.num_layers), sample_bytes // max(per_layer, 1)))


def _on_device(module: nn.Module | None, device: torch.device) -> bool:
    if module is None:
        return True
    return all(t.device == device for t in itertools.chain(module.parameters(), module.buffers()))


def runnable_layers(adapter: Any) -> int:
    """How many decoder layers a timing may run: the first ones up to the first with a weight off
    the adapter's device (a proposer moves the layers it never runs to ``meta``); none where the
    embedding, the final norm or the LM head is off it."""
    device, backbone = adapter.device, adapter.model.model
    ends = [getattr(backbone, "embed_tokens", None), getattr(backbone, "norm", None), adapter.model.lm_head]
    if not all(_on_device(module, device) for module in ends):
        return 0
    return next(
        (i for i, layer in enumerate(_model_layers(adapter)) if not _on_device(layer, device)),
        len(_model_layers(adapter)),
    )


def _still_winning(
    adapter: Any,
    chosen: dict[int, Product],
    deadline: float,
    *,
    context: int = 64,
    repeats: int = RECHECK_REPEATS,
) -> dict[int, bool]:
    """Whether each product of ``chosen`` (row count or wide bucket -> product) is still faster
    than ``F.linear`` (:func:`_holds`), in one interleaved sweep over all of them: passes of the
    sample of decoder layers a calibration times (scaled to all; a smaller one, served from the
    cache, would judge otherwise), without the LM head (one matrix, which on a large vocabulary
    would cost as much as the layers' sample),
    after one untimed pass of ``F.linear`` and one of each product that goes through oneDNN (whose
    first pass of a shape makes its primitive). Two repeats time every row count, up and down, so
    that a drift of the machine's speed falls on both products and every row count alike; up to
    ``repeats`` in all time those whose products' passes do not yet lie clearly apart
    (:func:`_apart`).

    No row count starts past ``deadline`` (read on :func:`_now`), or where its last repeat would
    end past it; those with fewer than two timed repeats by then are left out of the answer (not
    re-checked). Nothing is timed, and the answer is empty, without a runnable layer."""
    counts = sorted(chosen)
    if not counts or not runnable_layers(adapter) or _now() >= deadline:
        return {}
    linears = {m: linear_of(product) for m, product in chosen.items()}
    sample = min(sampled_layers(adapter, SAMPLE_BYTES), runnable_layers(adapter))  # as they were decided
    wide_sample = min(sampled_layers(adapter, WIDE_SAMPLE_BYTES), runnable_layers(adapter))
    times: Samples = {m: {"standard": [], "chosen": []} for m in counts}
    token = _FORCED.set(None)
    try:
        with torch.inference_mode():
            short, wide = [m for m in counts if m <= EXACT_ROWS], [m for m in counts if m > EXACT_ROWS]
            passes = {
                is_short: _Passes(adapter, layers, False, context, _clock, max(group))
                for is_short, group, layers in ((True, short, sample), (False, wide, wide_sample))
                if group
            }

            def run(m: int, kind: str) -> float:
                return passes[m <= EXACT_ROWS](m, linears[m] if kind == "chosen" else None)

            run(counts[0], "standard")
            for m in counts:
                if chosen[m] != "transposed" and _now() < deadline:  # oneDNN makes a primitive per shape
                    run(m, "chosen")
            took: dict[int, float] = {}  # seconds the last repeat of each row count took
            sweep = counts
            for r in range(repeats):
                if r >= 2:
                    sweep = [m for m in sweep if not _apart(times[m]["standard"], times[m]["chosen"])]
                for m in sweep if r % 2 == 0 else reversed(sweep):
                    began = _now()
                    if began >= deadline or began + took.get(m, 0.0) > deadline:
                        break
                    for kind in ("standard", "chosen") if r % 2 == 0 else ("chosen", "standard"):
                        times[m][kind].append(run(m, kind))
                    took[m] = _now() - began
                else:
                    continue
                break
    finally:
        _FORCED.reset(token)
    return {m: _holds(t["standard"], t["chosen"]) for m, t in times.items() if len(t["chosen"]) >= 2}


# -- decisions, per model and thread count, in the process and on disk --------------------------

Decision = tuple[bool, tuple[float, float] | None, Product]  # (planned, timings, product)


def _boot() -> str | None:
    """This boot of the machine (Linux's boot id), or None where it cannot be read (decisions
    read from disk are then re-checked by every process)."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    return None


@dataclass
class _Decisions:
    """What is known of one model's passes at one thread count: ``known`` by row count (a bucket
    for wide passes); ``boots``: the boot in which each was last timed or re-checked;
    ``unchecked``: planned ones read from disk and not re-checked in this process (F.linear here,
    kept in the file); ``transient``: F.linear in this process only (left untimed by a budget),
    never written to disk; ``settled``: the first pass has decided what a generation needs."""

    known: dict[int, Decision] = field(default_factory=dict)
    boots: dict[int, str | None] = field(default_factory=dict)
    unchecked: set[int] = field(default_factory=set)
    transient: set[int] = field(default_factory=set)
    settled: bool = False

    def kept(self) -> dict[int, Decision]:
        return {m: d for m, d in self.known.items() if m not in self.transient}

    def linear(self, key: int) -> Linear | None:
        """The product of passes decided by ``key``; None (F.linear) unless planned and checked."""
        planned, _, product = self.known.get(key, (False, None, "transposed"))
        return linear_of(product) if planned and key not in self.unchecked else None

    def read(self, store: Path | None) -> list[int]:
        """Take the decisions ``store`` holds for row counts not known yet; the planned ones among
        them last timed or re-checked in an earlier boot (to re-check), in order. A product dropped
        at a re-check in an earlier boot is left out, to be timed afresh."""
        planned, now = [], _boot()
        boots: dict[int, str | None] = {}
        for m, decision in sorted(_read_decisions(store, boots).items() if store is not None else ()):
            this_boot = now is not None and boots[m] == now
            if m in self.known or (not this_boot and not decision[0] and decision[1] is None):
                continue
            self.known[m], self.boots[m] = decision, boots[m]
            if decision[0] and not this_boot:
                self.unchecked.add(m)
                planned.append(m)
        return planned


_DECISIONS: weakref.WeakKeyDictionary[Any, dict[int, _Decisions]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # one calibration at a time in a process: they would time each other


def _plan_of(known: dict[int, Decision], keys: Iterable[int]) -> MatmulPlan:
    keys = sorted(keys)
    rows = [m for m in keys if m <= EXACT_ROWS and known[m][0]]
    timings = {m: known[m][1] for m in keys if m <= EXACT_ROWS and known[m][1] is not None}
    onednn = frozenset(m for m in rows if known[m][2] == "onednn")
    shapes = {m: known[m][2] for m in rows if not isinstance(known[m][2], str)}
    wide = {m: known[m][2] for m in keys if m > EXACT_ROWS and known[m][0]}
    return MatmulPlan(frozenset(rows), timings, onednn, shapes, wide)  # type: ignore[arg-type]


class CpuProducts:
    """The products of one adapter's passes (hook ``eesd_linear_products``).

    ``fixed`` ("transposed" or "onednn"): that product for every pass. Else the first pass
    (:meth:`product`; a prefill, whose time is no round's cost) decides, within ``budget``
    seconds, all that a generation asks: row counts 1 .. ``FIRST_ROWS`` (and its own, if short),
    every ``WIDE_ROWS`` bucket, and a re-check of the decisions read from disk. A later pass only
    looks its product up, but for a short one wider than those (a batch), decided when first
    asked. Decisions are shared by the adapters of a model in the process, per thread count, and
    kept on disk.
    """

    def __init__(self, adapter: Any, fixed: str | None = None, budget: float = BUDGET) -> None:
        self._adapter = weakref.ref(adapter)
        self.fixed = fixed
        self.budget = budget
        self._fixed = None if fixed is None else linear_of(fixed)
        self._chosen: dict[int, dict[int, Linear | None]] = {}  # threads -> rows -> product

    def product(self, rows: int) -> Linear | None:
        """The ``(x, weight, bias)`` product of a pass over ``rows`` positions; None: F.linear."""
        forced = _FORCED.get()
        if forced is not _FREE:
            return forced  # type: ignore[no-any-return]
        if self._fixed is not None:
            return self._fixed
        chosen = self._chosen.get(torch.get_num_threads())
        found = _FREE if chosen is None else chosen.get(rows, _FREE)
        return self._decide(rows) if found is _FREE else found  # type: ignore[return-value]

    def _decide(self, rows: int) -> Linear | None:
        adapter, threads = self._adapter(), torch.get_num_threads()
        if adapter is None or rows < 1:
            return None
        with _LOCK:
            decisions = _DECISIONS.setdefault(adapter.model, {}).setdefault(threads, _Decisions())
            key = rows if rows <= EXACT_ROWS else _bucket(rows)
            if not decisions.settled:
                decisions.settled = True
                short = range(1, max(key if key <= EXACT_ROWS else 0, FIRST_ROWS) + 1)
                _settle(adapter, decisions, [*short, *WIDE_ROWS], self.budget)
            elif FIRST_ROWS < key <= EXACT_ROWS and key not in decisions.known:  # a batch wider than so far
                _settle(adapter, decisions, list(range(FIRST_ROWS + 1, key + 1)), self.budget)
            linear = decisions.linear(key)
            self._chosen.setdefault(threads, {})[rows] = linear
        return linear

    def describe(self) -> str:
        """What passes multiply with, in words (so far, at this thread count)."""
        if self.fixed is not None:
            return f"{NAMES[self.fixed]} for every pass"
        adapter = self._adapter()
        decisions = (
            None if adapter is None else _DECISIONS.get(adapter.model, {}).get(torch.get_num_threads())
        )
        if decisions is None or not decisions.known:
            return "timed at the first pass (none has run yet): F.linear until then"
        text = _plan_of(decisions.known, decisions.kept().keys() - decisions.unchecked).describe()
        if decisions.transient:
            text += f"; F.linear in this process, not timed, for {_passes_over(sorted(decisions.transient))}"
        if decisions.unchecked:
            text += (
                f"; F.linear in this process, not re-checked, for {_passes_over(sorted(decisions.unchecked))}"
            )
        return text


def products_for(adapter: Any, choice: str) -> CpuProducts | None:
    """The products of ``choice`` for ``adapter`` (see :func:`eesd_products.eesd_linear_products`)."""
    device, dtype = adapter.device, adapter.dtype
    if choice == "auto":
        if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
            return None
        return CpuProducts(adapter, budget=budget_seconds())
    if device.type != "cpu":
        raise ConfigError(
            f"products={choice!r} is a product for CPUs, and this model is on {device}: use "
            "products='auto' (which keeps F.linear there) or 'standard'."
        )
    if choice == "onednn" and not onednn_serves(dtype, device):
        raise ConfigError(
            f"products='onednn' needs a torch built with oneDNN and float32 or bfloat16 weights on the "
            f"CPU (this model: {dtype} on {device}): use products='transposed', 'auto' or 'standard'."
        )
    return CpuProducts(adapter, fixed=choice)


def budget_seconds() -> float:
    """The seconds the first pass may spend deciding: ``$EESD_PRODUCTS_BUDGET``, else :data:`BUDGET`."""
    raw = os.environ.get("EESD_PRODUCTS_BUDGET", "").strip()
    if not raw:
        return BUDGET
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(
            f"EESD_PRODUCTS_BUDGET={raw!r}: give the seconds a first timing of linear products may take "
            f"(default {BUDGET:g}; 'inf' for no limit)."
        )
    return value


def _settle(adapter: Any, decisions: _Decisions, group: list[int], budget: float) -> None:
    """Decide the row counts (or buckets) of ``group`` not yet known, from disk or by timing them,
    and re-check the planned decisions newly read from disk, all within ``budget`` seconds."""
    store = _store_file(adapter)
    recheck = decisions.read(store)
    missing = [m for m in group if m not in decisions.known]
    if not missing and not recheck:
        return
    wide = [m for m in missing if m > EXACT_ROWS]
    if wide and not onednn_serves(adapter.dtype, adapter.device):
        decisions.known.update({m: (False, None, "onednn") for m in wide})  # nothing to compare with
        decisions.boots.update(dict.fromkeys(wide, _boot()))
        missing = [m for m in missing if m <= EXACT_ROWS]
    if not runnable_layers(adapter):  # no layer to time on the adapter's device: F.linear here
        decisions.known.update(
            {m: (False, None, "transposed" if m <= EXACT_ROWS else "onednn") for m in missing}
        )
        decisions.transient.update(missing)
        changed = bool(wide)
    else:
        changed = _time(adapter, decisions, missing, recheck, budget) or bool(wide)
    if store is not None and changed:
        _write_decisions(store, decisions.kept(), decisions.boots)


def _time(adapter: Any, decisions: _Decisions, missing: list[int], recheck: list[int], budget: float) -> bool:
    """Re-check the planned decisions ``recheck`` in one sweep, then time the ``missing`` row counts
    (short ones, then wide buckets), within ``budget`` seconds in all, and record what was decided;
    whether the file changes. Timing says so on stderr, a line before and one after; a re-check
    alone says something only where it drops a decision or leaves one unchecked."""
    if missing:
        print(
            f"eesd: timing linear products for {_passes_over(missing)} of this model on this CPU "
            "(once per machine; --products standard or EESD_PRODUCTS=standard skips it)",
            file=sys.stderr,
            flush=True,
        )
    start = _now()
    deadline = start + budget
    checked = _still_winning(adapter, {m: decisions.known[m][2] for m in recheck}, deadline)
    dropped = [m for m in recheck if m in checked and not checked[m]]
    boot = _boot()
    for m in checked:
        decisions.unchecked.discard(m)
        decisions.boots[m] = boot
    for m in dropped:  # F.linear until the next boot, whose first process times them afresh
        decisions.known[m] = (False, None, decisions.known[m][2])
    unchecked = [m for m in recheck if m not in checked]
    done, left = [], []
    for group, options in (
        ([m for m in missing if m <= EXACT_ROWS], {}),
        ([m for m in missing if m > EXACT_ROWS], WIDE),
    ):
        if not group:
            continue
        rest = max(0.0, deadline - _now())
        plan = calibrate(adapter, max(group), only=group, clock=_clock, budget=rest, **options)  # type: ignore[arg-type]
        for m in group:
            if m in plan.timings:
                decisions.known[m] = (m in plan.rows, plan.timings[m], plan.product(m))
                decisions.boots[m] = boot
                done.append(m)
            else:
                decisions.known[m] = (False, None, "transposed" if m <= EXACT_ROWS else "onednn")
                decisions.transient.add(m)
                left.append(m)
    chosen = _plan_of(decisions.known, done)
    said = [chosen.describe()] if chosen.rows or chosen.wide else []
    standard = [m for m in done if not decisions.known[m][0]]
    if standard:
        said.append(f"F.linear for {_passes_over(standard)}")
    if left:
        said.append(
            f"{_passes_over(left)} keep F.linear in this process (the {budget:g} s "
            "budget, EESD_PRODUCTS_BUDGET, ran out; a later process times them)"
        )
    if dropped:
        said.append(
            f"{_passes_over(dropped)} are no longer faster with the product read from disk: "
            "F.linear for them until the machine restarts (the first process after that times them again)"
        )
    if unchecked:
        said.append(
            f"{_passes_over(unchecked)} keep F.linear in this process, not re-checked (the {budget:g} s "
            "budget ran out; the file keeps their product)"
        )
    if said and (missing or dropped or unchecked):
        what = "timed linear products" if missing else "re-checked the linear products read from disk"
        print(f"eesd: {what} in {_now() - start:.1f} s: {'; '.join(said)}", file=sys.stderr, flush=True)
    return bool(missing or checked)


def decisions_dir() -> Path | None:
    """Where calibrations are kept across processes: ``$EESD_PRODUCTS_DIR``, else ``products/`` in
    eesd's cache (:func:`~eesd_core.config.default_cache_dir`); ``EESD_PRODUCTS_DIR=off`` keeps
    them in the process only."""
    from eesd_core.config import default_cache_dir

    chosen = os.environ.get("EESD_PRODUCTS_DIR")
    if chosen:
        return None if chosen == "off" else Path(chosen).expanduser()
    return default_cache_dir() / "products"


def _store_file(adapter: Any) -> Path | None:
    """The file of this machine's decisions for passes of the adapter's model, or None."""
    folder, info = decisions_dir(), Path("/proc/cpuinfo")
    if folder is None:
        return None
    lines = info.read_text(errors="replace").splitlines() if info.is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    roots = [*_model_layers(adapter)[:1], adapter.model.lm_head]
    shapes = sorted({tuple(m.weight.shape) for root in roots for m in root.modules() if type(m) is nn.Linear})
    machine = [cpu or platform.processor() or platform.machine(), os.cpu_count(), torch.get_num_threads()]
    key = [*machine, torch.__version__, str(adapter.dtype), int(adapter.num_layers), shapes, SAMPLE_BYTES]
    key.append(PRODUCTS_VERSION)
    return folder / (hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24] + ".json")


def _product_of(kind: Any) -> Product:
    return kind if isinstance(kind, str) else tuple((tuple(s) if s else None, k) for s, k in kind)


def _read_decisions(path: Path, boots: dict[int, str | None] | None = None) -> dict[int, Decision]:
    """Decisions kept in ``path``; none if it is missing or unreadable (then they are measured).
    ``boots`` receives the boot each was last timed or re-checked in (None where not recorded)."""
    found: dict[int, Decision] = {}
    when: dict[int, str | None] = {}
    try:
        for m, (p, t, k, *rest) in json.loads(path.read_text()).items():
            if len(rest) > 1 or not isinstance(rest[0] if rest else None, str | None):
                return {}
            found[int(m)] = (bool(p), tuple(t) if t else None, _product_of(k))
            when[int(m)] = rest[0] if rest else None
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    if boots is not None:
        boots.update(when)
    return found


def _write_decisions(
    path: Path, known: dict[int, Decision], boots: dict[int, str | None] | None = None
) -> None:
    """Keep ``known`` (and the boot each was decided in) in ``path``, written whole or not at all;
    a folder that cannot be written leaves the decisions to this process."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    boots = boots or {}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = {str(m): [*decision, boots.get(m)] for m, decision in sorted(known.items())}
        temporary.write_text(json.dumps(rows))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
