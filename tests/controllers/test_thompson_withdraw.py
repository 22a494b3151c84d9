"""Taking drafts back: the engine asks ``keep`` before sampling, the Thompson controller withdraws
doubtful drafts, looks when only confident drafts pay, and learns from what it took back."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from eesd_thompson import ThompsonController, ThompsonOptions
from outcomes import Driven, outcome

from eesd_core.costs import CostTracker
from eesd_core.protocols import Confidence, Costs, DraftStep, Request, RoundOutcome, SamplingParams, Withdrawn
from eesd_core.testing.controllers import ErraticController
from eesd_core.testing.kit import TOY, Setup, installed
from eesd_core.testing.toy import ToyModel

# a plain step 0.1 s; a draft step 0.03 s, of which 0.02 s is the last input's layers [0, N), which
# a plain step pays too: a peek costs 0.01 s; a second verified position 0.03 s
COSTS = Costs(draft_step=0.03, propose_base=0.02, verify=lambda m: 0.08 + 0.03 * (m > 1))


def started(withdraws=True, costs=COSTS, max_draft=8, **options):
    run = Driven(
        ThompsonController(ThompsonOptions(**options)),
        Request(4, 64, max_draft, SamplingParams(), costs, withdraws=withdraws),
    )
    run.controller.kinds_seen.update({0, 1})  # costs measured
    return run


def teach(run, rounds, confident_share, confident_accepts=1.0, doubtful_accepts=0.0):
    """Rounds of one draft: a share of them confident (top-1 0.95), the rest doubtful (0.1)."""
    for i in range(rounds):
        confident = (i % 100) < 100 * confident_share
        conf = 0.95 if confident else 0.1
        rate = confident_accepts if confident else doubtful_accepts
        n = int((i * 0.618) % 1 < rate)
        run.learn(outcome(1, n, (conf,), 0.03, 0.11, COSTS))


def ask_round(run, conf):
    """One round's decisions as the engine asks them, not reported (what the controller learnt
    stays as taught): (drafted a first token?, kept it?)."""
    run.begin(COSTS)
    if not run.ask(0, 8):
        return False, False
    return True, run.keep(0, 8, conf)


def test_a_doubtful_draft_is_taken_back_and_a_confident_one_kept():
    run = started()
    teach(run, 60, confident_share=0.5)
    kept = {conf: 0 for conf in (0.1, 0.95)}
    for _ in range(200):
        for conf in kept:
            drafted, keep = ask_round(run, conf)
            kept[conf] += keep
    assert kept[0.1] <= 5
    assert kept[0.95] >= 150


def test_it_looks_when_only_confident_drafts_pay():
    """Drafts are accepted 30% of the time, below what one draft needs to pay (0.41 here); but
    the 30% that are confident are always right, and seeing one costs a tenth of a plain step."""
    looks = {}
    for withdraw in (True, False):
        run = started(withdraw=withdraw)
        teach(run, 100, confident_share=0.3)
        looks[withdraw] = sum(ask_round(run, 0.1)[0] for _ in range(200))
    assert looks[True] >= 150
    assert looks[False] <= 30


def test_no_look_when_the_peek_costs_as_much_as_it_could_gain():
    dear = Costs(draft_step=0.1, propose_base=0.0, verify=lambda m: 0.1 + 0.03 * (m > 1))
    run = started(costs=dear)
    teach(run, 100, confident_share=0.3)
    drafted = 0
    for _ in range(200):
        run.begin(dear)
        drafted += run.ask(0, 8)
    assert drafted <= 30


def test_in_a_batch_a_row_asked_after_refusals_looks_only_for_more():
    """A look is a draft step for every row of a batch. Alone, a row looks (a third of its first
    drafts are confident and always right, which repays the step); as the fourth row of a batch
    whose three other rows refused the step (at the end of their budget), the same row does not:
    the step would spend four rows' time for one row's tokens."""
    batched = replace(COSTS, batch_size=4)
    solo, batch = started(seed=3), started(seed=3)
    batch.controller.kinds[4] = {0, 1}  # as if the engine had measured the batch's rounds too
    for run in (solo, batch):
        teach(run, 100, confident_share=0.3)
    looks = {"alone": 0, "fourth": 0, "first": 0}
    for _ in range(200):
        solo.begin(COSTS)
        looks["alone"] += solo.ask(0, 8)
        batch.begin(batched, range(4))
        for row in range(3):
            assert not batch.ask(0, 0, row=row)
        looks["fourth"] += batch.ask(0, 8, row=3)
    for _ in range(200):  # the first row asked judges for every row, as a row alone does
        batch.begin(batched, range(4))
        looks["first"] += batch.ask(0, 8, row=0)
        for row in (1, 2, 3):
            batch.ask(0, 8, row=row)
    assert looks["alone"] >= 150 and looks["first"] >= 150
    assert looks["fourth"] <= 10, looks


def test_without_the_engine_s_leave_it_keeps_everything():
    run = started(withdraws=False)
    teach(run, 60, confident_share=0.5)
    run.begin(COSTS)
    assert run.ask(0, 8)
    assert all(run.keep(0, 8, 0.1) for _ in range(50))


def test_a_withdrawn_draft_teaches_its_bucket_and_the_posterior():
    run = started()
    ctrl = run.controller
    cell = ctrl.buckets.cells[ctrl.buckets.index(0.95)]
    before = (cell.alpha, cell.beta, ctrl.posterior.alpha, ctrl.posterior.beta)
    judged = Withdrawn(Confidence(None, 0.95, 0.05), acceptance=0.75)
    run.learn(RoundOutcome(0, 0, 0, (1,), 0.03, 0.08, costs=COSTS, withdrawn=judged))
    assert (cell.alpha, cell.beta) == pytest.approx((before[0] + 0.75, before[1] + 0.25))
    assert (ctrl.posterior.alpha, ctrl.posterior.beta) == pytest.approx((before[2] + 0.75, before[3] + 0.25))
    # after a rejection the pass never reached the withdrawn draft's position: nothing learnt of it
    unjudged = Withdrawn(Confidence(None, 0.95, 0.05), acceptance=None)
    run.learn(outcome(1, 0, (Confidence(0.5, 0.5, 0.7),), 0.06, 0.11, COSTS, withdrawn=unjudged))
    assert (cell.alpha, cell.beta) == pytest.approx((before[0] + 0.75, before[1] + 0.25))


def test_the_cost_tracker_measures_the_peek():
    tracker = CostTracker(4)
    tracker.observe(0, 0.02, 0.08)
    tracker.observe(1, 0.05, 0.11)
    assert tracker.snapshot().peek == pytest.approx(0.01)  # modelled: draft step 0.03 - base 0.02
    tracker.observe(0, 0.035, 0.08, withdrawn=True)  # a look: the base and a peek of 0.015
    assert tracker.snapshot().peek == pytest.approx(0.015)
    assert tracker.snapshot().propose_base == pytest.approx(0.02)


# -- the engine -------------------------------------------------------------------------------------


def _toy(seed=0, vocab=4):
    torch.manual_seed(seed)
    target = torch.rand(vocab + 1, vocab) + 0.05
    return ToyModel(target, target + 0.3 * torch.rand(vocab + 1, vocab), window=1)  # a close draft


@dataclass
class Recorder(ErraticController):
    second: bool = True  # False: take every second draft back

    def __post_init__(self) -> None:
        super().__post_init__()
        self.requests: list[Request] = []
        self.asked: list[DraftStep] = []

    def start(self, request: Request) -> Any:
        self.requests.append(request)
        return super().start(request)

    def keep(self, state: Any, step: DraftStep) -> bool:
        self.asked.append(step)
        return super().keep(state, step) and (self.second or step.index < 2)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_what_a_withdrawn_draft_would_have_scored_is_exact(temperature):
    """Every round drafts two tokens and takes the second back; its acceptance chance must be
    sum_x min(p(x), q(x)) of the toy tables at its position, when the first was accepted."""
    model = _toy()
    ctrl = Recorder(schedule=(True,), keeps=(True,), second=False)
    setup = Setup(model, drafter=TOY, controller=lambda: ctrl, max_draft_tokens=3)
    sampling = SamplingParams(temperature)
    with installed(setup.subjects()):
        dec = setup.build()
        prompt = [1, 2]
        result = dec.generate(torch.tensor([prompt]), max_new_tokens=12, temperature=temperature, seed=3)
    tokens = result.sequences[0].tolist()
    judged = 0
    end = len(prompt) + 12 - 3
    capped = [o for o in ctrl.updates if o.withdrawn is None]  # rounds the engine allowed one draft
    assert all(o.position >= end for o in capped)
    for o in ctrl.updates:
        if o.withdrawn is None:
            continue
        assert o.drafted == 1
        history = tokens[: o.position + 1] + [tokens[o.position + 1]]  # pending token, then d_1
        if o.accepted < o.drafted:
            assert o.withdrawn.acceptance is None
            continue
        logits = model.logits(history, draft=True)
        p = model.next_probs(history, sampling)
        if temperature:
            q = torch.softmax(logits / temperature, -1)
            expected = float(torch.minimum(p, q.to(p.dtype)).sum())
        else:
            q = torch.softmax(logits.float(), -1)  # the confidence greedy drafts report
            expected = float(p[q.argmax()])
        assert o.withdrawn.acceptance == pytest.approx(expected)
        assert o.withdrawn.confidence.top1 == pytest.approx(float(q.max()))
        judged += 1
    assert judged >= 2
    assert result.stats.withdrawn == len(ctrl.updates) - len(capped)
    assert all(step.token is None and step.confidence.prob is None for step in ctrl.asked)
    assert ctrl.requests[0].withdraws


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_row_of_a_batch_judges_its_withdrawn_draft_exactly(temperature):
    """The same in a batch: each row drafts two tokens and takes the second back, judged by that
    row's own p at its position."""
    model = _toy(1)
    ctrl = Recorder(schedule=(True,), keeps=(True,), second=False)
    setup = Setup(model, drafter=TOY, controller=lambda: ctrl, max_draft_tokens=3)
    sampling = SamplingParams(temperature)
    prompts = [[1, 2], [3, 1, 0]]
    with installed(setup.subjects()):
        dec = setup.build()
        result = dec.generate(prompts, max_new_tokens=10, temperature=temperature, seed=5, eos_token_id=[])
    assert ctrl.requests[0].withdraws and ctrl.requests[0].batch_size == 2
    judged = 0
    for o in ctrl.updates:
        if o.withdrawn is None:
            continue
        tokens = result.sequences[o.row].tolist()
        history = tokens[: o.position + 2]  # pending token, then d_1
        if o.accepted < o.drafted:
            assert o.withdrawn.acceptance is None
            continue
        p = model.next_probs(history, sampling)
        q = torch.softmax(model.logits(history, draft=True) / (temperature or 1.0), -1)
        expected = float(torch.minimum(p, q.to(p.dtype)).sum()) if temperature else float(p[q.argmax()])
        assert o.withdrawn.acceptance == pytest.approx(expected)
        judged += 1
    assert judged >= 4 and {o.row for o in ctrl.updates if o.withdrawn is not None} == {0, 1}
    assert all(step.token is None and step.confidence.prob is None for step in ctrl.asked)


