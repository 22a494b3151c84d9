"""The lossless verifier: speculative sampling, which is exact match at temperature 0.

For each draft d_i (sampled from q_i), accept with probability min(1, p_i(d_i) / q_i(d_i)). At the
first rejection, emit a token from norm(max(0, p_i - q_i)) and stop; after k acceptances emit a
bonus token from p_k. The committed tokens then follow p exactly (Leviathan et al. 2023, Chen et al.
2023). A deterministic drafter passes ``q=None``: q_i is one-hot on d_i. At temperature 0 p and q are
one-hot, so acceptance is ``d_i == argmax p_i`` and no randomness is drawn.

Each row draws only from its own RandomSource: ``bernoulli(min(1, p_i(d_i) / q_i(d_i)))`` once per
draft, in order, until the first rejection (a certain outcome, 0 or 1, is still asked, so a source
may count draws per draft as transformers does), then ``categorical`` for the emitted token unless
its distribution has a single token. A draft with q_i(d_i) = 0, which sampling from q never
proposes, is rejected without a draw. Ties in p are settled before the verifier, by
:func:`~eesd_core.sampling.one_hot_argmax` taking the first maximum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eesd_core.devices import HOST
from eesd_core.protocols import RandomSource
from eesd_core.sampling import residual
from eesd_lossless.options import LosslessOptions


class LosslessVerifier:
    """Rejection sampling against the target; randomness only from the ``rng`` passed in."""

    def __init__(self, options: LosslessOptions | None = None) -> None:
        self.options = options or LosslessOptions()

    def verify(
        self,
        drafts: Sequence[torch.Tensor],  # [k_b] each
        qs: Sequence[torch.Tensor | None],  # [k_b, V] each
        p: torch.Tensor,  # [B, m, V], m > every k_b
        rngs: Sequence[RandomSource],
    ) -> list[tuple[int, int]]:
        """Every row of a round with one read from the device for all rows: p and q at each
        draft, and the argmax and support size of p at two positions of each row, its bonus
        token's and its first draft that p may reject (greedy, where a rejection emits p's argmax).
        Only a draw from a distribution of more than one token touches the device again, per row."""
        rows, m = p.shape[0], p.shape[1]
        exact = torch.float32 if p.device.type == "mps" else torch.float64  # token ids and p alike
        if not any(d.shape[0] for d in drafts):  # a round that drafted nothing: a bonus token a row
            bonus = p[:, 0]
            top, support = torch.stack([bonus.argmax(-1).to(exact), (bonus > 0).sum(-1).to(exact)]).tolist()
            return [
                (0, int(top[b]) if support[b] == 1 else rng.categorical(p[b, 0]))
                for b, rng in enumerate(rngs)
            ]
        picked = torch.zeros(rows, m, dtype=torch.long, device=HOST)  # drafts are host ids
        for b, d in enumerate(drafts):
            if d.shape[0]:
                picked[b, : d.shape[0]] = d
        ks = torch.tensor([len(d) for d in drafts], device=HOST).to(p.device, non_blocking=True)
        targets = p.gather(2, picked.to(p.device, non_blocking=True)[..., None])[..., 0]  # [B, m]: no wait
        beyond = torch.arange(m, device=p.device) >= ks[:, None]
        first = ((targets < 1) | beyond).int().argmax(-1)  # the first draft p may reject, else k_b
        at = p[torch.arange(rows, device=p.device)[:, None], torch.stack([first, ks], dim=1)]  # [B, 2, V]
        read = [first, at.argmax(-1), (at > 0).sum(-1), targets]
        for d, q in zip(drafts, qs, strict=True):
            if q is not None:  # q_i(d_i)
                at = d.to(q.device, non_blocking=True)
                read.append(q[torch.arange(q.shape[0], device=q.device), at].to(p.device))
        flat = torch.cat([t.reshape(-1).to(exact) for t in read]).tolist()  # the one read
        first, top, support = flat[:rows], flat[rows : 3 * rows], flat[3 * rows : 5 * rows]  # [2b], [2b + 1]
        targets, proposed = flat[5 * rows : 5 * rows + rows * m], flat[5 * rows + rows * m :][::-1]
        out = []
        for b, (d, q, rng) in enumerate(zip(drafts, qs, rngs, strict=True)):
            k, base = int(d.shape[0]), b * m
            proposals = [proposed.pop() for _ in range(k)] if q is not None else [1.0] * k
            for i, draft in enumerate(d.tolist() if k else ()):
                if proposals[i] > 0 and rng.bernoulli(min(1.0, targets[base + i] / proposals[i])):
                    continue
                if q is None and i == first[b] and support[2 * b] == 1:  # p one-hot off the draft
                    out.append((i, int(top[2 * b])))  # its residual is p
                    break
                p_row = p[b, i]
                q_row = _one_hot(draft, p_row) if q is None else q[i].to(p_row.dtype)
                out.append((i, _draw(residual(p_row, q_row), rng)))
                break
            else:
                out.append((k, int(top[2 * b + 1]) if support[2 * b + 1] == 1 else rng.categorical(p[b, k])))
        return out


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    out[token] = 1.0
    return out


def _draw(probs: torch.Tensor, rng: RandomSource) -> int:
    """A token from ``probs``; a one-hot distribution is read, not sampled, so greedy is exact."""
    support, top = torch.stack([(probs > 0).sum(), probs.argmax()]).tolist()
    return top if support == 1 else rng.categorical(probs)
