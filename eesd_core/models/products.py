"""A faster product for the linear layers of short passes (decoding steps, verification) on CPUs.

Decoding runs the target over m positions at a time: m = 1 for a plain step or a draft step,
m = k + 1 for a verification pass. Several CPU BLAS back-ends serve ``F.linear`` with so few rows
through a per-row path: on a 2-core x86 CPU with torch 2.13, the 49152 x 576 LM head of SmolLM2 took
7 ms for one row, 14 ms for two and 22 ms for three, and a whole pass of the model over two
positions cost 1.6 times a pass over one. The same product written as ``(W @ x.T).T`` takes a
GEMM path that reads the weights once: 2.3 ms for two rows of that LM head, and as little for one
row padded with a row of zeros.

A third product is oneDNN's linear (:func:`onednn_linear`, where torch is built with oneDNN, for
float32 and bfloat16): its cost hardly grows with m. On the same machine one 8960 x 1536 matrix of
Qwen2.5-1.5B took 3.7 ms with ``F.linear`` for one row, 1.8 ms transposed for one or two rows but
3.5 ms for three and 5.9 ms for eight, and 2.2 to 3.5 ms through oneDNN for one to eight rows; a
whole pass over four positions fell from 2.4 to 1.5 times a pass over one. Which of the two is
faster depends on the matrix's shape too, so a third candidate ("mixed", :func:`_shape_products`)
takes, for each shape, the one that timing the model's own matrices of that shape favours.

Which path is faster depends on the back-end, the CPU, the thread count and m, so it is measured:
:func:`calibrate` times passes of the model each way for every m and keeps the fastest other
product only where it beats ``F.linear`` clearly, twice. All compute the same sums in other
orders, so results differ from ``F.linear``'s in the last bits only, as any change of kernel
does; the verifier compares the drafter's q with whatever p the target computes, so decoding
stays lossless, and greedy output is checked against transformers' token for token.

An adapter applies its :class:`MatmulPlan` itself, pass by pass: a pass over a planned number of
rows runs inside a :class:`LinearRouter` of the modules it uses, which sends each ``nn.Linear``
through the planned product; any other pass runs exactly as it would without a plan.

Calibrating takes time (about 45 s for Qwen2.5-1.5B and m = 1 .. 9 on a 2-core CPU), so the
decisions are also kept on disk (:func:`decisions_dir`), one file per machine, torch version,
thread count and set of matrix shapes, and a later process on the same machine reads them instead
of timing again. Delete the folder to measure again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODES = ("auto", "standard", "transposed", "onednn")
PRODUCTS = ("transposed", "onednn")  # the products other than F.linear, by name
# The transposed product must beat F.linear by this much, in two measurements and without
# overlapping timings, to be used: on a 2-core machine shared with other work a pass varies by 10%
# from one run to the next, and F.linear is the product transformers itself uses.
MARGIN = 0.85
# Decoder-layer weights a calibration pass reads at most; the rest of the layers are extrapolated.
SAMPLE_BYTES = 512 << 20
PRODUCTS_VERSION = 2  # changes with the products, so that decisions kept for older ones are not read
EXACT_ROWS = 16  # passes over up to this many positions are decided row count by row count
# Wider passes (prefills, large batches) take the decision of the first of these at or above their
# row count (the last beyond it): oneDNN's product or F.linear, timed over a smaller sample of
# layers without the LM head (a prefill's reads one position). On a 2-core AMD EPYC, Qwen2.5-1.5B's
# layers over 32 to 128 positions ran 1.5 to 1.7 times faster through oneDNN than F.linear (MKL).
WIDE_ROWS = (32, 64, 128, 256, 512)
WIDE = {"candidates": ["onednn"], "sample_bytes": 64 << 20, "head": False, "repeats": 3}


def transposed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T`` (weights read once).

    A single row is padded with a row of zeros, which keeps it on the GEMM path. Several rows, and
    their result, are row-major: a GEMM over column-major rows (``.T`` of a result, kept by an MLP's
    ``act(gate(x)) * up(x)``) reads the weights slowly (README, "Short passes on CPUs").
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
    return chosen.get(tuple(weight.shape), chosen[None])  # type: ignore[call-overload]


def product_linear(product: Product, x: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``product`` (for this weight's shape)."""
    multiply = transposed_linear if _for_weight(product, weight) == "transposed" else onednn_linear
    return multiply(x, weight, bias)


