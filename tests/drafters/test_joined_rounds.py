"""One-row early-exit states drafting together (a serving engine's requests).

``join`` lays the caches of requests of different lengths side by side for one round of the
drafter's steps and ``part`` hands each request its row back. Every draft distribution of a joined round must
equal the one the request's own round computes (float64), and the states it leaves behind must
draft the next rounds as a solo state would, after any rollback.
"""

from __future__ import annotations

import random

import pytest
import torch
from eesd_early_exit.drafter import EarlyExitDrafter
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import save_head
from eesd_early_exit.options import EarlyExitOptions
from tinymodels import make_tiny

from eesd_core.cache import BatchLayout
from eesd_core.models import find_adapter

EXIT = 2
CAPACITY = 64


def _drafter(family: str, tmp_path, head: bool) -> EarlyExitDrafter:  # noqa: ANN001
    model = make_tiny(family, 3, vocab=97, layers=4, dtype=torch.float64)
    adapter = find_adapter(model)
    path = None
    if head:
        torch.manual_seed(1)
        exit_head = ExitHead(adapter, EXIT).to(torch.float64)
        with torch.no_grad():
            for p in exit_head.parameters():
                p.add_(0.05 * torch.randn_like(p))
        path = str(save_head(exit_head, adapter, tmp_path / "plain.safetensors", dtype=torch.float64))
    drafter = EarlyExitDrafter(EarlyExitOptions(exit_layer=EXIT, head=path))
    drafter.attach(adapter)
    return drafter


def _state(drafter: EarlyExitDrafter, tokens: list[int]):  # noqa: ANN202
    """A one-row state, laid out densely, whose caches hold every token but the last (the pending
    one), as a proposer's do."""
    adapter = drafter.adapter
    cache = adapter.new_cache(num_layers=drafter.shared_layers)
    state = drafter.begin(cache, BatchLayout(1, CAPACITY, adapter.device), None)
    if len(tokens) > 1:
        x = adapter.embed(torch.tensor([tokens[:-1]]))
        drafter.extend(state, adapter.run(x, 0, drafter.shared_layers, cache, 0))
    return state


def _cut(drafter: EarlyExitDrafter, state, length: int) -> None:  # noqa: ANN001
    state.cache.crop(length)
    drafter.rollback(state, length)


def _solo(drafter: EarlyExitDrafter, state, tokens: list[int], k: int):  # noqa: ANN001, ANN202
    drafts, logits = [], []
    token, position = tokens[-1], len(tokens) - 1
    for i in range(k):
        history = [torch.tensor(tokens + drafts)]
        out = drafter.step(state, torch.tensor([token]), position + i, [True], history).logits[0]
        token = int(out.argmax())
        drafts.append(token)
        logits.append(out)
    drafter.finish(state, torch.tensor([token]), position + k)
    return drafts, logits


def _joined(drafter: EarlyExitDrafter, states, rows: list[list[int]], ks: list[int], behind=None):  # noqa: ANN001, ANN202
    joined = drafter.join(states, max(ks) + 1, behind)
    layout, width = joined.layout, joined.layout.slots
    drafts: list[list[int]] = [[] for _ in rows]
    logits: list[list[torch.Tensor]] = [[] for _ in rows]
    feed = torch.tensor([tokens[-1] for tokens in rows])
    feeding, steps = [True] * len(rows), 0
    while True:
        layout.mark(width + steps, feeding, [len(t) - 1 + steps for t in rows])
        drafting = [f and len(d) < k for f, d, k in zip(feeding, drafts, ks, strict=True)]
        if not any(drafting):
            break
        history = [torch.tensor(t + d) for t, d in zip(rows, drafts, strict=True)]
        out = drafter.step(joined, feed, width + steps, drafting, history).logits
        for j, on in enumerate(drafting):
            feed[j] = int(out[j].argmax()) if on else 0
            if on:
                drafts[j].append(int(feed[j]))
                logits[j].append(out[j])
        feeding, steps = drafting, steps + 1
    hidden = drafter.finish(joined, feed, width + steps)
    drafter.part(joined, states, [k + 1 for k in ks], hidden)
    return drafts, logits


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("head", [True, False], ids=["exit-layer", "untrained"])
@pytest.mark.parametrize("lag", [False, True], ids=["caught-up", "behind"])
def test_joined_rounds_draft_what_each_request_drafts_alone(family, head, lag, tmp_path) -> None:  # noqa: ANN001
    """With ``lag``, the joined requests' caches lack the last 0-3 committed tokens, which
    ``join`` runs for all of them in one pass (a proposer catching up on what vLLM accepted)."""
    drafter = _drafter(family, tmp_path, head)
    rng = random.Random(7)
    rows = [[rng.randrange(3, 97) for _ in range(n)] for n in (9, 2, 14, 5)]
    together = [_state(drafter, tokens) for tokens in rows]
    alone = [_state(drafter, tokens) for tokens in rows]
    for round_ in range(4):
        ks = [rng.randrange(1, 5) for _ in rows]
        behind = None
        if lag:  # cut the joined states back; join catches them up
            behind = []
            for tokens, state in zip(rows, together, strict=True):
                cut = len(tokens) - 1 - rng.randrange(min(4, len(tokens)))
                _cut(drafter, state, cut)
                behind.append(tokens[cut : len(tokens) - 1])
            assert any(behind) and len({len(b) for b in behind}) > 1
        got, got_logits = _joined(drafter, together, rows, ks, behind)
        for j, tokens in enumerate(rows):
            want, want_logits = _solo(drafter, alone[j], tokens, ks[j])
            assert got[j] == want, (round_, j)
            for a, b in zip(got_logits[j], want_logits, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
            # verification keeps a random prefix of the drafts and one token of its own
            kept = rng.randrange(ks[j] + 1)
            tokens.extend(want[:kept] + [rng.randrange(3, 97)])
            for state in (together[j], alone[j]):
                _cut(drafter, state, len(tokens) - 1)
        if round_ == 1:  # a request that drafts alone between joined rounds
            _solo(drafter, together[0], rows[0], 2)
            _solo(drafter, alone[0], rows[0], 2)
            for state in (together[0], alone[0]):
                _cut(drafter, state, len(rows[0]) - 1)


def test_top_input_heads_join_with_their_top_states_laid_out_by_slot(tmp_path) -> None:  # noqa: ANN001
    model = make_tiny("llama", 3, vocab=97, layers=4, dtype=torch.float64)
    adapter = find_adapter(model)
    path = save_head(ExitHead(adapter, EXIT, top_input=True), adapter, tmp_path / "top.safetensors")
    drafter = EarlyExitDrafter(EarlyExitOptions(head=str(path)))
    drafter.attach(adapter)
    short, long = _state(drafter, [5, 6, 7]), _state(drafter, [5, 6, 7, 8, 9])
    with pytest.raises((ValueError, RuntimeError), match="top states"):
        drafter.join([short, long], extra=2)  # a state must hold the tops of its cached positions
    for state in (short, long):
        n = state.cache.lengths[0]
        state.tops = torch.randn(1, n + 3, adapter.hidden_size, dtype=torch.float64)  # by slot
    joined = drafter.join([short, long], extra=2)
    width = joined.layout.slots
    for row, state in enumerate((short, long)):
        n = state.cache.lengths[0]
        assert torch.equal(joined.tops[row, width - n : width], state.tops[0, :n])
        assert not joined.tops[row, : width - n].any()
