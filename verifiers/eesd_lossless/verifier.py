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
        """Every row of a round with one read from the device for all rows: the argmax and
        support size of p where each row's bonus token would come from (p[b, k_b]), p and q at
        each draft. Only a draw from a rejection's residual, or from a distribution of more than
        one token (sampling), touches the device per row."""
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
        ks = torch.tensor([len(d) for d in drafts], dtype=torch.long, device=HOST).to(p.device)
        bonus = p[torch.arange(rows, device=p.device), ks]  # [B, V]
        read = [bonus.argmax(-1), (bonus > 0).sum(-1), p.gather(2, picked.to(p.device)[..., None])[..., 0]]
        for d, q in zip(drafts, qs, strict=True):
            if q is not None:  # q_i(d_i)
                read.append(q[torch.arange(q.shape[0], device=q.device), d.to(q.device)].to(p.device))
        flat = torch.cat([t.reshape(-1).to(exact) for t in read]).tolist()  # the one read
        top, support, targets = flat[:rows], flat[rows : 2 * rows], flat[2 * rows : 2 * rows + rows * m]
        proposed = flat[2 * rows + rows * m :][::-1]  # popped from the end, row after row
        out = []
        for b, (d, q, rng) in enumerate(zip(drafts, qs, rngs, strict=True)):
            k, base = int(d.shape[0]), b * m
            proposals = [proposed.pop() for _ in range(k)] if q is not None else [1.0] * k
            for i, draft in enumerate(d.tolist() if k else ()):
                if proposals[i] > 0 and rng.bernoulli(min(1.0, targets[base + i] / proposals[i])):
                    continue
                p_row = p[b, i]
                q_row = _one_hot(draft, p_row) if q is None else q[i].to(p_row.dtype)
                out.append((i, _draw(residual(p_row, q_row), rng)))
                break
            else:
                out.append((k, int(top[b]) if support[b] == 1 else rng.categorical(p[b, k])))
        return out


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    out[token] = 1.0
    return out


def _draw(probs: torch.Tensor, rng: RandomSource) -> int:
    """A token from ``probs``; a one-hot distribution is read, not sampled, so greedy is exact."""
    support, top = torch.stack([(probs > 0).sum(), probs.argmax()]).tolist()
    return top if support == 1 else rng.categorical(probs)
