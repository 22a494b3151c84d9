"""The batch gate: in a static batch, drafting is kept only while it advances the call (the row
with fewest tokens) faster per second than plain rounds do."""

from __future__ import annotations

import pytest
from eesd_thompson import ThompsonController, ThompsonOptions
from eesd_thompson.gate import LEAST_DRAFTED, LEAST_PLAIN, BatchGate

from eesd_core.protocols import Costs, DraftStep, Request, RoundOutcome, SamplingParams

# a batch of 4 where a draft round costs 1.4 plain steps: worth it for each row's own tokens
# at high acceptance, not for a call that waits for its slowest row
BATCH = Costs(draft_step=0.1, propose_base=0.0, verify=lambda m: 1.0 + 0.3 * (m > 1), batch_size=4)


def _round(gate: BatchGate, committed: list[int], drafted: int, seconds: float, rows=None) -> None:
    for row in rows if rows is not None else range(len(committed)):
        n = committed[row]
        gate.observe(RoundOutcome(0, drafted, max(n - 1, 0), (1,) * n, 0.0, seconds, row=row))


def test_the_gate_measures_the_row_with_fewest_tokens():
    gate = BatchGate()
    _round(gate, [1, 1, 1, 1], 0, 1.0)
    _round(gate, [3, 3, 3, 1], 2, 1.5)  # three rows gain 3, the call gains 1
    _round(gate, [1, 1, 1, 1], 0, 1.0)  # ends the round before
    assert (gate.drafted.tokens, gate.drafted.seconds, gate.drafted.rounds) == (1, 1.5, 1)
    _round(gate, [1, 1], 0, 1.0, rows=[0, 1])  # rows 2 and 3 left: the fewest of rows 0 and 1
    _round(gate, [1, 1], 0, 1.0, rows=[0, 1])
    assert (gate.plain.tokens, gate.plain.rounds) == (2, 2)  # (1 of the round before row 3 left)


def test_the_gate_shuts_only_when_drafting_advances_the_call_more_slowly():
    slow, fast = BatchGate(), BatchGate()
    for gate, gains in ((slow, [3, 3, 3, 1]), (fast, [3, 2, 3, 2])):
        for _ in range(LEAST_PLAIN + 1):
            _round(gate, [1, 1, 1, 1], 0, 1.0)
        for i in range(LEAST_DRAFTED + 1):
            assert not gate.shut or i > LEAST_DRAFTED  # never before enough rounds
            _round(gate, gains, 2, 1.5)
        _round(gate, [1, 1, 1, 1], 0, 1.0)
    assert slow.shut and slow.drafted.rate < slow.plain.rate
    assert not fast.shut and fast.drafted.rate > fast.plain.rate


def _started(batch_size: int, **options) -> ThompsonController:
    ctrl = ThompsonController(ThompsonOptions(alpha0=900, beta0=100, **options))
    ctrl.start(Request(4, 64, 8, SamplingParams(), BATCH, batch_size=batch_size))
    ctrl._kinds[4] = {0, 1, 2}  # as if the engine had measured the batch's rounds
    return ctrl


def _first_drafts(ctrl: ThompsonController, rounds: int, gains: list[int]) -> int:
    """Batch rounds as the engine reports them: each row's first ask, then every row's outcome
    (drafting rounds commit ``gains``). Returns how many rounds drafted."""
    drafted_rounds = 0
    for _ in range(rounds):
        drafts = [ctrl.should_continue(DraftStep(0, 2, BATCH, row=row)) for row in range(4)]
        drafted = 2 if any(drafts) else 0
        drafted_rounds += drafted > 0
        for row in range(4):
            n = gains[row] if drafted else 1
            seen = (0.9,) * drafted
            ctrl.update(
                RoundOutcome(0, drafted, n - 1, (1,) * n, 0.2 * drafted, 1.0, seen, seen, seen, BATCH, row)
            )
    return drafted_rounds


def test_a_static_batch_stops_drafting_once_drafts_slow_its_call():
    """Drafts accepted 90% of the time: each row's own tokens say draft every round. But one row
    always gains 1 token in a drafting round that costs 1.4 plain ones, so the call advances at
    0.71 tokens a second against 1 in plain rounds: once both are measured, the rounds stay plain
    but for rare probes. Without the gate, or in a generation that is not one batch call (a
    serving engine's requests, each started alone), they draft on."""
    gated = _started(4)
    first = _first_drafts(gated, 40, [3, 3, 3, 1])
    later = _first_drafts(gated, 200, [3, 3, 3, 1])
    assert first >= LEAST_DRAFTED and gated._gates[4].shut
    assert later <= 20
    for ungated in (_started(4, gate=False), _started(1)):
        _first_drafts(ungated, 40, [3, 3, 3, 1])
        assert _first_drafts(ungated, 200, [3, 3, 3, 1]) >= 150


def test_a_static_batch_whose_drafts_advance_its_call_drafts_on():
    """Every row gains 2 or 3 tokens a drafting round: the call advances 2 tokens per 1.4 s
    against 1 per second plain, and after the plain rounds that measure that, drafting goes on."""
    gated = _started(4)
    _first_drafts(gated, 40, [3, 2, 3, 2])
    assert not gated._gates[4].shut and gated._gates[4].plain.rounds >= LEAST_PLAIN
    assert _first_drafts(gated, 200, [3, 2, 3, 2]) >= 150


def test_what_the_gate_measured_shrinks_at_each_start_until_it_measures_again():
    """A gate shut by one workload opens again after some generations, as the posterior forgets:
    each start shrinks its evidence by ``decay``; below the rounds it needs, it measures anew."""
    ctrl = _started(4)
    _first_drafts(ctrl, 40, [3, 3, 3, 1])
    gate = ctrl._gates[4]
    assert gate.shut
    rates = gate.drafted.rate, gate.plain.rate
    starts = 0
    while gate.shut:
        ctrl.start(Request(4, 64, 8, SamplingParams(), BATCH, batch_size=4))
        starts += 1
        assert (gate.drafted.rate, gate.plain.rate) == pytest.approx(rates)  # the rates stay
    assert 1 <= starts <= 12 and gate.drafted.rounds < LEAST_DRAFTED
    request_scoped = _started(4, scope="request")
    _first_drafts(request_scoped, 40, [3, 3, 3, 1])
    request_scoped.start(Request(4, 64, 8, SamplingParams(), BATCH, batch_size=4))
    assert request_scoped._gates[4].drafted.rounds == request_scoped._gates[4].plain.rounds == 0


def test_a_round_the_gate_keeps_plain_costs_its_other_rows_no_draws():
    """Once the gate has shut, the first row asked decides a plain round for the batch: the rows
    after it refuse without drawing from the controller's stream (at B = 64 their draws cost
    more than a millisecond a round on the host). A round the gate lets probe asks every row."""
    ctrl = _started(4)
    _first_drafts(ctrl, 40, [3, 3, 3, 1])
    assert ctrl._gates[4].shut
    plain = probed = 0
    for _ in range(60):
        first = ctrl.should_continue(DraftStep(0, 2, BATCH, row=0))
        state = ctrl.rng.getstate()
        rest = [ctrl.should_continue(DraftStep(0, 2, BATCH, row=row)) for row in (1, 2, 3)]
        if ctrl._lockstep.plain:
            assert not first and rest == [False, False, False] and ctrl.rng.getstate() == state
            plain += 1
        else:
            probed += 1
        for row in range(4):
            ctrl.update(RoundOutcome(0, 0, 0, (1,), 0.0, 1.0, costs=BATCH, row=row))
    assert plain >= 50 and plain + probed == 60
