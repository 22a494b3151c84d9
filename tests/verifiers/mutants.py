"""Verifiers with planted bugs, each one line away from the lossless verifier."""

from __future__ import annotations

import torch
from eesd_lossless.verifier import _draw, _one_hot

from eesd_core.sampling import residual


class Unmutated:
    """The lossless verifier rewritten with one seam per mutation."""

    def ratio(self, target: float, proposed: float) -> float:
        return min(1.0, target / proposed)

    def fallback(self, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
        return residual(p_row, q_row)

    def bonus_row(self, k: int) -> int:
        return k

    def verify(self, drafts, qs, p, rngs):
        rows = zip(drafts, qs, rngs, strict=True)
        return [self.verify_row(d, q, p[b, : len(d) + 1], rng) for b, (d, q, rng) in enumerate(rows)]

    def verify_row(self, draft_tokens, q, p, rng):
        for i, draft in enumerate(draft_tokens.tolist()):
            target, proposed = float(p[i, draft]), 1.0 if q is None else float(q[i, draft])
            if proposed > 0 and rng.bernoulli(self.ratio(target, proposed)):
                continue
            q_row = _one_hot(draft, p[i]) if q is None else q[i].to(p.dtype)
            return i, _draw(self.fallback(p[i], q_row), rng)
        k = len(draft_tokens)
        return k, _draw(p[self.bonus_row(k)], rng)


class UnclippedRatio(Unmutated):
    def ratio(self, target, proposed):
        return target / proposed


class InvertedRatio(Unmutated):
    def ratio(self, target, proposed):
        return min(1.0, proposed / target) if target > 0 else 0.0


class ResampleFromP(Unmutated):
    def fallback(self, p_row, q_row):
        return p_row


class OffByOneBonus(Unmutated):
    def bonus_row(self, k):
        return max(k - 1, 0)


class AlwaysAccept(Unmutated):
    def ratio(self, target, proposed):
        return 1.0


MUTANTS = [UnclippedRatio, InvertedRatio, ResampleFromP, OffByOneBonus, AlwaysAccept]
