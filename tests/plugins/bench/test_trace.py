"""Trace recording, replay and the oracles: hand-made traces with known answers, and a recorded
trace checked against what the engine really does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eesd_baselines import FixedK, FixedOptions
from eesd_bench.trace import (
    CostModel,
    Position,
    PromptTrace,
    Trace,
    best_fixed,
    build_controller,
    compare_controllers,
    fixed_time,
    format_table,
    oracle_time,
    record_trace,
    replay,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import FAST_DRAFT, SMOL_CPU, synthetic_trace

from eesd_core import SpeculativeDecoder

UNIT = CostModel(draft_step=1.0, propose_base=0.0, verify=(10.0,) * 4)  # round_time(k) = 10 + k


def hand_trace(accepted=(3, 2, 1, 0, 0, 0), k=3):
    n = len(accepted)
    positions = []
    for t, a in enumerate(accepted):
        limit = min(k, n - 1 - t)
        conf = tuple(0.9 if i < a else 0.1 for i in range(limit))
        positions.append(Position(limit, a, conf, conf, tuple(1 - c for c in conf)))
    return Trace(k, UNIT, (PromptTrace(2, tuple(range(n)), tuple(positions)),))


def test_fixed_k_replays_by_hand():
    trace = hand_trace()
    # k=3: commit 4 at t=0, then one rejected draft at t=4, then a plain step: 13 + 11 + 10
    assert fixed_time(trace, 3) == pytest.approx(34 / 6)
    assert fixed_time(trace, 1) == pytest.approx(43 / 6)
    assert fixed_time(trace, 0) == pytest.approx(10)
    result = replay(trace, FixedK(FixedOptions(k=3)), learn_costs=False)
    assert (result.tokens, result.rounds, result.drafted, result.accepted) == (6, 3, 4, 3)
    assert result.time_per_token == pytest.approx(34 / 6)
    assert best_fixed(trace) == (3, pytest.approx(34 / 6))


def test_oracle_chooses_each_round_in_hindsight():
    trace = hand_trace()
    assert oracle_time(trace) == pytest.approx(33 / 6)  # as k=3, but no doomed draft at t=4


class Confident:
    """Drafts while the latest draft's top-1 is at least one half."""

    def start(self, request):
        return None

    def begin_round(self, state, round):
        pass

    def should_continue(self, state, step):
        return step.index == 0 or step.confidence.top1 >= 0.5

    def update(self, state, outcomes):
        pass


def test_replay_hands_the_recorded_confidences_to_the_controller():
    result = replay(hand_trace(), Confident(), learn_costs=False)
    # t=0: drafts 0.9 0.9 0.9 -> 4 tokens; t=4: one draft 0.1, rejected; t=5: nothing to draft
    assert (result.rounds, result.drafted, result.accepted) == (3, 4, 3)


class TakesSecondBack:
    """Takes every round's second draft back, on its q alone."""

    withdraws = True

    def __init__(self):
        self.judged = []

    def start(self, request):
        assert request.withdraws

    def begin_round(self, state, round):
        pass

    def should_continue(self, state, step):
        return True

    def keep(self, state, step):
        assert step.token is None and step.confidence.prob is None and step.confidence.top1 in (0.1, 0.9)
        return step.index != 2

    def update(self, state, outcomes):
        self.judged += [o.withdrawn.acceptance for o in outcomes if o.withdrawn is not None]


def test_replay_judges_drafts_taken_back_by_the_trace():
    ctrl = TakesSecondBack()
    result = replay(hand_trace(), ctrl, learn_costs=False)
    # t=0: one draft, the second (accepted there) taken back; t=2: likewise, rejected there;
    # t=4: the one draft allowed, rejected; t=5: a plain step. Each draft taken back costs a peek.
    assert ctrl.judged == [1.0, 0.0] and result.withdrawn == 2
    assert (result.tokens, result.rounds, result.drafted, result.accepted) == (6, 4, 3, 2)
    assert result.time == pytest.approx(11 + 1 + 11 + 1 + 11 + 10)


def test_json_round_trip(tmp_path):
    trace = synthetic_trace(0.5, prompts=2, tokens=20)
    assert Trace.from_dict(json.loads(json.dumps(trace.to_dict()))) == trace
    trace.save(tmp_path / "trace.json")
    assert Trace.load(tmp_path / "trace.json") == trace


class Silent:
    """A drafter's view without confidences: the controller sees None."""

    def __init__(self):
        self.seen = []

    def start(self, request):
        return None

    def begin_round(self, state, round):
        pass

    def should_continue(self, state, step):
        self.seen.append(step.confidence)
        return step.index < 2

    def update(self, state, outcomes):
        pass


def test_replay_without_confidences():
    trace = hand_trace()
    bare = tuple(Position(p.drafts, p.accepted) for p in trace.prompts[0].positions)
    trace = Trace(3, UNIT, (PromptTrace(2, trace.prompts[0].tokens, bare),))
    ctrl = Silent()
    assert replay(trace, ctrl).tokens == 6 and set(ctrl.seen) == {None}


