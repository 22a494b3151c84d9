"""Self-distillation of the exit head: data capture, training, checkpoints, head files, evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eesd_early_exit import data as data_module
from eesd_early_exit.data import (
    CaptureSettings,
    capture_batch,
    generate_shards,
    rank_vocab,
    read_shards,
    shard_layers,
)
from eesd_early_exit.distill import DistillConfig, distill, new_head
from eesd_early_exit.headfile import read_metadata
from eesd_early_exit.prompts import encode_prompts, load_prompts
from eesd_early_exit.train import TrainSettings, train_head
from safetensors import safe_open
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError, HeadError
from eesd_core.models import find_adapter

EXIT = 2


def _prompts(count: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 8, (count,), generator=g).tolist()
    return [torch.randint(3, 97, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """A tiny random Llama whose next-token distributions are peaked, like a trained model's."""
    model = make_tiny(dtype=torch.float32, seed=3)
    model.lm_head.weight.data *= 6
    return model


@pytest.fixture(scope="module")
def samples(model: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> list:
    settings = CaptureSettings(EXIT, 24, top_k=8, batch_size=8)
    work = tmp_path_factory.mktemp("data")
    return read_shards(generate_shards(find_adapter(model), _prompts(24), work, settings, [2], False))


def _config(tmp_path: Path, **train: object) -> DistillConfig:
    settings = dict(epochs=2, lr=3e-3, batch_tokens=64, checkpoint_every=2)
    settings.update(train)
    return DistillConfig(
        exit_layer=EXIT,
        out=tmp_path / "head.safetensors",
        max_new_tokens=16,
        top_k=8,
        generate_batch=4,
        train=TrainSettings(**settings),
        eval_prompts=3,
        eval_max_new_tokens=20,
    )


def test_capture_matches_transformers(model: torch.nn.Module) -> None:
    prompts = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13, 14], [4]]
    samples = capture_batch(
        find_adapter(model), prompts, CaptureSettings(EXIT, 12, top_k=8), [], torch.Generator()
    )
    for prompt, s in zip(prompts, samples, strict=True):
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :]
        assert s.response.tolist() == expected.tolist()
        assert s.hidden.shape == (len(prompt) + 11, 32) and s.topk_ids.shape == (12, 8)
        assert s.topk_ids[:, 0].tolist() == s.response.tolist()
        assert bool((s.topk_logprobs[:, :-1] >= s.topk_logprobs[:, 1:]).all())
        with torch.no_grad():
            out = model(s.tokens[:-1].view(1, -1), output_hidden_states=True)
        # States are about 0.07 in size and stored in float16: 1e-4 catches a wrong position.
        torch.testing.assert_close(s.hidden.float(), out.hidden_states[EXIT][0], atol=1e-4, rtol=1e-3)
        teacher = torch.log_softmax(out.logits[0, len(prompt) - 1 :], -1).gather(1, s.topk_ids.long())
        torch.testing.assert_close(s.topk_logprobs.float(), teacher, atol=3e-3, rtol=0)


def test_rows_that_leave_the_batch_keep_their_own_results(model: torch.nn.Module, monkeypatch) -> None:
    """Finished rows are dropped from the batch and its cache; every row still gets what it would
    get alone."""
    adapter, prompts = find_adapter(model), _prompts(12, seed=4)
    alone = [
        capture_batch(adapter, [p], CaptureSettings(EXIT, 16, top_k=4), [], torch.Generator())[0]
        for p in prompts
    ]

    def cut_lengths(token: int) -> set[int]:
        return {s.response.tolist().index(token) if token in s.response.tolist() else 16 for s in alone}

    eos = max(range(97), key=lambda token: len(cut_lengths(token)))  # rows end at many steps
    kept = []
    original = data_module.keep_rows
    monkeypatch.setattr(
        data_module, "keep_rows", lambda cache, rows: kept.append(len(rows)) or original(cache, rows)
    )
    together = capture_batch(adapter, prompts, CaptureSettings(EXIT, 16, top_k=4), [eos], torch.Generator())
    assert len(kept) >= 2 and kept == sorted(kept, reverse=True)  # the batch shrank more than once
    for solo, s in zip(alone, together, strict=True):
        cut = solo.response.tolist()
        cut = cut[: cut.index(eos) + 1] if eos in cut else cut
        assert s.response.tolist() == cut
        assert torch.equal(s.topk_ids, solo.topk_ids[: len(cut)])
        torch.testing.assert_close(s.hidden, solo.hidden[: len(s.hidden)], atol=1e-4, rtol=1e-3)


