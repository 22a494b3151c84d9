"""A faster product for the linear layers of short passes (decoding steps, verification) on CPUs.

Decoding runs the target over m positions at a time: m = 1 for a plain step or a draft step,
m = k + 1 for a verification pass. Several CPU BLAS back-ends serve ``F.linear`` with so few rows
through a per-row path: on a 2-core x86 CPU with torch 2.13, the 49152 x 576 LM head of SmolLM2 took
7 ms for one row, 14 ms for two and 22 ms for three, and a whole pass of the model over two
positions cost 1.6 times a pass over one. The same product written as ``(W @ x.T).T`` takes a
GEMM path that reads the weights once: 2.3 ms for two rows of that LM head, and as little for one
row padded with a row of zeros. Whole passes of that model took 26 ms instead of 38 for one
position and 36 ms instead of 62 for two.

Which path is faster depends on the back-end, the CPU, the thread count and m, so it is measured:
:func:`calibrate` times whole passes of the model both ways for every m and keeps the transposed
product only where it wins. Both compute the same sums in another order, so results differ from
``F.linear``'s in the last bits only, as any change of kernel does; the verifier compares the
drafter's q with whatever p the target computes, so decoding stays lossless, and greedy output is
checked against transformers' token for token.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

MODES = ("auto", "standard", "transposed")
# The transposed product must beat the standard one by this much to be used: on a tie the
# standard path is kept, as it is the one transformers uses.
MARGIN = 0.95


def transposed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T`` (weights read once).

    A single row is padded with a row of zeros, which keeps it on the GEMM path.
    """
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1:
        padded = rows.new_zeros(2, rows.shape[1])
        padded[0] = rows[0]
        out = (weight @ padded.t()).t()[:1]
    else:
        out = (weight @ rows.t()).t()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class _TransposedRows(TorchFunctionMode):
    """Routes ``F.linear`` through :func:`transposed_linear` for inputs with a listed row count."""

    def __init__(self, rows: frozenset[int]) -> None:
        super().__init__()
        self.rows = rows

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x = args[0]
            if x.dim() and x.shape[-1] and x.numel() // x.shape[-1] in self.rows:
                weight = args[1] if len(args) > 1 else kwargs["weight"]
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                return transposed_linear(x, weight, bias)
        return func(*args, **kwargs)


@dataclass(frozen=True)
class MatmulPlan:
    """Which row counts m use the transposed product, and the timings that chose them.

    ``timings[m]`` is (standard, transposed) median seconds of a whole pass over m positions.
    """

    rows: frozenset[int] = frozenset()
    timings: dict[int, tuple[float, float]] = field(default_factory=dict)

    def active(self) -> AbstractContextManager[Any]:
        """A context in which every ``F.linear`` over a listed number of rows is transposed."""
        return _TransposedRows(self.rows) if self.rows else nullcontext()

    def restricted(self, max_rows: int) -> MatmulPlan:
        """The same choices for m <= ``max_rows`` only."""
        return MatmulPlan(
            frozenset(m for m in self.rows if m <= max_rows),
            {m: t for m, t in self.timings.items() if m <= max_rows},
        )

    def describe(self) -> str:
        if not self.rows:
            return "standard F.linear for every pass"
        return "transposed product for passes over m = " + ", ".join(str(m) for m in sorted(self.rows))


def fixed_plan(rows: Iterable[int]) -> MatmulPlan:
    """A plan without measuring: the transposed product for exactly these row counts."""
    return MatmulPlan(frozenset(int(m) for m in rows if m >= 1))


def _median_pair(
    run: Callable[[AbstractContextManager[Any]], None],
    mode: _TransposedRows,
    repeats: int,
    clock: Callable[[], float],
) -> tuple[float, float]:
    """Median times of ``run`` without and with ``mode``, alternating so drifts fall on both."""
    run(nullcontext())
    run(mode)
    standard: list[float] = []
    transposed: list[float] = []
    for _ in range(repeats):
        for context, out in ((nullcontext(), standard), (mode, transposed)):
            start = clock()
            run(context)
            out.append(clock() - start)
    return statistics.median(standard), statistics.median(transposed)


def calibrate(
    adapter: Any,
    max_rows: int,
    *,
    context: int = 64,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> MatmulPlan:
    """Time whole passes of the adapter's model over m = 1 .. ``max_rows`` positions both ways.

    Each pass runs every layer, the final norm and the LM head after ``context`` cached
    positions, on a scratch cache; the model's weights are only read. About ``2 * (repeats + 1)``
    passes per m: a few seconds for a 135M-parameter model on a 2-core CPU.
    """
    device = adapter.device
    cache = adapter.new_cache(capacity=context + max_rows)
    timings: dict[int, tuple[float, float]] = {}
    with torch.inference_mode():
        prefix = torch.zeros(context, dtype=torch.long, device=device)
        adapter.run_layers(adapter.embed(prefix), 0, adapter.num_layers, cache, 0)
        for m in range(1, max_rows + 1):
            hidden = adapter.embed(torch.zeros(m, dtype=torch.long, device=device))

            def run(ctx: AbstractContextManager[Any], hidden: torch.Tensor = hidden) -> None:
                with ctx:
                    out = adapter.run_layers(hidden, 0, adapter.num_layers, cache, context)
                    adapter.logits(adapter.norm(out))
                cache.crop(context)

            timings[m] = _median_pair(run, _TransposedRows(frozenset({m})), repeats, clock)
    rows = frozenset(m for m, (standard, transposed) in timings.items() if transposed < MARGIN * standard)
    return MatmulPlan(rows, timings)


_PLANS: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], MatmulPlan]] = weakref.WeakKeyDictionary()


def plan_for(adapter: Any, mode: str, max_rows: int) -> MatmulPlan:
    """The plan for ``mode``: ``"standard"``, ``"transposed"`` (every m <= ``max_rows``) or ``"auto"``.

    ``"auto"`` calibrates on CPUs, once per model, thread count and ``max_rows`` in a process,
    and keeps the standard path elsewhere: GPU GEMMs serve a few rows well, and float64 models are
    reference computations (the test oracles) whose numbers should not depend on a timing.
    """
    if mode == "standard":
        return MatmulPlan()
    if mode == "transposed":
        return fixed_plan(range(1, max_rows + 1))
    if adapter.device.type != "cpu" or adapter.dtype == torch.float64:
        return MatmulPlan()
    plans = _PLANS.setdefault(getattr(adapter, "model", adapter), {})
    threads = torch.get_num_threads()
    for (plan_threads, plan_rows), plan in plans.items():
        if plan_threads == threads and plan_rows >= max_rows:
            return plan if plan_rows == max_rows else plan.restricted(max_rows)
    plans[(threads, max_rows)] = plan = calibrate(adapter, max_rows)
    return plan
