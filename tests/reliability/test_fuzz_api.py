"""Random configurations and inputs thrown at the public API: every failure is an EESDError."""

from __future__ import annotations

import contextlib
import resource

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tinymodels import make_tiny

from eesd_core import EESDError, SpeculativeDecoder

MODEL = make_tiny("llama", 3, vocab=31, layers=3)

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 40),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(-2, 40), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
option_dicts = st.dictionaries(
    st.sampled_from(["exit_layer", "head", "k", "variant", "typo", "threshold"]), anything, max_size=2
)


@settings(max_examples=60, deadline=None)
@given(
    drafter=st.sampled_from(["early_exit", "none", "nope", None]),
    drafter_options=st.one_of(st.none(), option_dicts),
    controller=st.sampled_from(["fixed", "thompson", "missing"]),
    controller_options=st.one_of(st.none(), option_dicts),
    max_draft_tokens=st.one_of(st.integers(-2, 70), st.floats(), st.text(max_size=2)),
)
def test_random_configurations(  # noqa: ANN201
    drafter,
    drafter_options,
    controller,
    controller_options,
    max_draft_tokens,  # noqa: ANN001
):
    # any configuration either builds a decoder or fails with an EESDError; anything else escapes
    with contextlib.suppress(EESDError):
        SpeculativeDecoder(
            MODEL,
            drafter=drafter,
            drafter_options=drafter_options,
            controller=controller,
            controller_options=controller_options,
            max_draft_tokens=max_draft_tokens,
        )


DECODER = SpeculativeDecoder(
    MODEL,
    drafter="early_exit",
    drafter_options={"exit_layer": 1},
    controller="fixed",
    controller_options={"k": 3},
)


@settings(max_examples=80, deadline=None)
@given(
    ids=st.one_of(
        st.lists(st.integers(-3, 40), max_size=6),
        st.text(max_size=3),
        st.none(),
        st.lists(st.floats(), min_size=1, max_size=3),
    ),
    max_new_tokens=st.one_of(st.integers(-3, 8), st.floats(), st.none()),
    temperature=st.one_of(st.floats(-1, 3), st.just(float("nan")), st.just(float("inf"))),
    top_k=st.integers(-2, 40),
    top_p=st.floats(-0.5, 1.5),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
)
def test_random_generate_arguments(ids, max_new_tokens, temperature, top_k, top_p, seed) -> None:  # noqa: ANN001
    try:
        out = DECODER.generate(
            ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
        )
    except EESDError:
        return
    assert out.sequences.shape[1] <= len(ids) + max_new_tokens
    assert int(out.sequences.max()) < 31


@pytest.mark.parametrize("ids", [torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([3, 4])])
def test_integer_tensors_of_any_width_are_accepted(ids: torch.Tensor) -> None:
    assert DECODER.generate(ids, max_new_tokens=2).sequences.shape[1] == ids.numel() + 2


odd = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 40),
    st.floats(),
    st.text(max_size=3),
    st.builds(np.int64, st.integers(-3, 40)),
    st.builds(np.float32, st.floats(0, 2, width=32)),
    st.just(np.True_),
    st.lists(
        st.one_of(st.booleans(), st.integers(-3, 40), st.builds(np.int64, st.integers(0, 30))), max_size=3
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    batch=st.booleans(),
    max_new_tokens=st.one_of(odd, st.integers(1, 6)),
    temperature=st.one_of(odd, st.sampled_from([0.0, 0.7, 1e-40])),
    seed=odd,
    eos_token_id=odd,
    pad_token_id=odd,
    attention_mask=st.one_of(st.none(), odd),
)
def test_odd_generate_arguments_fail_cleanly_and_in_bounded_memory(  # noqa: ANN201
    batch,
    max_new_tokens,
    temperature,
    seed,
    eos_token_id,
    pad_token_id,
    attention_mask,  # noqa: ANN001
):
    # only EESDError subclasses escape, whatever the kind of each argument; memory stays bounded
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]]) if batch else [5, 6]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        out = DECODER.generate(
            ids,
            attention_mask=attention_mask,
            pad_token_id=pad_token_id,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            eos_token_id=eos_token_id,
        )
    except EESDError:
        return
    finally:
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB
    assert out.sequences.shape[-1] <= 3 + int(max_new_tokens)
