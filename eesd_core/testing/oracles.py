"""Exact oracles: the distributions decoding must produce, computed, not sampled.

* :func:`lossless_step` is the closed form of one step of speculative sampling: P(n, token).
* :func:`round_distribution` runs one verification round (drafts from q, the verifier, then plain
  sampling to a fixed horizon) and enumerates its randomness; losslessness says it equals
  :func:`autoregressive_distribution` over the same horizon.
* :func:`engine_distribution` does the same for whole generations of the real engine.

:func:`engine_distribution` needs all of a generation's randomness to come from its
:class:`~eesd_core.protocols.RandomSource`: it passes the enumerating source as ``generate(rng=...)``
and sets the decoder's ``clock`` to one that ticks a fixed step per reading, so that controllers
that weigh measured costs decide the same way on every replay. Each run builds a fresh decoder, so
controllers and drafters start from their initial state, and reseeds Python's and torch's global
generators (restored afterwards). Tensors are tiny, so torch runs on one thread meanwhile: on a busy
machine its thread pool would cost more than the work.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from eesd_core.protocols import RandomSource, SamplingParams, Verifier
from eesd_core.sampling import residual
from eesd_core.testing.errors import DistributionMismatch, breach, must
from eesd_core.testing.kit import Setup, installed
from eesd_core.testing.randomness import EnumeratingRandom, distribution, enumerate_runs

Sequences = dict[tuple[int, ...], float]
_SAMPLE = SamplingParams(1.0)


def autoregressive_distribution(
    next_probs: Callable[[list[int]], torch.Tensor],
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_token_id: Sequence[int] = (),
) -> Sequences:
    """P(new tokens) under plain sampling from ``next_probs(history)``, stopping at EOS or the limit."""
    out: Sequences = {}

    def walk(new: list[int], prob: float) -> None:
        if len(new) == max_new_tokens or (new and new[-1] in eos_token_id):
            out[tuple(new)] = prob
            return
        probs = next_probs(list(prompt) + new).to(torch.float64)
        probs = probs / probs.sum()
        for token in probs.nonzero().view(-1).tolist():
            walk(new + [token], prob * float(probs[token]))

    walk([], 1.0)
    return out


def lossless_step(
    draft_tokens: Sequence[int], q: torch.Tensor | None, p: torch.Tensor
) -> dict[tuple[int, int], float]:
    """P(n, token) of speculative sampling for fixed drafts: the rule the lossless verifier follows."""
    out: dict[tuple[int, int], float] = {}
    alive = 1.0
    p = p.to(torch.float64)
    for i, draft in enumerate(draft_tokens):
        q_row = torch.zeros_like(p[i]) if q is None else q[i].to(torch.float64)
        if q is None:
            q_row[draft] = 1.0
        accept = min(1.0, float(p[i, draft] / q_row[draft])) if q_row[draft] > 0 else 0.0
        fallback = residual(p[i], q_row)
        for token in fallback.nonzero().view(-1).tolist():
            out[(i, token)] = alive * (1 - accept) * float(fallback[token] / fallback.sum())
        alive *= accept
    last = p[len(draft_tokens)]
    for token in last.nonzero().view(-1).tolist():
        out[(len(draft_tokens), token)] = alive * float(last[token] / last.sum())
    return {key: value for key, value in out.items() if value > 0}


def verified(results: Any, drafts: Sequence[Any], vocab_size: int) -> list[tuple[int, int]]:
    """A verifier's answer as one (n, token) per row, n in [0, k_b] and token in [0, V); anything
    else is a :class:`~eesd_core.testing.errors.ContractBreach` naming the rule and the value."""
    rows = len(drafts)
    must(
        isinstance(results, (list, tuple)) and len(results) == rows,
        f"verify must return {rows} (n, token)",
        results,
    )
    out = []
    for result, row in zip(results, drafts, strict=True):
        try:
            n, token = int(result[0]), int(result[1])
        except (TypeError, ValueError, IndexError):
            raise breach("verify must return an (n, token) pair of ints per row", result) from None
        must(0 <= n <= len(row), f"verify's n must lie in [0, {len(row)}], the row's drafts", n)
        must(0 <= token < vocab_size, f"verify's token must lie in [0, {vocab_size}), the vocabulary", token)
        out.append((n, token))
    return out


def step_distribution(
    verifier: Verifier, draft_tokens: Sequence[int], q: torch.Tensor | None, p: torch.Tensor
) -> dict[tuple[int, int], float]:
    """P(n, token) of ``verifier`` for fixed drafts, by enumerating its randomness."""
    drafts = torch.tensor(list(draft_tokens), dtype=torch.long)

    def run(rng: EnumeratingRandom) -> tuple[int, int]:
        return verified(verifier.verify([drafts], [q], p[None], [rng]), [drafts], p.shape[-1])[0]

    return distribution(enumerate_runs(run))


def round_distribution(
    verifier: Verifier,
    next_probs: Callable[[list[int]], torch.Tensor],
    draft_probs: Callable[[list[int]], torch.Tensor],
    k: int,
    deterministic: bool = False,
) -> Sequences:
    """P(first k + 1 tokens) of one round of ``k`` drafts, completed by plain sampling from p.

    ``next_probs(prefix)`` is p and ``draft_probs(prefix)`` is q after ``prefix`` (the tokens so
    far in this round). With ``deterministic``, each draft is the argmax of q and ``q=None`` is
    passed, like a drafter that proposes without sampling.
    """

    def run(rng: EnumeratingRandom) -> tuple[int, ...]:
        drafts: list[int] = []
        rows = []
        for _ in range(k):
            q_row = draft_probs(drafts)
            drafts.append(int(q_row.argmax()) if deterministic else rng.categorical(q_row))
            rows.append(q_row)
        p = torch.stack([next_probs(drafts[:i]) for i in range(k + 1)])  # [k+1, V]
        q = None if deterministic or not k else torch.stack(rows)  # [k, V]
        row = torch.tensor(drafts, dtype=torch.long)
        n, token = verified(verifier.verify([row], [q], p[None], [rng]), [row], p.shape[-1])[0]
        tokens = drafts[:n] + [token]
        while len(tokens) < k + 1:
            tokens.append(rng.categorical(next_probs(tokens)))
        return tuple(tokens)

    return distribution(enumerate_runs(run))


class _FixedStepClock:
    """A clock that advances 1 ms per reading, so measured costs replay identically."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-3
        return self.now


