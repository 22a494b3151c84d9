"""Batched decoding: every row equals its own decoding alone, whatever the other rows do.

Tiny random float64 models of three families, ragged prompts, an EOS that stops some rows in the
middle of a round, every drafter kind (plain, early exit with no head, an exit layer, a top-input
exit layer; prompt lookup) and every registered controller. The exact joint distribution of the
rows is checked on toy models by the kit (``check_lossless_batch``, the contract classes).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import save_head
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.models import find_adapter
from eesd_core.registry import get_manager

LENGTHS = (5, 1, 9, 3, 12)
NEW = 24


def _prompts(seed: int = 0, vocab: int = 97) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in LENGTHS]


def _solo(model, prompt: list[int], eos: int | None = None, new: int = NEW) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def _eos_for(model, prompts: list[list[int]]) -> int:
    """A token greedy decoding of row 0 emits a few tokens in, so that rows stop at different times."""
    row = _solo(model, prompts[0])
    return row[min(6, len(row) - 1)]


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(family):
    return make_tiny(family, 2, layers=4)


@pytest.fixture(scope="module")
def heads(model, tmp_path_factory) -> dict[str, str]:
    adapter = find_adapter(model)
    folder = tmp_path_factory.mktemp("heads")
    # exit heads at layer 3 of 4 start as copies of the last layer, so their drafts are often
    # right; small noise (and, for the top-input head, weak top weights) makes some wrong
    torch.manual_seed(3)
    plain = ExitHead(adapter, 3).to(torch.float64)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.02 * torch.randn_like(p))
    top = ExitHead(adapter, 3, top_input=True).to(torch.float64)
    with torch.no_grad():
        for p in top.parameters():
            p.add_(0.01 * torch.randn_like(p))
        top.fuse.weight[:, adapter.hidden_size :].normal_(0, 0.02)
    return {
        "exit": str(save_head(plain, adapter, folder / "exit.safetensors", dtype=torch.float64)),
        "top": str(save_head(top, adapter, folder / "top.safetensors", dtype=torch.float64)),
    }


def _drafters(heads: dict[str, str]) -> dict[str, dict]:
    return {
        "plain": dict(drafter=None),
        "untrained": dict(drafter="early_exit", drafter_options={"exit_layer": 1}),
        "exit": dict(drafter="early_exit", drafter_options={"head": heads["exit"]}),
        "top": dict(drafter="early_exit", drafter_options={"head": heads["top"]}),
        "lookup": dict(drafter="prompt_lookup"),
    }


CONTROLLERS = sorted(get_manager().registry("controller").names())


def observe(dec: SpeculativeDecoder, record) -> None:  # noqa: ANN001
    """Hand every row's outcome of every round of ``dec``'s calls to ``record``."""
    parts = dec.parts
    dec.parts = lambda: replace(parts(), observe=record)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_every_row_equals_its_greedy_decoding_alone(model, heads, controller: str) -> None:
    prompts = _prompts()
    eos = _eos_for(model, prompts)
    expected = [_solo(model, p, eos) for p in prompts]
    assert len({len(e) for e in expected}) > 1, "the EOS should stop rows at different lengths"
    for name, options in _drafters(heads).items():
        dec = SpeculativeDecoder(model, controller=controller, max_draft_tokens=4, **options)
        out = dec.generate(prompts, max_new_tokens=NEW, eos_token_id=[eos])
        got = [row[len(p) :].tolist() for row, p in zip(out.sequences, prompts, strict=True)]
        assert got == expected, (name, controller)
        assert [s.new_tokens for s in out.stats.rows] == [len(e) for e in expected]
        assert out.stats.new_tokens == sum(len(e) for e in expected)


@pytest.mark.parametrize("name", ["plain", "exit", "top"])
def test_a_dense_adapter_prefills_ragged_prompts_in_one_pass(model, heads, name, monkeypatch) -> None:
    """Where padding is computed (``skip_padding`` off, the default on GPUs: each group of rows
    would cost a pass of kernel launches), the target's prefill runs every row over every slot in
    one pass, as transformers does, and so do the exit layers when they catch up; every row still
    equals its greedy decoding alone. Skipping padding, ragged prompts go in groups."""
    import eesd_early_exit.drafter as exit_batch

    import eesd_core.round as core_batch

    grouped: list[int] = []
    for module in (core_batch, exit_batch):
        packed = module.packed_groups
        monkeypatch.setattr(
            module, "packed_groups", lambda v, packed=packed, **kw: grouped.append(1) or packed(v, **kw)
        )
    prompts = _prompts()
    eos = _eos_for(model, prompts)
    expected = [_solo(model, p, eos) for p in prompts]
    for skip in (False, True):
        grouped.clear()
        options = _drafters(heads)[name] | {"adapter_options": {"skip_padding": skip}}
        dec = SpeculativeDecoder(model, controller="fixed", controller_options={"k": 2}, **options)
        embed, passes = dec.adapter.embed, []
        dec.adapter.embed = lambda t, embed=embed, passes=passes: passes.append(t.shape) or embed(t)
        generation = dec.stream(prompts, max_new_tokens=NEW, eos_token_id=[eos])
        next(generation)
        assert (len(passes) == 1) is not skip, (name, skip, passes)  # the prefill's passes
        rest = list(generation)
        assert rest and bool(grouped) is skip, (name, skip)
        got = [row[len(p) :] for row, p in zip(generation.sequences, prompts, strict=True)]
        assert got == expected, (name, skip)


def test_drafts_equal_the_solo_drafts(model, heads) -> None:
    """With a fixed k, each row's rounds in the batch are its rounds alone: same drafts, same q."""
    prompts = _prompts(1)
    for name in ("untrained", "exit", "top"):
        accepted = 0
        options = _drafters(heads)[name]
        solo = []
        for prompt in prompts:
            dec = SpeculativeDecoder(model, controller="fixed", controller_options={"k": 3}, **options)
            rounds: list = []
            observe(dec, rounds.append)
            dec.generate(prompt, max_new_tokens=NEW, eos_token_id=[])
            solo.append(rounds)
        dec = SpeculativeDecoder(model, controller="fixed", controller_options={"k": 3}, **options)
        batch: dict[int, list] = {}

        def record(outcome, batch=batch) -> None:
            batch.setdefault(outcome.row, []).append(outcome)

        observe(dec, record)
        out = dec.generate(prompts, max_new_tokens=NEW, eos_token_id=[])
        for row, rounds in enumerate(solo):
            assert [(o.tokens, o.drafted, o.accepted) for o in batch[row]] == [
                (o.tokens, o.drafted, o.accepted) for o in rounds
            ], (name, row)
            for mine, alone in zip(batch[row], rounds, strict=True):
                assert _probs(mine) == pytest.approx(_probs(alone), abs=1e-9), (name, row)
            accepted += sum(o.accepted for o in rounds)
        assert out.stats.accepted == accepted
        assert accepted > 0 or name == "untrained", name
        assert accepted < out.stats.drafted, name


