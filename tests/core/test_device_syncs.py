"""How often a round waits for the device: greedy, where passes do not skip padding (the GPU
default), a round waits once per draft step drawn from q and once to verify (reads of the device
and blocking copies onto it alike), for one sequence and for batches (but for a round that
realigns a batch, a rare one), counted on the CPU by
:class:`~eesd_core.testing.DeviceSyncs`."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.testing import DeviceSyncs

NO_SKIPS = {"adapter_options": {"skip_padding": False}}
EXIT = {"drafter": "early_exit", "drafter_options": {"exit_layer": 2}}
SETUPS: dict[str, dict[str, Any]] = {
    "plain": {"drafter": None},
    "fixed-k3": {**EXIT, "controller": "fixed", "controller_options": {"k": 3}},
    "thompson": EXIT,  # takes drafts back: a step shows q's confidence before it draws
    "prompt-lookup": {"drafter": "prompt_lookup", "controller": "fixed", "controller_options": {"k": 3}},
}
PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6, 9, 11, 5, 6], [8, 9, 10, 11, 12], [3, 4, 5, 6, 3, 4, 5]]


def _rounds(name: str, rows: int) -> list[tuple[int, int, int]]:
    """(waits, draft steps that drew from q, realignments) of every round after the prefill."""
    model = make_tiny("llama", 4)
    decoder = SpeculativeDecoder(model, **SETUPS[name], **NO_SKIPS)
    steps = [0]
    if decoder.drafter is not None:
        step = decoder.drafter.step

        def counted(*args: Any) -> Any:
            draft = step(*args)
            steps[0] += draft.logits is not None
            return draft

        decoder.drafter.step = counted  # the decoder's own drafter, not the model
    prompts = PROMPTS[0] if rows == 1 else PROMPTS[:rows]
    generation = decoder.stream(prompts, max_new_tokens=24, eos_token_id=[])
    with DeviceSyncs(model) as syncs:
        next(generation)
        out = [(len(syncs.sites), steps[0], 0)]
        for _ in generation:
            relayouts = 0 if rows == 1 else generation.stats.relayouts
            out.append((len(syncs.sites), steps[0], relayouts))
    return [(r - r0, s - s0, m - m0) for (r0, s0, m0), (r, s, m) in zip(out, out[1:], strict=False)]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("name", list(SETUPS))
def test_a_greedy_round_waits_once_per_draft_step_and_once_to_verify(name: str, rows: int) -> None:
    rounds = _rounds(name, rows)
    assert len(rounds) >= 3
    for waits, steps, realigned in rounds:
        assert waits == steps + 1 or realigned, rounds  # realigning a batch (rare) waits more
    assert sum(realigned for _, _, realigned in rounds) <= 2
    most = max(steps for _, steps, _ in rounds)
    if name == "thompson":  # how far it drafts depends on measured times; its first round drafts
        assert most >= 1, rounds
    else:  # prompt lookup's fixed drafts wait for nothing
        assert most == {"plain": 0, "fixed-k3": 3, "prompt-lookup": 0}[name], rounds
    if name == "prompt-lookup":  # it did draft: fewer rounds than the tokens after the first
        assert len(rounds) < 23


def test_the_counter_sees_waits_and_ignores_host_work() -> None:
    """DeviceSyncs counts reads of what the model computed and blocking copies onto its device, not
    the host's own tensors, nor copies the host does not wait for."""
    model = make_tiny("llama", 2)
    device = torch.device("cpu")  # not HOST itself: the model's device
    with torch.inference_mode(), DeviceSyncs(model) as syncs:
        host = torch.tensor([3, 4, 5])
        host.tolist()
        logits = model.lm_head(model.model.embed_tokens(host.to(device, non_blocking=True)[None]))
        later = logits.argmax(-1).to("cpu", non_blocking=True)
        later.tolist()
        assert syncs.sites == []
        int(logits[0, -1].argmax())
        bool(logits.isnan().any())
        torch.tensor([1, 2], device=device)
        host.to(device)
    kinds = [site.split("@")[0] for site in syncs.sites]
    assert kinds == ["__int__", "__bool__", "tensor onto the device", "to onto the device"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["plain", "fixed-k3"])
def test_on_a_gpu_torch_reports_the_same_waits(name: str) -> None:
    """On a GPU, torch's own report of synchronising calls (``set_sync_debug_mode``) per round."""
    model = make_tiny("llama", 4).to("cuda")
    decoder = SpeculativeDecoder(model, **SETUPS[name], **NO_SKIPS)
    steps = [0]
    if decoder.drafter is not None:
        step = decoder.drafter.step

        def counted(*args: Any) -> Any:
            steps[0] += 1
            return step(*args)

        decoder.drafter.step = counted
    generation = decoder.stream(PROMPTS[0], max_new_tokens=24, eos_token_id=[])
    next(generation)
    rounds = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while not generation.done:
            before = steps[0]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                next(generation)
            waits = sum("synchroniz" in str(w.message) for w in caught)
            rounds.append((waits, steps[0] - before))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(waits == drew + 1 for waits, drew in rounds), rounds
