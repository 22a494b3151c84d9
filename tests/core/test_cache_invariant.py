"""After every round each cache holds exactly the committed tokens but the pending one.

A verifier that accepts a random number of drafts drives the engine through every rollback depth;
after each round the lengths of all target layers and of the exit layer are checked, and at the end
the cached keys and values are compared with a fresh transformers forward over the same tokens.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from eesd_early_exit.head import ExitHead
from tinymodels import make_tiny
from transformers import DynamicCache

from eesd_core import SpeculativeDecoder, hookimpl
from eesd_core.models import find_adapter
from eesd_core.registry import get_manager, reset_manager


class RandomAcceptVerifier:
    """Accepts n ~ U{0..k} drafts and emits a random token: wrong on purpose, fine for caches."""

    def __init__(self, options: object = None) -> None:
        self.random = random.Random(7)

    def verify(self, drafts, qs, p, rngs):  # noqa: ANN001, ANN201
        return [(self.random.randint(0, len(d)), self.random.randrange(3, p.shape[-1])) for d in drafts]


class RandomController:
    def __init__(self, options: object = None) -> None:
        self.random = random.Random(3)

    def start(self, request):  # noqa: ANN001, ANN201
        return None

    def begin_round(self, state, round):  # noqa: ANN001, ANN201
        pass

    def should_continue(self, state, step):  # noqa: ANN001, ANN201
        return self.random.random() < 0.8

    def update(self, state, outcomes):  # noqa: ANN001, ANN201
        pass


class _Plugin:
    @hookimpl
    def eesd_register_verifiers(self, register):  # noqa: ANN001, ANN201
        register.add("random_accept", RandomAcceptVerifier)

    @hookimpl
    def eesd_register_controllers(self, register):  # noqa: ANN001, ANN201
        register.add("random_stop", RandomController)


@pytest.fixture
def with_test_plugins():
    reset_manager()
    get_manager().register(_Plugin(), "cache-invariant-test")
    yield
    reset_manager()


def _reference_keys(model, tokens: list[int]) -> list[torch.Tensor]:
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([tokens]), past_key_values=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cache_holds_committed_tokens_after_every_round(family: str, with_test_plugins: None) -> None:
    model = make_tiny(family, 11, layers=5)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="random_stop",
        verifier="random_accept",
        max_draft_tokens=6,
    )
    dec.drafter.head = ExitHead(dec.adapter, exit_layer=2, num_layers=1)
    ids = torch.tensor([[5, 9, 4, 17]])
    rounds = 0
    generation = dec.stream(ids, max_new_tokens=120, eos_token_id=[])
    for _ in generation:
        committed, state = generation.lengths[0], generation.draft_state
        if not generation.done:
            assert generation.cache.lengths == [committed - 1] * 5
            deferred = sum(t.shape[1] for t in state.deferred)
            assert state.exit_cache.lengths[0] + deferred == committed - 1
        rounds += 1
    assert rounds > 30 and 0 < generation.stats.accepted < generation.stats.drafted

    history = generation.sequence
    final = len(history) - 1
    expected = _reference_keys(model, history[:final])
    generation.cache.crop(final)
    for layer, keys in enumerate(expected):
        assert generation.cache.lengths[layer] == final
        ours = generation.cache.keys[layer][:, :, :final]
        torch.testing.assert_close(ours, keys, rtol=1e-10, atol=1e-10)


def test_exit_cache_matches_a_fresh_pass(with_test_plugins: None) -> None:
    model = make_tiny("llama", 12, layers=4)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 2},
        controller="random_stop",
        verifier="random_accept",
        max_draft_tokens=5,
    )
    head = ExitHead(dec.adapter, exit_layer=2, num_layers=1)
    dec.drafter.head = head
    generation = dec.stream(torch.tensor([[3, 8, 6]]), max_new_tokens=60, eos_token_id=[])
    assert list(generation)
    history, state = generation.sequence, generation.draft_state
    with torch.inference_mode():
        dec.drafter._flush(state)
    length = min(state.exit_cache.lengths[0], len(history) - 1)
    with torch.no_grad():
        fresh_target = dec.adapter.new_cache()
        x = dec.adapter.embed(torch.tensor(history[:length]))
        h = dec.adapter.run(x, 0, 2, fresh_target, 0)
        fresh_exit = head.new_cache()
        head.hidden(h, 0, fresh_exit, None)
    torch.testing.assert_close(
        state.exit_cache.keys[0][:, :, :length],
        fresh_exit.keys[0][:, :, :length],
        rtol=1e-10,
        atol=1e-10,
    )


def test_keep_rows_drops_batch_rows_in_every_layer() -> None:
    from eesd_early_exit.data import keep_rows

    from eesd_core.cache import KVCache

    cache = KVCache(2, capacity=4)
    keys = torch.arange(5 * 2 * 3 * 1, dtype=torch.float32).view(5, 2, 3, 1)
    for layer in range(2):
        cache.update(keys + layer, -keys - layer, layer)
    keep_rows(cache, torch.tensor([0, 3]))
    for layer in range(2):
        k, v = cache.update(torch.zeros(2, 2, 1, 1), torch.zeros(2, 2, 1, 1), layer)
        assert k.shape == (2, 2, 4, 1) and cache.get_seq_length(layer) == 4
        torch.testing.assert_close(k[:, :, :3], keys[[0, 3]] + layer)
        torch.testing.assert_close(v[:, :, :3], -keys[[0, 3]] - layer)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_layers_take_the_cache_by_the_name_transformers_expects(family):
    """The adapter hands each layer its cache under the keyword the installed transformers takes
    (``cache`` since 5.23, ``past_key_values`` before), so no deprecation is triggered, and the
    layers' keys and values land in the cache."""
    adapter = find_adapter(make_tiny(family))
    cache = adapter.new_cache()
    tokens = torch.tensor([5, 9, 11, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        adapter.run(adapter.embed(tokens), 0, adapter.num_layers, cache, 0)
    assert [cache.get_seq_length(i) for i in range(adapter.num_layers)] == [len(tokens)] * adapter.num_layers