def test_padded_tensor_batch(model) -> None:
    """transformers' conventions: left padding in, ``[B, T + n]`` out, stopped rows padded."""
    prompts = _prompts(2)[:3]
    eos = _eos_for(model, prompts)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 2}, controller="fixed"
    )
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[eos], pad_token_id=1)
    expected = [_solo(model, p, eos) for p in prompts]
    new = max(len(e) for e in expected)
    assert out.sequences.shape == (len(prompts), width + new)
    assert torch.equal(out.sequences[:, :width], ids)
    for row, tokens in enumerate(expected):
        assert out.sequences[row, width:].tolist() == tokens + [1] * (new - len(tokens))
    hf = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=1
    )
    assert torch.equal(out.sequences, hf[:, : out.sequences.shape[1]])


def test_sampled_rows_do_not_depend_on_the_batch(model, heads) -> None:
    """Row b draws from its own stream: the same as alone with that seed, whoever shares the batch."""
    prompts = _prompts(3)
    for options in (dict(drafter=None), _drafters(heads)["exit"]):

        def make(options=options) -> SpeculativeDecoder:
            return SpeculativeDecoder(model, controller="fixed", controller_options={"k": 2}, **options)

        seeds = [11, 12, 13, 14, 15]
        out = make().generate(prompts, max_new_tokens=12, temperature=0.9, seed=seeds, eos_token_id=[])
        alone = [
            make().generate(p, max_new_tokens=12, temperature=0.9, seed=s, eos_token_id=[])
            for p, s in zip(prompts, seeds, strict=True)
        ]
        assert [r.tolist() for r in out.sequences] == [a.sequences[0].tolist() for a in alone]
        pair = make().generate(
            [prompts[3], prompts[1]], max_new_tokens=12, temperature=0.9, seed=[14, 12], eos_token_id=[]
        )
        assert pair.sequences[0].tolist() == out.sequences[3].tolist()
        default = make().generate(prompts[:2], max_new_tokens=12, temperature=0.9, seed=11, eos_token_id=[])
        assert [r.tolist() for r in default.sequences] == [r.tolist() for r in out.sequences[:2]]


