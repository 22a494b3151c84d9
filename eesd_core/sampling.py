"""Pure probability helpers: logits to **p**, the target's next-token distribution, and **q**, the
drafter's. Both go through the same processing (temperature, then top-k, then top-p, as transformers
orders its warpers) in float32 or wider; temperature 0 puts all mass on the first maximum.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from eesd_core.devices import later
from eesd_core.errors import InputError, NumericalError
from eesd_core.protocols import SamplingParams


def check_finite(logits: torch.Tensor, what: str) -> Callable[[], None]:
    """A check refusing NaN (and +inf) logits, sampling from which would be silently wrong; call it
    after reading a tensor computed after it (:func:`~eesd_core.devices.later`): it adds no wait."""
    bad = later((torch.isnan(logits) | torch.isposinf(logits)).any())

    def check() -> None:
        if bool(bad):
            raise NumericalError(
                f"{what} logits contain NaN or +inf. The model produced invalid values: check its "
                "weights and dtype (float16 overflows easily; try float32 or bfloat16)."
            )

    return check


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution over the vocabulary for each row of ``logits``. # [m, V] -> [m, V]"""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if params.greedy:
        return one_hot_argmax(logits)
    scores = _warp(logits, params)
    probs = torch.softmax(scores, dim=-1)
    if torch.isnan(probs).any():
        check_finite(logits, "The model's")()
        if bool(torch.isinf(scores).any()) and bool(torch.isfinite(logits).any(dim=-1).all()):
            raise InputError(
                f"temperature={params.temperature} is so small that logits / temperature overflow "
                f"{logits.dtype}: use temperature=0 for greedy decoding, or a larger temperature."
            )
        raise NumericalError("every logit is -inf in a row: there is no token to sample.")
    return probs


def log_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """log p for each row of ``logits``; greedy, that of the logits at temperature 1 (transformers'
    scores), not of the one-hot p. # [m, V] -> [m, V]"""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.log_softmax(logits if params.greedy else _warp(logits, params), dim=-1)


def _warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scores = logits / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        scores = _keep_top_k(scores, params.top_k)
    return _keep_top_p(scores, params.top_p) if params.top_p < 1.0 else scores


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """All mass on the first maximum of each row, as ``torch.argmax`` picks it. # [m, V]"""
    out = torch.zeros_like(logits)
    out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return out


def _keep_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, -math.inf)


def _keep_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: drop the least likely tokens whose total mass is at most 1 - top_p."""
    sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - top_p)
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, -math.inf)


def confidence(probs: torch.Tensor, tokens: torch.Tensor) -> list[tuple[int, float, float, float]]:
    """(token, its q, top-1 probability, entropy in nats) of each distribution ``[r, V]`` and its
    token ``[r]`` (still on the device, say), all rows read from the device in one transfer."""
    tokens, rows = tokens.to(probs.device), torch.arange(probs.shape[0], device=probs.device)
    values = [tokens, probs[rows, tokens], probs.max(-1).values, torch.special.entr(probs).sum(-1)]
    read = torch.stack([v.double() for v in values], dim=1).tolist()
    return [(int(index), prob, top, entropy) for index, prob, top, entropy in read]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after a rejection. # [V], [V] -> [V]"""
    diff = (p - q).clamp_min(0)
    total = diff.sum()
    return p if total <= 0 else diff / total


class TorchRandom:
    """The default :class:`~eesd_core.protocols.RandomSource`, seeded through a torch Generator."""

    def __init__(self, seed: int | None = None, device: str | torch.device = "cpu") -> None:
        self.generator = torch.Generator(device=device)
        try:
            self.generator.seed() if seed is None else self.generator.manual_seed(seed)
        except (RuntimeError, ValueError):
            raise InputError(
                f"seed {seed} does not fit in 64 bits (row b of a batch draws from seed + b)."
            ) from None

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, device=self.generator.device))

    def bernoulli(self, prob: float) -> bool:
        return prob >= 1.0 or (prob > 0.0 and self.uniform() < prob)

    def categorical(self, probs: torch.Tensor) -> int:
        probs = probs.to(
            self.generator.device, torch.float32 if probs.dtype in (torch.float16, torch.bfloat16) else None
        )
        return int(torch.multinomial(probs, 1, generator=self.generator))  # one seed, one text anywhere
