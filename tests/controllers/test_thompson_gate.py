"""The batch gate: in a static batch, drafting is kept only while it advances the call (the row
with fewest tokens) faster per second than plain rounds do."""

from __future__ import annotations

import pytest
from eesd_thompson import ThompsonController, ThompsonOptions
from eesd_thompson.gate import LEAST_DRAFTED, LEAST_PLAIN, BatchGate
from outcomes import Driven, outcome

from eesd_core.protocols import Costs, Request, RoundOutcome, SamplingParams

# a batch of 4 where a draft round costs 1.4 plain steps: worth it for each row's own tokens
# at high acceptance, not for a call that waits for its slowest row
BATCH = Costs(draft_step=0.1, propose_base=0.0, verify=lambda m: 1.0 + 0.3 * (m > 1), batch_size=4)


def _round(gate: BatchGate, committed: list[int], drafted: int, seconds: float, rows=None) -> None:
    rows = rows if rows is not None else range(len(committed))
    gate.observe_round(
        [
            RoundOutcome(0, drafted, max(committed[r] - 1, 0), (1,) * committed[r], 0.0, seconds, row=r)
            for r in rows
        ]
    )


def test_the_gate_measures_the_row_with_fewest_tokens():
    gate = BatchGate()
    _round(gate, [1, 1, 1, 1], 0, 1.0)
    assert gate.plain.rounds == gate.drafted.rounds == 0  # a first round has nothing to grow from
    _round(gate, [3, 3, 3, 1], 2, 1.5)  # three rows gain 3, the call gains 1
    assert (gate.drafted.tokens, gate.drafted.seconds, gate.drafted.rounds) == (1, 1.5, 1)
    assert gate.plain.rounds == 0
    _round(gate, [1, 1, 1, 1], 0, 1.0)
    _round(gate, [1, 1], 0, 1.0, rows=[0, 1])  # rows 2 and 3 left: the fewest of rows 0 and 1
    assert (gate.plain.tokens, gate.plain.rounds) == (2, 2)  # (1, not 3, in the round row 3 left)
    assert gate.drafted.rounds == 1


def test_the_gate_shuts_only_when_drafting_advances_the_call_more_slowly():
    slow, fast = BatchGate(), BatchGate()
    for gate, gains in ((slow, [3, 3, 3, 1]), (fast, [3, 2, 3, 2])):
        for _ in range(LEAST_PLAIN + 1):
            _round(gate, [1, 1, 1, 1], 0, 1.0)
        for i in range(LEAST_DRAFTED + 1):
            assert not gate.shut or i >= LEAST_DRAFTED  # never before enough rounds
            _round(gate, gains, 2, 1.5)
        _round(gate, [1, 1, 1, 1], 0, 1.0)
    assert slow.shut and slow.drafted.rate < slow.plain.rate
    assert not fast.shut and fast.drafted.rate > fast.plain.rate


def _started(batch_size: int, **options) -> Driven:
    ctrl = ThompsonController(ThompsonOptions(alpha0=900, beta0=100, **options))
    run = Driven(ctrl, Request(4, 64, 8, SamplingParams(), BATCH, batch_size=batch_size))
    ctrl.kinds[4] = {0, 1, 2}  # as if the engine had measured the batch's rounds
    return run


def _first_drafts(run: Driven, rounds: int, gains: list[int]) -> int:
    """Batch rounds as the engine runs them: the round begins for its four rows, each row's first
    ask, then every row's outcome (drafting rounds commit ``gains``). Returns how many rounds
    drafted."""
    drafted_rounds = 0
    for _ in range(rounds):
        run.begin(BATCH, range(4))
        drafts = [run.ask(0, 2, row=row) for row in range(4)]
        drafted = 2 if any(drafts) else 0
        drafted_rounds += drafted > 0
        ns = [gains[row] - 1 if drafted else 0 for row in range(4)]
        run.end(*(outcome(drafted, ns[row], None, 0.2 * drafted, 1.0, BATCH, row) for row in range(4)))
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
    assert first >= LEAST_DRAFTED and gated.controller.gates[4].shut
    assert later <= 20
    for ungated in (_started(4, gate=False), _started(1)):
        _first_drafts(ungated, 40, [3, 3, 3, 1])
        assert _first_drafts(ungated, 200, [3, 3, 3, 1]) >= 150


def test_a_static_batch_whose_drafts_advance_its_call_drafts_on():
    """Every row gains 2 or 3 tokens a drafting round: the call advances 2 tokens per 1.4 s
    against 1 per second plain, and after the plain rounds that measure that, drafting goes on."""
    gated = _started(4)
    _first_drafts(gated, 40, [3, 2, 3, 2])
    assert not gated.controller.gates[4].shut and gated.controller.gates[4].plain.rounds >= LEAST_PLAIN
    assert _first_drafts(gated, 200, [3, 2, 3, 2]) >= 150


def test_what_the_gate_measured_shrinks_at_each_start_until_it_measures_again():
    """A gate shut by one workload opens again after some generations, as the posterior forgets:
    each start shrinks its evidence by ``decay``; below the rounds it needs, it measures anew."""
    run = _started(4)
    _first_drafts(run, 40, [3, 3, 3, 1])
    ctrl, gate = run.controller, run.controller.gates[4]
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
    request_scoped.controller.start(Request(4, 64, 8, SamplingParams(), BATCH, batch_size=4))
    gate = request_scoped.controller.gates[4]
    assert gate.drafted.rounds == gate.plain.rounds == 0


def test_a_round_the_gate_keeps_plain_costs_its_other_rows_no_draws():
    """Once the gate has shut, the first row asked decides a plain round for the batch: the rows
    after it refuse without drawing from the controller's stream (at B = 64 their draws cost
    more than a millisecond a round on the host). A round the gate lets probe asks every row."""
    run = _started(4)
    _first_drafts(run, 40, [3, 3, 3, 1])
    assert run.controller.gates[4].shut
    plain = probed = 0
    for _ in range(60):
        run.begin(BATCH, range(4))
        first = run.ask(0, 2, row=0)
        state = run.state.rng.getstate()
        rest = [run.ask(0, 2, row=row) for row in (1, 2, 3)]
        if run.state.lockstep.plain:
            assert not first and rest == [False, False, False] and run.state.rng.getstate() == state
            plain += 1
        else:
            probed += 1
        run.end(*(RoundOutcome(0, 0, 0, (1,), 0.0, 1.0, costs=BATCH, row=row) for row in range(4)))
    assert plain >= 50 and plain + probed == 60
