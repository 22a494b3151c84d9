"""The per-pass costs that decide whether early-exit speculative decoding pays, for a model shape.

The model is built from a public config with random weights (nothing is downloaded: the values of
the weights do not change what a pass costs), on ``--device`` in ``--dtype``. Every timing is the
median of ``--repeats`` after warm-up runs, with a KV cache of ``--context`` positions already
filled and rolled back to that length after each pass; on a GPU the device is synchronised before
every clock read. The passes are the ones the engine runs, through the adapter's own methods:

1. plain step: eesd's pass over one new position (layers [0, L), final norm, LM head), and
   transformers' ``forward`` of one token with its ``DynamicCache`` beside it;
2. verification of m = 1..16 positions (the same pass over m positions);
3. for each exit layer N: a draft step of a head shaped like the shipped ones (layers [0, N) on
   one position, the map of [h_N, top state], one exit layer copied from layer L - 1, its norm, and
   the LM head over ``--subset`` rows, widened to the vocabulary), the untrained exit's step
   (layers [0, N), the final norm, the whole LM head), layers [0, N) alone (what ``finish`` runs on
   the round's last token) and the rest of the target, layers [N, L) with norm and head, over
   m = 1..9 positions (what verification runs after the drafter);
4. per-round overhead: the engine generates ``--tokens`` tokens greedily with the untrained exit at
   the first N and a fixed k (0, 1, 2, 4, 8), each round timed from outside. The overhead of a
   round is its median time less the passes it is made of, k untrained draft steps + layers
   [0, N) + layers [N, L) over k + 1 positions: controller, sampling, verifier and bookkeeping;
5. the speedup those costs imply, MODELLED: drafts accepted independently with probability alpha,
   ``eesd_bench.modelled.RoundCosts`` with the engine's own split of a round, propose_base =
   per-round overhead + layers [0, N), draft_step = exit-head draft step + per-draft overhead,
   verify[k] = layers [N, L) over k + 1 positions; the overhead's per-round and per-draft parts are
   a line fitted over k.

Two checks are printed with their measured ratios: verification of 9 positions within 1.2 times
one position, and every round's overhead under 10 % of a plain step.

On a CUDA GPU (bfloat16; one H100 holds the 8B shape, 16 GB of weights)::

    python benchmarks/cost_curves.py --shape qwen2.5-1.5b --device cuda --dtype bfloat16 \\
        --exit-mlp-width 1536 --alpha 0.5 --out benchmarks/out/costs-qwen.json
    python benchmarks/cost_curves.py --shape llama-3-8b --device cuda --dtype bfloat16 \\
        --out benchmarks/out/costs-llama-3-8b.json

``--compile graphs`` times the same passes captured into CUDA graphs (each shape is captured in the
warm-up runs); ``--compile static`` runs them eagerly on the buffers graphs capture.

On a CPU, a few layers of a small shape::

    python benchmarks/cost_curves.py --shape smollm2-135m --layers 4 --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from eesd_bench.env import environment, products_of
from eesd_bench.kernels import add_sdpa_argument, attention_kernels
from eesd_bench.modelled import RoundCosts
from eesd_early_exit.head import ExitHead

from eesd_core import SpeculativeDecoder
from eesd_core.cache import KVCache
from eesd_core.devices import resolve_device, resolve_dtype
from eesd_core.errors import ConfigError

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-1.5b": (
        "Qwen2ForCausalLM",
        dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=32768,
            use_sliding_window=False,
        ),
    ),
    "llama-3-8b": (
        "LlamaForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
        ),
    ),
    "smollm2-135m": (
        "LlamaForCausalLM",
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
        ),
    ),
    "tiny": (
        "LlamaForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=4096,
        ),
    ),
}
VERIFY_ROWS = 16  # verification curve m = 1..16
MAX_K = 8  # the modelled k = 0..8, so the rest of the target is timed over m = 1..9
ROUND_KS = (0, 1, 2, 4, 8)
ALPHAS = (0.5, 0.6, 0.7, 0.8)
WARMUP = 3
VERIFY_LIMIT, OVERHEAD_LIMIT, MEMORY_LIMIT = 1.2, 0.10, 1.6
COPY_BYTES = {"cuda": 2 << 30, "cpu": 256 << 20, "mps": 256 << 20}  # the copy that measures bandwidth


def build_model(
    shape: str | tuple[str, dict[str, Any]], layers: int, device: torch.device, dtype: torch.dtype
) -> Any:
    """A model of ``shape`` (a name in :data:`SHAPES`, or a class name and its configuration) with
    ``layers`` decoder layers and random weights, made on ``device``."""
    class_name, kwargs = SHAPES[shape] if isinstance(shape, str) else shape
    config = getattr(transformers, class_name).config_class(**{**kwargs, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device(device):  # made in place: an 8B model is never held on the host
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).eval()


class Clock:
    """Host seconds, read after the device has finished the work queued before."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter()