def _routed_forward(
    product: str | None, index: torch.Tensor | None, module: nn.Linear, x: torch.Tensor
) -> torch.Tensor:
    if index is None:  # every row: the planned product itself, nothing built per call
        return product_linear(product, x, module.weight, module.bias)  # type: ignore[arg-type]
    rows = x.reshape(-1, x.shape[-1]).index_select(0, index)
    linear = nn.functional.linear if product is None else partial(product_linear, product)
    out = linear(rows, module.weight, module.bias)
    full = out.new_zeros(x.shape[:-1].numel(), out.shape[-1]).index_copy_(0, index, out)
    return full.view(*x.shape[:-1], out.shape[-1])


class LinearRouter:
    """While entered, every plain ``nn.Linear`` under ``roots`` multiplies with ``product``
    (:func:`transposed_linear` or :func:`onednn_linear`).

    It shadows each module's ``forward`` on the instance for the duration, so nothing but those
    calls changes: no other operation is intercepted (a ``TorchFunctionMode`` would see every torch
    call of the pass). Subclasses of ``nn.Linear`` (quantized layers) and modules whose ``forward``
    is already replaced on the instance (offloading hooks) keep their own. The model is shared
    state: another thread running the same modules meanwhile gets the same product.

    With ``index`` (flat indexes over a pass's rows and positions), each multiplies those rows of
    its input alone and gives zeros for the others, the padding of a ragged batched pass;
    ``product`` None keeps ``F.linear`` for them.
    """

    def __init__(
        self, roots: Iterable[nn.Module], product: Product | None = "transposed", index: Any = None
    ) -> None:
        self._linears = [
            (module, partial(_routed_forward, product and _for_weight(product, module.weight), index, module))
            for root in roots
            for module in root.modules()
            if type(module) is nn.Linear
        ]
        self._entered: list[nn.Module] = []

    def __enter__(self) -> LinearRouter:
        for module, forward in self._linears:
            slots = vars(module)
            if "forward" not in slots:
                slots["forward"] = forward
                self._entered.append(module)
        return self

    def __exit__(self, *exc: object) -> None:
        for module in self._entered:
            vars(module).pop("forward", None)
        self._entered.clear()


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
        return next((bucket for bucket in WIDE_ROWS if bucket >= m), WIDE_ROWS[-1])

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
            edges = dict(zip(WIDE_ROWS, [EXACT_ROWS, *WIDE_ROWS], strict=False))
            spans = [f"{edges[b] + 1}-{b}" + " and more" * (b == WIDE_ROWS[-1]) for b in sorted(self.wide)]
            name = "oneDNN's" if set(self.wide.values()) == {"onednn"} else "the measured product"
            parts.append(f"{name} for wider passes over m = " + ", ".join(spans))
        return "; ".join(parts)


def fixed_plan(rows: Iterable[int], product: str = "transposed") -> MatmulPlan:
    """A plan without measuring: ``product`` for exactly these row counts."""
    planned = frozenset(int(m) for m in rows if m >= 1)
    return MatmulPlan(planned, onednn=planned if product == "onednn" else frozenset())


Samples = dict[int, dict[str, list[float]]]  # m -> product ("standard" too) -> seconds


def _measure(run: Callable[[int, str], float], counts: list[int], repeats: int, kinds: list[str]) -> Samples:
    """The times ``run(m, kind)`` returns, ``repeats`` each, for each m and each product in ``kinds``.

    Repeats sweep all row counts, up and down in turn, and reverse the order of the products, so a
    drift of the machine's speed falls on every product and on every m alike.
    """
    for m in counts:
        for kind in kinds:
            run(m, kind)
    times: Samples = {m: {kind: [] for kind in kinds} for m in counts}
    for r in range(repeats):
        for m in counts if r % 2 == 0 else reversed(counts):
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                times[m][kind].append(run(m, kind))
    return times


