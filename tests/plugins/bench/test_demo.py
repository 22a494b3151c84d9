"""``eesd demo``: interleaved timing, the table, the verdict, progress lines, and a run end to end."""

from __future__ import annotations

import itertools

import pytest
import torch
from bytetok import byte_tokenizer
from eesd_bench.demo import (
    GAIN_MODEL,
    HF,
    PLAIN,
    Call,
    differing,
    equality,
    measure,
    rates,
    report,
    rotation,
    verdict,
)

from eesd_core.cli import main

FAST = "eesd default"


def fake_runners(events: list[str]) -> dict:
    def runner(name):
        def run(ids):
            events.append(f"{name} {ids[0]}")
            return [ids[0], 7]

        return run

    return {name: runner(name) for name in (FAST, PLAIN, HF)}


def test_rotation_shifts_by_one_place_per_round() -> None:
    methods = ["a", "b", "c"]
    assert [rotation(methods, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_measure_warms_up_then_interleaves_with_a_progress_line_before_each_step() -> None:
    events: list[str] = []
    calls = measure(fake_runners(events), [[1], [2]], 2, progress=lambda m: events.append(f"say {m}"))
    assert events == [
        f"say warming up {FAST} (one untimed call)",
        f"{FAST} 1",
        f"say warming up {PLAIN} (one untimed call)",
        f"{PLAIN} 1",
        f"say warming up {HF} (one untimed call)",
        f"{HF} 1",
        f"say timing round 1 of 2: {FAST}, {PLAIN}, {HF}, on 2 prompts",
        f"{FAST} 1",
        f"{PLAIN} 1",
        f"{HF} 1",
        f"{FAST} 2",
        f"{PLAIN} 2",
        f"{HF} 2",
        f"say timing round 2 of 2: {PLAIN}, {HF}, {FAST}, on 2 prompts",
        f"{PLAIN} 1",
        f"{HF} 1",
        f"{FAST} 1",
        f"{PLAIN} 2",
        f"{HF} 2",
        f"{FAST} 2",
    ]
    assert [(c.method, c.round, c.prompt) for c in calls[:3]] == [(FAST, 0, 0), (PLAIN, 0, 0), (HF, 0, 0)]
    assert len(calls) == 12


def test_each_call_is_timed_alone() -> None:
    ticks = itertools.count()
    calls = measure(fake_runners([]), [[1]], 1, progress=lambda m: None, clock=lambda: float(next(ticks)))
    assert [c.seconds for c in calls] == [1.0, 1.0, 1.0]


def test_rates_join_the_prompts_of_a_round_and_skip_the_stream() -> None:
    calls = [
        Call(FAST, 0, 0, [1, 2], 1.0),
        Call(FAST, 0, 1, [1, 2, 3, 4], 1.0),
        Call(FAST, 1, 0, [1], 1.0),
        Call(FAST, -1, 0, [1] * 50, 0.1),
    ]
    assert rates(calls) == {FAST: [3.0, 1.0]}


PER_ROUND = {FAST: [10.0, 12.0, 30.0], PLAIN: [20.0, 25.0, 21.0], HF: [40.0, 50.0, 45.0]}


def test_report_shows_medians_spreads_and_ratios_of_medians() -> None:
    lines = report(PER_ROUND, [FAST, PLAIN, HF], 3, 2, 64).splitlines()
    assert lines[0].split() == ["method", "tokens/s", "min-max", "x", "eesd", "plain", "x", "transformers"]
    assert lines[1].split() == ["eesd", "default", "12.0", "10.0-30.0", "0.57x", "0.27x"]
    assert lines[2].split() == ["eesd", "plain", "21.0", "20.0-25.0", "1.00x", "0.47x"]
    assert lines[3].split() == ["transformers", "generate()", "45.0", "40.0-50.0", "2.14x", "1.00x"]
    assert "median over 3 rounds" in report(PER_ROUND, [FAST, PLAIN, HF], 3, 2, 64)


def test_report_without_transformers_has_no_such_column() -> None:
    text = report({FAST: [2.0], PLAIN: [1.0]}, [FAST, PLAIN], 1, 2, 8)
    assert "transformers" not in text.splitlines()[0]
    assert "2.00x" in text


def test_verdict_says_plainly_when_default_is_not_faster_and_names_the_larger_model() -> None:
    said = verdict(PER_ROUND, FAST, "smollm2-135m-instruct")
    assert said.startswith(f"{FAST} is not faster than plain decoding here (0.57x by the medians)")
    assert f"eesd demo --model {GAIN_MODEL}" in said
    on_the_larger = verdict(PER_ROUND, FAST, GAIN_MODEL)
    assert "is not faster" in on_the_larger and "--model" not in on_the_larger


def test_verdict_when_faster() -> None:
    clear = {FAST: [30.0, 31.0, 32.0], PLAIN: [20.0, 21.0, 22.0]}
    assert verdict(clear, FAST, "m") == f"{FAST} is 1.48x as fast as plain decoding here, in every round."
    overlapping = {FAST: [19.0, 31.0, 32.0], PLAIN: [20.0, 21.0, 22.0]}
    assert "some rounds overlap" in verdict(overlapping, FAST, "m")


def test_differences_are_named() -> None:
    calls = [Call(HF, 0, 0, [1, 2], 1.0), Call(FAST, 0, 0, [1, 2], 1.0), Call(FAST, 1, 0, [1, 3], 1.0)]
    same = lambda call, reference: call.tokens == reference  # noqa: E731
    assert equality(calls[:2], HF, differing(calls[:2], HF, same)).startswith("identical")
    differences = differing(calls, HF, same)
    assert differences == [calls[2]]
    assert equality(calls, HF, differences) == f"NOT identical to {HF}'s: {FAST} on prompt 1, round 2"


@pytest.fixture
def checkpoint(tmp_path, tiny):
    path = tmp_path / "tiny"
    tiny("llama", seed=2, vocab=259, dtype=torch.float32).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def test_demo_end_to_end_on_a_tiny_model(checkpoint, capsys) -> None:
    args = ["demo", "--model", str(checkpoint), "--max-new-tokens", "4", "--repeats", "2"]
    assert main([*args, "--products", "standard", "--prompt", "the cat sat"]) == 0
    out, err = capsys.readouterr()
    progress = [line for line in err.splitlines() if line.startswith("eesd: ")]
    assert progress[0].startswith("eesd: loading ")
    assert [line.split(":")[1].strip() for line in progress[1:]] == [
        f"warming up {FAST} (one untimed call)",
        f"warming up {PLAIN} (one untimed call)",
        f"warming up {HF} (one untimed call)",
        "timing round 1 of 2",
        "timing round 2 of 2",
    ]
    assert "> the cat sat" in out
    assert f"greedy outputs: identical: every method gave {HF}'s tokens" in out
    assert "median over 2 rounds" in out


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [("--repeats", "0", "--repeats must be at least 1, not 0."), ("--max-new-tokens", "-1", "at least 1")],
)
def test_demo_refuses_counts_below_one(option, value, says, capsys) -> None:
    assert main(["demo", option, value]) == 1
    assert says in capsys.readouterr().err