@contextmanager
def _quiet_globals() -> Iterator[None]:
    """Restore global generators afterwards; one torch thread meanwhile (tiny tensors)."""
    torch_state, python_state, threads = torch.get_rng_state(), random.getstate(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        torch.set_num_threads(threads)


def engine_distribution(
    setup: Setup,
    prompt: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = _SAMPLE,
    eos_token_id: Sequence[int] = (),
    max_runs: int = 100_000,
    keywords: Mapping[str, Any] | None = None,
) -> Sequences:
    """P(new tokens) of ``setup``'s decoder generating after ``prompt``, exactly, by enumeration;
    ``keywords``: more ``generate()`` arguments (logits processors, ``min_new_tokens``, ...)."""

    def run(rng: RandomSource) -> tuple[int, ...]:
        random.seed(0)
        torch.default_generator.manual_seed(0)
        decoder = setup.build()
        decoder.clock = _FixedStepClock()
        result = decoder.generate(
            list(prompt),
            rng=rng,
            max_new_tokens=max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            eos_token_id=list(eos_token_id),
            seed=0,
            **(keywords or {}),
        )
        return tuple(result.sequences[0, len(prompt) :].tolist())  # type: ignore[call-overload]

    with installed(setup.subjects()), _quiet_globals():
        return distribution(enumerate_runs(run, max_runs))


def engine_batch_distribution(
    setup: Setup,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams = _SAMPLE,
    eos_token_id: Sequence[int] = (),
    max_runs: int = 100_000,
    keywords: Mapping[str, Any] | None = None,
) -> dict[tuple[tuple[int, ...], ...], float]:
    """P(new tokens of every row) of one batched call, exactly: every row draws from one
    enumerating source, so the joint outcome of the rows is enumerated (``keywords`` as above)."""

    def run(rng: RandomSource) -> tuple[tuple[int, ...], ...]:
        random.seed(0)
        torch.default_generator.manual_seed(0)
        decoder = setup.build()
        decoder.clock = _FixedStepClock()
        result = decoder.generate(
            [list(p) for p in prompts],
            rng=[rng] * len(prompts),
            max_new_tokens=max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            eos_token_id=list(eos_token_id),
            **(keywords or {}),
        )
        return tuple(tuple(row[len(p) :].tolist()) for row, p in zip(result.sequences, prompts, strict=True))

    with installed(setup.subjects()), _quiet_globals():
        return distribution(enumerate_runs(run, max_runs))


def independent_rows(rows: Sequence[Sequences]) -> dict[tuple[tuple[int, ...], ...], float]:
    """The joint distribution of independent rows: the product of their own distributions."""
    joint: dict[tuple[tuple[int, ...], ...], float] = {(): 1.0}
    for row in rows:
        joint = {key + (out,): p * q for key, p in joint.items() for out, q in row.items()}
    return joint


def assert_distributions_equal(
    actual: Mapping[Any, float], expected: Mapping[Any, float], atol: float = 1e-12, what: str = "outcomes"
) -> None:
    """Equal probabilities outcome by outcome (missing outcomes count as 0), within ``atol``."""
    keys = set(actual) | set(expected)
    gaps = sorted(((abs(actual.get(k, 0.0) - expected.get(k, 0.0)), k) for k in keys), reverse=True)
    if gaps and gaps[0][0] > atol:
        worst = "; ".join(
            f"{k}: got {actual.get(k, 0.0):.15g}, expected {expected.get(k, 0.0):.15g}"
            for gap, k in gaps[:5]
            if gap > atol
        )
        raise DistributionMismatch(
            f"The distribution of {what} differs from the exact one by up to {gaps[0][0]:.3g} "
            f"(tolerance {atol:g}). Largest differences: {worst}. Decoding is not lossless here: the "
            "failing example above is the smallest case found."
        )
    total = math.fsum(actual.values())
    if abs(total - 1.0) > max(atol, 1e-9):
        raise DistributionMismatch(f"The probabilities of {what} sum to {total!r}, not 1.")
