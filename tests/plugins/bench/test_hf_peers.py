"""transformers' assisted generation with a draft model and its prompt lookup, as bench methods.

Each runs on a tiny random Llama; greedy, both must give plain ``generate()``'s tokens.
"""

from __future__ import annotations

import json

import pytest
import torch
from bytetok import byte_tokenizer
from eesd_bench.batch import batched_methods
from eesd_bench.methods import GROUPS, expand_methods, parse_method
from eesd_bench.prompts import Question
from eesd_bench.runners import BenchSettings, HFRunner, build_runner
from eesd_bench.session import Session
from tinymodels import make_tiny

from eesd_core.cli import main
from eesd_core.errors import ConfigError

VOCAB = 97
MAX_NEW = 24
PROMPT = [1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
GREEDY = BenchSettings(max_new_tokens=MAX_NEW)
REGISTERED = {
    "drafter": ["early_exit", "prompt_lookup"],
    "controller": ["thompson"],
    "verifier": ["lossless"],
}


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=2, vocab=VOCAB)


@pytest.fixture(scope="module")
def draft():
    """Another random model over the same vocabulary: its drafts are mostly wrong."""
    return make_tiny("llama", seed=5, vocab=VOCAB, layers=2)


def _plain(model, prompt: list[int] = PROMPT) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
    return out[0, len(prompt) :].tolist()


def test_prompt_lookup_takes_k_and_max_ngram() -> None:
    assert parse_method("hf_prompt_lookup").generation_options() == {
        "prompt_lookup_num_tokens": 10,
        "max_matching_ngram_size": 2,
    }
    spec = parse_method("hf_prompt_lookup:k=4,max_ngram=3")
    assert spec.kind == "hf_prompt_lookup" and spec.plugins() == []
    assert spec.generation_options() == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3}


def test_assisted_takes_the_draft_models_generation_keys() -> None:
    assert parse_method("hf_assisted").generation_options() == {}
    spec = parse_method("hf_assisted:num_assistant_tokens=5,num_assistant_tokens_schedule=heuristic")
    assert spec.kind == "hf_assisted" and spec.plugins() == []
    options = {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "heuristic"}
    assert spec.generation_options() == options


@pytest.mark.parametrize(
    "text",
    [
        "hf_prompt_lookup:k=0",
        "hf_prompt_lookup:k=2.5",
        "hf_assisted:num_assistant_tokens=0",
        "hf_assisted:num_assistant_tokens_schedule=sometimes",
        "hf_assisted:assistant_confidence_threshold=2",
    ],
)
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="Method"):
        parse_method(text).generation_options()


@pytest.mark.parametrize("text", ["hf_prompt_lookup:n=3", "hf_assisted:k=4", "hf:k=4", "hf_early_exit:k=4"])
def test_unknown_keys_of_hf_kinds_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="has no key"):
        parse_method(text)


def test_all_has_prompt_lookup_but_not_what_needs_a_draft_model() -> None:
    specs, _ = expand_methods(["all"], REGISTERED)
    names = [s.name for s in specs]
    assert "hf_prompt_lookup" in names and "hf_assisted" not in GROUPS["all"]


def test_assisted_without_a_draft_model_is_refused(target) -> None:
    with pytest.raises(ConfigError, match="--assistant-model"):
        build_runner(parse_method("hf_assisted"), target, GREEDY)


def test_a_draft_model_with_another_vocabulary_is_refused(target) -> None:
    with pytest.raises(ConfigError, match="vocabulary"):
        HFRunner(target, assistant=make_tiny("llama", seed=5, vocab=VOCAB + 3, layers=2))


@pytest.mark.parametrize("text", ["hf_assisted", "hf_assisted:num_assistant_tokens=3", "hf_prompt_lookup"])
def test_greedy_equals_plain_generate(target, draft, text: str) -> None:
    runner = build_runner(parse_method(text), target, GREEDY, draft)
    out = runner.generate(PROMPT, GREEDY, seed=0)
    assert out.tokens == _plain(target) and len(out.tokens) == MAX_NEW
    assert 1 <= out.stats["rounds"] <= MAX_NEW


def test_target_passes_are_counted_without_the_draft_models(target) -> None:
    """A draft model equal to the target gets every draft accepted: fewer target passes than tokens."""
    same = make_tiny("llama", seed=2, vocab=VOCAB)
    assisted = build_runner(parse_method("hf_assisted"), target, GREEDY, same).generate(PROMPT, GREEDY, 0)
    plain = build_runner(parse_method("hf"), target, GREEDY).generate(PROMPT, GREEDY, 0)
    assert assisted.tokens == plain.tokens
    assert plain.stats == {"rounds": MAX_NEW} and assisted.stats["rounds"] < MAX_NEW // 2 + 2


