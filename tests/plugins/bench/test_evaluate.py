"""Offline controller evaluation: trace files and staleness, cost profiles, the leaderboard, the
commands, and replay against the engine's own rounds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from eesd_baselines import FixedK, FixedOptions
from eesd_bench.evaluate import (
    ALL,
    categories,
    evaluate,
    format_board,
    leaderboard,
    matching_profiles,
    parse_controller,
    under,
)
from eesd_bench.profiles import CostProfile, from_cost_curves, load_profile, shipped_profiles
from eesd_bench.trace import CostModel, Trace, fixed_time, record_trace, replay
from eesd_bench.tracefile import StaleTraceError, check_fresh, load_trace, shipped_traces
from synthetic import SMOL_CPU, synthetic_trace

from eesd_core import SpeculativeDecoder
from eesd_core.cli import main
from eesd_core.errors import ConfigError, InputError
from eesd_core.hookspecs import hookimpl
from eesd_core.registry import get_manager, reset_manager

RESULTS = Path(__file__).parents[3] / "benchmarks" / "results"
PROFILE = CostProfile({1: SMOL_CPU}, {1: SMOL_CPU.plain_step * 0.9}, {"name": "smol"})


def labelled(trace: Trace, names: list[str]) -> Trace:
    prompts = tuple(replace(p, category=c) for p, c in zip(trace.prompts, names, strict=True))
    return replace(trace, prompts=prompts)


def test_trace_file_keeps_categories_and_compresses(tmp_path):
    trace = labelled(synthetic_trace(0.6, prompts=2, tokens=30), ["qa", "code"])
    trace.save(tmp_path / "t.json.gz")
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert Trace.load(tmp_path / "t.json.gz") == trace
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not an eesd trace"):
        Trace.load(tmp_path / "bad.json")


def with_head(trace: Trace, head: Path, digest: str) -> Trace:
    return replace(trace, meta={"head": head.name, "head_path": str(head), "head_sha256": digest})


def test_a_changed_or_missing_head_makes_the_trace_stale(tmp_path):
    from eesd_bench.tracefile import file_digest

    head = tmp_path / "my-head.safetensors"
    head.write_bytes(b"weights")
    trace = with_head(synthetic_trace(0.6, prompts=1, tokens=10), head, file_digest(head))
    check_fresh(trace)
    trace.save(tmp_path / "t.json.gz")
    assert load_trace(str(tmp_path / "t.json.gz")) == trace
    head.write_bytes(b"other weights")
    with pytest.raises(StaleTraceError, match="another version of the exit head my-head"):
        load_trace(str(tmp_path / "t.json.gz"))
    assert load_trace(str(tmp_path / "t.json.gz"), allow_stale=True) == trace
    head.unlink()
    with pytest.raises(StaleTraceError, match="no longer installed"):
        check_fresh(trace)


def test_the_command_refuses_a_stale_trace(tmp_path, capsys):
    head = tmp_path / "h.safetensors"
    head.write_bytes(b"new")
    with_head(synthetic_trace(0.6, prompts=1, tokens=10), head, "0" * 64).save(tmp_path / "t.json.gz")
    assert main(["controllers", "evaluate", "--traces", str(tmp_path / "t.json.gz")]) == 1
    err = capsys.readouterr().err
    assert "another version of the exit head h.safetensors" in err and "eesd trace record" in err


def test_every_shipped_trace_is_fresh_and_names_what_made_it():
    traces = shipped_traces()
    assert traces, "eesd ships traces"
    for name, path in traces.items():
        trace = load_trace(name)
        assert path.stat().st_size < 2_000_000
        for key in ("model", "head", "head_sha256", "eesd_version", "model_shape"):
            assert trace.meta.get(key), (name, key)
        assert all(p.category for p in trace.prompts)


def test_every_shipped_profile_names_machine_shape_precision_and_date():
    for name in shipped_profiles():
        profile = load_profile(name)
        for key in ("machine", "model_shape", "precision", "date", "source"):
            assert profile.meta.get(key), (name, key)
        costs = profile.at(1)
        assert costs.draft_step > 0 and len(costs.verify) >= 9 and profile.plain_step(1) > 0


def test_profile_round_trip_and_gpu_profile_from_cost_curves(tmp_path):
    PROFILE.save(tmp_path / "p.json")
    again = CostProfile.load(tmp_path / "p.json")
    assert again.at(1) == SMOL_CPU and again.plain_step(1) == PROFILE.plain_step(1)
    with pytest.raises(InputError, match="no batch size 4"):
        again.at(4)
    curves = json.loads((RESULTS / "cost-curves-qwen2.5-1.5b-nvidia-h200.json").read_text())
    gpu = from_cost_curves(curves, 4, "cost-curves-qwen2.5-1.5b-nvidia-h200.json")
    modelled = curves["modelled"]["by_exit_layer"]["4"]["costs"]
    assert gpu.at(1).verify == tuple(modelled["verify"])
    assert gpu.plain_step(1) == curves["timings"]["plain_step"]["median"]
    with pytest.raises(InputError, match="no exit layer 5"):
        from_cost_curves(curves, 5, "curves")


def test_a_profile_too_short_for_the_trace_is_refused():
    short = CostProfile({1: CostModel(0.1, 0.1, (1.0, 1.1))}, {}, {"name": "short"})
    with pytest.raises(InputError, match="--max-draft-tokens 8"):
        under(synthetic_trace(0.5, prompts=1, tokens=10), short)


def test_profiles_timed_at_two_moments_average_cost_by_cost():
    early = CostProfile({1: CostModel(0.1, 0.2, (1.0, 1.2))}, {1: 0.9}, {"name": "early"})
    late = CostProfile({1: CostModel(0.3, 0.4, (2.0, 1.6))}, {1: 1.1}, {"name": "late"})
    mean = CostProfile.mean([early, late])
    costs = mean.at(1)
    assert costs.draft_step == pytest.approx(0.2) and costs.propose_base == pytest.approx(0.3)
    assert costs.verify == pytest.approx((1.5, 1.4)) and mean.plain_step(1) == pytest.approx(1.0)
    assert mean.meta["name"] == "early"
    other = CostProfile({4: CostModel(0.1, 0.2, (1.0, 1.2))}, {4: 0.9}, {})
    with pytest.raises(InputError, match="same batch sizes"):
        CostProfile.mean([early, other])


def test_leaderboard_by_category():
    trace = labelled(synthetic_trace(0.7, prompts=3, tokens=60), ["qa", "code", "code"])
    board = leaderboard(
        trace, PROFILE, {"thompson": ("thompson", {}), "k2": lambda: FixedK(FixedOptions(k=2))}
    )
    assert board["categories"] == ["qa", "code", ALL]
    assert board["tokens"] == {"qa": 60, "code": 120, ALL: 180}
    rows = board["rows"]
    for group, sub in {**categories(trace), ALL: trace}.items():
        oracle = rows["oracle"][group]["time_per_token"]
        fixed = rows["best fixed k"][group]
        assert fixed["time_per_token"] == pytest.approx(fixed_time(sub, fixed["k"]))
        assert fixed["time_per_token"] <= fixed_time(sub, 2) + 1e-12
        assert rows["plain"][group]["speedup"] == 1.0
        for label in ("thompson", "k2", "best fixed k"):
            assert rows[label][group]["time_per_token"] >= oracle - 1e-12
    assert rows["k2"][ALL]["time_per_token"] == pytest.approx(
        replay(under(trace, PROFILE), FixedK(FixedOptions(k=2))).time_per_token
    )
    ratio = board["vs_best_fixed"]["k2"]["qa"]
    assert ratio == pytest.approx(
        rows["k2"]["qa"]["time_per_token"] / rows["best fixed k"]["qa"]["time_per_token"]
    )
    text = format_board(board)
    assert "thompson" in text and "time / best fixed" in text and "k=" in text


def test_evaluate_pairs_and_matching_profiles():
    trace = replace(
        synthetic_trace(0.5, prompts=1, tokens=20),
        meta={"model_shape": {"layers": 30, "hidden_size": 576, "vocab_size": 7}},
    )
    fits = replace(PROFILE, meta={"model_shape": {"layers": 30, "hidden_size": 576, "vocab_size": 7}})
    assert matching_profiles(trace, {"fits": fits, "other": PROFILE}) == ["fits"]
    boards = evaluate({"t": trace}, {"fits": fits}, {"fixed": ("fixed", {})})
    assert [(b["trace"], b["profile"]) for b in boards] == [("t", "fits")]


def test_parse_controller_forms():
    assert parse_controller("ucb") == ("ucb", ("ucb", {}))
    assert parse_controller('fixed={"k": 2}') == ('fixed={"k": 2}', ("fixed", {"k": 2}))
    name, factory = parse_controller("eesd_baselines:FixedK")
    assert name == "FixedK" and factory is FixedK
    with pytest.raises(ConfigError, match="JSON object"):
        parse_controller("fixed=3")
    with pytest.raises(ConfigError, match="Cannot import"):
        parse_controller("no_such_module:Thing")


def test_evaluate_command_writes_the_leaderboard(tmp_path, capsys):
    trace = labelled(synthetic_trace(0.6, prompts=2, tokens=30), ["qa", "code"])
    trace.save(tmp_path / "t.json.gz")
    PROFILE.save(tmp_path / "cpu.json")
    argv = [
        "controllers",
        "evaluate",
        "--traces",
        str(tmp_path / "t.json.gz"),
        "--profiles",
        str(tmp_path / "cpu.json"),
    ]
    assert main([*argv, "--controllers", "thompson", 'fixed={"k": 1}', "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "trace t, cost profile cpu" in out and 'fixed={"k": 1}' in out
    saved = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    assert saved["boards"][0]["categories"] == ["qa", "code", ALL]


class _Rounds:
    """Collects every round the engine finishes, as (drafted, accepted)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    @hookimpl
    def eesd_round_end(self, outcome) -> None:  # noqa: ANN001
        self.seen.append((outcome.drafted, outcome.accepted))


