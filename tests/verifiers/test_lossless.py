"""The lossless verifier: its exact step distribution, greedy exact match, and its edge cases."""

from __future__ import annotations

import random

import torch
from eesd_lossless import LosslessVerifier
from hypothesis import given
from hypothesis import strategies as st

from eesd_core.protocols import SamplingParams
from eesd_core.sampling import process_logits
from eesd_core.testing import strategies as es
from eesd_core.testing.oracles import assert_distributions_equal, lossless_step, step_distribution
from eesd_core.testing.randomness import EnumeratingRandom, NoRandom


@st.composite
def steps(draw, deterministic=False):
    """(drafts, q, p) with each draft inside the support of its q row."""
    vocab, k = draw(st.integers(2, 5)), draw(st.integers(0, 4))
    p = draw(es.prob_matrices(k + 1, vocab))
    q = draw(es.prob_matrices(k, vocab))
    if deterministic:
        return draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k)), None, p
    drafts = [draw(st.sampled_from(row.nonzero().view(-1).tolist())) for row in q]
    return drafts, q, p


@given(steps())
def test_step_follows_the_closed_form(step):
    """P(n, token) of the verifier, enumerated, equals the closed form of speculative sampling."""
    drafts, q, p = step
    assert_distributions_equal(
        step_distribution(LosslessVerifier(), drafts, q, p), lossless_step(drafts, q, p)
    )


@given(steps(deterministic=True))
def test_deterministic_drafts_are_one_hot_q(step):
    """q=None means each draft had q = 1: accept with p(d), resample from p without d."""
    drafts, _, p = step
    one_hot = torch.eye(p.shape[1], dtype=p.dtype)[drafts] if drafts else None
    expected = lossless_step(drafts, one_hot, p)
    assert_distributions_equal(step_distribution(LosslessVerifier(), drafts, None, p), expected)


