"""Decoding on buffers allocated once (``compile="static"``): transformers' tokens, every batch row
its solo reply, the exact distribution, and the option's errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from eesd_bench.env import products_of
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import save_head
from eesd_graphs.static import Captured, StaticCache
from tinymodels import make_tiny

from eesd_core import SpeculativeDecoder
from eesd_core.errors import ConfigError
from eesd_core.models import find_adapter
from eesd_core.protocols import SamplingParams
from eesd_core.testing.hf import first_tokens_distribution, tiny_llama
from eesd_core.testing.kit import Setup
from eesd_core.testing.oracles import assert_distributions_equal, engine_distribution
from eesd_core.testing.syncs import DeviceSyncs

STATIC = {"compile": "static"}
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma3"]
# every family in the slow suite; Llama's layout and Gemma 3's windows in every run
SOME_SLOW = [f if f in ("llama", "gemma3") else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]


def _decoder(model: torch.nn.Module, k: int, **options: object) -> SpeculativeDecoder:
    drafter = {"drafter": "early_exit", "drafter_options": {"exit_layer": 2}} if k else {"drafter": None}
    controller = {"controller": "fixed", "controller_options": {"k": k}} if k else {}
    return SpeculativeDecoder(model, **drafter, **controller, adapter_options=STATIC | options)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", SOME_SLOW)
def test_static_buffers_decode_like_transformers(family: str) -> None:
    """Plain, early exit with k = 1 and 8 (rejections leave stale slots that the mask must hide);
    every layer's buffers as wide as the cache."""
    model = make_tiny(family, 3)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    for k in (0, 1, 8):
        dec = _decoder(model, k)
        generation = dec.stream(ids, max_new_tokens=40, eos_token_id=[])
        tokens = [token for step in generation for token in step]
        cache = generation.cache
        assert isinstance(cache, StaticCache)
        assert {b.shape[2] for b in (*cache.keys, *cache.values) if b is not None} == {cache.capacity}
        assert ids[0].tolist() + tokens == expected[0].tolist(), (family, k)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("skip_padding", [True, False])
