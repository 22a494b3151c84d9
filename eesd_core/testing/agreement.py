"""Greedy agreement with a reference decoder, stated precisely for every precision.

In float32 and float64 eesd's greedy tokens equal transformers' ``generate()`` token for token, and
that is what every check here requires. In bfloat16 and float16 they may not, and legitimately: a
verification pass over k + 1 positions and a one-position step multiply in different orders, so
where the reference's two best logits are within rounding of each other the two can pick different
tokens, and from there on they continue different texts. The rule:

* tokens must be equal up to the first position where they differ;
* in half precision a difference is a **tie**, not an error, when the reference's own top-2 logits
  at that position differ by at most ``TIE_ULPS`` units in the last place of the larger one
  (``TIE_ULPS * finfo(dtype).eps * max(1, |top-1 logit|)``); after a tie nothing more is compared;
* any other difference, and any difference at all in float32/float64, is a mismatch.

Ties are reported apart from matches, so a run says how many of its outputs were cut short by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eesd_core.devices import HALF

TIE_ULPS = 4


def tie_tolerance(top1: float, dtype: torch.dtype) -> float:
    """The largest top-2 gap counted as a tie for logits of ``dtype``; 0 outside half precision."""
    if dtype not in HALF:
        return 0.0
    return TIE_ULPS * torch.finfo(dtype).eps * max(1.0, abs(top1))


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class GreedyAgreement:
    """How a greedy output compares with the reference: ``matched`` tokens agree before the first
    difference (all of them when ``equal``); a difference is a ``tie`` when the reference's top-2
    gap there (``gap``) is within ``tolerance``."""

    equal: bool
    matched: int
    tie: bool = False
    gap: float | None = None
    tolerance: float | None = None

    @property
    def ok(self) -> bool:
        """Equal, or cut short by a tie in half precision."""
        return self.equal or self.tie

    def describe(self) -> str:
        if self.equal:
            return "equal"
        kind = "tie" if self.tie else "MISMATCH"
        if self.gap is None:
            return f"{kind} after {self.matched} equal tokens"
        gap = f"top-2 gap {self.gap:.3g}, tolerance {self.tolerance:.3g}"
        return f"{kind} after {self.matched} equal tokens ({gap})"


def top2_gap(logits: torch.Tensor) -> tuple[float, float]:
    """(top-1 logit, top-1 minus top-2) of one row of logits ``[V]``."""
    best = logits.float().topk(2).values.tolist()
    return best[0], best[0] - best[1]


def compare_greedy(
    reference: Sequence[int],
    tokens: Sequence[int],
    dtype: torch.dtype,
    reference_logits: Any = None,
) -> GreedyAgreement:
    """Compare ``tokens`` with the ``reference``'s new tokens under the rule of this module.

    ``reference_logits`` gives the reference's logits at each of its steps: a tensor ``[n, V]``, a
    sequence of ``[V]`` rows (transformers' ``output_logits``), or a callable taking a position and
    returning that row (to compute only the one needed). Without it a difference is a mismatch.
    """
    at = first_difference(list(reference), list(tokens))
    if at is None:
        return GreedyAgreement(equal=True, matched=len(reference))
    if dtype not in HALF or reference_logits is None or at >= len(reference) or at >= len(tokens):
        return GreedyAgreement(equal=False, matched=at)
    row = reference_logits(at) if callable(reference_logits) else reference_logits[at]
    top1, gap = top2_gap(torch.as_tensor(row).reshape(-1))
    tolerance = tie_tolerance(top1, dtype)
    return GreedyAgreement(equal=False, matched=at, tie=gap <= tolerance, gap=gap, tolerance=tolerance)


def logits_after(model: Any, prefix: Sequence[int]) -> torch.Tensor:
    """The model's next-token logits ``[V]`` after ``prefix``, from one full forward pass: the
    reference row :func:`compare_greedy` needs when only the reference's tokens were kept."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu()