@pytest.fixture
def rounds():
    reset_manager()
    observer = _Rounds()
    get_manager().register(observer, "rounds-test")
    yield observer
    reset_manager()


class _Logged:
    """Wraps a controller to note the rounds it learns from, in replay."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner, self.seen = inner, []

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self.inner, name)

    def update(self, state, outcomes) -> None:  # noqa: ANN001
        self.seen.extend((o.drafted, o.accepted) for o in outcomes)
        self.inner.update(state, outcomes)


@pytest.mark.parametrize(
    ("name", "options"),
    [("heuristic", {"start": 2}), ("confidence", {"threshold": 0.3}), ("fixed", {"k": 3})],
)
def test_replay_of_a_saved_trace_makes_the_engines_rounds(tiny, tmp_path, rounds, name, options):
    """The same deterministic controller, serving the same prompts in turn: replay of the recorded
    trace (through a file) decides every round as the engine did, and sees the same acceptances."""
    from eesd_bench.trace import build_controller

    model = tiny(seed=3)
    common = {"drafter": "early_exit", "drafter_options": {"exit_layer": 3}, "max_draft_tokens": 4}
    prompts = [[1, 5, 7, 9], [1, 11, 12], [2, 3]]
    recorder = SpeculativeDecoder(model, controller="fixed", **common)
    record_trace(recorder, prompts, max_new_tokens=30).save(tmp_path / "t.json.gz")
    rounds.seen.clear()
    dec = SpeculativeDecoder(model, controller=name, controller_options=options, **common)
    for prompt in prompts:
        dec.generate(prompt, max_new_tokens=30)
    logged = _Logged(build_controller((name, options)))
    replay(Trace.load(tmp_path / "t.json.gz"), logged)
    assert len(rounds.seen) > 20
    assert logged.seen == rounds.seen


@pytest.fixture
def checkpoint(tmp_path, tiny):
    import torch
    from bytetok import byte_tokenizer

    path = tmp_path / "tiny"
    tiny("llama", seed=2, vocab=259, dtype=torch.float32).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def test_record_measure_and_evaluate_end_to_end(checkpoint, tmp_path, capsys):
    model = ["--model", str(checkpoint), "--products", "standard", "--max-draft-tokens", "3"]
    model += ["--drafter-options", '{"exit_layer": 2, "head": null}']
    trace_file = str(tmp_path / "t.json.gz")
    record = ["trace", "record", *model, "--categories", "coding", "qa", "--own-code", "1"]
    assert main([*record, "--max-new-tokens", "6", "--out", trace_file]) == 0
    err = capsys.readouterr().err
    assert "measuring costs" in err and "[3/3] own_code own-code-0: 6 tokens" in err
    trace = Trace.load(trace_file)
    assert [p.category for p in trace.prompts] == ["coding", "qa", "own_code"]
    assert trace.meta["head"] is None and trace.meta["eesd_version"] and trace.meta["max_new_tokens"] == 6
    assert main([*record, "--max-new-tokens", "6", "--out", trace_file, "--resume"]) == 0
    assert "[1/3]" not in capsys.readouterr().err  # nothing left to record
    assert main([*record, "--max-new-tokens", "7", "--out", trace_file, "--resume"]) == 1
    assert "other settings" in capsys.readouterr().err

    profile_file = str(tmp_path / "p.json")
    assert main(["costs", "measure", *model, "--cycles", "1", "--out", profile_file]) == 0
    profile = CostProfile.load(profile_file)
    assert len(profile.at(1).verify) == 4 and profile.plain_step(1) > 0
    assert profile.meta["precision"] == "float32" and profile.meta["model_shape"]["vocab_size"] == 259

    evaluate_args = ["controllers", "evaluate", "--traces", trace_file, "--profiles", profile_file]
    assert main(evaluate_args) == 0
    out = capsys.readouterr().out
    assert "coding" in out and "own_code" in out and "thompson" in out


def test_a_profile_holds_every_batch_size_asked(checkpoint, tmp_path, capsys):
    model = ["--model", str(checkpoint), "--products", "standard", "--max-draft-tokens", "2"]
    model += ["--drafter-options", '{"exit_layer": 2, "head": null}']
    profile_file = str(tmp_path / "p.json")
    measure = ["costs", "measure", *model, "--cycles", "1", "--batch-sizes", "1", "3", "--out", profile_file]
    assert main([*measure, "--sdpa", "math"]) == 0
    out, err = capsys.readouterr()
    assert "batch size 3, 1/2" in err
    assert "  batch size 1: plain step" in out and "  batch size 3: plain step" in out
    profile = CostProfile.load(profile_file)
    assert sorted(profile.batches) == [1, 3] and sorted(profile.plain) == [1, 3]
    assert profile.meta["sdpa"] == ["math"]  # the attention kernels it was timed with are kept
    for size in (1, 3):
        assert len(profile.at(size).verify) == 3 and profile.plain_step(size) > 0
    assert CostProfile.from_dict(profile.to_dict()).batches == profile.batches
    with pytest.raises(InputError, match="no batch size 2"):
        profile.at(2)
    assert main(["costs", "measure", *model, "--batch-sizes", "0", "--out", profile_file]) == 1
    assert "batch sizes of at least 1" in capsys.readouterr().err


def test_measured_costs_cycle_k_alike_in_every_row(tiny):
    """Rounds of a batch of three copies of one prompt: each round drafts the same k in every row,
    k cycling 0, 1, 2, 0, ... (until the last tokens leave no room for drafts); one outcome per row
    and round."""
    from eesd_bench.trace import _recorded, _Recorder

    dec = SpeculativeDecoder(tiny(seed=3), drafter_options={"exit_layer": 3}, max_draft_tokens=2)
    recorder = _Recorder(cycle=2)
    _recorded(dec, recorder, [1, 5, 7, 9], 3, max_new_tokens=12, eos_token_id=[])
    by_round = [recorder.outcomes[i : i + 3] for i in range(0, len(recorder.outcomes), 3)]
    assert len(by_round) == recorder.rounds == 11, "one token a round after the prefill's"
    assert [o.row for o in recorder.outcomes] == [0, 1, 2] * recorder.rounds
    assert [[o.drafted for o in r] for r in by_round[:9]] == [[r % 3] * 3 for r in range(9)]
