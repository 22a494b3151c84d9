"""Aggregation as Spec-Bench computes it, the equality check, and the modelled speedup."""

from __future__ import annotations

import pytest
from eesd_bench.methods import parse_method
from eesd_bench.modelled import RoundCosts, expected_tokens, modelled_report
from eesd_bench.prompts import Question
from eesd_bench.report import markdown, mismatches, summarize
from eesd_bench.run import first_difference, rotated, run_benchmark
from eesd_bench.runners import BenchSettings, Output


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert rotated([1, 2, 3], 4) == [2, 3, 1]


def _sample(method, task, tps, **extra):
    return {
        "run": 0,
        "question_id": 0,
        "category": task,
        "task": task,
        "method": method,
        "new_tokens": 10,
        "seconds": 10 / tps,
        "tokens_per_second": tps,
        "equal": True,
        **extra,
    }


def test_speedup_is_the_ratio_of_mean_tokens_per_second() -> None:
    samples = [
        _sample("hf", "qa", 10.0, rounds=10),
        _sample("hf", "rag", 30.0, rounds=10),
        _sample(
            "x",
            "qa",
            20.0,
            rounds=5,
            drafted=8,
            accepted=5,
            draft_time=0.1,
            verify_time=0.3,
            drafted_by_position=[5, 3],
            accepted_by_position=[4, 1],
        ),
        _sample(
            "x",
            "rag",
            30.0,
            rounds=4,
            drafted=8,
            accepted=6,
            draft_time=0.1,
            verify_time=0.1,
            drafted_by_position=[4, 4],
            accepted_by_position=[3, 3],
            equal=False,
            first_diff=3,
        ),
    ]
    summary = summarize(samples, ["hf", "x"], "hf")
    x = summary["overall"]["x"]
    assert x["speedup"] == pytest.approx(25.0 / 20.0)  # not the mean of per-sample ratios (1.5)
    assert summary["groups"]["qa"]["x"]["speedup"] == pytest.approx(2.0)
    assert x["mean_accepted_tokens"] == pytest.approx(20 / 9)
    assert x["acceptance_rate"] == pytest.approx(11 / 16)
    assert x["acceptance_by_position"] == pytest.approx([7 / 9, 4 / 7])
    assert x["draft_share"] == pytest.approx(0.2 / (0.5 + 10 / 30))
    assert (x["equal"], x["checked"]) == (1, 2)
    assert summary["overall"]["hf"]["draft_share"] is None
    assert mismatches(samples) == [
        {"method": "x", "run": 0, "question_id": 0, "first_diff": 3, "new_tokens": 10}
    ]


class _Fake:
    """A runner that returns fixed tokens (optionally wrong at one place) and logs its calls."""

    def __init__(self, name, log, wrong_at=None):
        self.name, self.log, self.wrong_at = name, log, wrong_at

    def generate(self, prompt, settings, seed):
        self.log.append((self.name, len(prompt), settings.max_new_tokens, seed))
        tokens = [7] * settings.max_new_tokens
        if self.wrong_at is not None and prompt[0] == 1:
            tokens[self.wrong_at] = 8
        return Output(tokens, 0.5, {"rounds": settings.max_new_tokens})


def test_interleaving_warmup_and_equality(monkeypatch) -> None:
    log = []
    fakes = {"hf": _Fake("hf", log), "a": _Fake("a", log), "b": _Fake("b", log, wrong_at=2)}
    monkeypatch.setattr("eesd_bench.run.build_runner", lambda spec, model, settings: fakes[spec.name])
    methods = [parse_method("hf"), parse_method("eesd:controller=fixed"), parse_method("eesd_plain")]
    methods = [type(m)(n, m.kind, m.options) for m, n in zip(methods, ["hf", "a", "b"], strict=True)]
    prompts = [(Question(i, "qa", "t"), [i, 5, 6]) for i in range(3)]
    samples = run_benchmark(None, prompts, methods, BenchSettings(max_new_tokens=40, seed=3), runs=2)
    assert [entry[2] for entry in log[:3]] == [32, 32, 32]  # one warm-up each, at most 32 tokens
    timed = [entry[0] for entry in log[3:]]
    assert timed[:9] == ["hf", "a", "b", "a", "b", "hf", "b", "hf", "a"]
    assert {entry[3] for entry in log[3:] if entry[1] == 3} == {3, 4, 5}
    assert len(samples) == 18
    wrong = [s for s in samples if s["equal"] is False]
    assert {(s["method"], s["question_id"], s["first_diff"]) for s in wrong} == {("b", 1, 2)}
    assert all("tokens" in s for s in samples if s["method"] == "hf" or s["equal"] is False)
    assert not any("tokens" in s for s in samples if s["method"] == "a")


def test_sampled_runs_are_not_compared(monkeypatch) -> None:
    fakes = {"hf": _Fake("hf", []), "b": _Fake("b", [], wrong_at=0)}
    monkeypatch.setattr("eesd_bench.run.build_runner", lambda spec, model, settings: fakes[spec.name])
    methods = [parse_method("hf"), type(parse_method("hf"))("b", "eesd", {})]
    samples = run_benchmark(None, [(Question(1, "qa", "t"), [1])], methods, BenchSettings(4, temperature=0.7))
    assert all(s["equal"] is None for s in samples)
    page = markdown(
        {
            "environment": {},
            "settings": {"temperature": 0.7},
            "summary": summarize(samples, ["hf", "b"], "hf"),
        }
    )
    assert "Not checked" in page and "| b |" in page


def test_modelled_speedup() -> None:
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 3) == 4.0
    costs = RoundCosts(draft_step=0.2, propose_base=0.3, verify=[0.7, 0.75, 0.8])  # plain step 1.0
    assert costs.speedup(0.5, 1) == pytest.approx(1.5 / 1.25)
    even = costs.break_even(1)
    assert costs.speedup(even, 1) == pytest.approx(1.0, abs=1e-6)
    assert RoundCosts(2.0, 0.3, [0.7, 0.75]).break_even(1) is None
    assert costs.best(0.05) == (0, pytest.approx(1.0))
    report = modelled_report(costs, {"eesd_default": 0.5, "other": None})
    assert len(report["speedup"]) == len(report["alphas"]) and len(report["speedup"][0]) == 2
    assert list(report["measured"]) == ["eesd_default"]
