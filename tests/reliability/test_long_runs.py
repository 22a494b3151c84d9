"""Long runs keep memory flat: no growth across many calls, and only the KV cache grows within one."""

from __future__ import annotations

import gc
import os

import pytest
from eesd_bench.env import cache_bytes
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")


@pytest.mark.slow
def test_thousand_generations_do_not_grow_memory() -> None:
    model = make_tiny("llama", 4, vocab=64, layers=3, dtype=__import__("torch").float32)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 1},
        controller="thompson",
        max_draft_tokens=4,
    )
    for seed in range(50):
        dec.generate([5, 6, 7, seed % 60 + 3], max_new_tokens=12, temperature=1.0, seed=seed)
    gc.collect()
    before = _rss_bytes()
    lengths = set()
    for seed in range(1000):
        generation = dec.stream([5, 6, 7, seed % 60 + 3], max_new_tokens=12, temperature=1.0, seed=seed)
        for _ in generation:
            pass
        lengths.add(max(generation.cache.lengths))
    gc.collect()
    growth = _rss_bytes() - before
    assert max(lengths) <= 4 + 12 + 4
    assert growth < 8 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MiB over 1000 calls"


@pytest.mark.slow
def test_long_generation_grows_only_by_the_cache() -> None:
    import torch

    model = make_tiny("llama", 5, vocab=64, layers=3, dtype=torch.float32, max_position_embeddings=8192)
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 1},
        controller="fixed",
        controller_options={"k": 3},
    )
    dec.generate([5, 6, 7], max_new_tokens=64, eos_token_id=[])
    gc.collect()
    before = _rss_bytes()
    generation = dec.stream([5, 6, 7], max_new_tokens=4000, eos_token_id=[])
    for _ in generation:
        pass
    held = cache_bytes(generation.cache) + cache_bytes(generation.draft_state.exit_cache)
    gc.collect()
    growth = _rss_bytes() - before
    assert generation.stats.new_tokens == 4000
    assert growth < held + 16 * 2**20, (growth, held)