def test_a_draft_q_never_proposes_is_rejected_and_replaced_from_the_residual():
    """q(d) = 0 < p(d): no acceptance draw, and the token comes from norm(max(0, p - q))."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    assert step_distribution(LosslessVerifier(), [0], q, p) == {(0, 0): 1.0}


def test_all_drafts_accepted_gives_a_bonus_token_from_the_last_row():
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    assert step_distribution(LosslessVerifier(), [1, 0], q, p) == {(2, 0): 0.25, (2, 1): 0.75}


def test_no_drafts_is_a_plain_sampling_step():
    p = torch.tensor([[0.1, 0.0, 0.9]], dtype=torch.float64)
    got = step_distribution(LosslessVerifier(), [], None, p)
    assert_distributions_equal(got, {(0, 0): 0.1, (0, 2): 0.9})


def test_greedy_ties_go_to_the_first_maximum_without_randomness():
    """Tied logits: p is one-hot on the first maximum, so only that draft is accepted."""
    p = process_logits(torch.tensor([[2.0, 2.0, 0.0], [0.0, 1.0, 1.0]]), SamplingParams(0.0))
    verifier = LosslessVerifier()
    assert verifier.verify([torch.tensor([1])], [None], p[None], [NoRandom()]) == [(0, 0)]
    assert verifier.verify([torch.tensor([0])], [None], p[None], [NoRandom()]) == [(1, 1)]


def test_minus_infinity_logits_are_never_emitted():
    """Tokens with logit -inf have p = 0: neither accepted nor sampled."""
    logits = torch.tensor([[0.0, -torch.inf, 1.0], [-torch.inf, 0.0, 0.0]], dtype=torch.float64)
    p = process_logits(logits, SamplingParams(1.0))
    q = torch.tensor([[0.2, 0.6, 0.2]], dtype=torch.float64)
    got = step_distribution(LosslessVerifier(), [1], q, p)
    assert all(token != 1 for n, token in got if n == 0)
    assert_distributions_equal(got, lossless_step([1], q, p))


def test_float32_p_with_float64_q():
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]], dtype=torch.float32)
    q = torch.tensor([[0.6, 0.4]], dtype=torch.float64)
    got = step_distribution(LosslessVerifier(), [0], q, p)
    assert_distributions_equal(got, lossless_step([0], q, p.double()), atol=1e-7)


@given(steps())
def test_randomness_comes_only_from_the_source(step):
    """The global Python and torch generators are untouched; answers are plain ints."""
    drafts, q, p = step
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    [(n, token)] = LosslessVerifier().verify(
        [torch.tensor(drafts, dtype=torch.long)], [q], p[None], [EnumeratingRandom()]
    )
    assert type(n) is int and type(token) is int and 0 <= n <= len(drafts)
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state


@given(st.integers(2, 5).flatmap(lambda v: st.tuples(es.prob_matrices(2, v), es.prob_matrices(1, v))))
def test_the_closed_form_itself_gives_p_for_the_first_token(rows):
    """Independent of any verifier: drafts from q, then the closed form, leave the first token ~ p_0."""
    p, q = rows
    first = torch.zeros(p.shape[1], dtype=torch.float64)
    for draft in q[0].nonzero().view(-1).tolist():
        for (n, token), prob in lossless_step([draft], q, p).items():
            first[draft if n else token] += float(q[0, draft]) * prob
    assert torch.allclose(first, p[0], rtol=0, atol=1e-12)


# -- a batch round verified in one call ----------------------------------------------------------


def _batch_case() -> tuple[list[list[int]], list, torch.Tensor, list]:
    """Three rows: two sampled drafts against q, one fixed draft, none; p over four positions."""
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(3, 4, 5, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 5, generator=gen, dtype=torch.float64), -1)
    uniforms = [([0.1, 0.9, 0.5], [0.3, 0.7]), ([0.95], [0.2]), ([], [0.6])]
    return [[1, 4], [2], []], [q, None, None], p, uniforms


def test_rows_verified_together_answer_as_each_alone() -> None:
    from eesd_core.testing.checks import check_verify_batch

    drafts, qs, p, uniforms = _batch_case()
    check_verify_batch(LosslessVerifier(), drafts, qs, p, uniforms)


def test_a_verifier_that_mixes_up_rows_is_reported() -> None:
    """The kit's check catches a batch path that answers a row with another row's p."""
    from eesd_core.testing.checks import check_verify_batch
    from eesd_core.testing.errors import DistributionMismatch

    class Shifted(LosslessVerifier):
        def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN202
            return super().verify(drafts, qs, p.roll(1, dims=0) if len(drafts) > 1 else p, rngs)

    drafts, qs, p, uniforms = _batch_case()
    try:
        check_verify_batch(Shifted(), drafts, qs, p, uniforms)
    except DistributionMismatch as exc:
        assert "together returned" in str(exc)
    else:
        raise AssertionError("a verifier reading the wrong rows passed the check")


def test_a_verifier_written_row_by_row_decodes_batches_alike() -> None:
    """A verifier that verifies one row at a time decodes a batch as the lossless verifier does:
    same tokens, greedy and sampled with a seed."""
    from tinymodels import make_tiny

    from eesd_core import SpeculativeDecoder

    class RowByRow:
        def __init__(self) -> None:
            self.inner, self.calls = LosslessVerifier(), 0

        def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN202
            self.calls += len(drafts)
            rows = zip(drafts, qs, rngs, strict=True)
            return [self.inner.verify([d], [q], p[b : b + 1], [r])[0] for b, (d, q, r) in enumerate(rows)]

    model = make_tiny("llama", 2, layers=4)
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22]]
    for temperature in (0.0, 1.0):
        outs = []
        for verifier in (None, RowByRow()):
            dec = SpeculativeDecoder(
                model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
            )
            if verifier is not None:
                dec.verifier = verifier
            result = dec.generate(prompts, max_new_tokens=12, temperature=temperature, seed=4)
            outs.append([s.tolist() for s in result.sequences])
        assert outs[0] == outs[1] and verifier.calls >= 3 * 12 // 3
