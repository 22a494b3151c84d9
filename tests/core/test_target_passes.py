"""A call runs the target at most once per new token: the prefill draws the first token itself."""

from __future__ import annotations

import pytest
import torch
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder


def _count_target_passes(dec: SpeculativeDecoder) -> list[int]:
    """Count the rows of the adapter's calls that run the target's last layer: one per row and
    target pass (a batch's prefill of ragged prompts may run its rows in groups)."""
    adapter, calls = dec.adapter, [0]
    original = adapter.run

    def counted(hidden, start, end, *args, **kwargs):
        calls[0] += hidden.shape[0] * (end == adapter.num_layers and end > start)
        return original(hidden, start, end, *args, **kwargs)

    adapter.run = counted
    return calls


@pytest.mark.parametrize("new_tokens", [1, 2, 9])
def test_plain_decoding_runs_the_target_once_per_new_token(new_tokens) -> None:
    model = make_tiny("llama", 3, layers=3)
    dec = SpeculativeDecoder(model, drafter=None)
    calls = _count_target_passes(dec)
    prompt = [5, 9, 4, 17, 3]
    out = dec.generate(prompt, max_new_tokens=new_tokens, eos_token_id=[])
    assert calls[0] == new_tokens
    assert out.stats.rounds == new_tokens and out.stats.mean_accepted_tokens == 1.0
    reference = model.generate(
        torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert out.sequences[0].tolist() == reference[0].tolist()


def test_a_batch_runs_the_target_once_per_new_token() -> None:
    """Each row goes through the target once per new token; after the prefill (which may run the
    rows in groups), each round is one pass over every row."""
    model = make_tiny("qwen2", 4, layers=3)
    dec = SpeculativeDecoder(model, drafter=None)
    rows = _count_target_passes(dec)
    passes = []
    original = dec.adapter.run
    dec.adapter.run = lambda hidden, *a, **k: passes.append(hidden.shape[0]) or original(hidden, *a, **k)
    prompts = [[5, 9, 4, 17, 3], [8, 1], [30]]
    generation = dec.stream(prompts, max_new_tokens=6, eos_token_id=[])
    next(generation)  # the prefill
    passes.clear()
    for _ in generation:
        pass
    assert rows[0] == 6 * len(prompts)
    assert passes == [len(prompts)] * 5  # five rounds, each one pass over the three rows
    assert generation.stats.rounds == 6
    assert [row.rounds for row in generation.stats.rows] == [6, 6, 6]


def test_one_new_token_asks_the_controller_nothing() -> None:
    """The first token comes from the prefill, so a one-token call makes no round to decide."""
    model = make_tiny("llama", 5, layers=4)
    dec = SpeculativeDecoder(model, drafter_options={"exit_layer": 2, "head": None}, max_draft_tokens=3)
    asked, updated = [], []
    original, update = dec.controller.should_continue, dec.controller.update
    dec.controller.should_continue = lambda state, step: asked.append(step) or original(state, step)
    dec.controller.update = lambda state, outcomes: updated.append(outcomes) or update(state, outcomes)
    out = dec.generate([5, 9, 4], max_new_tokens=1, eos_token_id=[])
    assert len(out.sequences[0]) == 4 and out.stats.drafted == 0
    assert asked == [] and updated == []


@pytest.mark.parametrize("drafter", ["early_exit", "prompt_lookup"])
def test_a_row_that_ends_at_its_first_token_leaves_the_batch_after_the_prefill(drafter) -> None:
    """Row 0's first token is an EOS, drawn by the prefill: it leaves the batch before any round
    (the batch is realigned at once) and the other rows still equal their solo generations."""
    model = make_tiny("llama", 6, layers=4)
    options = {"exit_layer": 2, "head": None} if drafter == "early_exit" else {}
    dec = SpeculativeDecoder(
        model, drafter=drafter, drafter_options=options, controller="fixed", controller_options={"k": 2}
    )
    prompts = [[5, 9, 4, 17, 3], [8, 1], [30, 31, 32], [7]]
    eos = int(dec.generate(prompts[0], max_new_tokens=1, eos_token_id=[]).sequences[0, -1])
    solo = [dec.generate(p, max_new_tokens=8, eos_token_id=[eos]).sequences[0].tolist() for p in prompts]
    assert len(solo[0]) == len(prompts[0]) + 1  # row 0 ends at its first token
    assert any(len(s) > len(p) + 2 for s, p in zip(solo[1:], prompts[1:], strict=True))
    out = dec.generate(prompts, max_new_tokens=8, eos_token_id=[eos])
    assert [row.tolist() for row in out.sequences] == solo
    assert out.stats.rows[0].rounds == 1 and out.stats.relayouts >= 1