@pytest.mark.parametrize("text", ["hf_assisted", "hf_prompt_lookup"])
def test_sampled_runs_are_reproducible(target, draft, text: str) -> None:
    settings = BenchSettings(max_new_tokens=MAX_NEW, temperature=0.7)
    runner = build_runner(parse_method(text), target, settings, draft)
    first, again = runner.generate(PROMPT, settings, seed=3), runner.generate(PROMPT, settings, seed=3)
    assert first.tokens == again.tokens and 1 <= len(first.tokens) <= MAX_NEW
    assert all(0 <= t < VOCAB for t in first.tokens)


def test_a_checkpoints_repetition_penalty_is_not_applied(draft) -> None:
    """The bench compares plain decoding: a checkpoint's own defaults must not change the baseline."""
    model = make_tiny("llama", seed=2, vocab=VOCAB)
    reference = _plain(model)
    model.generation_config.repetition_penalty = 5.0
    for text in ("hf", "hf_assisted", "hf_prompt_lookup"):
        runner = build_runner(parse_method(text), model, GREEDY, draft)
        assert runner.generate(PROMPT, GREEDY, 0).tokens == reference, text


def test_a_session_records_the_draft_model_and_checks_equality(target, draft) -> None:
    methods = [parse_method(m) for m in ("hf", "hf_assisted", "hf_prompt_lookup:k=4")]
    prompts = [(Question(1, "qa", "x"), PROMPT), (Question(2, "qa", "y"), [1, 9, 10, 11, 9, 10])]
    session = Session(target, prompts, methods, GREEDY, assistant=draft, assistant_name="tiny-draft")
    result = session.run(progress=False)
    assert all(s["equal"] for s in result["samples"]), result["mismatches"]
    assert all(s["rounds"] >= 1 for s in result["samples"])
    record = result["assistant"]
    bytes_ = sum(p.numel() * p.element_size() for p in draft.parameters())
    assert record["name"] == "tiny-draft" and record["parameter_bytes"] == bytes_
    assert record["dtype"] == "float64" and any("tiny-draft" in n for n in result["notes"])
    assert result["summary"]["overall"]["hf_assisted"]["mean_accepted_tokens"] >= 1.0
    json.dumps(result, default=str)


def test_without_hf_assisted_a_session_records_no_draft_model(target, draft) -> None:
    prompts = [(Question(1, "qa", "x"), PROMPT)]
    session = Session(target, prompts, [parse_method("hf")], GREEDY, assistant=draft)
    assert session.run(progress=False)["assistant"] is None


def test_bench_batch_leaves_both_out() -> None:
    specs, notes = batched_methods(["hf", "hf_assisted", "hf_prompt_lookup"], REGISTERED)
    assert [s.name for s in specs] == ["hf"]
    assert any(n.startswith("hf_assisted: skipped") for n in notes)
    assert any(n.startswith("hf_prompt_lookup: skipped") for n in notes)
    with pytest.raises(ConfigError, match="runs batched"):
        batched_methods(["hf_assisted"], REGISTERED)


# -- the command ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A target, a draft model sharing its tokenizer, and one with another tokenizer."""
    root = tmp_path_factory.mktemp("peers")
    vocab = len(byte_tokenizer())
    make_tiny("llama", seed=2, vocab=vocab, dtype=torch.float32).save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    make_tiny("llama", seed=5, vocab=vocab, layers=2, dtype=torch.float32).save_pretrained(root / "draft")
    byte_tokenizer().save_pretrained(root / "draft")
    make_tiny("llama", seed=5, vocab=vocab, layers=2, dtype=torch.float32).save_pretrained(root / "other")
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    other.save_pretrained(root / "other")
    questions = root / "question.jsonl"
    row = {"question_id": 1, "category": "writing", "turns": ["the cat sat on the mat, the cat sat"]}
    questions.write_text(json.dumps(row) + "\n")
    return root


