"""Modelled speedup from measured costs: the acceptance rate a drafter needs before drafting pays.

With every draft accepted independently with probability alpha (the i.i.d. model of Leviathan et
al.), a round of k drafts commits E = (1 - alpha^(k+1)) / (1 - alpha) tokens and costs
``propose_base + k * draft_step + verify(k + 1)``; plain decoding commits one token per plain step
(the round with k = 0). The speedup of k drafts is E * plain_step / round_time(k). Set beside the
acceptance rate a head actually reaches, the table shows how far that head is from one that pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round of k drafts commits: the accepted prefix plus the target's own token."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class RoundCosts:
    """Seconds of a round by k, from a cost model: ``draft_step``, ``propose_base``, ``verify[m - 1]``."""

    def __init__(self, draft_step: float, propose_base: float, verify: Sequence[float]) -> None:
        self.draft_step, self.propose_base, self.verify = draft_step, propose_base, tuple(verify)

    @classmethod
    def of(cls, model: Any) -> RoundCosts:
        return cls(model.draft_step, model.propose_base, model.verify)

    @property
    def max_k(self) -> int:
        return len(self.verify) - 1

    def round_time(self, k: int) -> float:
        return self.propose_base + k * self.draft_step + self.verify[k]

    def speedup(self, alpha: float, k: int) -> float:
        return expected_tokens(alpha, k) * self.round_time(0) / self.round_time(k)

    def break_even(self, k: int) -> float | None:
        """The least alpha at which k drafts a round beat plain decoding; None if none does."""
        if self.speedup(1.0, k) < 1.0:
            return None
        low, high = 0.0, 1.0
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (low, mid) if self.speedup(mid, k) >= 1.0 else (mid, high)
        return high

    def best(self, alpha: float) -> tuple[int, float]:
        """The k (0 = plain) with the highest modelled speedup at ``alpha``, and that speedup."""
        k = max(range(self.max_k + 1), key=lambda j: self.speedup(alpha, j))
        return k, self.speedup(alpha, k)


def modelled_report(costs: RoundCosts, measured: Mapping[str, float | None]) -> dict[str, Any]:
    """Speedup by alpha and k, break-even alpha per k, and where each measured acceptance rate lands."""
    ks = list(range(1, costs.max_k + 1))
    return {
        "costs": {
            "draft_step": costs.draft_step,
            "propose_base": costs.propose_base,
            "verify": list(costs.verify),
            "plain_step": costs.round_time(0),
        },
        "alphas": list(ALPHAS),
        "ks": ks,
        "speedup": [[costs.speedup(alpha, k) for k in ks] for alpha in ALPHAS],
        "break_even": {str(k): costs.break_even(k) for k in ks},
        "measured": {
            method: {"alpha": alpha, "best_k": costs.best(alpha)[0], "speedup": costs.best(alpha)[1]}
            for method, alpha in measured.items()
            if alpha is not None
        },
    }


def markdown_lines(report: Mapping[str, Any]) -> list[str]:
    c = report["costs"]
    lines = [
        "## Modelled speedup (i.i.d. acceptance alpha, measured costs)",
        "",
        f"Plain step {c['plain_step'] * 1e3:.1f} ms; draft step {c['draft_step'] * 1e3:.1f} ms; "
        f"proposal base {c['propose_base'] * 1e3:.1f} ms; verify of m = 1..{len(c['verify'])} positions: "
        + ", ".join(f"{v * 1e3:.0f}" for v in c["verify"])
        + " ms.",
        "",
        "| alpha | " + " | ".join(f"k={k}" for k in report["ks"]) + " |",
        "|---|" + "---|" * len(report["ks"]),
    ]
    for alpha, row in zip(report["alphas"], report["speedup"], strict=True):
        lines.append(f"| {alpha:.1f} | " + " | ".join(f"{s:.2f}" for s in row) + " |")
    even = ", ".join(
        f"k={k}: {'never' if a is None else f'{a:.2f}'}" for k, a in report["break_even"].items()
    )
    lines += ["", f"Break-even alpha (speedup 1.00): {even}."]
    for method, m in report["measured"].items():
        lines.append(
            f"- `{method}` accepts alpha = {m['alpha']:.2f}: the model's best is k = {m['best_k']} "
            f"at {m['speedup']:.2f}x."
        )
    return lines
