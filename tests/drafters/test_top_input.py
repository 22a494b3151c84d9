"""The top-input exit head: data with several layers, the engine's top states, exact drafts.

A top-input head reads [h_N(t), top(t - 1)]; the drafter keeps the target's top states of committed
positions and re-runs accepted positions after each round. These tests check every draft
distribution against a from-scratch computation (float64), greedy equality with transformers, and
the exact output distribution over a small vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eesd_early_exit.data import CaptureSettings, capture_batch, generate_shards, read_shards, shard_layers
from eesd_early_exit.distill import DistillConfig, distill
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import read_metadata, save_head
from eesd_early_exit.train import TrainSettings, collate, train_head
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError, HeadError
from eesd_core.models import find_adapter
from eesd_core.protocols import SamplingParams
from eesd_core.sampling import process_logits
from eesd_core.testing.hf import first_tokens_distribution, tiny_llama
from eesd_core.testing.kit import Setup
from eesd_core.testing.oracles import assert_distributions_equal, engine_distribution

EXIT = 2


def _random_top_head(adapter, exit_layer: int = EXIT, seed: int = 0, vocab_ids=None) -> ExitHead:
    """An untrained top-input head whose top weights are far from zero, so they matter."""
    torch.manual_seed(seed)
    head = ExitHead(adapter, exit_layer, vocab_ids=vocab_ids, top_input=True).to(adapter.dtype)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
        assert head.fuse is not None
        head.fuse.weight[:, adapter.hidden_size :].normal_(0, 0.5)
    return head


@pytest.fixture(scope="module")
def model64() -> torch.nn.Module:
    model = make_tiny("llama", 5, vocab=97, layers=4, dtype=torch.float64)
    model.lm_head.weight.data *= 4
    return model


@pytest.fixture(scope="module")
def head64(model64, tmp_path_factory: pytest.TempPathFactory) -> Path:
    adapter = find_adapter(model64)
    path = tmp_path_factory.mktemp("top") / "top.safetensors"
    return save_head(_random_top_head(adapter), adapter, path, dtype=torch.float64)


# -- data ------------------------------------------------------------------------------------


def test_capture_keeps_every_asked_layer(model64) -> None:
    adapter = find_adapter(model64)
    settings = CaptureSettings(EXIT, 9, top_k=4, extra_layers=(1, 4))
    assert settings.layers == (1, 2, 4)
    sample = capture_batch(adapter, [[1, 5, 6, 7]], settings, [], torch.Generator())[0]
    assert sample.layers is not None and sorted(sample.layers) == [1, 2, 4]
    with torch.no_grad():
        states = model64(sample.tokens[:-1].view(1, -1), output_hidden_states=True).hidden_states
    for n in (1, 2):
        torch.testing.assert_close(sample.layers[n].double(), states[n][0], atol=1e-2, rtol=1e-3)
    # transformers reports the last layer after the final norm; the data keeps it before
    torch.testing.assert_close(adapter.norm(sample.layers[4].double()), states[4][0], atol=2e-2, rtol=1e-3)
    assert torch.equal(sample.hidden, sample.layers[EXIT])


def test_one_generation_serves_every_captured_layer(model64, tmp_path: Path) -> None:
    adapter, prompts = find_adapter(model64), [[1, 5, 6], [7, 8, 9, 10], [11]]
    wide = CaptureSettings(EXIT, 6, top_k=4, batch_size=2, extra_layers=(1, 4))
    paths = generate_shards(adapter, prompts, tmp_path, wide, [], False)
    for layer in (1, 2):
        # another exit layer, and the top states, come from the same shards
        reused = generate_shards(
            adapter, prompts, tmp_path, CaptureSettings(layer, 6, top_k=4, batch_size=2), [], False
        )
        assert reused == paths
        samples = read_shards(paths, layer, top_layer=4)
        assert all(s.top is not None and s.top.shape == s.hidden.shape for s in samples)
    with pytest.raises(ConfigError, match="say which"):
        read_shards(paths)
    with pytest.raises(ConfigError, match="not of layer 3"):
        read_shards(paths, 3)
    with pytest.raises(ConfigError, match="layers 1..4"):
        capture_batch(adapter, [[1]], CaptureSettings(5, 2, top_k=4), [], torch.Generator())


def test_a_layer_the_shards_lack_is_added_from_their_tokens(model64, tmp_path: Path) -> None:
    adapter, prompts = find_adapter(model64), [[1, 5, 6], [7, 8, 9, 10], [11]]
    paths = generate_shards(
        adapter, prompts, tmp_path / "a", CaptureSettings(EXIT, 6, top_k=4, batch_size=2), [], False
    )
    before = read_shards(paths, EXIT)
    # exit layer 3 was not captured: a teacher-forced pass over the stored tokens adds it in place
    wider = CaptureSettings(3, 6, top_k=4, batch_size=2, extra_layers=(1,))
    assert generate_shards(adapter, prompts, tmp_path / "a", wider, [], False) == paths
    assert all(shard_layers(p) == [1, EXIT, 3] for p in paths)
    # ... and equals what a generation that captured it would have kept
    fresh = read_shards(generate_shards(adapter, prompts, tmp_path / "b", wider, [], False), 3)
    for added, generated in zip(read_shards(paths, 3), fresh, strict=True):
        assert torch.equal(added.tokens, generated.tokens)
        torch.testing.assert_close(added.hidden.double(), generated.hidden.double(), atol=2e-3, rtol=1e-3)
    for kept, old in zip(read_shards(paths, EXIT), before, strict=True):
        assert torch.equal(kept.hidden, old.hidden) and torch.equal(kept.topk_ids, old.topk_ids)
    with pytest.raises(ConfigError, match="layers 1..4"):
        generate_shards(
            adapter, prompts, tmp_path / "a", CaptureSettings(5, 6, top_k=4, batch_size=2), [], False
        )


def test_collate_shifts_the_top_states_by_one_position() -> None:
    from eesd_early_exit.data import Sample

    top = torch.arange(5 * 2, dtype=torch.float32).view(5, 2)
    sample = Sample(
        tokens=torch.arange(6),
        prompt_length=3,
        hidden=torch.zeros(5, 2),
        topk_logprobs=torch.zeros(3, 2),
        topk_ids=torch.zeros(3, 2, dtype=torch.int32),
        top=top,
    )
    batch = collate([sample], [0], None)
    assert batch["top"][0, 0].tolist() == [0.0, 0.0]
    assert torch.equal(batch["top"][0, 1:], top[:-1])
    # targets: the states at the positions that predict the response (from prompt_length - 1)
    assert torch.equal(batch["top_target"], top[2:])


# -- drafting --------------------------------------------------------------------------------


def _reference_q(model, head, tokens: list[int], position: int, drafts: list[int], sampling) -> torch.Tensor:
    """q of each draft of a round at ``position``, from scratch: one pass over the committed
    context with the target's own top states, then the head's outputs as stand-ins."""
    sequence = torch.tensor([tokens + drafts])
    with torch.no_grad():
        states = model(sequence, output_hidden_states=True).hidden_states
    lower, top = states[head.exit_layer], states[-1]  # top: after the final norm, as the head reads it
    previous = torch.cat([torch.zeros_like(top[:, :1]), top[:, :-1]], dim=1)
    cache = head.new_cache()
    with torch.no_grad():
        out = head.hidden(lower[:, : position + 1], 0, cache, None, previous[:, : position + 1])[:, -1:]
        rows = [process_logits(head.logits(out)[0], sampling)[0]]
        for j in range(1, len(drafts)):
            stand_in = head.top_state(out)
            out = head.hidden(lower[:, position + j : position + j + 1], position + j, cache, None, stand_in)
            rows.append(process_logits(head.logits(out)[0], sampling)[0])
    return torch.stack(rows)


class Pattern:
    """Drafts k = 0, 3, 0, 0, 1, 4, 2, ... in turn: plain rounds between drafting ones; records
    where each round started."""

    def __init__(self, ks: list[int]) -> None:
        self.ks, self.round, self.positions = ks, 0, []

    def start(self, request) -> None:
        self.round = 0

    def begin_round(self, state, round) -> None:
        pass

    def should_continue(self, state, step) -> bool:
        return step.index < self.ks[self.round % len(self.ks)]

    def update(self, state, outcomes) -> None:
        self.round += 1
        self.positions.extend(outcome.position for outcome in outcomes)


class Withholding(Pattern):
    """The same pattern, taking back every third draft it is asked to keep (the engine then
    verifies the drafts before it), so the caches must stay right after withdrawals too."""

    withdraws = True

    def __init__(self, ks: list[int]) -> None:
        super().__init__(ks)
        self.asked = 0

    def keep(self, state, step) -> bool:
        self.asked += 1
        return self.asked % 3 != 0


class Recorder:
    """The lossless verifier, recording the drafts and q it was handed."""

    def __init__(self, inner) -> None:
        self.inner, self.seen = inner, []

    def verify(self, drafts, qs, p, rngs):
        self.seen.extend((d.tolist(), q) for d, q in zip(drafts, qs, strict=True))
        return self.inner.verify(drafts, qs, p, rngs)


@pytest.mark.parametrize(
    ("ks", "controller"),
    [([3], Pattern), ([0, 3, 0, 0, 1, 4, 2], Pattern), ([0, 3, 0, 0, 1, 4, 2], Withholding)],
    ids=["k3", "mixed", "withdrawing"],
)
def test_every_draft_distribution_matches_a_fresh_computation(model64, head64, ks, controller) -> None:
    dec = SpeculativeDecoder(model64, drafter_options={"head": str(head64)}, max_draft_tokens=4)
    assert dec.drafter.reads_top_states
    sampling = SamplingParams(1.0)
    checked = withdrawn = 0
    for seed, prompt in enumerate([[3, 1, 4, 1, 5], [9, 2], [7]]):
        dec.controller, dec.verifier = controller(ks), Recorder(dec.verifier)
        out = dec.generate(prompt, max_new_tokens=28, temperature=1.0, seed=seed, eos_token_id=[])
        sequence = out.sequences[0].tolist()
        rounds = dec.verifier.seen[1:]  # the first draw is the prefill's
        for position, (drafts, q) in zip(dec.controller.positions, rounds, strict=True):
            if not drafts:
                continue
            history = sequence[: position + 1]
            expected = _reference_q(model64, dec.drafter.head, history, position, drafts, sampling)
            torch.testing.assert_close(q, expected, atol=1e-10, rtol=1e-9)
            checked += len(drafts)
        dec.verifier = dec.verifier.inner
        withdrawn += out.stats.withdrawn
    assert checked >= 30
    assert (withdrawn >= 5) == (controller is Withholding)


def _assert_greedy_equal(model, dec, prompts: list[list[int]], max_new_tokens: int) -> None:
    for prompt in prompts:
        out = dec.generate(prompt, max_new_tokens=max_new_tokens, eos_token_id=[])
        expected = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert out.sequences.tolist() == expected.tolist(), prompt


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_equals_transformers_with_a_top_input_head(model64, head64, k) -> None:
    dec = SpeculativeDecoder(
        model64,
        drafter_options={"head": str(head64)},
        controller="fixed",
        controller_options={"k": k},
        max_draft_tokens=k,
    )
    _assert_greedy_equal(model64, dec, [[3, 1, 4, 1, 5], [9, 2], [7], list(range(10, 40))], 40)


@pytest.mark.parametrize("head", ["top", "untrained"])
def test_greedy_equals_transformers_when_drafts_are_taken_back(model64, head64, head) -> None:
    dec = SpeculativeDecoder(
        model64, drafter_options={"head": str(head64) if head == "top" else None}, max_draft_tokens=4
    )
    dec.controller = Withholding([0, 3, 1, 4, 2])
    _assert_greedy_equal(model64, dec, [[3, 1, 4, 1, 5], [9, 2], list(range(10, 40))], 40)


@pytest.mark.slow
def test_exact_distribution_with_a_top_input_head(tmp_path: Path) -> None:
    model = tiny_llama(vocab_size=8)
    adapter = find_adapter(model)
    path = save_head(
        _random_top_head(adapter, 1, seed=2), adapter, tmp_path / "top.safetensors", dtype=torch.float64
    )
    setup = Setup(
        model,
        drafter="early_exit",
        drafter_options={"head": str(path)},
        controller="fixed",
        max_draft_tokens=2,
    )
    sampling = SamplingParams(1.0, top_k=3)
    prompt = [3, 1, 4]
    actual = engine_distribution(setup, prompt, 4, sampling)
    assert_distributions_equal(actual, first_tokens_distribution(model, prompt, 4, sampling))


# -- files and training ----------------------------------------------------------------------


def test_head_files_say_their_input(model64, head64, tmp_path: Path) -> None:
    assert read_metadata(head64)["exit_input"] == "hidden+top"
    adapter = find_adapter(model64)
    plain = save_head(ExitHead(adapter, EXIT), adapter, tmp_path / "plain.safetensors")
    assert read_metadata(plain)["exit_input"] == "hidden"
    dec = SpeculativeDecoder(model64, drafter_options={"head": str(plain)})
    assert not dec.drafter.reads_top_states
    # a file that needs an input this version does not know is refused before any tensor is read
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(plain), framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    future = tmp_path / "future.safetensors"
    save_file(tensors, str(future), metadata={**metadata, "exit_input": "hidden+draft-tree"})
    with pytest.raises(HeadError, match="exit input this eesd does not know"):
        read_metadata(future)


def test_distilling_a_top_input_head(tmp_path: Path) -> None:
    model = make_tiny(dtype=torch.float32, seed=3)
    model.lm_head.weight.data *= 6
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, 97, (int(n),), generator=g).tolist() for n in torch.randint(2, 8, (16,), generator=g)
    ]
    config = DistillConfig(
        exit_layer=EXIT,
        out=tmp_path / "top.safetensors",
        max_new_tokens=12,
        top_k=8,
        generate_batch=4,
        top_input=True,
        train=TrainSettings(epochs=2, lr=3e-3, batch_tokens=64, top_weight=1.0),
        eval_prompts=2,
        eval_max_new_tokens=12,
    )
    report = distill(model, config, prompts=prompts, heldout=prompts[:3], progress=False)
    assert report["settings"]["top_input"] and report["eval"]["teacher_forced"]["positions"] > 0
    assert read_metadata(config.out)["exit_input"] == "hidden+top"
    # the same work directory serves a paper head at that layer: the data has both layers
    plain = DistillConfig(**{**config.__dict__, "top_input": False, "out": tmp_path / "plain.safetensors"})
    plain.train = TrainSettings(epochs=1, lr=3e-3, batch_tokens=64)
    plain.work_dir = config.work
    distill(model, plain, prompts=prompts, heldout=prompts[:3], progress=False)
    assert read_metadata(plain.out)["exit_input"] == "hidden"


def test_a_two_layer_head_distils_and_decodes_losslessly(tmp_path: Path) -> None:
    model = make_tiny(dtype=torch.float32, seed=3)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 97, (5,), generator=g).tolist() for _ in range(8)]
    config = DistillConfig(
        exit_layer=1,
        out=tmp_path / "two.safetensors",
        max_new_tokens=10,
        top_k=8,
        generate_batch=4,
        head_layers=2,
        top_input=True,
        train=TrainSettings(epochs=1, lr=3e-3, batch_tokens=64, top_weight=0.5),
        eval_prompts=0,
    )
    distill(model, config, prompts=prompts, heldout=prompts[:2], progress=False)
    assert read_metadata(config.out)["num_exit_layers"] == "2"
    dec = SpeculativeDecoder(
        model, drafter_options={"head": str(config.out)}, controller="fixed", controller_options={"k": 3}
    )
    _assert_greedy_equal(model, dec, prompts[:3], 24)


def test_top_weight_needs_a_top_input_head(model64) -> None:
    head = ExitHead(find_adapter(model64), EXIT).double()
    with pytest.raises(ConfigError, match="--top-input"):
        train_head(head, [], TrainSettings(top_weight=1.0), progress=False)


def test_bad_capture_layers_are_refused() -> None:
    from eesd_early_exit.distill import _check, _numbers

    with pytest.raises(ConfigError, match="comma-separated ints"):
        _numbers("3,six", int, "--capture-layers")
    assert _numbers("3, 6,", int, "--capture-layers") == (3, 6)
    assert _numbers("0,0.8", float, "--temperature") == (0.0, 0.8)
    adapter = find_adapter(make_tiny("llama", 0, vocab=61, layers=4, dtype=torch.float32))
    with pytest.raises(ConfigError, match="out of range"):
        _check(adapter, DistillConfig(exit_layer=2, capture_layers=(5,)))