def timed(clock: Clock, run: Callable[[], Any], reset: Callable[[], None], repeats: int) -> dict[str, Any]:
    """``run`` timed ``repeats`` times after ``WARMUP`` untimed runs, ``reset`` after each."""
    for _ in range(WARMUP):
        run()
        reset()
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
        reset()
    return {"median": statistics.median(times), "times": times}


def memory(model: Any, device: torch.device, clock: Clock, repeats: int) -> dict[str, float]:
    """What a plain step must read of the weights (every parameter once, but of an input embedding
    not shared with the LM head one row only) and the bandwidth of a copy on ``device`` (bytes
    read plus bytes written over its median time): the floor a step's time is held against."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix once
    read = total if embed.data_ptr() == head.data_ptr() else total - embed.numel() * embed.element_size()
    source = torch.empty(COPY_BYTES[device.type], dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = timed(clock, lambda: target.copy_(source), lambda: None, max(3, min(repeats, 10)))
    return {"weight_bytes": read, "copy_bandwidth": 2 * source.numel() / copy["median"]}


def random_ids(count: int, vocab: int) -> torch.Tensor:
    """The same token ids on the host for every pass and every generation."""
    return torch.randint(vocab, (count,), generator=torch.Generator().manual_seed(0))


class Passes:
    """The passes a round is made of, each from ``context`` cached positions, as the engine runs
    them: token ids live on the host and go to the device in the pass."""

    def __init__(self, adapter: Any, context: int) -> None:
        self.adapter, self.context, self.device = adapter, context, adapter.device
        self.ids = random_ids(context + VERIFY_ROWS, adapter.vocab_size)
        self.token = int(self.ids[context])
        size = (1, max(context, VERIFY_ROWS), adapter.hidden_size)  # inputs of the exit and upper layers
        generator = torch.Generator().manual_seed(1)
        self.states = torch.randn(size, generator=generator).to(self.device, adapter.dtype)
        self.cache = adapter.new_cache(capacity=context + VERIFY_ROWS)
        prefix = adapter.embed(self.ids[:context].to(self.device))
        adapter.run(prefix, 0, adapter.num_layers, self.cache, 0)

    def reset(self) -> None:
        self.cache.crop(self.context)

    def verify(self, m: int) -> torch.Tensor:
        a = self.adapter
        hidden = a.embed(self.ids[self.context : self.context + m].to(self.device))
        return a.logits(a.norm(a.run(hidden, 0, a.num_layers, self.cache, self.context)))[0]  # [m, V]

    def lower(self, n: int) -> tuple[torch.Tensor, Any]:
        """Layers [0, n) on one token, as the drafter's ``_lower``. # [1, 1, H]"""
        a = self.adapter
        x = a.embed(torch.tensor([self.token], device=self.device))
        rotary = a.rotary(x, self.context)
        return a.run(x, 0, n, self.cache, self.context, None, rotary), rotary

    def untrained_draft(self, n: int) -> torch.Tensor:
        h, _ = self.lower(n)
        return self.adapter.logits(self.adapter.norm(h))[0, 0]  # [V]

    def tail(self, n: int, m: int) -> torch.Tensor:
        """Layers [n, L), norm and LM head over m positions: verification after the drafter."""
        a = self.adapter
        top = a.run(self.states[:, :m], n, a.num_layers, self.cache, self.context)
        return a.logits(a.norm(top))[0]  # [m, V]

    def exit_head(self, n: int, subset: int, mlp_width: int | None) -> tuple[ExitHead, KVCache]:
        """A head shaped like the shipped ones, its cache filled with ``context`` positions."""
        a = self.adapter
        vocab_ids = None
        if 0 < subset < a.vocab_size:
            vocab_ids = torch.randperm(a.vocab_size, generator=torch.Generator().manual_seed(2))[:subset]
        with torch.inference_mode(False):
            head = ExitHead(a, n, vocab_ids=vocab_ids, top_input=True, mlp_width=mlp_width).eval()
        cache = KVCache(head.num_layers, self.context + VERIFY_ROWS)
        prefix = self.states[:, : self.context]
        head.hidden(prefix, 0, cache, None, torch.zeros_like(prefix))
        return head, cache

    def exit_draft(self, head: ExitHead, cache: KVCache, n: int) -> torch.Tensor:
        """One draft step past the first of a round: the head reads its own previous output."""
        h, rotary = self.lower(n)
        stand_in = self.states[:, :1]
        out = head.hidden(h, self.context, cache, rotary, head.top_state(stand_in))
        return head.logits(out)[0, 0]  # [V]


