"""Timed replays (:mod:`eesd_bench.timed`, ``benchmarks/timed_replay.py``): the controller sees the
trace's confidences, the rounds accept what the trace accepted, and the script times every method."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from eesd_bench.timed import FIRST_ID, Cursor, TraceDrafter, TraceVerifier, replay_prompts
from eesd_bench.trace import Position, PromptTrace
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "timed_replay.py"


def _trace(accepted: list[int], length: int = 7) -> PromptTrace:
    positions = [Position(0, 0)] + [
        Position(8, a, tuple(round(0.1 + 0.1 * i + 0.01 * t, 4) for i in range(8)))
        for t, a in enumerate(accepted, 1)
    ]
    return PromptTrace(length, tuple(range(len(positions))), tuple(positions))


def test_rounds_accept_and_show_what_the_trace_recorded() -> None:
    traces = [
        _trace([0, 2, 3, 1, 0, 3, 3, 2, 0, 1, 3, 0, 2, 2, 1, 3]),
        _trace([3, 3, 3, 0, 1, 2, 0, 3, 1, 1, 2, 3]),
    ]
    model = make_tiny("llama", 2)
    dec = SpeculativeDecoder(
        model, drafter_options={"exit_layer": 2}, controller="fixed", controller_options={"k": 3}
    )
    dec.drafter = TraceDrafter(dec.drafter, traces, dec.adapter.vocab_size)
    dec.verifier = TraceVerifier()
    seen = []
    parts = dec.parts
    dec.parts = lambda: replace(parts(), observe=seen.append)
    prompts = replay_prompts(traces, dec.adapter.vocab_size)
    assert [p[0] for p in prompts] == [FIRST_ID, FIRST_ID + 1] and all(len(p) == 7 for p in prompts)
    tokens = 12
    out = dec.generate(prompts, max_new_tokens=tokens, eos_token_id=[], rng=[Cursor(t) for t in traces])
    for row, trace in enumerate(traces):
        t, rounds = 1, [o for o in seen if o.row == row]
        for outcome in rounds:
            expected = min(outcome.drafted, trace.positions[t].accepted)
            assert outcome.accepted == expected
            top1 = [c.top1 for c in outcome.confidences]
            assert top1 == pytest.approx(
                [trace.positions[t].top1[i] for i in range(outcome.drafted)], abs=1e-5
            )
            t += expected + 1
        assert out.stats.rows[row].new_tokens == tokens and t >= tokens


@pytest.mark.slow
def test_the_script_times_each_method_side_by_side(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("timed_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    threads = torch.get_num_threads()
    out = tmp_path / "replay.json"
    try:
        argv = ["--shape", "tiny", "--compile", "off", "static", "--repeats", "1", "--categories", "own_code"]
        argv += ["--controller", "fixed", "--controller-options", '{"k": 3}']
        result = module.main([*argv, "--batch-sizes", "1", "3", "--threads", "1", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert out.exists() and result["tokens"] == 48 and len(result["prompts"]) == 3
    for size in ("1", "3"):
        entry = result["by_batch"][size]
        assert set(entry["seconds_per_token"]) == {
            "plain-off",
            "default-off",
            "plain-static",
            "default-static",
        }
        assert (
            entry["tokens_per_round"]["plain-off"] == 1.0 and entry["tokens_per_round"]["default-off"] > 1.0
        )
        assert set(result["ratios"][size]) == {
            "default/plain off",
            "default/plain static",
            "plain static/off",
            "default static/off",
        }
