"""Hypothesis strategies for decoding tests: distributions, toy models, erratic controllers, steps.

Distributions are *mapped* from bounded floats, never filtered, and include exact zeros and ties,
the cases where speculative sampling is easiest to get wrong.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from eesd_core.protocols import Confidence, Costs, DraftStep, Request, RoundOutcome, SamplingParams
from eesd_core.testing.controllers import ErraticController
from eesd_core.testing.toy import ToyModel

# Simplest first (uniform rows, full of ties); an exact zero in about one draw of five.
_WEIGHTS = st.one_of(
    st.just(1.0), st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.just(0.0), st.sampled_from([0.5, 0.25])
)


def _normalised(weights: list[float], fallback: int) -> torch.Tensor:
    probs = torch.tensor(weights, dtype=torch.float64)
    if float(probs.sum()) <= 0:
        probs[fallback % len(weights)] = 1.0
    return probs / probs.sum()


@st.composite
def prob_vectors(draw: st.DrawFn, vocab_size: int) -> torch.Tensor:
    """A float64 distribution over ``vocab_size`` tokens, often with zeros and ties. # [V]"""
    weights = draw(st.lists(_WEIGHTS, min_size=vocab_size, max_size=vocab_size))
    return _normalised(weights, draw(st.integers(0, vocab_size - 1)))


def prob_matrices(rows: int, vocab_size: int) -> st.SearchStrategy[torch.Tensor]:
    """``rows`` distributions stacked. # [rows, V]"""
    vectors = st.lists(prob_vectors(vocab_size), min_size=rows, max_size=rows)
    return vectors.map(lambda vs: torch.stack(vs) if vs else torch.empty(0, vocab_size, dtype=torch.float64))


def one_hot_matrices(rows: int, vocab_size: int) -> st.SearchStrategy[torch.Tensor]:
    """Greedy targets: each row all mass on one token. # [rows, V]"""
    tokens = st.lists(st.integers(0, vocab_size - 1), min_size=rows, max_size=rows)
    return tokens.map(lambda ts: torch.eye(vocab_size, dtype=torch.float64)[ts])


def logits_from(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is ``probs``; -inf where a probability is 0."""
    return probs.log()


@st.composite
def toy_models(
    draw: st.DrawFn,
    vocab_sizes: st.SearchStrategy[int] | None = None,
    windows: st.SearchStrategy[int] | None = None,
    num_layers: st.SearchStrategy[int] | None = None,
) -> ToyModel:
    """A random n-gram :class:`ToyModel`; its draft table is sometimes the target's (q = p).

    Defaults: 2 or 3 tokens, a window of 0 or 1 token (unigram or bigram), 2 or 3 layers.
    """
    vocab = draw(st.integers(2, 3) if vocab_sizes is None else vocab_sizes)
    window = draw(st.integers(0, 1) if windows is None else windows)
    layers = draw(st.integers(2, 3) if num_layers is None else num_layers)
    rows = (vocab + 1) ** window
    target = draw(prob_matrices(rows, vocab))
    draft = draw(st.one_of(prob_matrices(rows, vocab), st.just(None)))
    return ToyModel(target, draft, window=window, num_layers=layers)


def prompts(vocab_size: int, max_size: int = 3) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_size)


def sampling_params(greedy: bool | None = None) -> st.SearchStrategy[SamplingParams]:
    """Temperature, top-k and top-p as ``generate()`` takes them; ``greedy`` forces the choice."""
    sampled = st.builds(
        SamplingParams,
        temperature=st.sampled_from([1.0, 0.5, 1.7]),
        top_k=st.sampled_from([0, 0, 0, 2, 1]),
        top_p=st.sampled_from([1.0, 1.0, 0.9, 0.7]),
    )
    if greedy is None:
        return st.one_of(st.just(SamplingParams(0.0)), sampled)
    return st.just(SamplingParams(0.0)) if greedy else sampled


def erratic_controllers(withdrawing: bool = True) -> st.SearchStrategy[ErraticController]:
    """Arbitrary continue/stop and keep/withdraw decisions, including always and never;
    ``withdrawing=False`` keeps every draft (for a verifier's tests: drafts must reach it)."""
    schedules = st.one_of(
        st.just((True,)), st.just((False,)), st.lists(st.booleans(), min_size=1, max_size=6).map(tuple)
    )
    keeps = schedules if withdrawing else st.just((True,))
    return st.builds(ErraticController, schedule=schedules, salt=st.integers(0, 5), keeps=keeps)


_MAYBE_TIME = st.one_of(st.none(), st.just(0.0), st.floats(0.0, 1e3, allow_nan=False))
_PROB = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


@st.composite
def costs(draw: st.DrawFn) -> Costs:
    """Measured costs as a controller may see them: unknown, zero, or anything plausible."""
    verify = draw(st.lists(_MAYBE_TIME, min_size=1, max_size=10))
    return Costs(
        draft_step=draw(_MAYBE_TIME),
        propose_base=draw(_MAYBE_TIME),
        verify=lambda m: verify[m % len(verify)],
    )


@st.composite
def confidences(draw: st.DrawFn) -> Confidence:
    """A draft's confidence: q(d) <= top-1, any entropy."""
    top1 = draw(_PROB)
    return Confidence(draw(_PROB) * top1, top1, draw(st.one_of(st.just(0.0), st.floats(0.0, 12.0))))


@st.composite
def draft_steps(draw: st.DrawFn, max_draft_tokens: int | None = None) -> DraftStep:
    """A step as the engine hands it to ``should_continue``: index 0 carries no draft."""
    limit = draw(st.integers(1, 64)) if max_draft_tokens is None else max_draft_tokens
    index = draw(st.integers(0, limit))
    if not index:
        return DraftStep(index=0, max_draft_tokens=limit)
    return DraftStep(index, limit, 0, draw(st.integers(0, 50_000)), draw(confidences()))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    return Request(
        prompt_length=draw(st.integers(1, 4096)),
        max_new_tokens=draw(st.integers(1, 4096)),
        max_draft_tokens=draw(st.integers(1, 64)),
        sampling=draw(sampling_params()),
        costs=draw(costs()),
    )


@st.composite
def round_outcomes(draw: st.DrawFn) -> RoundOutcome:
    """What ``update`` receives: k drafted (maybe 0), n <= k accepted, confidences for each draft."""
    k = draw(st.integers(0, 64))
    n = draw(st.integers(0, k))
    return RoundOutcome(
        position=draw(st.integers(0, 4096)),
        drafted=k,
        accepted=n,
        tokens=tuple(draw(st.lists(st.integers(0, 50_000), min_size=n + 1, max_size=n + 1))),
        confidences=tuple(draw(st.lists(confidences(), min_size=k, max_size=k))),
        draft_time=draw(st.floats(0.0, 10.0)),
        verify_time=draw(st.floats(0.0, 10.0)),
        costs=draw(costs()),
    )