def simulate_drafts(run, tracker, rounds):
    """Rounds of at most one draft, each confident (top-1 0.95) and right, timed as ``COSTS``
    says, through a real cost tracker: the indexes of the rounds that drafted, and of those that
    kept their draft."""
    drafted, kept = [], []
    for i in range(rounds):
        costs = tracker.snapshot()
        run.begin(costs)
        if not run.ask(0, 1):
            tracker.observe(0, 0.02, 0.08)
            run.end(outcome(0, 0, (), 0.02, 0.08, costs))
            continue
        drafted.append(i)
        if run.keep(0, 1, Confidence(0.95, 0.95, 0.05)):
            kept.append(i)
            tracker.observe(1, 0.05, 0.11)
            run.end(outcome(1, 1, (Confidence(0.95, 0.95, 0.05),), 0.05, 0.11, costs))
        else:
            tracker.observe(0, 0.03, 0.08, withdrawn=True)  # the base and the peek
            look = Withdrawn(Confidence(None, 0.95, 0.05), acceptance=1.0)
            run.end(RoundOutcome(0, 0, 0, (1,), 0.03, 0.08, costs=costs, withdrawn=look))
    return drafted, kept


@pytest.mark.parametrize("refresh", [8, None])
def test_a_slow_first_measurement_of_a_verified_draft_is_measured_again(refresh):
    """Confident drafts, always right, repay their verification (0.03 s for a token that saves a
    0.1 s step); but a first round with one draft that happened to run slowly (0.3 s of
    verification) says keeping one costs 0.2 s more than a plain step. Rounds turn plain, and the
    drafts that posterior draws still make are taken back, which never measures that cost again.
    After ``refresh`` rounds without a verified draft, the next draft is kept anyway: its faster
    measurement replaces the slow figure, and drafts are kept from then on. Without it the slow
    figure stands for good."""
    tracker = CostTracker(1)
    tracker.observe(1, 0.05, 0.30)  # the slow first round of one draft
    tracker.observe(0, 0.02, 0.08)
    run = started(costs=tracker.snapshot(), max_draft=1, refresh=refresh)
    teach(run, 40, confident_share=1.0)  # the buckets know that confident drafts are right
    drafted, kept = simulate_drafts(run, tracker, 120)
    if refresh is None:  # nothing is measured again: a lock-out's probes wait for ``refresh`` too
        assert kept == []
        assert tracker.verify[2] == pytest.approx(0.30)
    else:
        assert drafted and kept[0] == next(i for i in drafted if i >= refresh)
        assert tracker.verify[2] == pytest.approx(0.11)
        assert [i for i in drafted if i >= kept[0]] == kept  # nothing taken back any more
        assert len(kept) >= 0.85 * (120 - kept[0])  # plain only to measure plain steps (refresh)
