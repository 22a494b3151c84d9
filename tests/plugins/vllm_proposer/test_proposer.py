"""The vLLM proposer against a stand-in for vLLM's scheduler, runnable without vLLM installed.

``Scheduler`` calls ``propose`` exactly as vLLM's model runner does (rows in the step's order,
the tokens each row just sampled, its length, the token table) and verifies the drafts greedily
with the target, as vLLM's rejection sampler does at temperature 0. It reorders rows every step,
finishes requests mid-round, preempts requests and brings them back recomputed, and sometimes
schedules fewer drafts than proposed. Every request's tokens must equal plain greedy decoding.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from eesd_vllm.options import OPTIONS_ENV, ProposerOptions, read_options
from eesd_vllm.proposer import EarlyExitProposer, common_prefix
from tinymodels import make_tiny

from eesd_core.errors import ConfigError, EESDError
from eesd_core.protocols import DraftStep, Request, RoundOutcome, RoundStart

VOCAB = 97


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", 5, vocab=VOCAB, layers=4, dtype=torch.float32).save_pretrained(path)
    return path


def vllm_config(path: Path, k: int = 4, max_model_len: int = 200, eager: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(
            max_model_len=max_model_len, model=str(path), dtype=torch.float32, enforce_eager=eager
        ),
    )


def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


class Scheduler:
    """What vLLM's engine does around a custom proposer, at temperature 0, in a few lines."""

    def __init__(self, model: torch.nn.Module, proposer: EarlyExitProposer, seed: int = 0) -> None:
        self.model, self.proposer = model, proposer
        self.rng = random.Random(seed)
        self.table = np.zeros((16, proposer.max_model_len), dtype=np.int32)
        self.fed: dict[int, tuple[int, list[int], torch.Tensor]] = {}
        self.tops = proposer.drafter.reads_top_states

    def target_next(self, tokens: list[int], fed_from: int | None = None, request: int = -1) -> list[int]:
        """The target's greedy token after every position of ``tokens``; ``fed_from``: the pass
        feeds positions from there (as vLLM's would), whose last-layer states a proposer with a
        top-input head is shown before ``propose``, as its hook on vLLM's model sees them."""
        seen: list[torch.Tensor] = []
        hook = self.model.model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0][0]))
        try:
            with torch.inference_mode():
                logits = self.model(torch.tensor([tokens])).logits[0]
        finally:
            hook.remove()
        if fed_from is not None:
            self.fed[request] = (fed_from, tokens[fed_from:], seen[0][fed_from:])
        return logits.argmax(-1).tolist()

    def show_pass(self, order: list[int]) -> None:
        """What the hook sees of one pass over the requests of ``order``, in that order."""
        ids, positions, states, starts = [], [], [], [0]
        for i in order:
            first, tokens, hidden = self.fed.pop(i, (0, [], None))
            ids += tokens
            positions += range(first, first + len(tokens))
            if hidden is not None:
                states.append(hidden)
            starts.append(len(ids))
        self.fed.clear()
        hidden = torch.cat(states) if states else torch.zeros(0, self.model.config.hidden_size)
        self.proposer.observe_forward(np.array(ids), np.array(positions), np.array(starts), hidden)

    def run(
        self,
        prompts: list[list[int]],
        limits: list[int],
        preempt: bool = True,
        drop_drafts: bool = True,
    ) -> list[list[int]]:
        live = {i: list(p) for i, p in enumerate(prompts)}
        new = {i: 0 for i in live}
        sampled: dict[int, list[int]] = {i: [] for i in live}
        drafts: dict[int, list[int]] = {i: [] for i in live}
        away: dict[int, int] = {}
        done: dict[int, list[int]] = {}
        while live:
            # verification of the drafts proposed last step (the first step is the prefill)
            for i, tokens in live.items():
                if i in away:
                    continue
                proposed = drafts[i]
                if drop_drafts and proposed and self.rng.random() < 0.2:
                    proposed = proposed[: self.rng.randrange(len(proposed))]  # scheduled fewer
                start = 0 if new[i] == 0 else len(tokens) - 1  # the first step is the prefill
                best = self.target_next(tokens + proposed, start, i)[len(tokens) - 1 :]
                kept = common_prefix(np.array(proposed), np.array(best[: len(proposed)]))
                emitted = best[: kept + 1][: limits[i] - new[i]]
                tokens.extend(emitted)
                new[i] += len(emitted)
                sampled[i] = emitted
            for i in [i for i in live if new[i] >= limits[i]]:
                done[i] = live.pop(i)[len(prompts[i]) :]
            for i in list(away):
                away[i] -= 1
                if away[i] == 0:  # back, recomputed: the prefill samples the next token again
                    del away[i]
                    token = self.target_next(live[i], 0, i)[-1]
                    live[i].append(token)
                    new[i] += 1
                    sampled[i] = [token]
                    if new[i] >= limits[i]:
                        done[i] = live.pop(i)[len(prompts[i]) :]
            if preempt and live and self.rng.random() < 0.15:
                victim = self.rng.choice(sorted(live))
                away.setdefault(victim, self.rng.randrange(1, 4))
            order = [i for i in live if i not in away]
            self.rng.shuffle(order)
            if not order:
                continue
            for row, i in enumerate(order):
                self.table[row, : len(live[i])] = live[i]
            lengths = np.array([len(live[i]) for i in order], dtype=np.int32)
            if self.tops:
                self.show_pass(order)
            out = self.proposer.propose([sampled[i] for i in order], lengths, self.table)
            assert len(out) == len(order)
            for i, proposal in zip(order, out, strict=True):
                assert len(proposal) <= self.proposer.max_k
                assert all(isinstance(t, int) and 0 <= t < VOCAB for t in proposal)
                drafts[i] = proposal
        return [done[i] for i in range(len(prompts))]