def measure_passes(model: Any, adapter: Any, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """Plain step, verification curve, transformers' step, and the drafting passes of each N."""
    passes, repeats = Passes(adapter, args.context), args.repeats
    verify = [
        {"m": m, **timed(clock, lambda m=m: passes.verify(m), passes.reset, repeats)}
        for m in range(1, VERIFY_ROWS + 1)
    ]
    draft = {str(n): measure_exit(passes, n, args, clock) for n in args.exit_layers}
    hf = hf_step(model, passes, clock, repeats)
    return {"plain_step": verify[0], "hf_forward": hf, "verify": verify, "draft": draft}


def measure_exit(passes: Passes, n: int, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """The passes of drafting from layer ``n``."""
    head, exit_cache = passes.exit_head(n, args.subset, args.exit_mlp_width)

    def reset_both() -> None:
        passes.reset()
        exit_cache.crop(args.context)

    repeats, reset = args.repeats, passes.reset
    return {
        "exit_head": timed(clock, lambda: passes.exit_draft(head, exit_cache, n), reset_both, repeats),
        "untrained": timed(clock, lambda: passes.untrained_draft(n), reset, repeats),
        "lower": timed(clock, lambda: passes.lower(n), reset, repeats),
        "tail": [
            {"m": m, **timed(clock, lambda m=m: passes.tail(n, m), reset, repeats)}
            for m in range(1, MAX_K + 2)
        ],
    }


def hf_step(model: Any, passes: Passes, clock: Clock, repeats: int) -> dict[str, Any]:
    """transformers' ``forward`` of one token after ``context`` tokens in its own DynamicCache."""
    context = passes.context
    ids = passes.ids.to(passes.device)[None]  # [1, T]
    cache = model(input_ids=ids[:, :context], use_cache=True, logits_to_keep=1).past_key_values
    one = ids[:, context : context + 1]
    return timed(
        clock,
        lambda: model(input_ids=one, past_key_values=cache, use_cache=True),
        lambda: cache.crop(-(cache.get_seq_length() - context)),  # a negative crop drops positions
        repeats,
    )


def round_times(model: Any, n: int, k: int | None, args: argparse.Namespace, clock: Clock) -> list[float]:
    """Seconds of each round of one greedy generation that drafted k tokens (``None``: plain
    decoding), timed from outside the engine; the first round, which prefills, is left out."""
    adapter = {"compile": args.compile}
    if k is None:
        dec = SpeculativeDecoder(model, drafter=None, adapter_options=adapter)
    else:
        options = {"exit_layer": n, "head": None}
        dec = SpeculativeDecoder(
            model,
            drafter_options=options,
            controller="fixed",
            controller_options={"k": k},
            adapter_options=adapter,
        )
    prompt = random_ids(args.context, dec.adapter.vocab_size).tolist()
    dec.generate(prompt, max_new_tokens=MAX_K + 2, eos_token_id=[])  # warm-up
    generation = dec.stream(prompt, max_new_tokens=args.tokens, eos_token_id=[])
    next(generation)
    times = []
    while not generation.done:
        drafted = generation.stats.drafted
        start = clock()
        next(generation)
        seconds = clock() - start
        if generation.stats.drafted - drafted == (k or 0):
            times.append(seconds)
    return times


def summary(times: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(times) if times else None, "times": times}


def measure_rounds(model: Any, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """Rounds of the engine at the first exit layer, by fixed k, and of plain decoding."""
    n = args.exit_layers[0]
    by_k = {str(k): summary(round_times(model, n, k, args, clock)) for k in ROUND_KS}
    return {"exit_layer": n, "plain": summary(round_times(model, n, None, args, clock)), "by_k": by_k}


OVERHEAD_DERIVATION = (
    "overhead(k) = median time of the engine's rounds that drafted k (timed from outside; untrained "
    "exit at N, fixed k) - (k * untrained draft step + layers [0, N) on one position + layers [N, L) "
    "with norm and LM head over k + 1 positions), each pass timed alone at the context (the rounds "
    "run at context .. context + tokens); per_round and per_draft: intercept and slope of a "
    "least-squares line of overhead(k) over k; plain: a round of plain decoding - the plain step"
)
MODEL_NOTE = (
    "MODELLED, not timed: drafts accepted independently with probability alpha, E_k = (1 - "
    "alpha^(k+1)) / (1 - alpha) tokens a round; round_time(k) = propose_base + k * draft_step + "
    "verify[k] with propose_base = per-round overhead + layers [0, N) on one position, draft_step = "
    "exit-head draft step + per-draft overhead (overhead parts clamped at 0), verify[k] = layers "
    "[N, L) with norm and LM head over k + 1 positions; speedup = E_k * round_time(0) / round_time(k), "
    "a round that drafts nothing standing for plain decoding"
)


def beyond(round_time: float, passes: float, plain: float) -> dict[str, float]:
    extra = round_time - passes
    return {"round": round_time, "passes": passes, "overhead": extra, "of_plain": extra / plain}


def overhead(timings: dict[str, Any], rounds: dict[str, Any]) -> dict[str, Any]:
    """What a round costs beyond its passes (see ``OVERHEAD_DERIVATION``)."""
    passes = timings["draft"][str(rounds["exit_layer"])]
    plain = timings["plain_step"]["median"]
    by_k = {}
    for key, got in rounds["by_k"].items():
        if got["median"] is not None:  # None: no round reached k
            k = int(key)
            parts = k * passes["untrained"]["median"] + passes["lower"]["median"]
            by_k[key] = beyond(got["median"], parts + passes["tail"][k]["median"], plain)
    per_draft, per_round = 0.0, 0.0
    if len(by_k) >= 2:
        ks = [float(k) for k in by_k]
        per_draft, per_round = statistics.linear_regression(ks, [o["overhead"] for o in by_k.values()])
    return {
        "exit_layer": rounds["exit_layer"],
        "derivation": OVERHEAD_DERIVATION,
        "by_k": by_k,
        "per_round": per_round,
        "per_draft": per_draft,
        "plain": beyond(rounds["plain"]["median"], plain, plain),
    }


def modelled(timings: dict[str, Any], over: dict[str, Any], alphas: Sequence[float]) -> dict[str, Any]:
    """MODELLED speedups by exit layer: the i.i.d. model of ``eesd_bench.modelled`` on these costs."""
    per_round, per_draft = max(over["per_round"], 0.0), max(over["per_draft"], 0.0)
    by_layer = {}
    for n, passes in timings["draft"].items():
        costs = RoundCosts(
            draft_step=passes["exit_head"]["median"] + per_draft,
            propose_base=per_round + passes["lower"]["median"],
            verify=[t["median"] for t in passes["tail"]],
        )
        best = [dict(zip(("k", "speedup"), costs.best(alpha), strict=True)) for alpha in alphas]
        by_layer[n] = {
            "costs": {
                "draft_step": costs.draft_step,
                "propose_base": costs.propose_base,
                "verify": costs.verify,
            },
            "best": [{"alpha": alpha, **b} for alpha, b in zip(alphas, best, strict=True)],
            "break_even": {str(k): costs.break_even(k) for k in range(1, MAX_K + 1)},
        }
    return {
        "note": MODEL_NOTE,
        "alphas": list(alphas),
        "by_exit_layer": by_layer,
    }


def checks(timings: dict[str, Any], over: dict[str, Any], floor: dict[str, float]) -> list[dict[str, Any]]:
    verify = [v["median"] for v in timings["verify"]]
    rows = verify[MAX_K] / verify[0]
    bound = verify[0] / (floor["weight_bytes"] / floor["copy_bandwidth"])
    worst = max(o["of_plain"] for o in over["by_k"].values())
    ks = ", ".join(over["by_k"])
    return [
        {
            "name": f"verification of k+1 <= 9 rows within {VERIFY_LIMIT}x of one row",
            "measure": "verify(9) / verify(1)",
            "ratio": rows,
            "limit": VERIFY_LIMIT,
            "pass": rows <= VERIFY_LIMIT,
        },
        {
            "name": f"per-round overhead under {OVERHEAD_LIMIT:.0%} of a plain step",
            "measure": f"max over k in {ks} of overhead(k) / plain step",
            "ratio": worst,
            "limit": OVERHEAD_LIMIT,
            "pass": worst <= OVERHEAD_LIMIT,
        },
        {
            "name": f"a plain step within {MEMORY_LIMIT}x of reading the weights at the copy bandwidth",
            "measure": "plain step / (weight bytes / copy bandwidth)",
            "ratio": bound,
            "limit": MEMORY_LIMIT,
            "pass": bound <= MEMORY_LIMIT,
        },
    ]


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def report(result: dict[str, Any]) -> list[str]:
    """The human-readable table: timings in ms, then the MODELLED speedups, then the checks."""
    t, over = result["timings"], result["overhead"]
    plain = t["plain_step"]["median"]
    lines = [
        f"cost curves: {result['shape']}, {result['layers']} of {result['full_layers']} layers, "
        f"{result['device']} {result['dtype']}, {result['threads']} thread(s), passes {result['compile']}; "
        f"context {result['context']}; "
        f"median of {result['repeats']} after {WARMUP} warm-up runs; ms",
        f"plain step (eesd, one position)        {ms(plain)}",
        f"transformers forward (one token)       {ms(t['hf_forward']['median'])}"
        f"  ({t['hf_forward']['median'] / plain:.2f}x eesd's)",
        "verification over m positions (ms, and / one position):",
        "  m  " + "".join(f"{v['m']:>8d}" for v in t["verify"]),
        "  ms " + "".join(f"{ms(v['median']):>8s}" for v in t["verify"]),
        "  /1 " + "".join(f"{v['median'] / plain:>8.2f}" for v in t["verify"]),
        f"draft steps by exit layer N (exit head: top input, one exit layer, {result['head_vocab']} "
        "LM-head rows); then layers [N, L) + norm + head over m = 1..9:",
        "  N  exit head  untrained  [0, N)  " + "".join(f"{m:>8d}" for m in range(1, MAX_K + 2)),
    ]
    for n, d in t["draft"].items():
        tail = "".join(f"{ms(x['median']):>8s}" for x in d["tail"])
        lines.append(
            f"  {n:<3s}{ms(d['exit_head']['median']):>9s}{ms(d['untrained']['median']):>11s}"
            f"{ms(d['lower']['median']):>8s}  {tail}"
        )
    lines += [
        f"engine rounds, untrained exit at N = {over['exit_layer']}, fixed k, greedy, {result['tokens']} "
        "tokens (median over rounds):",
        "  k      round   passes  overhead  / plain step",
    ]
    for k, o in {"plain": over["plain"], **over["by_k"]}.items():
        lines.append(
            f"  {k:<5s} {ms(o['round']):>8s} {ms(o['passes']):>8s} {ms(o['overhead']):>9s}"
            f"  {o['of_plain']:>10.3f}"
        )
    lines += [
        f"  fitted over k: {ms(over['per_round'])} ms a round + {ms(over['per_draft'])} ms a draft",
        f"  derived as: {over['derivation']}.",
        "MODELLED speedup (not timed; i.i.d. acceptance alpha; best k in 0..8, k = 0 is plain):",
        "  alpha " + "".join(f"{'N = ' + n:>14s}" for n in result["modelled"]["by_exit_layer"]),
    ]
    layers = result["modelled"]["by_exit_layer"].values()
    for i, alpha in enumerate(result["modelled"]["alphas"]):
        cells = [f"k={m['best'][i]['k']} {m['best'][i]['speedup']:.2f}x" for m in layers]
        lines.append(f"  {alpha:<5.2f} " + "".join(f"{c:>14s}" for c in cells) + "  MODELLED")
    even = ", ".join(
        f"N = {n}: {'never' if m['break_even']['1'] is None else format(m['break_even']['1'], '.2f')}"
        for n, m in result["modelled"]["by_exit_layer"].items()
    )
    lines.append(f"  alpha at which k = 1 breaks even (MODELLED): {even}")
    lines.append("checks:")
    for check in result["checks"]:
        verdict = "PASS" if check["pass"] else "FAIL"
        lines.append(f"  {check['name']}: {check['measure']} = {check['ratio']:.3f}  {verdict}")
    return lines


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` atomically: a temporary file beside it, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the result is for anyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def numbers(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cost_curves.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--layers", type=int, help="keep only the first L decoder layers (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=512, help="cached positions before each pass")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--exit-layers", type=numbers(int), help="comma list (default 2,4,6,8 below L)")
    parser.add_argument("--subset", type=int, default=8192, help="LM-head rows of the exit head (0: all)")
    parser.add_argument("--exit-mlp-width", type=int, help="hidden units of the exit layer's MLP")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens of each timed generation")
    parser.add_argument("--alpha", type=numbers(float), default=[], help="more acceptance rates to model")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--compile", default="off", help="how the adapter runs passes: off (eager), static or graphs (CUDA)"
    )
    parser.add_argument("--out", type=Path, help="write every timing here as JSON")
    add_sdpa_argument(parser)
    args = parser.parse_args(argv)
    try:
        args.device, args.dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    except ConfigError as exc:
        parser.error(str(exc))
    full = SHAPES[args.shape][1]["num_hidden_layers"]
    args.full_layers, args.layers = full, args.layers or full
    if not 2 <= args.layers <= full:
        parser.error(f"--layers must be 2..{full} for {args.shape} (an exit layer needs one above it)")
    if args.exit_layers is None:
        args.exit_layers = [n for n in (2, 4, 6, 8) if n < args.layers] or [1]
    if not args.exit_layers or not all(1 <= n < args.layers for n in args.exit_layers):
        parser.error(f"--exit-layers must be in 1..{args.layers - 1}")
    width = SHAPES[args.shape][1]["intermediate_size"]
    if args.exit_mlp_width is not None and not 1 <= args.exit_mlp_width <= width:
        parser.error(f"--exit-mlp-width must be in 1..{width}")
    if min(args.context, args.repeats, args.threads or 1) < 1 or args.subset < 0:
        parser.error("--context, --repeats and --threads must be at least 1, --subset at least 0")
    if args.tokens < 2 * (MAX_K + 1):
        parser.error(f"--tokens must be at least {2 * (MAX_K + 1)}, so that rounds of k = {MAX_K} are timed")
    if not all(0.0 <= a <= 1.0 for a in args.alpha):
        parser.error("--alpha values are acceptance rates in [0, 1]")
    args.alphas = sorted(set(ALPHAS) | set(args.alpha))
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock(args.device)
    model = build_model(args.shape, args.layers, args.device, args.dtype)
    adapter = SpeculativeDecoder(model, drafter=None, adapter_options={"compile": args.compile}).adapter
    with attention_kernels(args.sdpa):
        with torch.inference_mode():
            timings = measure_passes(model, adapter, args, clock)
            floor = memory(model, args.device, clock, args.repeats)
        rounds = measure_rounds(model, args, clock)
    over = overhead(timings, rounds)
    env = environment(model, args.shape)
    if args.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(args.device)
    result = {
        "shape": args.shape,
        "model_class": SHAPES[args.shape][0],
        "config": {**SHAPES[args.shape][1], "num_hidden_layers": args.layers},
        "layers": args.layers,
        "full_layers": args.full_layers,
        "device": str(args.device),
        "dtype": str(args.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "sdpa": args.sdpa,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attention": model.config._attn_implementation,
        "products": products_of(adapter),
        "compile": args.compile,
        "repeats": args.repeats,
        "warmup": WARMUP,
        "context": args.context,
        "tokens": args.tokens,
        "exit_layers": args.exit_layers,
        "head_vocab": args.subset if 0 < args.subset < adapter.vocab_size else adapter.vocab_size,
        "exit_mlp_width": args.exit_mlp_width,
        "environment": env,
        "timings": {**timings, "rounds": rounds},
        "overhead": over,
        "modelled": modelled(timings, over, args.alphas),
        "memory": floor,
        "checks": checks(timings, over, floor),
    }
    print("\n".join(report(result)))
    if args.out is not None:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