def _bench(root, out, *extra: str) -> int:
    return main(
        [
            "bench",
            "--model",
            str(root / "target"),
            "--questions",
            str(root / "question.jsonl"),
            "--max-new-tokens",
            "8",
            "--no-memory",
            "--no-progress",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_the_command_runs_both_with_a_draft_model(checkpoints, tmp_path) -> None:
    methods = ["--methods", "hf", "hf_assisted", "hf_prompt_lookup"]
    assert _bench(checkpoints, tmp_path, *methods, "--assistant-model", str(checkpoints / "draft")) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert [s["method"] for s in result["samples"]] == ["hf", "hf_assisted", "hf_prompt_lookup"]
    assert all(s["equal"] for s in result["samples"]), result["mismatches"]
    assert result["settings"]["assistant"] == str(checkpoints / "draft")
    assert result["assistant"]["name"] == str(checkpoints / "draft")
    assert result["assistant"]["parameter_bytes"] > 0 and result["assistant"]["dtype"] == "float32"
    assert "hf_assisted drafts with" in (tmp_path / "results.md").read_text()


def test_the_command_refuses_hf_assisted_without_a_draft_model(checkpoints, tmp_path, capsys) -> None:
    assert _bench(checkpoints, tmp_path, "--methods", "hf", "hf_assisted") == 1
    assert "--assistant-model" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_the_command_refuses_a_draft_model_with_another_tokenizer(checkpoints, tmp_path, capsys) -> None:
    extra = ["--methods", "hf", "hf_assisted", "--assistant-model", str(checkpoints / "other")]
    assert _bench(checkpoints, tmp_path, *extra) == 1
    assert "tokenizer" in capsys.readouterr().err


def test_the_memory_probe_loads_the_draft_model_from_the_settings(checkpoints) -> None:
    """The probe's child rebuilds the runner from the settings alone (here called in process)."""
    from dataclasses import asdict

    from eesd_bench.memory import probe

    settings = BenchSettings(max_new_tokens=6, assistant=str(checkpoints / "draft"))
    request = {
        "model": str(checkpoints / "target"),
        "method": "hf_assisted",
        "prompt": [1, 5, 6, 7],
        "settings": asdict(settings),
    }
    assert probe(request)["new_tokens"] == 6


# -- transformers' static cache, compiled where it compiles --------------------------------------


def test_static_takes_compile_auto_true_or_false() -> None:
    auto = parse_method("hf_static")
    assert auto.kind == "hf_static" and auto.plugins() == [] and auto.options == {}
    options = auto.generation_options()
    assert options["cache_implementation"] == "static" and not options["compile_config"]._compile_all_devices
    forced = parse_method("hf_compiled")
    assert forced.options == {"compile": True}
    assert forced.generation_options()["compile_config"]._compile_all_devices
    never = parse_method("hf_static:compile=false")
    assert never.generation_options() == {"cache_implementation": "static", "disable_compile": True}


@pytest.mark.parametrize("text", ["hf_static:compile=1", "hf_static:compile=yes", "hf_static:compile=none"])
def test_a_compile_that_is_not_auto_true_or_false_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="compile is auto, true or false"):
        parse_method(text).generation_options()


@pytest.mark.parametrize("text", ["hf_static", "hf_static:compile=false"])
def test_static_greedy_equals_plain_generate_and_says_nothing_where_it_does_not_compile(
    target, text: str, capsys
) -> None:  # noqa: ANN001
    runner = build_runner(parse_method(text), target, GREEDY)
    assert not runner.compiles, "transformers does not compile on a CPU unless told to"
    for prompt in (PROMPT, PROMPT[:5]):  # a shorter prompt after a longer one reuses the cache
        out = runner.generate(prompt, GREEDY, seed=0)
        assert out.tokens == _plain(target, prompt) and out.stats == {"rounds": MAX_NEW}
    assert capsys.readouterr().err == ""


def test_static_runs_batched_and_each_row_equals_plain_generate(target) -> None:  # noqa: ANN001
    from eesd_bench.batch import build

    specs, notes = batched_methods(["hf_static", "hf_prompt_lookup"], REGISTERED)
    assert [s.name for s in specs] == ["hf_static"] and "hf_prompt_lookup" in notes[0]
    runner = build(specs[0], target, GREEDY, pad=0)
    assert not runner.compiles
    ids = torch.tensor([[0, 0, 0, *PROMPT[:9]], PROMPT])
    mask = (torch.arange(12) >= torch.tensor([[3], [0]])).long()
    rows = runner.run(ids, mask, MAX_NEW).rows
    assert rows[1] == _plain(target) and rows[0] == _plain(target, PROMPT[:9])


@pytest.mark.slow
def test_compiled_on_a_cpu_says_so_once_and_gives_plain_generates_tokens(target, capsys) -> None:  # noqa: ANN001
    runner = build_runner(parse_method("hf_compiled"), target, GREEDY)
    assert runner.compiles
    first, again = runner.generate(PROMPT, GREEDY, seed=0), runner.generate(PROMPT, GREEDY, seed=0)
    assert first.tokens == again.tokens == _plain(target)
    err = capsys.readouterr().err
    assert err.count("transformers compiles the model's forward (torch.compile)") == 1