def _wins(standard: list[float], transposed: list[float]) -> bool:
    """Clearly faster: a median below ``MARGIN`` of F.linear's, and the slower quarter of the
    other product's passes faster than the faster quarter of the standard ones. Noise that makes
    the two overlap (other work on the machine) decides for F.linear."""
    quick = statistics.quantiles(standard, n=4, method="inclusive")[0]
    slow = statistics.quantiles(transposed, n=4, method="inclusive")[2]
    return statistics.median(transposed) < MARGIN * statistics.median(standard) and slow < quick


def _choice(samples: dict[str, list[float]]) -> str | None:
    """Of the products that beat F.linear clearly, the one with the lowest median; or None."""
    winners = [k for k in samples if k != "standard" and _wins(samples["standard"], samples[k])]
    return min(winners, key=lambda k: statistics.median(samples[k])) if winners else None


def calibrate(
    adapter: Any,
    max_rows: int,
    *,
    context: int = 64,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
    only: Iterable[int] | None = None,
    sample_bytes: int = SAMPLE_BYTES,
    candidates: Iterable[str] | None = None,
    head: bool = True,
) -> MatmulPlan:
    """Time passes of the adapter's model over m = 1 .. ``max_rows`` positions with ``F.linear``
    and with each of ``candidates`` (default: the transposed product, and oneDNN's where it
    serves the model), or over the row counts in ``only``.

    Each pass runs the decoder layers, the final norm and the LM head after ``context`` cached
    positions, on a scratch cache; the model's weights are only read. Where some other product
    wins clearly (:func:`_wins`), all are measured again, and the fastest that wins again is
    planned (a product whose passes vary, as the transposed one's do on some CPUs, then yields to
    a steadier one rather than to ``F.linear``). About ``(products) * (repeats + 1)`` passes per
    m, twice that where another product won.

    A model whose layers weigh more than ``sample_bytes`` runs only as many of its layers as fit
    (at least one): their time, scaled to all layers, plus the LM head's (unless ``head`` is
    false) is the time of a pass.
    The layers of a decoder are alike, so the sample decides as the whole would, and a 1.5B model
    calibrates in seconds rather than minutes. The adapter's own plan is restored afterwards.
    """
    if repeats < 2:
        raise ValueError("calibration needs at least two repeats to see how much passes vary")
    if candidates is None:
        serves = onednn_serves(adapter.dtype, adapter.device)
        candidates = ["transposed"] + (["onednn"] if serves else [])
        candidates += ["mixed"] if serves and hasattr(adapter, "_layers") else []
    others = list(candidates)
    device, saved = adapter.device, adapter.products
    cache = adapter.new_cache(capacity=context + max_rows)
    counts = sorted(set(only)) if only is not None else range(1, max_rows + 1)
    zeros = [torch.zeros(m, dtype=torch.long, device=device) for m in counts]
    inputs = {len(ids): adapter.embed(ids) for ids in zeros}
    layers = sampled_layers(adapter, sample_bytes)
    scale = adapter.num_layers / layers
    mixed: dict[int, Product] = {}

    def plan_of(m: int, kind: str) -> MatmulPlan:
        if kind == "mixed":
            return MatmulPlan(frozenset([m]), shapes={m: mixed[m]})
        return MatmulPlan() if kind == "standard" else fixed_plan([m], kind)

    def run(m: int, kind: str) -> float:
        adapter.products = plan_of(m, kind)
        start = clock()
        hidden = adapter.run_layers(inputs[m], 0, layers, cache, context)
        if layers == adapter.num_layers and head:
            adapter.logits(adapter.norm(hidden))
            seconds = clock() - start
        else:
            middle = clock()
            if head:
                adapter.logits(adapter.norm(hidden))
            seconds = scale * (middle - start) + (clock() - middle if head else 0.0)
        cache.crop(context)
        return seconds

    try:
        with torch.inference_mode():
            prefix = adapter.embed(torch.zeros(context, dtype=torch.long, device=device))
            adapter.run_layers(prefix, 0, layers, cache, 0)
            if "mixed" in others:
                mixed.update(_shape_products(adapter, layers, list(inputs), repeats, clock))
            kinds = ["standard", *others]
            first = _measure(run, list(inputs), repeats, kinds)
            again = _measure(run, [m for m, s in first.items() if _choice(s)], repeats, kinds)
    finally:
        adapter.products = saved
    chosen = {m: _choice(samples) for m, samples in again.items()}
    timings = {}
    for m, samples in (first | again).items():
        other = chosen.get(m) or min(others, key=lambda k: statistics.median(samples[k]))
        timings[m] = (statistics.median(samples["standard"]), statistics.median(samples[other]))
    rows = frozenset(m for m, kind in chosen.items() if kind)
    onednn = frozenset(m for m, kind in chosen.items() if kind == "onednn")
    return MatmulPlan(rows, timings, onednn, {m: mixed[m] for m, kind in chosen.items() if kind == "mixed"})


