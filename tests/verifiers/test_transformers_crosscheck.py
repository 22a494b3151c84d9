"""Same p, q, drafts and uniform draws: our verifier decides exactly as transformers does.

transformers' ``_speculative_sampling`` draws one uniform r_i per draft up front and accepts while
``r_i <= p_i / q_i`` (so a ratio above 1 always accepts), then samples the next token with
``torch.multinomial`` from norm(max(0, p - q)) after a rejection, or from p after k acceptances.
Our verifier asks its RandomSource ``bernoulli(min(1, p_i / q_i))`` per draft, in order, until a
rejection, then ``categorical``. :class:`ScriptedRandom` answers those with the same uniforms
(``u <= prob``, inverse CDF), and transformers' ``torch.rand_like`` / ``torch.multinomial`` are
patched to read them, so both sides see identical draws. Both take the softmax of the same float64
logits. Drafts come from the support of q: transformers accepts a draft with q = 0 (ratio inf),
ours rejects it, and such a draft is never proposed by sampling from q.
"""

from __future__ import annotations

from unittest import mock

import torch
from eesd_lossless import LosslessVerifier
from hypothesis import given
from hypothesis import strategies as st
from transformers.generation import utils as hf_utils

from eesd_core.testing import strategies as es
from eesd_core.testing.randomness import ScriptedRandom, inverse_cdf

_UNIFORMS = st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 0.25, 0.5, 0.75]))


@st.composite
def cases(draw):
    vocab, k = draw(st.integers(2, 6)), draw(st.integers(1, 5))
    p = draw(es.prob_matrices(k + 1, vocab)).log()  # logits [k+1, V]
    q = draw(es.prob_matrices(k, vocab)).log()  # [k, V]
    drafts = [draw(st.sampled_from(row.isfinite().nonzero().view(-1).tolist())) for row in q]
    accept = draw(st.lists(_UNIFORMS, min_size=k, max_size=k))
    return p, q, drafts, accept, draw(_UNIFORMS)


def transformers_decision(p_logits, q_logits, drafts, accept, sample):
    """(n, token) from transformers' own ``_speculative_sampling`` with the given uniforms."""
    k = len(drafts)
    candidates = torch.tensor([[0, *drafts]])  # a one-token prompt, then the drafts

    def multinomial(probs, num_samples):
        return torch.tensor([[inverse_cdf(probs[0], sample)]])

    with (
        mock.patch.object(torch, "rand_like", lambda t: torch.tensor(accept, dtype=t.dtype)),
        mock.patch.object(torch, "multinomial", multinomial),
    ):
        tokens, n = hf_utils._speculative_sampling(candidates, q_logits[None], k, p_logits[None])
    return int(n), int(tokens[0, -1])


@given(cases())
def test_same_decisions_as_transformers(case):
    p_logits, q_logits, drafts, accept, sample = case
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    [ours] = LosslessVerifier().verify(
        [torch.tensor(drafts)], [q], p[None], [ScriptedRandom(accept, [sample])]
    )
    assert ours == transformers_decision(p_logits, q_logits, drafts, accept, sample)


def test_acceptance_at_equality_follows_transformers():
    """r = p/q exactly: transformers accepts (``<=``); so does the scripted source."""
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    [ours] = LosslessVerifier().verify([torch.tensor([0])], [q], p[None], [ScriptedRandom([0.5], [0.9])])
    assert ours == transformers_decision(p.log(), q.log(), [0], [0.5], 0.9) == (1, 1)