@given(
    rate=st.floats(0.0, 1.0),
    persistence=st.floats(0.0, 0.95),
    seed=st.integers(0, 100),
    name=st.sampled_from(["thompson", "fixed", "heuristic", "confidence", "ema", "ucb"]),
    fast=st.booleans(),
)
@settings(max_examples=25, deadline=None)
def test_no_controller_beats_the_oracle(rate, persistence, seed, name, fast):
    costs = FAST_DRAFT if fast else SMOL_CPU
    trace = synthetic_trace(rate, persistence, costs, prompts=2, tokens=30, seed=seed)
    oracle = oracle_time(trace)
    assert best_fixed(trace)[1] >= oracle - 1e-12
    assert replay(trace, build_controller((name, {}))).time_per_token >= oracle - 1e-12


def test_compare_controllers_table():
    trace = synthetic_trace(0.8, prompts=2, tokens=40)
    rows = compare_controllers(trace, {"ts": ("thompson", {}), "k2": lambda: FixedK(FixedOptions(k=2))})
    names = [r["controller"] for r in rows]
    assert names[0] == "plain" and names[2] == "oracle per round" and names[-2:] == ["ts", "k2"]
    assert rows[0]["speedup"] == 1.0 and rows[2]["vs_oracle"] == 1.0
    assert rows[-1]["time_per_token"] == pytest.approx(fixed_time(trace, 2))
    assert "oracle per round" in format_table(rows)


def test_default_thompson_decodes_plainly_when_drafts_are_rarely_right():
    for seed in range(3):
        trace = synthetic_trace(0.1, 0.6, SMOL_CPU, prompts=5, tokens=64, seed=seed)
        assert replay(trace, build_controller(("thompson", {}))).time_per_token <= 1.03 * SMOL_CPU.plain_step


def test_default_thompson_drafts_when_drafts_are_usually_right():
    trace = synthetic_trace(0.9, 0.6, FAST_DRAFT, prompts=5, tokens=64)
    time = replay(trace, build_controller(("thompson", {}))).time_per_token
    assert time < 0.8 * FAST_DRAFT.plain_step
    assert time < 1.1 * best_fixed(trace)[1]


_RECORDED: dict[str, tuple] = {}


@pytest.fixture
def recorded(tiny):
    """A tiny model, two prompts and their trace, recorded once for the module."""
    if not _RECORDED:
        model = tiny(seed=3)
        dec = SpeculativeDecoder(
            model,
            drafter="early_exit",
            drafter_options={"exit_layer": 3},
            controller="fixed",
            max_draft_tokens=4,
        )
        prompts = [[1, 5, 7, 9], [1, 11, 12]]
        _RECORDED["tiny"] = model, prompts, record_trace(dec, prompts, max_new_tokens=30)
    return _RECORDED["tiny"]


def test_recorded_trace_follows_the_greedy_output(recorded):
    model, prompts, trace = recorded
    plain = SpeculativeDecoder(model, drafter=None)
    for prompt, pt in zip(prompts, trace.prompts, strict=True):
        expected = plain.generate(prompt, max_new_tokens=30).sequences[0, len(prompt) :].tolist()
        assert list(pt.tokens) == expected
        assert len(pt.positions) == len(pt.tokens)
        for t, pos in enumerate(pt.positions):
            assert pos.drafts == len(pos.top1) == (min(4, len(pt.tokens) - 1 - t) if t else 0)
            if t + 1 < len(pt.positions) and pos.accepted:
                assert pt.positions[t + 1].accepted >= pos.accepted - 1
    costs = trace.costs
    assert costs.draft_step >= 0 and costs.propose_base > 0 and len(costs.verify) == 5


def test_recording_leaves_the_decoder_as_it_was(tiny):
    dec = SpeculativeDecoder(
        tiny(seed=3),
        drafter="early_exit",
        drafter_options={"exit_layer": 3},
        controller="fixed",
        max_draft_tokens=2,
    )
    controller, verifier = dec.controller, dec.verifier
    trace = record_trace(dec, [[1, 5, 7]], max_new_tokens=6)
    assert dec.controller is controller and dec.verifier is verifier
    assert len(trace.prompts[0].tokens) == 6


@pytest.mark.parametrize("k", [1, 3])
def test_replay_matches_the_engine(recorded, k):
    model, prompts, trace = recorded
    dec = SpeculativeDecoder(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 3},
        controller="fixed",
        controller_options={"k": k},
        max_draft_tokens=4,
    )
    rounds = drafted = accepted = 0
    for prompt in prompts:
        stats = dec.generate(prompt, max_new_tokens=30).stats
        rounds, drafted, accepted = rounds + stats.rounds, drafted + stats.drafted, accepted + stats.accepted
    result = replay(trace, FixedK(FixedOptions(k=k)))
    assert (result.rounds, result.drafted, result.accepted) == (rounds, drafted, accepted)


SMOLLM2 = Path(__file__).parent / "data" / "smollm2_exit6_trace.json"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_thompson_keeps_plain_speed_on_a_recorded_smollm2_trace(seed):
    """SmolLM2-135M drafting from layer 6 of 30 with its own LM head: drafts are almost never right
    and a draft step costs a third of a forward pass on a CPU, so plain decoding is the best policy."""
    trace = Trace.from_dict(json.loads(SMOLLM2.read_text()))
    result = replay(trace, build_controller(("thompson", {"seed": seed})))
    assert result.time_per_token <= 1.03 * trace.costs.plain_step
