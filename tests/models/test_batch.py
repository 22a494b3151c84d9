"""The adapters' batched pass: each row of a left-padded batch computes what it would alone.

Rows of different lengths, per-row positions, sliding windows (Mistral, Gemma 3), rows that lose
a key in the middle of their cache (a gap), and the states after chosen layers as distillation
keeps them.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from tinymodels import make_tiny

from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter

FAMILIES = [("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 3}), ("gemma3", {})]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]


def _alone(adapter, tokens: list[int]) -> torch.Tensor:
    """The last-layer states of ``tokens`` run as one sequence. # [T, H]"""
    cache = adapter.new_cache()
    return adapter.run(adapter.embed(torch.tensor(tokens)), 0, adapter.num_layers, cache, 0)[0]


def _left_padded(prompts: list[list[int]], total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids ``[B, P]``, positions ``[B, P]`` and key validity ``[B, total]`` of a left-padded batch."""
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    valid = torch.zeros(len(prompts), total, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        ids[b, longest - len(prompt) :] = torch.tensor(prompt)
        valid[b, longest - len(prompt) : longest] = True
    positions = (valid[:, :longest].long().cumsum(1) - 1).clamp_min(0)
    return ids, positions, valid


@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_prefill_and_steps_of_a_padded_batch_equal_each_row_alone(family: str, overrides: dict) -> None:
    adapter = find_adapter(make_tiny(family, 2, **overrides))
    steps = [[20, 21, 22], [23, 24, 25], [26, 27, 28]]  # per row: the tokens fed after its prompt
    longest = max(len(p) for p in PROMPTS)
    ids, positions, valid = _left_padded(PROMPTS, longest + len(steps[0]))
    cache = adapter.new_cache(capacity=4)
    with torch.no_grad():
        out = adapter.run(adapter.embed(ids), 0, adapter.num_layers, cache, positions, valid[:, :longest])
        outs = [out]
        for t in range(len(steps[0])):
            token = torch.tensor([[row[t]] for row in steps])
            positions = positions[:, -1:] + 1
            valid[:, longest + t] = True
            outs.append(
                adapter.run(
                    adapter.embed(token), 0, adapter.num_layers, cache, positions, valid[:, : longest + t + 1]
                )
            )
        for b, prompt in enumerate(PROMPTS):
            alone = _alone(adapter, prompt + steps[b])
            torch.testing.assert_close(
                outs[0][b, longest - len(prompt) :], alone[: len(prompt)], rtol=0, atol=1e-12
            )
            for t in range(len(steps[0])):
                torch.testing.assert_close(outs[1 + t][b, 0], alone[len(prompt) + t], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_a_gap_in_a_rows_cache_is_skipped(family: str, overrides: dict) -> None:
    """Row 0 drops the key of a rejected token: it continues as if that token never was."""
    adapter = find_adapter(make_tiny(family, 3, **overrides))
    prompt, rejected, after = [5, 6, 7, 8], 40, [9, 10, 11]
    cache = adapter.new_cache()
    valid = torch.ones(2, len(prompt) + 1 + len(after), dtype=torch.bool)
    with torch.no_grad():
        ids = torch.tensor([prompt + [rejected]] * 2)
        positions = torch.arange(len(ids[0])).expand(2, -1)
        adapter.run(adapter.embed(ids), 0, adapter.num_layers, cache, positions, valid[:, : len(ids[0])])
        valid[0, len(prompt)] = False
        ids = torch.tensor([after, after])
        positions = torch.stack([torch.arange(4, 7), torch.arange(5, 8)])
        out = adapter.run(adapter.embed(ids), 0, adapter.num_layers, cache, positions, valid)
        torch.testing.assert_close(out[0], _alone(adapter, prompt + after)[len(prompt) :], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            out[1], _alone(adapter, prompt + [rejected] + after)[len(prompt) + 1 :], rtol=0, atol=1e-12
        )


@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_distillation_capture_equals_one_sequence_at_a_time(family: str, overrides: dict) -> None:
    """The states distillation keeps (after layer N and after the last layer) and the teacher's
    top-k equal those of each prompt decoded alone."""
    from eesd_early_exit.data import CaptureSettings, capture_batch

    adapter = find_adapter(make_tiny(family, 4, **overrides))
    settings = CaptureSettings(exit_layer=2, max_new_tokens=5, top_k=4, extra_layers=(adapter.num_layers,))
    samples = capture_batch(adapter, PROMPTS, settings, [], torch.Generator())
    for prompt, sample in zip(PROMPTS, samples, strict=True):
        tokens = sample.tokens.tolist()
        assert tokens[: len(prompt)] == prompt
        with torch.no_grad():
            x = adapter.embed(torch.tensor(tokens[:-1]))
            cache = adapter.new_cache()
            low = adapter.run(x, 0, 2, cache, 0)
            top = adapter.run(low, 2, adapter.num_layers, cache, 0)
            logits = adapter.logits(adapter.norm(top))[0]
        assert tokens[len(prompt) :] == logits[len(prompt) - 1 :].argmax(-1).tolist()
        torch.testing.assert_close(sample.hidden.double(), low[0], rtol=1e-3, atol=1e-2)
        torch.testing.assert_close(sample.layers[adapter.num_layers].double(), top[0], rtol=1e-3, atol=1e-2)
        expected = torch.log_softmax(logits[len(prompt) - 1 :].float(), -1).topk(4).indices
        assert torch.equal(sample.topk_ids.long(), expected)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_a_ragged_pass_multiplies_only_the_positions_that_count(
    family: str, overrides: dict, skip: bool
) -> None:
    """Rows feeding different numbers of tokens (a verification pass of ragged drafts) leave
    padding at the end of the shorter rows: each row's real positions still equal the row alone,
    and the linear layers multiply only the real positions (every position, padding included,
    with ``skip_padding`` off)."""
    adapter = find_adapter(make_tiny(family, 2, **overrides), {"skip_padding": skip})
    fed = [[20, 21, 22, 23], [24], [25, 26]]  # per row: the tokens this pass feeds
    longest = max(len(p) for p in PROMPTS)
    m = max(len(f) for f in fed)
    ids, positions, valid = _left_padded(PROMPTS, longest + m)
    cache = adapter.new_cache()
    rows_seen: list[int] = []  # rows of each product with the first decoder layer's first matrix
    weight = next(m for m in adapter.model.modules() if type(m) is torch.nn.Linear).weight
    linear = torch.nn.functional.linear

    def counting(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if w is weight:
            rows_seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return linear(x, w, b)

    with torch.no_grad(), mock.patch.object(torch.nn.functional, "linear", counting):
        adapter.run(adapter.embed(ids), 0, adapter.num_layers, cache, positions, valid[:, :longest])
        step = torch.zeros(len(fed), m, dtype=torch.long)
        for b, tokens in enumerate(fed):
            step[b, : len(tokens)] = torch.tensor(tokens)
            valid[b, longest : longest + len(tokens)] = True
        where = positions[:, -1:] + 1 + torch.arange(m)
        rows_seen.clear()
        out = adapter.run(adapter.embed(step), 0, adapter.num_layers, cache, where, valid)
    assert rows_seen and set(rows_seen) == {sum(map(len, fed)) if skip else len(fed) * m}
    for b, prompt in enumerate(PROMPTS):
        alone = _alone(adapter, prompt + fed[b])
        torch.testing.assert_close(out[b, : len(fed[b])], alone[len(prompt) :], rtol=0, atol=1e-12)
        assert torch.isfinite(out[b]).all()


def test_padding_is_skipped_on_cpus_and_computed_on_gpus_unless_told() -> None:
    """``skip_padding="auto"`` (the default) skips on a CPU, where a pass costs the arithmetic of
    its positions, and not on a GPU, where gathering and scattering the rows that count costs
    more kernels than their rows save; ``True`` and ``False`` hold on every device."""
    model = make_tiny("llama", 2)
    gpu = mock.PropertyMock(return_value=torch.device("cuda", 0))
    for option, on_cpu, on_gpu in (("auto", True, False), (True, True, True), (False, False, False)):
        adapter = find_adapter(model, {"skip_padding": option})
        assert adapter.skips_padding is on_cpu
        with mock.patch.object(type(adapter), "device", gpu):
            assert adapter.skips_padding is on_gpu
    assert find_adapter(model).options.skip_padding == "auto"
    with pytest.raises(ConfigError, match="skip_padding"):
        find_adapter(model, {"skip_padding": "sometimes"})