def test_stream_and_stats(model) -> None:
    prompts = _prompts(4)
    eos = _eos_for(model, prompts)
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 1}, controller="fixed"
    )
    generation = dec.stream(prompts, max_new_tokens=NEW, eos_token_id=[eos])
    rounds = list(generation)
    assert all(len(r) == len(prompts) for r in rounds)
    joined = [sum((r[row] for r in rounds), []) for row in range(len(prompts))]
    assert joined == [_solo(model, p, eos) for p in prompts]
    stats = generation.stats
    assert stats.rounds == len(rounds) and stats.relayouts >= 1  # rows that stopped left the batch
    assert all(0 < s.total_time <= stats.total_time for s in stats.rows)
    assert stats.to_dict()["new_tokens"] == sum(map(len, joined))


def test_controllers_see_rows_and_the_batch_size(model) -> None:
    from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart

    seen: dict[str, list] = {"requests": [], "rows": set(), "outcomes": set()}

    class Recorder:
        def start(self, request: Request) -> None:
            seen["requests"].append(request.batch_size)

        def begin_round(self, state: None, round: RoundStart) -> None:
            seen.setdefault("rounds", []).append(round.rows)

        def should_continue(self, state: None, step: DraftStep) -> bool:
            seen["rows"].add(step.row)
            return step.index < 2

        def update(self, state: None, outcomes: list[RoundOutcome]) -> None:
            seen.setdefault("updates", []).append(tuple(o.row for o in outcomes))
            seen["outcomes"].update(o.row for o in outcomes)

    from eesd_core.testing.kit import Setup, installed

    setup = Setup(model, drafter="early_exit", drafter_options={"exit_layer": 1}, controller=Recorder)
    with installed(setup.subjects()):
        setup.build().generate(_prompts(5)[:3], max_new_tokens=6, eos_token_id=[])
    rounds, updates = seen.pop("rounds"), seen.pop("updates")
    assert seen == {"requests": [3], "rows": {0, 1, 2}, "outcomes": {0, 1, 2}}
    assert rounds[0] == (0, 1, 2) and updates == rounds  # each round's rows, told at its start and end


def test_a_batch_size_measures_its_own_draft_rounds_after_solo_ones(model) -> None:
    """The Thompson controller, having learnt the solo costs, still tries drafts at a batch size
    it has not met, so that batch size's costs get measured (else it decodes plainly for good)."""
    dec = SpeculativeDecoder(
        model, drafter="early_exit", drafter_options={"exit_layer": 1}, controller="thompson"
    )
    prompts = _prompts(6)
    dec.generate(prompts[0], max_new_tokens=8, eos_token_id=[])
    assert dec.costs(1).propose[1] is not None and dec.costs(1).propose[0] is not None
    dec.generate(prompts[:4], max_new_tokens=8, eos_token_id=[])
    batch = dec.costs(4)
    assert batch.propose[0] is not None and any(t is not None for t in batch.propose[1:])