def prompts_of(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        body = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 12))]
        out.append(body * (1 + i % 3))  # some repetition, so that some drafts are kept
    return out


@pytest.mark.parametrize(
    "options",
    [
        dict(exit_layer=2, head=None, controller="fixed", controller_options={"k": 4}),
        dict(exit_layer=1, head=None, controller="thompson"),
        dict(exit_layer=3, head=None, controller="fixed", controller_options={"k": 2}),
    ],
    ids=["fixed4", "thompson", "fixed2"],
)
def test_requests_equal_plain_greedy_through_reorders_preemption_and_finishes(checkpoint, options) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    proposer = EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(**options))
    prompts = prompts_of(1, 6)
    limits = [7, 23, 12, 30, 1, 17]
    got = Scheduler(model, proposer, seed=3).run(prompts, limits)
    for prompt, limit, tokens in zip(prompts, limits, got, strict=True):
        assert tokens == greedy(model, prompt, limit)
    if options["controller"] == "fixed":
        assert proposer.stats["drafted"] > 0 and proposer.stats["accepted"] > 0
    assert not proposer.caches or len(proposer.caches) <= len(prompts)


@pytest.fixture(scope="module")
def plain_head(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain exit head with one exit layer, perturbed away from its initial copy of the target."""
    from eesd_early_exit.head import ExitHead
    from eesd_early_exit.headfile import save_head
    from transformers import AutoModelForCausalLM

    from eesd_core.models import find_adapter

    adapter = find_adapter(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval())
    torch.manual_seed(2)
    head = ExitHead(adapter, 2).to(torch.float64)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.02 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("heads") / "plain.safetensors"
    return save_head(head, adapter, path, dtype=torch.float64)


@pytest.fixture(scope="module")
def top_head(checkpoint, tmp_path_factory) -> Path:  # noqa: ANN001
    """A top-input head at layer 2 of the float64 target whose drafts are sometimes right."""
    from eesd_early_exit.head import ExitHead
    from eesd_early_exit.headfile import save_head
    from transformers import AutoModelForCausalLM

    from eesd_core.models import find_adapter

    adapter = find_adapter(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval())
    torch.manual_seed(4)
    head = ExitHead(adapter, 2, top_input=True).to(torch.float64)  # layer 3's copy, reading h_2
    with torch.no_grad():  # and, weakly, the top state: enough that a wrong one changes drafts
        head.fuse.weight[:, adapter.hidden_size :].normal_(0, 0.003)
    path = tmp_path_factory.mktemp("heads") / "top.safetensors"
    return save_head(head, adapter, path, dtype=torch.float64)


def _float64(checkpoint: Path) -> tuple[torch.nn.Module, SimpleNamespace]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval()
    config = vllm_config(checkpoint)
    config.model_config.dtype = torch.float64
    return model, config


def _learnt_rounds(controller) -> list[tuple[int, int]]:  # noqa: ANN001
    """(drafted, accepted) of every round ``controller`` learns from from now on."""
    rounds: list[tuple[int, int]] = []
    update = controller.update

    def spy(state, outcomes) -> None:  # noqa: ANN001
        rounds.extend((o.drafted, o.accepted) for o in outcomes)
        update(state, outcomes)

    controller.update = spy
    return rounds


@pytest.mark.parametrize("controller", ["fixed", "thompson"])
def test_a_top_input_head_drafts_from_the_states_of_vllms_passes(checkpoint, top_head, controller) -> None:  # noqa: ANN001
    """Through reorders, preemption, recomputation and drafts vLLM did not schedule, every
    request keeps the top states of its committed positions, drafts, and equals plain greedy."""
    model, config = _float64(checkpoint)
    options = {"k": 3} if controller == "fixed" else {}
    proposer = EarlyExitProposer(
        config, ProposerOptions(head=str(top_head), controller=controller, controller_options=options)
    )
    assert proposer.drafter.reads_top_states
    prompts, limits = prompts_of(6, 6), [30, 12, 41, 7, 25, 33]
    got = Scheduler(model, proposer, seed=3).run(prompts, limits)
    assert got == [greedy(model, p, n) for p, n in zip(prompts, limits, strict=True)]
    assert proposer.stats["without_top_states"] == 0
    assert 0 < proposer.stats["accepted"] < proposer.stats["drafted"]
    assert proposer.stats["joined_rounds"] > 0


def test_a_top_input_head_drafts_what_eesds_own_engine_drafts(checkpoint, top_head) -> None:  # noqa: ANN001
    """One request, every draft scheduled: the proposer's rounds (drafts made, drafts kept) are
    those of eesd's engine with the same head, which hands the drafter the target's states
    itself; a top state read at the wrong position would change them."""
    from eesd_core import SpeculativeDecoder

    model, config = _float64(checkpoint)
    prompt, limit = prompts_of(8, 1)[0], 40
    fixed = dict(controller="fixed", controller_options={"k": 3})
    proposer = EarlyExitProposer(config, ProposerOptions(head=str(top_head), guard=False, **fixed))
    rounds = _learnt_rounds(proposer.controller)
    got = Scheduler(model, proposer).run([prompt], [limit], preempt=False, drop_drafts=False)
    drafter = dict(drafter="early_exit", drafter_options={"head": str(top_head)})
    decoder = SpeculativeDecoder(model, **drafter, **fixed)
    engine = _learnt_rounds(decoder.controller)
    out = decoder.generate(prompt, max_new_tokens=limit, eos_token_id=[])
    assert got[0] == out.sequences[0, len(prompt) :].tolist()
    shared = min(len(rounds), len(engine)) - 2  # the last rounds differ: limits are counted apart
    assert shared > 5 and rounds[:shared] == engine[:shared]
    assert 0 < sum(a for _, a in rounds[:shared]) < sum(d for d, _ in rounds[:shared])


def alone(proposer: EarlyExitProposer) -> None:
    """Let every request of a step draft a round of its own, never joined."""
    proposer._draft_together = lambda group, p=proposer: [  # type: ignore[method-assign]
        p._draft(entry, tokens) for _, entry, tokens in group
    ]


@pytest.mark.parametrize("controller", ["fixed", "thompson"])
@pytest.mark.parametrize("kind", ["plain", "top"])
def test_requests_drafting_together_propose_what_they_would_alone(  # noqa: ANN001
    checkpoint, plain_head, top_head, controller, kind
) -> None:
    """The rows of a step draft in one batched pass per draft step; with a fixed k each row's
    drafts equal those of its own round, step after step (the Thompson controller weighs a batch's
    time per row, so its choices may differ there), and every request still equals plain greedy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval()
    config = vllm_config(checkpoint)
    config.model_config.dtype = torch.float64
    controller_options = {"k": 4} if controller == "fixed" else {}
    proposals = []
    for together in (True, False):
        head = plain_head if kind == "plain" else top_head
        options = ProposerOptions(
            head=str(head), controller=controller, controller_options=controller_options, guard=False
        )
        proposer = EarlyExitProposer(config, options)
        if not together:
            alone(proposer)
        calls: list[list[list[int]]] = []
        propose = proposer.propose
        proposer.propose = lambda *a, f=propose, c=calls: c.append(f(*a)) or c[-1]  # type: ignore[method-assign]
        prompts = prompts_of(4, 6)
        limits = [9, 25, 14, 30, 3, 19]
        got = Scheduler(model, proposer, seed=5).run(prompts, limits)
        assert got == [greedy(model, p, n) for p, n in zip(prompts, limits, strict=True)]
        proposals.append(calls)
        assert (proposer.stats["joined_rounds"] > 0) == together
        assert (proposer.stats["caught_together"] > 0) == together  # kept last drafts ran joined
    if controller == "fixed":
        assert proposals[0] == proposals[1]
    assert all(sum(len(d) for step in calls for d in step) > 0 for calls in proposals)


def test_a_second_batch_reuses_nothing_it_should_not(checkpoint) -> None:  # noqa: ANN001
    """Two waves through one proposer (as a server sees them), with prompts sharing prefixes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    options = ProposerOptions(exit_layer=2, head=None, controller="fixed", controller_options={"k": 3})
    proposer = EarlyExitProposer(vllm_config(checkpoint, k=3), options)
    shared = [5, 6, 7, 8, 9, 10]
    first = [shared + [11], shared + [12, 13], shared]
    second = [shared + [11, 40], shared, [5, 6, 7]]
    for wave, seed in ((first, 0), (second, 1)):
        got = Scheduler(model, proposer, seed=seed).run(wave, [15, 9, 20])
        assert got == [greedy(model, p, n) for p, n in zip(wave, [15, 9, 20], strict=True)]


def test_a_finished_request_leaves_its_cache(checkpoint) -> None:  # noqa: ANN001
    options = ProposerOptions(
        exit_layer=2, head=None, controller="fixed", controller_options={"k": 2}, guard=False
    )
    proposer = EarlyExitProposer(vllm_config(checkpoint, k=2), options)
    table = np.zeros((4, 200), dtype=np.int32)
    table[0, :5], table[1, :4] = [3, 4, 5, 6, 7], [8, 9, 10, 11]
    assert [len(d) for d in proposer.propose([[7], [11]], np.array([5, 4]), table)] == [2, 2]
    assert len(proposer.caches) == 2
    table[0, :4] = [8, 9, 10, 11]  # the first request finished; the second moved up a row
    table[0, 4] = 50
    proposer.propose([[50]], np.array([5]), table)
    assert len(proposer.caches) == 1 and list(proposer.caches[0].tokens[:5]) == [8, 9, 10, 11, 50]
    assert proposer.memory_bytes() > proposer.kept_bytes
    assert proposer.propose([[]], np.array([5]), table) == [[]]  # a prefill in progress: no drafts


def test_catching_up_on_the_round_before_is_charged_to_the_drafts(checkpoint) -> None:  # noqa: ANN001
    """The tokens a drafting request's caches lack after a round (the last draft vLLM kept) run
    because it drafts, every step (in the first draft step's pass): that time counts in the
    proposal time the controller learns from. The prompt's catching up, a pass of its own before
    the first draft, does not."""
    import time

    options = ProposerOptions(
        exit_layer=2, head=None, controller="fixed", controller_options={"k": 2}, guard=False
    )
    proposer = EarlyExitProposer(vllm_config(checkpoint, k=2), options)
    eager, folded, lag = proposer._catch_up, proposer.drafter.catch_up, 0.05

    def slow_eager(entry, tokens) -> None:  # noqa: ANN001
        if len(entry.tokens) < len(tokens) - 1:  # a pass runs
            time.sleep(lag)
        eager(entry, tokens)

    def slow_folded(state, tokens) -> None:  # noqa: ANN001
        time.sleep(lag)
        folded(state, tokens)

    proposer._catch_up = slow_eager  # type: ignore[method-assign]
    proposer.drafter.catch_up = slow_folded  # type: ignore[method-assign]
    table = np.zeros((1, 200), dtype=np.int32)
    table[0, :20] = np.arange(3, 23)
    drafts = proposer.propose([[22]], np.array([20]), table)[0]  # the prompt's 19 tokens catch up
    assert len(drafts) == 2 and proposer._previous[2] < lag
    table[0, 20:22], table[0, 22] = drafts, 60  # vLLM kept both drafts and added a token
    proposer.propose([drafts + [60]], np.array([23]), table)
    assert len(proposer.caches[0].tokens) >= 22  # the kept last draft ran through layers [0, N)
    assert proposer._previous[2] >= lag


def test_top_input_heads_need_an_eager_model_and_say_so(checkpoint, tmp_path) -> None:  # noqa: ANN001
    from eesd_early_exit.head import ExitHead
    from eesd_early_exit.headfile import save_head
    from transformers import AutoModelForCausalLM

    from eesd_core.models import find_adapter

    adapter = find_adapter(AutoModelForCausalLM.from_pretrained(checkpoint).eval())
    path = save_head(ExitHead(adapter, 2, top_input=True), adapter, tmp_path / "top.safetensors")
    with pytest.raises(ConfigError, match="enforce_eager=True"):  # a compiled model is not hooked
        EarlyExitProposer(vllm_config(checkpoint, eager=False), ProposerOptions(head=str(path)))
    eager = EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(head=str(path)))
    assert eager.drafter.reads_top_states
    plain = save_head(ExitHead(adapter, 2), adapter, tmp_path / "plain.safetensors")
    proposer = EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(head=str(plain)))
    assert proposer.drafter.shared_layers == 2 and "plain.safetensors" in proposer.describe()


def test_bad_configuration_fails_at_start(checkpoint) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="no exit-head file"):
        EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(head="/nowhere/head.safetensors"))
    with pytest.raises(ConfigError, match="out of range"):
        EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(exit_layer=4, head=None))
    with pytest.raises(EESDError, match="No controller named 'nope'"):
        EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(head=None, controller="nope"))
    with pytest.raises(ConfigError, match="cannot load"):
        EarlyExitProposer(vllm_config(checkpoint.parent / "missing"), ProposerOptions(head=None))


def test_options_travel_in_the_environment(monkeypatch) -> None:  # noqa: ANN001
    import eesd_vllm

    config = eesd_vllm.speculative_config(5, exit_layer=3, head=None, controller="fixed")
    assert config == {
        "method": "custom_class",
        "model": "eesd_vllm.EarlyExitProposer",
        "num_speculative_tokens": 5,
    }
    assert read_options() == ProposerOptions(exit_layer=3, head=None, controller="fixed")
    assert json.loads(read_options({OPTIONS_ENV: '{"exit_layer": 2}'}).model_dump_json())["exit_layer"] == 2
    assert read_options({}) == ProposerOptions()
    with pytest.raises(ConfigError, match="JSON object"):
        read_options({OPTIONS_ENV: "[1]"})
    with pytest.raises(ConfigError, match="must hold a JSON"):
        read_options({OPTIONS_ENV: "{exit"})
    with pytest.raises(ConfigError, match="exit_layr"):
        eesd_vllm.speculative_config(4, exit_layr=2)


def test_the_gate_takes_its_options_and_refuses_bad_ones(checkpoint) -> None:  # noqa: ANN001
    import inspect

    from eesd_vllm.gate import DraftGate
    from eesd_vllm.options import GateOptions

    # the options' defaults are the gate's own
    defaults = {k: p.default for k, p in inspect.signature(DraftGate).parameters.items()}
    assert defaults == GateOptions().model_dump()
    options = ProposerOptions(exit_layer=2, head=None, guard_options={"proof_from": 3, "min_steps": 5})
    proposer = EarlyExitProposer(vllm_config(checkpoint), options)
    assert (proposer.gate.proof_from, proposer.gate.min_steps, proposer.gate.z) == (3, 5, 1.0)
    with pytest.raises(ConfigError, match="proof_form"):
        read_options({OPTIONS_ENV: '{"guard_options": {"proof_form": 1}}'})
    with pytest.raises(ConfigError, match="floor"):
        read_options({OPTIONS_ENV: '{"guard_options": {"floor": 1.5}}'})


def test_vllm_config_prints_the_settings_with_further_options(monkeypatch, capsys) -> None:  # noqa: ANN001
    import shlex

    from eesd_core.cli import main

    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    extra = '{"dtype": "bfloat16", "guard_options": {"proof_from": 2}}'
    assert main(["vllm-config", "--k", "5", "--head", "none", "--exit-layer", "3", "--options", extra]) == 0
    lines = dict(line.removeprefix("export ").split("=", 1) for line in capsys.readouterr().out.splitlines())
    options = read_options({OPTIONS_ENV: shlex.split(lines[OPTIONS_ENV])[0]})
    assert options == ProposerOptions(
        exit_layer=3, head=None, dtype="bfloat16", guard_options={"proof_from": 2}
    )
    assert json.loads(shlex.split(lines["EESD_VLLM_SPEC"])[0])["num_speculative_tokens"] == 5
    for bad, said in (
        ("{exit", "JSON object"),
        ("[1]", "JSON object"),
        ('{"guard_options": {"z": -1}}', "z"),
    ):
        assert main(["vllm-config", "--head", "none", "--options", bad]) == 1
        assert said in capsys.readouterr().err


def test_common_prefix() -> None:
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix(np.array([], dtype=int), np.array([1])) == 0


def test_the_expand_repair_spreads_each_value_over_its_positions() -> None:
    from eesd_vllm.fixes import expand

    out = torch.full((7,), float("nan"))
    values = torch.tensor([0.7, 0.0, 1.5])
    expand(out, values, torch.tensor([2, 3, 7], dtype=torch.int32), 0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.5, 1.5, 1.5, 1.5])
    ids = torch.zeros(3, dtype=torch.int64)
    expand(ids, torch.tensor([4, 9]), torch.tensor([1, 3]), 9, -1)
    assert ids.tolist() == [4, -1, -1]


class TakesBack:
    """Drafts up to three tokens and takes a draft back on its q alone (a deterministic function of
    the context, so rows decide the same drafting together or alone); records what it learns."""

    withdraws = True

    def __init__(self) -> None:
        self.updates: list[RoundOutcome] = []

    def start(self, request: Request) -> None:
        assert request.withdraws

    def begin_round(self, state: None, round: RoundStart) -> None:
        assert len(round.rows) == 1  # each request is a generation of its own

    def should_continue(self, state: None, step: DraftStep) -> bool:
        return step.index < 3

    def keep(self, state: None, step: DraftStep) -> bool:
        seen = step.confidence
        assert step.token is None and seen is not None and seen.prob is None
        return int(seen.top1 * 1e6) % 3 != 0

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        assert len(outcomes) == 1
        self.updates.extend(outcomes)


def test_drafts_taken_back_change_no_token_and_are_judged_by_the_next_step(checkpoint, plain_head) -> None:  # noqa: ANN001
    """A controller that takes drafts back on q's confidence, alone and drafting together: every
    request still equals plain greedy, rows drafting together propose what they would alone, and
    each withdrawn draft is reported accepted exactly when it is the target's argmax there."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64).eval()
    config = vllm_config(checkpoint)
    config.model_config.dtype = torch.float64
    proposals, judged = [], []
    for together in (True, False):
        options = ProposerOptions(head=str(plain_head), controller="fixed", guard=False)
        proposer = EarlyExitProposer(config, options)
        controller = proposer.controller = TakesBack()
        if not together:
            alone(proposer)
        seen: list[tuple[int, list[int], RoundOutcome]] = []

        def spy(entry, tokens, learn=proposer._learn, seen=seen, c=controller) -> None:  # noqa: ANN001
            back, before = entry.round.withdrawn, len(c.updates)
            learn(entry, tokens)
            if back is not None:  # (confidence, q, logits): the draft taken back is their argmax
                outcome = c.updates[before]
                token = int(back[2].argmax())
                seen.append((token, list(tokens[: entry.committed + outcome.drafted]), outcome))

        proposer._learn = spy  # type: ignore[method-assign]
        calls: list[list[list[int]]] = []
        propose = proposer.propose
        proposer.propose = lambda *a, f=propose, c=calls: c.append(f(*a)) or c[-1]  # type: ignore[method-assign]
        prompts, limits = prompts_of(6, 6), [11, 24, 16, 30, 5, 20]
        got = Scheduler(model, proposer, seed=7).run(prompts, limits, drop_drafts=False)
        assert got == [greedy(model, p, n) for p, n in zip(prompts, limits, strict=True)]
        assert proposer.stats["withdrawn"] > 0 and proposer.stats["drafted"] > 0
        proposals.append(calls)
        judged.append(seen)
    assert proposals[0] == proposals[1]
    scheduler = Scheduler(model, proposer)
    checked = 0
    for token, prefix, outcome in judged[0]:
        assert outcome.withdrawn is not None
        if outcome.accepted < outcome.drafted:
            assert outcome.withdrawn.acceptance is None  # the pass never reached its position
            continue
        best = scheduler.target_next(prefix)[-1]
        assert outcome.withdrawn.acceptance == float(best == token)
        checked += 1
    assert checked > 5 and {o.withdrawn.acceptance for _, _, o in judged[0]} >= {0.0, 1.0}


class RecordingGate:
    """A gate that opens as told and keeps what the proposer scores."""

    def __init__(self, opens: bool = True) -> None:
        self.opens, self.scores = opens, []

    def open(self, size: int, plain_known: bool = True) -> bool:
        return self.opens

    def score(self, size: int, tokens: int, rows: int, seconds: float, plain_step: float | None) -> None:
        self.scores.append((size, tokens, rows, seconds))


def two_drafting_requests(checkpoint) -> tuple:  # noqa: ANN001
    """A proposer drafting two tokens for each of two requests, its gate recording the scores,
    vLLM's token table, and the first step's drafts."""
    options = ProposerOptions(exit_layer=2, head=None, controller="fixed", controller_options={"k": 2})
    proposer = EarlyExitProposer(vllm_config(checkpoint, k=2), options)
    proposer.gate = gate = RecordingGate()
    table = np.zeros((2, 200), dtype=np.int32)
    table[0, :5], table[1, :4] = [3, 4, 5, 6, 7], [8, 9, 10, 11]
    return proposer, gate, table, proposer.propose([[7], [11]], np.array([5, 4]), table)


def test_the_gate_is_told_what_a_drafting_step_committed(checkpoint) -> None:  # noqa: ANN001
    """A step's score counts the tokens each of its requests committed (kept drafts and vLLM's
    token), one for a request that finished since, and the step's whole time; a step in which no
    request drafted is not scored."""
    proposer, gate, table, drafts = two_drafting_requests(checkpoint)
    assert [len(d) for d in drafts] == [2, 2] and gate.scores == []
    table[0, 5:7], table[0, 7] = drafts[0], 60  # the first kept both drafts and added a token
    table[1, 4] = 61  # the second kept none
    proposer.propose([[*drafts[0], 60], [61]], np.array([8, 5]), table)
    ((size, tokens, rows, seconds),) = gate.scores
    assert (size, tokens, rows) == (2, 4, 2) and seconds > 0
    table[0, :6] = table[1, :6]  # the first finished: one token counted for it
    table[0, 5] = 62
    proposer.propose([[62]], np.array([6]), table)
    assert gate.scores[-1][1:3] == (1 + 1, 2)


def test_a_cache_another_request_took_counts_one_token(checkpoint) -> None:  # noqa: ANN001
    """A request that finished leaves its cache to a new one sharing its prefix (a system prompt):
    the cache's length jumps by the new request's prompt, which the score must not count as
    tokens the drafting step committed."""
    proposer, gate, table, drafts = two_drafting_requests(checkpoint)
    assert [len(d) for d in drafts] == [2, 2]
    table[0, 5:60] = np.arange(20, 75)  # the first finished; a new request shares its five tokens
    table[1, 4] = 61  # the second kept none
    proposer.propose([[74], [61]], np.array([60, 5]), table)
    ((size, tokens, rows, _),) = gate.scores
    assert (size, tokens, rows) == (2, 1 + 1, 2)


def test_a_closed_gate_leaves_every_request_plain(checkpoint) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    proposer = EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(exit_layer=2, head=None))
    proposer.gate = RecordingGate(opens=False)
    prompts = prompts_of(4, 3)
    got = Scheduler(model, proposer, seed=5).run(prompts, [9, 14, 5])
    assert got == [greedy(model, p, n) for p, n in zip(prompts, [9, 14, 5], strict=True)]
    assert proposer.stats["drafted"] == 0 and proposer.stats["gated"] == proposer.stats["steps"] > 0
    assert proposer.caches == [] or all(len(entry.tokens) == 0 for entry in proposer.caches)


def test_a_request_that_drafts_nothing_keeps_its_cache_and_its_controller(checkpoint) -> None:  # noqa: ANN001
    """A request that has drafted nothing has an empty cache, which shares no prefix with it: it
    must still find that cache, on its row or another, and not start the controller afresh each
    step (a start is a new request to the controller, which discounts what it has learnt); and
    every plain step after the first reaches the controller."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    proposer = EarlyExitProposer(vllm_config(checkpoint), ProposerOptions(exit_layer=2, head=None))
    proposer.gate = RecordingGate(opens=False)
    starts, updates = [], []
    start, update = proposer.controller.start, proposer.controller.update
    proposer.controller.start = lambda request: starts.append(request) or start(request)  # type: ignore[method-assign]
    proposer.controller.update = lambda state, outcomes: updates.extend(outcomes) or update(state, outcomes)  # type: ignore[method-assign]
    prompts, limits = prompts_of(8, 3), [12, 20, 7]
    got = Scheduler(model, proposer, seed=3).run(prompts, limits, preempt=False)
    assert got == [greedy(model, p, n) for p, n in zip(prompts, limits, strict=True)]
    assert len(starts) == len(prompts)
    # each request's steps after its prefill: one per token after the first, the first unlearnt
    assert len(updates) == sum(n - 2 for n in limits)
    assert all(outcome.drafted == 0 and len(outcome.tokens) == 1 for outcome in updates)
