"""The toy target: its adapter behaves like a layered model and refuses broken invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eesd_core.cache import KVCache
from eesd_core.protocols import SamplingParams
from eesd_core.testing import strategies as es
from eesd_core.testing.errors import KitError, ToyInvariantError
from eesd_core.testing.toy import ToyAdapter, ToyModel


@given(es.toy_models(windows=st.integers(0, 2)), st.data())
def test_full_depth_logits_are_the_target_table(model, data):
    """Prefill-style block, then one token at a time: every position reads its own context."""
    tokens = data.draw(st.lists(st.integers(0, model.vocab_size - 1), min_size=1, max_size=6))
    adapter, cache = ToyAdapter(model), KVCache(model.num_layers)
    split = data.draw(st.integers(1, len(tokens)))
    rows = []
    for start, end in [(0, split), *((i, i + 1) for i in range(split, len(tokens)))]:
        hidden = adapter.run(
            adapter.embed(torch.tensor(tokens[start:end])), 0, model.num_layers, cache, start
        )
        rows.append(adapter.logits(adapter.norm(hidden))[0])
    logits = torch.cat(rows)  # [T, V]
    for i in range(len(tokens)):
        assert torch.equal(logits[i], model.logits(tokens[: i + 1]))


@given(es.toy_models(num_layers=st.integers(3, 4)), st.data())
def test_shallow_logits_are_the_draft_table(model, data):
    tokens = data.draw(st.lists(st.integers(0, model.vocab_size - 1), min_size=1, max_size=4))
    adapter = ToyAdapter(model)
    exit_layer = data.draw(st.integers(1, model.num_layers - 1))
    hidden = adapter.run(adapter.embed(torch.tensor(tokens)), 0, exit_layer, KVCache(model.num_layers), 0)
    assert torch.equal(adapter.logits(hidden)[0, -1], model.logits(tokens, draft=True))


def test_a_cache_not_rolled_back_is_refused():
    model = ToyModel(torch.ones(3, 2), window=1)
    adapter, cache = ToyAdapter(model), KVCache(model.num_layers)
    adapter.run(adapter.embed(torch.tensor([0, 1])), 0, model.num_layers, cache, 0)
    with pytest.raises(ToyInvariantError, match="rolled back"):
        adapter.run(adapter.embed(torch.tensor([1])), 0, model.num_layers, cache, 1)


def test_skipping_a_layer_is_refused():
    model = ToyModel(torch.ones(1, 2), window=0, num_layers=3)
    adapter, cache = ToyAdapter(model), KVCache(3)
    hidden = adapter.run(adapter.embed(torch.tensor([0])), 0, 1, cache, 0)
    with pytest.raises(ToyInvariantError, match="went through 1 layers"):
        adapter.run(hidden, 2, 3, cache, 0)
    with pytest.raises(ToyInvariantError, match="depth 0"):
        adapter.logits(adapter.embed(torch.tensor([0])))


def test_layers_that_disagree_on_the_context_are_refused():
    model = ToyModel(torch.ones(9, 2), window=2, num_layers=2)
    adapter, cache = ToyAdapter(model), KVCache(2)
    adapter.run(adapter.embed(torch.tensor([0])), 0, 2, cache, 0)
    cache.keys[1][0, 0, 0, 0] = 1.0  # layer 1 remembers another first token than layer 0
    with pytest.raises(ToyInvariantError, match="another context"):
        adapter.run(adapter.embed(torch.tensor([1])), 0, 2, cache, 1)


@pytest.mark.parametrize("table", [torch.ones(2, 2), torch.zeros(1, 2), -torch.ones(1, 2)])
def test_bad_tables_are_refused(table):
    with pytest.raises(KitError):
        ToyModel(table, window=0)


def test_next_probs_apply_the_sampling_parameters():
    model = ToyModel(torch.tensor([[1.0, 2.0, 1.0]]), window=0)
    assert model.next_probs([0], SamplingParams(0.0)).tolist() == [0.0, 1.0, 0.0]
    assert model.next_probs([0], SamplingParams(1.0, top_k=1)).tolist() == [0.0, 1.0, 0.0]
    assert torch.allclose(
        model.next_probs([0], SamplingParams(1.0)), torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    )