def test_the_gaps_are_squeezed_out_when_the_cache_would_overflow(model, heads) -> None:
    """Rows accepting different numbers of drafts leave gaps; the cache is realigned, not grown."""
    prompts = _prompts(6)
    dec = SpeculativeDecoder(
        model, controller="fixed", controller_options={"k": 4}, **_drafters(heads)["exit"]
    )
    generation = dec.stream(prompts, max_new_tokens=80, eos_token_id=[])
    capacity = generation.layout.capacity
    buffers = None
    for _ in generation:
        keys = generation.cache.keys[0]
        buffers = keys.shape[2] if keys is not None else buffers
        assert buffers is None or buffers == capacity
    assert generation.stats.relayouts >= 1
    assert [row[len(p) :] for row, p in zip(generation.sequences, prompts, strict=True)] == [
        _solo(model, p, new=80) for p in prompts
    ]


class TakesBack:
    """Drafts up to three tokens and takes back a draft whose q's top-1 falls in one of three
    bins: a keep rule of q alone, the same for a row alone and in a batch."""

    withdraws = True

    def __init__(self) -> None:
        self.requests: list = []

    def start(self, request) -> None:
        self.requests.append(request)

    def begin_round(self, state, round) -> None:
        pass

    def should_continue(self, state, step) -> bool:
        return step.index < 3

    def keep(self, state, step) -> bool:
        assert step.token is None and step.confidence.prob is None
        return int(step.confidence.top1 * 1e6) % 3 != 0

    def update(self, state, outcomes) -> None:
        pass


@pytest.mark.parametrize("name", ["untrained", "exit", "top"])
def test_rows_that_take_drafts_back_make_their_solo_rounds(model, heads, name) -> None:
    """Drafts taken back in a batch: each row's rounds (drafts, q, what was taken back and how it
    was judged) are its rounds alone, and every row equals its greedy decoding."""
    prompts, options = _prompts(2), _drafters(heads)[name]

    def rounds_of(prompt_or_batch) -> dict[int, list]:
        dec = SpeculativeDecoder(model, max_draft_tokens=3, **options)
        dec.controller = TakesBack()
        seen: dict[int, list] = {}
        observe(dec, lambda outcome: seen.setdefault(outcome.row, []).append(outcome))
        out = dec.generate(prompt_or_batch, max_new_tokens=NEW, eos_token_id=[])
        assert all(request.withdraws for request in dec.controller.requests)
        return seen, out

    solo = [rounds_of(prompt)[0][0] for prompt in prompts]
    batch, out = rounds_of(prompts)
    withdrawn = 0
    for row, (prompt, rounds) in enumerate(zip(prompts, solo, strict=True)):
        assert out.sequences[row][len(prompt) :].tolist() == _solo(model, prompt, None)
        mine = batch[row]
        summary = [[(o.tokens, o.drafted, o.accepted) for o in r] for r in (mine, rounds)]
        assert summary[0] == summary[1], (name, row)
        for a, b in zip(mine, rounds, strict=True):
            assert _probs(a) == pytest.approx(_probs(b), abs=1e-9)
            assert (a.withdrawn is None) == (b.withdrawn is None)
            if a.withdrawn is not None:
                withdrawn += 1
                assert a.withdrawn.confidence.top1 == pytest.approx(b.withdrawn.confidence.top1, abs=1e-9)
                assert a.withdrawn.acceptance == b.withdrawn.acceptance
    assert withdrawn >= 3 and out.stats.accepted > 0