def test_capture_stops_each_row_at_its_eos(model: torch.nn.Module) -> None:
    adapter = find_adapter(model)
    full = capture_batch(adapter, [[1, 5, 6]], CaptureSettings(EXIT, 10, top_k=4), [], torch.Generator())[0]
    eos = full.response[3].item()
    cut = capture_batch(
        adapter, [[1, 5, 6], [7, 8]], CaptureSettings(EXIT, 10, top_k=4), [eos], torch.Generator()
    )[0]
    first = full.response.tolist().index(eos)
    assert cut.response.tolist() == full.response.tolist()[: first + 1]
    assert len(cut.hidden) == 3 + first and len(cut.topk_ids) == first + 1


def test_sampled_capture_is_seeded(model: torch.nn.Module) -> None:
    adapter, settings = find_adapter(model), CaptureSettings(EXIT, 10, top_k=4, temperature=1.0)
    runs = [
        capture_batch(adapter, [[1, 5, 6]], settings, [], torch.Generator().manual_seed(s))[0]
        for s in (0, 0, 1)
    ]
    assert runs[0].response.tolist() == runs[1].response.tolist() != runs[2].response.tolist()


def test_sampling_draws_from_the_tempered_distribution() -> None:
    """Pearson's chi-square over the 5 likely outcomes of 60,000 draws; the bound 33.4 is the 1e-6
    upper quantile of chi-square with 4 degrees of freedom, so a correct sampler fails once in a
    million runs."""
    from eesd_early_exit.data import _choose

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -30.0]]).repeat(3000, 1)
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([_choose(logits, 0.7, generator) for _ in range(20)])
    counts = torch.bincount(draws, minlength=6).double()
    expected = torch.softmax(logits[0].double() / 0.7, -1) * len(draws)
    assert counts[5] == 0  # a token of probability 1e-19 is never drawn
    chi2 = float(((counts[:5] - expected[:5]) ** 2 / expected[:5]).sum())
    assert chi2 < 33.4, (counts.tolist(), expected.tolist())


def test_shards_resume_and_refuse_other_settings(model: torch.nn.Module, tmp_path: Path, monkeypatch) -> None:
    adapter, prompts = find_adapter(model), _prompts(10)
    settings = CaptureSettings(EXIT, 8, top_k=4, batch_size=4)
    paths = generate_shards(adapter, prompts[:6], tmp_path, settings, [2], False)
    assert [p.name for p in paths] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert [s.tokens[: s.prompt_length].tolist() for s in read_shards(paths)] == prompts[:6]
    paths[0].unlink()
    calls = []
    original = data_module.capture_batch
    monkeypatch.setattr(data_module, "capture_batch", lambda *a: calls.append(len(a[1])) or original(*a))
    more = generate_shards(adapter, prompts, tmp_path, settings, [2], False)
    assert calls == [4, 4, 2] and len(more) == 3  # shard 0 was missing, shard 1 held 2 prompts, not 4
    assert [s.tokens[: s.prompt_length].tolist() for s in read_shards(more)] == prompts
    generate_shards(adapter, prompts, tmp_path, settings, [2], False)
    assert calls == [4, 4, 2]  # nothing to make
    # another exit layer is added to the shards from their tokens, nothing is generated again
    deeper = CaptureSettings(EXIT + 1, 8, top_k=4, batch_size=4)
    generate_shards(adapter, prompts, tmp_path, deeper, [2], False)
    assert calls == [4, 4, 2] and all(shard_layers(p) == [EXIT, EXIT + 1] for p in more)
    with pytest.raises(ConfigError, match="other settings"):
        other = CaptureSettings(EXIT, 8, top_k=8, batch_size=4)
        generate_shards(adapter, prompts, tmp_path, other, [2], False)