def _shape_products(
    adapter: Any, layers: int, counts: list[int], repeats: int, clock: Callable[[], float]
) -> dict[int, Product]:
    """For each m, the faster of the transposed and oneDNN's product for each shape of matrix in
    the first ``layers`` decoder layers and the LM head, timed over all the matrices of that shape
    (so that they come from memory, as in a pass); unlisted shapes take oneDNN's.

    Which is faster depends on the shape: on a 2-core x86 CPU, for a gate or up matrix of
    Qwen2.5-1.5B (8960 x 1536) and two rows the transposed product took 1.6 ms and oneDNN's 2.4,
    for its down matrix (1536 x 8960) 3.0 and 2.35, so a pass over two positions through either
    alone cost 1.3 times one over one position."""
    weights: dict[tuple[int, int], list[torch.Tensor]] = {}
    for root in [*adapter._layers[:layers], adapter.model.lm_head]:
        for module in root.modules():
            if type(module) is nn.Linear:
                weights.setdefault(tuple(module.weight.shape), []).append(module.weight)

    def sweep(m: int, kind: str, shape: tuple[int, int]) -> float:
        x = torch.zeros(m, shape[1], dtype=adapter.dtype, device=adapter.device)
        start = clock()
        for weight in weights[shape]:
            product_linear(kind, x, weight)
        return clock() - start

    chosen: dict[int, Product] = {}
    for m in counts:
        best = []
        for shape in weights:
            times = _measure(lambda m, kind, shape=shape: sweep(m, kind, shape), [m], repeats, list(PRODUCTS))
            best.append((shape, min(PRODUCTS, key=lambda kind: statistics.median(times[m][kind]))))
        chosen[m] = (*sorted(best), (None, "onednn"))
    return chosen