def test_packed_groups_skip_left_padding() -> None:
    from eesd_core.cache import packed_groups

    lengths = (12, 1, 11, 3, 2)
    valid = torch.zeros(5, 12, dtype=torch.bool)
    for row, n in enumerate(lengths):
        valid[row, 12 - n :] = True
    groups = packed_groups(valid)
    assert groups is not None
    assert sorted(r for rows, _ in groups for r in rows.tolist()) == [0, 1, 2, 3, 4]
    for rows, first in groups:  # a group starts at its longest row's first slot
        assert first == min(12 - lengths[r] for r in rows.tolist())
    area = sum(len(rows) * (12 - first) for rows, first in groups)
    assert area <= 1.25 * sum(lengths) < 5 * 12
    assert packed_groups(torch.ones(3, 8, dtype=torch.bool)) is None  # nothing to skip
    capped = packed_groups(valid, max_tokens=12)  # no group over 12 tokens but a row alone
    assert sorted(r for rows, _ in capped for r in rows.tolist()) == [0, 1, 2, 3, 4]
    assert all(len(rows) * (12 - first) <= 12 or len(rows) == 1 for rows, first in capped)
    assert len(packed_groups(torch.ones(3, 8, dtype=torch.bool), max_tokens=16)) == 2  # split rows


@pytest.mark.parametrize("name", ["exit", "top"])
def test_packed_flush_writes_what_a_padded_pass_writes(model, heads, name, monkeypatch) -> None:
    """The exit layers' first run over ragged prompts goes group by group over each group's own
    slots; the keys and values it leaves in the exit cache equal those of one pass over every
    slot, at every slot a row holds, and no slot holds garbage (the padding it skips is zeros)."""
    import eesd_early_exit.drafter as batch_module

    prompts = _prompts(2)
    caches = {}
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr(batch_module, "packed_groups", lambda valid, **_: None)
        fixed = dict(controller="fixed", controller_options={"k": 2})
        dec = SpeculativeDecoder(model, **fixed, **_drafters(heads)[name])
        generation = dec.stream(prompts, max_new_tokens=2, eos_token_id=[])
        next(generation)  # the prefill: the exit layers have run on nothing yet
        state = generation.draft_state
        assert state.exit_slots == 0 and state.deferred
        width = state.deferred[0].shape[1]
        valid = state.layout.valid[:, :width].clone()
        if packed:
            assert batch_module.packed_groups(valid) is not None
        with torch.inference_mode():
            dec.drafter._flush(state)
        assert state.exit_slots == width and state.exit_cache.lengths == [width]
        caches[packed] = (state.exit_cache.keys[0][:, :, :width], state.exit_cache.values[0][:, :, :width])
    mask = valid[:, None, :, None]
    for mine, dense in zip(caches[True], caches[False], strict=True):
        torch.testing.assert_close(mine * mask, dense * mask, rtol=0, atol=1e-12)
        assert torch.isfinite(mine).all()