def test_vocab_subset_ranks_by_teacher_mass(samples: list) -> None:
    subset = rank_vocab(samples, 97, 20, keep=[2])
    assert len(subset) == 20 and 2 in subset.tolist() and subset.tolist() == sorted(subset.tolist())
    argmax = torch.cat([s.topk_ids[:, 0].long() for s in samples])
    assert torch.isin(argmax, subset).float().mean() > 0.5


@pytest.mark.parametrize("subset", [0, 40])
def test_training_reduces_the_loss(model: torch.nn.Module, samples: list, subset: int) -> None:
    from eesd_early_exit.evaluate import teacher_forced

    vocab = rank_vocab(samples, 97, subset, [2]) if subset else None
    head = new_head(find_adapter(model), DistillConfig(exit_layer=EXIT), vocab)
    before = teacher_forced(head, samples)["kl"]
    result = train_head(head, samples, TrainSettings(epochs=3, lr=3e-3, batch_tokens=96), progress=False)
    after = teacher_forced(head, samples)["kl"]
    assert result.steps > 5 and after < 0.9 * before
    assert sum(result.losses[-3:]) < sum(result.losses[:3])


def test_resumed_training_equals_an_uninterrupted_run(
    model: torch.nn.Module, samples: list, tmp_path: Path
) -> None:
    adapter, settings = (
        find_adapter(model),
        TrainSettings(epochs=2, lr=3e-3, batch_tokens=96, checkpoint_every=2),
    )
    whole = new_head(adapter, DistillConfig(exit_layer=EXIT), None)
    train_head(whole, samples, settings, progress=False)
    first = new_head(adapter, DistillConfig(exit_layer=EXIT), None)
    checkpoint = tmp_path / "checkpoint.pt"
    assert train_head(first, samples, settings, checkpoint, progress=False, max_steps=5).steps == 5
    second = new_head(adapter, DistillConfig(exit_layer=EXIT), None)
    resumed = train_head(second, samples, settings, checkpoint, resume=True, progress=False)
    assert resumed.losses and len(resumed.losses) == resumed.steps - 5
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(second.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="other training settings"):
        train_head(
            new_head(adapter, DistillConfig(exit_layer=EXIT), None),
            samples,
            TrainSettings(lr=1e-2),
            checkpoint,
            resume=True,
            progress=False,
        )


def test_distilled_head_loads_decodes_greedily_and_reports_engine_numbers(
    model: torch.nn.Module, tmp_path: Path
) -> None:
    prompts, heldout = _prompts(10), _prompts(3, seed=7)
    config = _config(tmp_path)
    report = distill(model, config, prompts, heldout, progress=False)
    meta = read_metadata(config.out)
    assert meta["exit_layer"] == str(EXIT) and meta["vocab_subset"] == "0" and meta["init_layer"] == "3"
    training = json.loads(meta["training"])
    assert training["settings"]["train"]["lr"] == 3e-3 and training["data"]["train_prompts"] == 10
    assert training["eval"] == json.loads(json.dumps(report["eval"]))

    dec = SpeculativeDecoder(
        model,
        drafter_options={"head": str(config.out)},
        controller="fixed",
        controller_options={"k": 8},
        max_draft_tokens=8,
    )
    drafted = [0] * 8
    for ids in heldout:
        ours = dec.generate(ids, max_new_tokens=20, eos_token_id=[2])
        theirs = model.generate(
            torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=2, pad_token_id=0
        )
        assert ours.sequences.tolist() == theirs.tolist()
        drafted = [
            a + b for a, b in zip(drafted, (ours.stats.drafted_by_position + [0] * 8)[:8], strict=True)
        ]

    decoding, forced = report["eval"]["decoding"], report["eval"]["teacher_forced"]
    assert decoding["drafted_by_position"] == drafted
    assert 0 <= forced["top1"] <= 1 and forced["positions"] > 0
    assert all(0 <= r <= 1 for r in decoding["acceptance_by_position"])
    assert decoding["mean_accepted_tokens"] == pytest.approx(decoding["new_tokens"] / decoding["rounds"])
    assert 1 <= decoding["mean_accepted_tokens"] <= 9
    assert decoding["first_draft_acceptance"] == decoding["accepted_by_position"][0] / drafted[0]