def test_static_batch_rows_equal_their_solo_replies(family: str, skip_padding: bool) -> None:
    """Ragged prompts (left padding, packed prefills where padding is skipped), rows that stop at
    different rounds and leave gaps, realignments."""
    model = make_tiny(family, 5)
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (11, 3, 7, 1)]
    dec = _decoder(model, 3, skip_padding=skip_padding)
    out = dec.generate(rows, max_new_tokens=24, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences, strict=True):
        solo = model.generate(
            torch.tensor([row]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence.tolist() == solo[0].tolist()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_static_buffers_widen_when_a_call_outgrows_them(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers made too narrow for the call: each pass that reaches past them widens them all."""
    from eesd_graphs.static import Slab, StaticPasses

    made: list[StaticCache] = []

    def narrow(self: StaticPasses, num_layers: int, capacity: int) -> StaticCache:
        made.append(StaticCache(self, Slab(num_layers, 4)))
        return made[-1]

    monkeypatch.setattr(StaticPasses, "new_cache", narrow)
    model = make_tiny(family, 7)
    ids = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(7))
    expected = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    for k in (0, 3):
        out = _decoder(model, k).generate(ids, max_new_tokens=30, eos_token_id=[])
        assert torch.equal(out.sequences, expected), (family, k)
    rows = [ids[0].tolist(), ids[0, 4:].tolist()]
    out = _decoder(model, 3).generate(rows, max_new_tokens=12, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences, strict=True):
        solo = model.generate(
            torch.tensor([row]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence.tolist() == solo[0].tolist()
    assert made and all(cache.capacity > 4 for cache in made)


@pytest.mark.parametrize(
    "replayed", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "replayed"]
)
def test_static_buffers_keep_the_exact_distribution(replayed: bool, request: pytest.FixtureRequest) -> None:
    """Every random choice of the engine enumerated over an 8-token vocabulary, on static buffers
    (and with every pass replayed after its capture)."""
    made = request.getfixturevalue("rerun") if replayed else None
    model = tiny_llama(vocab_size=8)
    setup = Setup(
        model,
        drafter="early_exit",
        drafter_options={"exit_layer": 1, "head": None},
        controller="fixed",
        max_draft_tokens=2,
        adapter_options=STATIC,
    )
    sampling = SamplingParams(1.0, top_k=3)
    actual = engine_distribution(setup, [3, 1, 4], 3, sampling)  # the prefill's token, then a round
    assert_distributions_equal(actual, first_tokens_distribution(model, [3, 1, 4], 3, sampling))
    assert made is None or made


def test_compile_choices() -> None:
    model = make_tiny("llama", 1)
    assert SpeculativeDecoder(model, drafter=None).adapter.passes is None  # auto: eager
    static = SpeculativeDecoder(model, drafter=None, adapter_options=STATIC).adapter
    assert static.passes.describe() == "static buffers, eager passes"
    assert products_of(static).endswith("; passes: static buffers, eager passes")
    assert SpeculativeDecoder(model, drafter=None, adapter_options={"compile": "off"}).adapter.passes is None
    with pytest.raises(ConfigError, match=r"compile='jit'.*compile='auto' or 'off'"):
        SpeculativeDecoder(model, drafter=None, adapter_options={"compile": "jit"})


class Rerun:
    """A CUDA graph's stand-in on the CPU: ``replay()`` runs the captured pass again, on the buffers
    it was captured on, into the same output tensor."""

    made: list[Rerun] = []

    def __init__(self, run: object) -> None:
        self.run, self.replays = run, 0
        self.out = run()  # type: ignore[operator]
        Rerun.made.append(self)

    def replay(self) -> None:
        self.out.copy_(self.run())  # type: ignore[operator]
        self.replays += 1


@pytest.fixture
def rerun(monkeypatch: pytest.MonkeyPatch) -> list[Rerun]:
    """``compile="static"`` made ``"graphs"`` on the CPU, with :class:`Rerun` for the graphs."""
    from eesd_graphs.static import StaticPasses

    Rerun.made = []
    init = StaticPasses.__init__
    monkeypatch.setattr(
        StaticPasses, "__init__", lambda self, adapter, graphs=False: init(self, adapter, True)
    )
    monkeypatch.setattr(StaticPasses, "capture", lambda self, run: Rerun(run))
    return Rerun.made


@pytest.mark.parametrize("family", SOME_SLOW)
def test_replayed_passes_decode_like_transformers(family: str, rerun: list[Rerun]) -> None:
    """Every pass a replay of a capture after its shape's first run: the buffers a replay reads
    hold this pass's inputs, and the cache's lengths move as an eager pass moves them."""
    model = make_tiny(family, 3)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    for k in (0, 1, 8):
        out = _decoder(model, k).generate(ids, max_new_tokens=40, eos_token_id=[])
        assert torch.equal(out.sequences, expected), (family, k)
    assert rerun and sum(graph.replays for graph in rerun) > 3 * 20


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_replayed_batches_equal_their_solo_replies(family: str, rerun: list[Rerun]) -> None:
    model = make_tiny(family, 5)
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (11, 3, 7, 1)]
    out = _decoder(model, 3, skip_padding=False).generate(rows, max_new_tokens=24, eos_token_id=[])
    for row, sequence in zip(rows, out.sequences, strict=True):
        solo = model.generate(
            torch.tensor([row]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert sequence.tolist() == solo[0].tolist()
    assert sum(graph.replays for graph in rerun) > 10


def test_a_later_call_replays_what_an_earlier_call_captured(rerun: list[Rerun]) -> None:
    """Once a call's cache is gone its slab (buffers and captured passes) serves the next call
    that fits; a call running at the same time gets a slab of its own."""
    model = make_tiny("llama", 3)
    dec = _decoder(model, 3)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (9, 12)]
    first = dec.stream(prompts[0], max_new_tokens=40, eos_token_id=[])
    slab = first.cache.slab
    tokens = [[t for step in first for t in step]]
    del first
    captured, replays = len(rerun), sum(graph.replays for graph in rerun)
    second = dec.stream(prompts[1], max_new_tokens=40, eos_token_id=[])
    assert second.cache.slab is slab
    started = next(second)
    alongside = dec.stream(prompts[0], max_new_tokens=8, eos_token_id=[])
    assert alongside.cache.slab is not slab
    tokens.append(started + [t for step in second for t in step])
    assert captured > 0 and len(rerun) - captured < captured  # most shapes captured already
    assert sum(graph.replays for graph in rerun[:captured]) - replays >= 20  # and replayed
    for prompt, new in zip(prompts, tokens, strict=True):
        solo = model.generate(
            torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert prompt + new == solo[0].tolist()


def test_graphs_need_cuda() -> None:
    with pytest.raises(ConfigError, match=r"compile='graphs' captures CUDA graphs.*compile='static'"):
        SpeculativeDecoder(make_tiny("llama", 1), drafter=None, adapter_options={"compile": "graphs"})


def _head_files(model: torch.nn.Module, folder: Path) -> dict[str, str]:
    """Exit heads at layer 3 of 4 (an exit layer of their own, on the exit cache): one reading
    layer 3 alone, one also reading the target's top state; noise makes some drafts wrong."""
    adapter = find_adapter(model)
    torch.manual_seed(3)
    plain = ExitHead(adapter, 3).to(torch.float64)
    top = ExitHead(adapter, 3, top_input=True).to(torch.float64)
    with torch.no_grad():
        for head in (plain, top):
            for p in head.parameters():
                p.add_(0.02 * torch.randn_like(p))
        top.fuse.weight[:, adapter.hidden_size :].normal_(0, 0.02)
    return {
        name: str(save_head(h, adapter, folder / f"{name}.safetensors"))
        for name, h in (("exit", plain), ("top", top))
    }


@pytest.mark.parametrize("graphs", [False, True], ids=["static", "replayed"])
@pytest.mark.parametrize("family", ["qwen2", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_exit_heads_draft_on_static_buffers(family: str, graphs: bool, tmp_path: Path, request) -> None:  # noqa: ANN001
    """The exit layers' own cache is a static one too (and their passes replayed), alone and in a
    ragged batch, with rows that stop at different rounds."""
    if graphs:
        request.getfixturevalue("rerun")
    model = make_tiny(family, 2)
    gen = torch.Generator().manual_seed(4)
    rows = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (8, 3, 11)]
    for name, path in _head_files(model, tmp_path).items():
        fixed = {"controller": "fixed", "controller_options": {"k": 3}}
        dec = SpeculativeDecoder(model, drafter_options={"head": path}, **fixed, adapter_options=STATIC)  # type: ignore[arg-type]
        generation = dec.stream(rows[0], max_new_tokens=32, eos_token_id=[])
        alone = rows[0] + [t for step in generation for t in step]
        exit_cache = generation.draft_state.exit_cache
        assert isinstance(exit_cache, StaticCache), name
        assert any(isinstance(entry, Captured) for entry in exit_cache.captured.values()) == graphs, name
        assert generation.stats.accepted > 0, name
        batch = dec.generate(rows, max_new_tokens=32, eos_token_id=[]).sequences
        for row, sequence in zip(rows, batch, strict=True):
            solo = model.generate(
                torch.tensor([row]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            assert sequence.tolist() == solo[0].tolist(), (family, name)
        assert alone == batch[0].tolist()


@pytest.mark.parametrize("k", [0, 3])
def test_a_static_pass_reads_nothing_from_the_device(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside every pass over the layers (the part a graph captures), nothing reads a tensor on the
    host: on a GPU each such read would wait for the device, and a capture would refuse it."""
    from eesd_core.models.base import DecoderAdapter

    model, run, inside = make_tiny("gemma3", 2), DecoderAdapter._run, []
    syncs = DeviceSyncs(model)

    def watched(self, *args):  # noqa: ANN001, ANN202
        before = len(syncs.sites)
        try:
            return run(self, *args)
        finally:
            inside.extend(syncs.sites[before:])

    monkeypatch.setattr(DecoderAdapter, "_run", watched)
    with syncs:
        _decoder(model, k).generate(list(range(3, 12)), max_new_tokens=16, eos_token_id=[])
    assert inside == []


def test_kept_slabs_serve_calls_of_other_batch_sizes_and_hold_nothing_stale() -> None:
    """A slab kept from a call of 2 rows serves calls of 3 and 1 rows; what a call left in it
    (NaN, from a call that failed, say) never reaches the next one."""
    model = make_tiny("llama", 6)
    dec = _decoder(model, 3, skip_padding=False)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (5, 9, 7)]
    for rows in (prompts[:2], prompts, prompts[2:], prompts[:2]):
        with torch.inference_mode():
            for slab in dec.adapter.passes._free:
                for buffer in (*slab.keys, *slab.values):
                    if buffer is not None:
                        buffer.fill_(float("nan"))
        out = dec.generate(rows, max_new_tokens=20, eos_token_id=[]) if len(rows) > 1 else None
        sequences = (
            out.sequences if out else [dec.generate(rows[0], max_new_tokens=20, eos_token_id=[]).sequences[0]]
        )
        for row, sequence in zip(rows, sequences, strict=True):
            solo = model.generate(
                torch.tensor([row]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            assert sequence.tolist() == solo[0].tolist()
    assert dec.adapter.passes._free  # the calls' slabs were kept, and reused


def test_a_pass_that_cannot_be_captured_runs_eagerly(
    rerun: list[Rerun], monkeypatch: pytest.MonkeyPatch
) -> None:
    from eesd_graphs.static import StaticPasses

    def refuse(self: StaticPasses, run: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(StaticPasses, "capture", refuse)
    model = make_tiny("qwen2", 3)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    dec = _decoder(model, 3)
    with pytest.warns(RuntimeWarning, match="could not be captured into a CUDA graph"):
        out = dec.generate(ids, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    assert dec.adapter.passes.failed > 0 and not rerun
    with warnings.catch_warnings():  # the shapes a call met once fail on their second sight, later
        warnings.simplefilter("ignore")
        for _ in range(2):
            dec.generate(ids, max_new_tokens=24, eos_token_id=[])
    failed = dec.adapter.passes.failed
    again = dec.generate(ids, max_new_tokens=24, eos_token_id=[])  # a shape that failed is not tried again
    assert dec.adapter.passes.failed == failed and torch.equal(again.sequences, expected)