@pytest.mark.parametrize("name", ["plain", "exit", "top"])
@pytest.mark.parametrize(("cap", "equal"), [(None, False), (9, False), (9, True)])
def test_packed_prefill_writes_what_a_padded_pass_writes(model, heads, name, cap, equal, monkeypatch) -> None:
    """The prefill of ragged prompts runs group by group over each group's own slots (on a CPU,
    ``cap`` tokens a pass at most): every layer's keys and values, the layer-N states handed to
    the drafter and the top states equal those of one pass over every slot, at every slot a row
    holds; what it skips is zeros."""
    import eesd_core.devices as devices
    import eesd_core.round as core_batch
    from eesd_core.cache import packed_groups

    monkeypatch.setattr(devices, "CPU_PASS_TOKENS", cap)
    prompts = [p[:4] for p in _prompts(7) if len(p) >= 4] if equal else _prompts(7)
    seen = {}
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr(core_batch, "packed_groups", lambda valid, **_: None)
        dec = SpeculativeDecoder(model, controller="fixed", **_drafters(heads)[name])
        generation = dec.stream(prompts, max_new_tokens=2, eos_token_id=[])
        first = next(generation)
        width = max(map(len, prompts))
        valid = generation.layout.spread()[0][:, :width].clone()
        if packed:
            groups = packed_groups(valid, max_tokens=cap)
            assert groups is not None and (cap is None or len(groups) > 1)
        cache = generation.cache
        tensors = [t[:, :, :width] for t in cache.keys + cache.values]
        state = generation.draft_state
        if state is not None:
            tensors.append(state.deferred[0])
            if state.tops is not None:
                tensors.append(state.tops[:, :width])
        seen[packed] = (first, tensors, valid)
    (first, mine, valid), (dense_first, dense, _) = seen[True], seen[False]
    assert first == dense_first
    for a, b in zip(mine, dense, strict=True):
        mask = valid[:, None, :, None] if a.dim() == 4 else valid[:, :, None]
        torch.testing.assert_close(a * mask, b * mask, rtol=0, atol=1e-12)
        assert not a.masked_select(~mask.expand_as(a)).any()  # skipped padding: zeros


class Switch:
    """Decodes plainly until switched on, then drafts two tokens a round."""

    on = False

    def start(self, request) -> None:
        pass

    def begin_round(self, state, round) -> None:
        pass

    def should_continue(self, state, step) -> bool:
        return self.on and step.index < 2

    def update(self, state, outcomes) -> None:
        pass


@pytest.mark.parametrize("name", ["exit", "top"])
def test_rows_leave_before_the_exit_layers_ever_ran(model, heads, name, monkeypatch) -> None:
    """Rows that stop before anyone drafted leave the batch without running the exit layers over
    the backlog (the waiting states move with the layout); the drafts made afterwards are those
    made when the backlog ran first, and every row equals its greedy decoding alone."""
    from eesd_early_exit.drafter import EarlyExitDrafter

    prompts = _prompts(8)
    eos = _eos_for(model, prompts)
    expected = [_solo(model, p, eos) for p in prompts]
    prompts = [p for p, e in zip(prompts, expected, strict=True) if len(e) >= 4]  # a few plain rounds
    expected = [e for e in expected if len(e) >= 4]
    assert len(prompts) >= 2 and len({len(e) for e in expected}) > 1

    def run() -> tuple[dict[int, list], list[list[int]]]:
        dec = SpeculativeDecoder(model, max_draft_tokens=2, **_drafters(heads)[name])
        dec.controller = switch = Switch()
        rounds: dict[int, list] = {}
        observe(dec, lambda outcome: rounds.setdefault(outcome.row, []).append(outcome))
        generation = dec.stream(prompts, max_new_tokens=NEW, eos_token_id=[eos])
        for _ in generation:
            if generation.stats.relayouts and not switch.on:
                switch.on = True
                moved = generation.draft_state.exit_slots == 0 and bool(generation.draft_state.deferred)
        assert switch.on and generation.stats.drafted > 0
        got = [row[len(p) :] for row, p in zip(generation.sequences, prompts, strict=True)]
        return rounds, got, moved

    rounds, got, moved = run()
    assert moved and got == expected
    relayout = EarlyExitDrafter.relayout

    def flushing(self, state, rows, index) -> None:
        self._flush(state)
        relayout(self, state, rows, index)

    monkeypatch.setattr(EarlyExitDrafter, "relayout", flushing)
    flushed, got, moved = run()
    assert not moved and got == expected
    for row, mine in rounds.items():
        assert [(o.drafted, o.accepted) for o in mine] == [(o.drafted, o.accepted) for o in flushed[row]]
        for a, b in zip(mine, flushed[row], strict=True):
            assert _probs(a) == pytest.approx(_probs(b), abs=1e-9), (name, row)


def _probs(outcome) -> list[float]:  # noqa: ANN001
    return [c.prob for c in outcome.confidences]