def test_distill_resumes_from_its_work_directory(model: torch.nn.Module, tmp_path: Path, monkeypatch) -> None:
    config = _config(tmp_path, epochs=1)
    config.eval_prompts = 0
    first = distill(model, config, _prompts(6), [], progress=False, max_steps=1)
    monkeypatch.setattr(data_module, "capture_batch", lambda *a: pytest.fail("data regenerated"))
    config.resume = True
    second = distill(model, config, _prompts(6), [], progress=False)
    assert first["steps"] == 1 and second["steps"] > 1
    assert read_metadata(config.out)["vocab_subset"] == "0"


def test_responses_at_several_temperatures(model: torch.nn.Module, tmp_path: Path, monkeypatch) -> None:
    """``temperatures=(0, 1)``: a greedy and a sampled response per prompt, each pass in its own
    directory, all of them trained on; the held-out data is the first pass's (greedy)."""
    config = _config(tmp_path, epochs=1)
    config.temperatures, config.eval_prompts = (0.0, 1.0), 0
    seen = []
    original = data_module.capture_batch
    monkeypatch.setattr(
        data_module, "capture_batch", lambda *a: seen.append(a[2].temperature) or original(*a)
    )
    prompts = _prompts(6)
    report = distill(model, config, prompts, prompts[:2], progress=False)
    assert seen == [0.0, 0.0, 1.0, 1.0, 0.0]  # two train batches per pass, then the held-out one
    greedy = read_shards(sorted((config.work / "train").glob("shard-*")))
    sampled = read_shards(sorted((config.work / "train-t1").glob("shard-*")))
    assert [s.tokens[: s.prompt_length].tolist() for s in greedy + sampled] == prompts + prompts
    assert [s.response.tolist() for s in greedy] != [s.response.tolist() for s in sampled]
    assert report["data"]["responses_per_prompt"] == 2
    assert report["data"]["train_positions"] == sum(len(s.response) for s in greedy + sampled)


def test_vocab_subset_head_file(model: torch.nn.Module, tmp_path: Path) -> None:
    config = _config(tmp_path, epochs=1)
    config.vocab_size_subset, config.mlp_width, config.eval_prompts = 30, 8, 1
    report = distill(model, config, _prompts(6), _prompts(1, seed=9), progress=False)
    assert read_metadata(config.out)["vocab_subset"] == "30"
    assert read_metadata(config.out)["mlp_width"] == "8"
    assert report["eval"]["decoding"]["rounds"] > 0


@pytest.mark.parametrize(
    "change",
    [
        {"exit_layer": 4},
        {"init_layer": 9},
        {"max_new_tokens": 0},
        {"top_k": 500},
        {"train": TrainSettings(epochs=0)},
        {"vocab_size_subset": -1},
        {"mlp_width": -1},
        {"mlp_width": 10_000},
        {"head_storage": "int4"},
        {"temperatures": ()},
        {"temperatures": (0.0, -1.0)},
        {"temperatures": (0.0, 0.8, 0.8)},
    ],
)
def test_bad_settings_fail_before_any_work(model: torch.nn.Module, tmp_path: Path, change: dict) -> None:
    config = _config(tmp_path)
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ConfigError):
        distill(model, config, _prompts(2), [], progress=False)
    assert not config.work.exists()