def sampled_layers(adapter: Any, sample_bytes: int) -> int:
    """How many of the adapter's decoder layers a calibration pass runs: all of them if their
    weights fit in ``sample_bytes``, else as many as fit, and at least one."""
    stack = getattr(adapter, "_layers", None)
    if not stack:
        return int(adapter.num_layers)
    per_layer = sum(p.numel() * p.element_size() for p in stack[0].parameters())
    if per_layer * adapter.num_layers <= sample_bytes:
        return int(adapter.num_layers)
    return max(1, min(int(adapter.num_layers), sample_bytes // max(per_layer, 1)))


_DECISIONS: weakref.WeakKeyDictionary[Any, dict[int, dict[int, tuple[bool, Any, str]]]] = (
    weakref.WeakKeyDictionary()
)


def plan_for(adapter: Any, mode: str, max_rows: int) -> MatmulPlan:
    """The plan for ``mode``: ``"standard"``; ``"transposed"`` or ``"onednn"`` (that product for
    every m <= ``max_rows``); or ``"auto"``.

    ``"auto"`` calibrates on CPUs and keeps the standard path elsewhere: GPU GEMMs serve a few rows
    well, and float64 models are reference computations (the test oracles) whose numbers should
    not depend on a timing. Each row count is decided once per model and thread count in a
    process, so a plain decoder and a drafting one on the same model run their one-position
    passes the same way, and a later, longer plan only measures the row counts it adds. Row counts
    past ``EXACT_ROWS`` are decided by bucket, whatever ``max_rows`` (``WIDE_ROWS``).
    """
    if mode == "standard":
        return MatmulPlan()
    if mode in PRODUCTS:
        if mode == "onednn" and not onednn_serves(adapter.dtype, adapter.device):
            from eesd_core.errors import ConfigError

            raise ConfigError(
                f"matmul='onednn' needs a torch built with oneDNN and float32 or bfloat16 weights on "
                f"the CPU (this model: {adapter.dtype} on {adapter.device}): use matmul='auto'."
            )
        return fixed_plan(range(1, max_rows + 1), mode)
    if adapter.device.type != "cpu" or adapter.dtype == torch.float64:
        return MatmulPlan()
    known = _DECISIONS.setdefault(adapter.model, {}).setdefault(torch.get_num_threads(), {})
    rows = range(1, min(max_rows, EXACT_ROWS) + 1)
    missing = [m for m in [*rows, *WIDE_ROWS] if m not in known]
    store = _store_file(adapter) if missing else None
    if store is not None:
        for m, decision in _read_decisions(store).items():
            known.setdefault(m, decision)
        missing = [m for m in missing if m not in known]
    wide = [m for m in missing if m > EXACT_ROWS]
    if wide and not onednn_serves(adapter.dtype, adapter.device):
        known.update({m: (False, None, "onednn") for m in wide})  # nothing to compare F.linear with
        wide = []
    for counts, options in (([m for m in missing if m <= EXACT_ROWS], {}), (wide, WIDE)):
        if counts:
            measured = calibrate(adapter, max(counts), only=counts, **options)  # type: ignore[arg-type]
            for m in counts:
                known[m] = (m in measured.rows, measured.timings.get(m), measured.product(m))
    if missing and store is not None:
        _write_decisions(store, known)
    timings = {m: known[m][1] for m in rows if known[m][1] is not None}
    planned = frozenset(m for m in rows if known[m][0])
    onednn = frozenset(m for m in planned if known[m][2] == "onednn")
    shapes = {m: known[m][2] for m in planned if not isinstance(known[m][2], str)}
    return MatmulPlan(planned, timings, onednn, shapes, {m: known[m][2] for m in WIDE_ROWS if known[m][0]})


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
    roots = [*getattr(adapter, "_layers", [])[:1], adapter.model.lm_head]
    shapes = sorted({tuple(m.weight.shape) for root in roots for m in root.modules() if type(m) is nn.Linear})
    machine = [cpu or platform.processor() or platform.machine(), os.cpu_count(), torch.get_num_threads()]
    key = [*machine, torch.__version__, str(adapter.dtype), int(adapter.num_layers), shapes, SAMPLE_BYTES]
    key.append(PRODUCTS_VERSION)
    return folder / (hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24] + ".json")


def _product_of(kind: Any) -> Product:
    return kind if isinstance(kind, str) else tuple((tuple(s) if s else None, k) for s, k in kind)


def _read_decisions(path: Path) -> dict[int, tuple[bool, Any, Product]]:
    """Decisions kept in ``path``; none if it is missing or unreadable (then they are measured)."""
    try:
        raw = json.loads(path.read_text())
        return {int(m): (bool(p), tuple(t) if t else None, _product_of(k)) for m, (p, t, k) in raw.items()}
    except (OSError, ValueError, TypeError):
        return {}


def _write_decisions(path: Path, known: dict[int, tuple[bool, Any, Product]]) -> None:
    """Keep ``known`` in ``path``, written whole or not at all; a folder that cannot be written
    leaves the decisions to this process."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({str(m): list(decision) for m, decision in sorted(known.items())}))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
