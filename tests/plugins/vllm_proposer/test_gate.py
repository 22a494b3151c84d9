"""The proposer's gate: drafting steps must beat plain ones, measured, or drafting stops."""

from __future__ import annotations

from eesd_vllm.gate import DraftGate


def scored(gate: DraftGate, steps: int, tokens: int, seconds: float, size: int = 4) -> None:
    for _ in range(steps):
        gate.score(size, tokens, 4, seconds, plain_step=0.3)


def test_the_gate_stays_open_until_drafting_steps_are_measured_slower() -> None:
    gate = DraftGate(min_steps=12)
    scored(gate, 11, tokens=4, seconds=0.375)  # slower than plain (4 tokens in 0.3 s)
    assert gate.open(4)  # too few steps to judge a gain of 0.8
    scored(gate, 1, tokens=4, seconds=0.375)
    assert abs(gate.gain(4) - 0.8) < 1e-9
    assert not gate.open(4)
    assert gate.open(1)  # another batch size is judged on its own


def test_faster_drafting_steps_keep_it_open() -> None:
    gate = DraftGate()
    scored(gate, 40, tokens=7, seconds=0.45)  # 7 tokens in 0.45 s against 4 in 0.3 s
    assert gate.gain(4) > 1 and all(gate.open(4) for _ in range(100))
    assert gate.closed_steps == 0


def test_a_closed_gate_probes_ever_more_rarely_and_reopens_on_a_good_probe() -> None:
    gate = DraftGate(min_steps=4, probe_every=2)
    scored(gate, 4, tokens=4, seconds=0.4)
    opened = [step for step in range(1, 200) if gate.open(4)]
    assert opened == [8, 16, 32, 64, 128]  # closed steps at which it probed: from 2 x batch size
    assert gate.probed_steps == 5 and gate.closed_steps == 199 - 5
    scored(gate, 1, tokens=5, seconds=0.4)  # a probe that paid, not enough to bring the gain to 1
    assert gate.gain(4) < 1 and not gate.open(4)
    scored(gate, 3, tokens=12, seconds=0.4)  # probes that paid well
    assert gate.gain(4) > 1 and gate.open(4)


def test_noisy_steps_near_break_even_do_not_close_it() -> None:
    """Where drafting need only show no loss (below ``proof_from`` requests): at one request, steps
    committing one token or three, a gain a little below 1 on average but within a standard error
    of it, keep the gate open; the same gain in steady steps closes it."""
    noisy = DraftGate(proof_from=2)
    for step in range(12):
        tokens = 1 if step % 3 else 3  # 5 tokens in 3 steps of 0.52 s, plain 0.3 s a token
        noisy.score(1, tokens, 1, 0.52, plain_step=0.3)
    assert noisy.gain(1) < 1 and noisy.open(1)
    steady = DraftGate(proof_from=2)
    for _ in range(12):
        steady.score(1, 1, 1, 0.33, plain_step=0.3)
    assert steady.gain(1) < 1 and not steady.open(1)


def test_a_clear_loss_closes_it_however_spread_the_steps() -> None:
    gate = DraftGate(floor=0.9)
    for step in range(12):  # 16 tokens a step, some steps dear (a request catching up on its prompt)
        gate.score(16, 16, 16, 0.9 if step % 4 == 0 else 0.31, plain_step=0.3)
    assert gate.gain(16) < 0.9 and not gate.open(16)


def test_a_heavy_loss_closes_it_after_a_few_steps() -> None:
    gate = DraftGate(min_steps=12, quick_steps=3, quick_floor=0.75)
    scored(gate, 2, tokens=5, seconds=0.9, size=16)  # requests catching up on their prompts
    assert gate.open(16)
    scored(gate, 1, tokens=5, seconds=0.9, size=16)
    assert gate.gain(16) < 0.75 and not gate.open(16)
    early = DraftGate(min_steps=12, quick_steps=3, quick_floor=0.75)
    scored(early, 3, tokens=4, seconds=0.36)  # a controller's first, noisy steps: 0.83
    assert early.open(4)


def test_no_drafting_before_a_plain_step_was_measured() -> None:
    gate = DraftGate()
    assert not gate.open(16, plain_known=False) and gate.open(16, plain_known=True)


def test_steps_without_a_plain_time_are_not_scored() -> None:
    gate = DraftGate(min_steps=1)
    gate.score(4, 4, 4, 0.5, plain_step=None)
    assert gate.gain(4) is None and gate.open(4)


def test_from_two_requests_drafting_must_show_a_gain() -> None:
    """Break-even drafting steps (gains of 0.9 and 1.1 in turn) close the gate at four requests,
    where drafting must be shown to pay, and leave it open at one, where it need only not lose;
    drafting that pays by more than its spread keeps it open at four."""

    def alternate(gate: DraftGate, size: int, steps: int, low: float, high: float) -> None:
        for step in range(steps):
            gain = low if step % 2 else high
            gate.score(size, size, size, 0.3 / gain, plain_step=0.3)

    even = DraftGate(min_steps=12, proof_from=2)
    alternate(even, 4, 11, 0.9, 1.1)
    assert even.open(4)  # too few steps to judge
    alternate(even, 4, 1, 0.9, 1.1)
    assert abs(even.gain(4) - 1.0) < 0.02 and not even.open(4)
    alone = DraftGate(min_steps=12, proof_from=2)
    alternate(alone, 1, 12, 0.9, 1.1)
    assert alone.open(1)
    paying = DraftGate(min_steps=12, proof_from=2)
    alternate(paying, 4, 40, 1.1, 1.3)
    assert paying.open(4) and paying.closed_steps == 0
    lenient = DraftGate(min_steps=12, proof_from=8)
    alternate(lenient, 4, 12, 0.9, 1.1)
    assert lenient.open(4)


def test_by_default_one_request_must_show_a_gain_too() -> None:
    """At one request, break-even drafting (SmolLM2 in vLLM's CPU build) closes the gate once it
    has been judged; drafting that pays (the 1.5B's code prompts, a gain of about 1.4 from steps
    committing one token or several) keeps it open."""
    even = DraftGate()
    for step in range(12):
        even.score(1, 1, 1, 0.3 / (0.9 if step % 2 else 1.1), plain_step=0.3)
    assert abs(even.gain(1) - 1.0) < 0.02 and not even.open(1)
    paying = DraftGate()
    for step in range(60):
        tokens = (1, 2, 1, 3, 1)[step % 5]  # 8 tokens in 5 steps of 0.4 s: plain 0.3 s a token
        paying.score(1, tokens, 1, 0.4, plain_step=0.3)
    assert paying.gain(1) > 1.1 and paying.open(1) and paying.closed_steps == 0