def test_prompt_sets_and_token_id_prompts(tmp_path: Path) -> None:
    train, heldout = load_prompts("train"), load_prompts("heldout")
    assert len(train) > 1000 and len(heldout) == 40 and not set(train) & set(heldout)
    assert encode_prompts([[5, 6], (7,)]) == [[5, 6], [7]]
    with pytest.raises(ConfigError, match="tokenizer"):
        encode_prompts(["text"])
    with pytest.raises(ConfigError):
        load_prompts("spec-bench")
    (tmp_path / "bad.json").write_text(json.dumps([[1, 2], []]))
    with pytest.raises(ConfigError, match="token-id lists"):
        load_prompts(path=tmp_path / "bad.json")


def test_cli_distils_and_evaluates_a_checkpoint_directory(
    model: torch.nn.Module, tmp_path: Path, capsys
) -> None:
    from eesd_core.cli import main

    model.save_pretrained(tmp_path / "tiny")
    (tmp_path / "ids.json").write_text(json.dumps(_prompts(6)))
    (tmp_path / "held.json").write_text(json.dumps(_prompts(2, seed=5)))
    head = tmp_path / "head.safetensors"
    common = [
        "--model",
        str(tmp_path / "tiny"),
        "--heldout-file",
        str(tmp_path / "held.json"),
        "--no-progress",
    ]
    common += [
        "--max-new-tokens",
        "12",
        "--teacher-top-k",
        "8",
        "--eval-prompts",
        "2",
        "--eval-max-new-tokens",
        "12",
    ]
    argv = [
        "distill",
        *common,
        "--exit-layer",
        "2",
        "--out",
        str(head),
        "--prompt-file",
        str(tmp_path / "ids.json"),
    ]
    assert main([*argv, "--vocab-size-subset", "50", "--epochs", "2", "--head-storage", "int8"]) == 0
    assert read_metadata(head)["vocab_subset"] == "50" and read_metadata(head)["storage"] == "int8"
    assert "mean accepted tokens" in capsys.readouterr().out
    assert main(["distill", *common, "--eval-only", str(head)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["decoding"] == json.loads(read_metadata(head)["training"])["eval"]["decoding"] | {
        "seconds": result["decoding"]["seconds"]
    }

    # continued on prompts it has not seen: the exit layer, subset and storage come from the file
    later, more = tmp_path / "later.safetensors", tmp_path / "more.json"
    more.write_text(json.dumps(_prompts(6) + _prompts(3, seed=11)))
    rest = [
        "--prompt-file",
        str(more),
        "--first-prompt",
        "6",
        "--head-storage",
        "int8",
        "--eval-prompts",
        "0",
    ]
    assert main(["distill", *common, "--init-head", str(head), "--out", str(later), *rest]) == 0
    meta = read_metadata(later)
    data = json.loads(meta["training"])["data"]
    assert (meta["exit_layer"], meta["vocab_subset"]) == ("2", "50") and data["train_prompts"] == 3
    assert json.loads(meta["training"])["settings"]["init_head"] == str(head)
    capsys.readouterr()
    assert (
        main(
            [
                "distill",
                *common,
                "--init-head",
                str(head),
                "--out",
                str(later),
                *rest[:2],
                "--first-prompt",
                "9",
            ]
        )
        == 1
    )
    assert "leaves none of the 9 prompts" in capsys.readouterr().err


def test_cli_command_is_registered(tmp_path: Path) -> None:
    from eesd_core.cli import build_parser, main

    args = build_parser().parse_args(
        ["distill", "--exit-layer", "2", "--out", "h.safetensors", "--epochs", "3"]
    )
    assert args.func.__module__ == "eesd_early_exit.command" and args.epochs == 3 and args.lr == 1e-3
    assert main(["distill", "--model", str(tmp_path)]) == 1


def test_training_forward_equals_the_decoding_path(model: torch.nn.Module, samples: list) -> None:
    from eesd_early_exit.train import collate, forward, frozen_lm_weight

    head = new_head(find_adapter(model), DistillConfig(exit_layer=EXIT), None).eval()
    s = samples[0]
    with torch.no_grad():
        trained = forward(head, frozen_lm_weight(head), collate([s], [0], None))
        cache, rows = head.new_cache(), []
        for position in range(len(s.hidden)):
            out = head.hidden(s.hidden[position].float().view(1, 1, -1), position, cache, None)
            rows.append(head.logits(out)[0])
    torch.testing.assert_close(trained, torch.cat(rows)[s.prompt_length - 1 :], atol=1e-4, rtol=1e-4)


def test_a_head_continues_training_on_later_prompts(model: torch.nn.Module, tmp_path: Path) -> None:
    """``init_head``: the head file sets the shape (subset, MLP width, top input) and the starting
    weights; ``first_prompt`` leaves out the prompts it learnt from."""
    prompts = _prompts(12)
    first = _config(tmp_path / "a", epochs=1)
    first.vocab_size_subset, first.mlp_width, first.top_input, first.eval_prompts = 30, 8, True, 0
    distill(model, first, prompts[:6], [], progress=False)

    later = _config(tmp_path / "b", epochs=1, lr=1e-12)  # too small a step to move a bfloat16 weight
    later.init_head, later.first_prompt, later.eval_prompts = first.out, 6, 0
    report = distill(model, later, prompts, [], progress=False)
    meta = read_metadata(later.out)
    assert (meta["vocab_subset"], meta["mlp_width"], meta["exit_input"]) == ("30", "8", "hidden+top")
    assert report["data"]["first_prompt"] == 6 and report["data"]["train_prompts"] == 6
    shards = read_shards(sorted((later.work / "train").glob("shard-*")), EXIT)
    assert [s.tokens[: s.prompt_length].tolist() for s in shards] == prompts[6:]
    with safe_open(str(first.out), "pt") as a, safe_open(str(later.out), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(name), b.get_tensor(name)) for name in a.keys())  # noqa: SIM118

    fresh = _config(tmp_path / "c", epochs=1, lr=1e-12)
    fresh.vocab_size_subset, fresh.mlp_width, fresh.top_input, fresh.eval_prompts = 30, 8, True, 0
    distill(model, fresh, prompts[6:], [], progress=False)
    with safe_open(str(first.out), "pt") as a, safe_open(str(fresh.out), "pt") as c:
        assert not torch.equal(a.get_tensor("fuse.weight"), c.get_tensor("fuse.weight"))


def test_a_head_to_continue_must_fit_before_any_work(model: torch.nn.Module, tmp_path: Path) -> None:
    first = _config(tmp_path / "a", epochs=1)
    first.eval_prompts = 0
    distill(model, first, _prompts(4), [], progress=False)
    elsewhere = _config(tmp_path / "b")
    elsewhere.init_head, elsewhere.exit_layer = first.out, EXIT + 1
    with pytest.raises(ConfigError, match="drafts from layer 2"):
        distill(model, elsewhere, _prompts(4), [], progress=False)
    other = make_tiny(dtype=torch.float32, seed=4)
    foreign = _config(tmp_path / "c")
    foreign.init_head = first.out
    with pytest.raises(HeadError, match="another model"):
        distill(other, foreign, _prompts(4), [], progress=False)
    negative = _config(tmp_path / "d")
    negative.first_prompt = -1
    with pytest.raises(ConfigError, match="first-prompt"):
        distill(model, negative, _prompts(4), [], progress=False)
    assert not any(config.work.exists() for config in (elsewhere, foreign, negative))
