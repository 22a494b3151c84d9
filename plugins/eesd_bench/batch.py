"""``eesd bench-batch``: throughput, per-row latency, greedy equality and memory at several batch sizes.

For batch size B the rows are the first B prompts of the pool (Spec-Bench first turns through the
chat template, categories taken in turn so that a batch mixes tasks; the pool repeats when it is
shorter than B), left-padded with the tokenizer's pad id (its EOS if it has none), as transformers
takes them. Every method makes one untimed warm-up generation at each B (a decoder chooses its
products for a batch size's passes the first time it meets it); then, for each B and repeat, the
methods run one after the other in an order that rotates by one place per repeat, each call timed
from outside with ``time.perf_counter``. Reported numbers are medians over the repeats:

- throughput: the new tokens of all rows (each row counted up to and including its EOS, never its
  padding) over the wall time of the call;
- per-row latency: the median over rows of the time until the row finished (transformers'
  ``generate()`` hands every row back when the call returns, so there it is the call's time);
- ratios of throughput to the baseline (``hf``) and to eesd plain, paired within each repeat.

Every row of every eesd run must equal transformers' greedy ``generate()`` on that row alone,
unpadded, token for token; a difference is listed and makes the command exit with status 1.
``--memory`` also runs each method once per B in a fresh process for its peak resident set, as
:mod:`eesd_bench.memory` measures it; ``python -m eesd_bench.batch`` is that child.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

from eesd_bench.helptext import DefaultsFormatter, plain_text
from eesd_bench.kernels import add_sdpa_argument, attention_kernels
from eesd_bench.methods import MethodSpec, expand_methods, parse_method
from eesd_bench.prompts import DEFAULT_QUESTIONS, Question, load_questions, select
from eesd_core.errors import ConfigError
from eesd_core.tools import add_device_arguments

SCHEMA = "eesd-bench-batch/1"
CPU_ONLY_MEMORY = (
    "memory not probed: the probe measures a fresh CPU process's peak resident memory, which says "
    "nothing of GPU memory; on a CUDA GPU every call's peak GPU memory is reported instead"
)
DEFAULT_SIZES = (1, 4, 16)
DEFAULT_METHODS = ("hf", "eesd_plain", "eesd_default")
BATCHED_KINDS = ("hf", "hf_static", "eesd")
WARMUP_TOKENS = 8


def add_batch(sub: Any) -> None:
    parser = sub.add_parser(
        "bench-batch",
        help="benchmark batched generation at several batch sizes",
        description=plain_text(__doc__),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="checkpoint directory or known model"
    )
    parser.add_argument("--cache-dir", default=None, help="where fetched models live (default: eesd's cache)")
    add_device_arguments(parser)
    parser.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="Spec-Bench question.jsonl")
    parser.add_argument(
        "--per-category", type=int, default=None, metavar="N", help="N questions a category (default: all)"
    )
    parser.add_argument(
        "--subset-seed",
        type=int,
        default=None,
        help="draw the N at random with this seed (default: the first N)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        metavar="B",
        help="batch sizes (add 64 for large batches; a size whose estimated footprint exceeds half "
        "of the available memory is skipped with a note)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="METHOD",
        help="hf, hf_static and eesd presets or specs (see eesd_bench.methods); others cannot run batched",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per method and batch size")
    parser.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="N for every early-exit method (default: the drafter's choice)",
    )
    parser.add_argument("--head", default="auto", help="exit-head file, 'none' or 'auto' (as eesd bench)")
    parser.add_argument("--max-draft-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--memory", action="store_true", help="probe peak memory in fresh processes (slow)")
    add_sdpa_argument(parser)
    parser.add_argument("--out", default=None, help="output directory (default benchmarks/out/batch-<time>)")
    parser.set_defaults(func=run_batch)


# -- batches ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """B rows: each row's index in the prompt pool, and the left-padded ``ids`` and ``mask`` [B, T]."""

    rows: tuple[int, ...]
    ids: Any
    mask: Any

    @property
    def size(self) -> int:
        return len(self.rows)


def interleave(questions: list[Question]) -> list[Question]:
    """The questions with categories taken in turn (first of each, second of each, ...)."""
    groups: dict[str, list[Question]] = {}
    for question in questions:
        groups.setdefault(question.category, []).append(question)
    depth = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(depth) for g in groups.values() if i < len(g)]


def left_pad(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    """``input_ids`` and ``attention_mask`` [B, T] with every row right-aligned, as transformers pads."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def make_batch(pool: list[list[int]], size: int, pad: int) -> Batch:
    rows = tuple(i % len(pool) for i in range(size))
    return Batch(rows, *left_pad([pool[i] for i in rows], pad))


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """A row's new tokens up to and including its first EOS; what follows is padding."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def eos_ids(model: Any) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def pad_id(tokenizer: Any, model: Any) -> int:
    """The tokenizer's pad id, else its EOS, else the model's first EOS."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, *eos_ids(model)):
        if candidate is not None:
            return int(candidate)
    raise ConfigError("The tokenizer has no pad or EOS token and the model no EOS: cannot pad a batch.")


# -- runners ----------------------------------------------------------------------------------------


@dataclass
class BatchOutput:
    """Each row's new tokens (to its EOS), the call's seconds, each row's finish time, counters."""

    rows: list[list[int]]
    seconds: float
    row_seconds: list[float]
    stats: dict[str, Any] = field(default_factory=dict)


class HFBatch:
    """transformers' batched greedy ``generate()``; every row comes back when the call returns.
    ``options`` are more of its keywords (a static cache's)."""

    def __init__(self, model: Any, pad: int, options: dict[str, Any] | None = None) -> None:
        from eesd_bench.runners import compiles

        self.model, self.pad, self.eos = model, pad, eos_ids(model)
        self.options = dict(options or {})
        self.compiles = compiles(model, self.options)

    def run(self, ids: Any, mask: Any, max_new_tokens: int) -> BatchOutput:
        if self.compiles:
            from eesd_bench.runners import say_compiling

            say_compiling()
            self.compiles = False
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        started = time.perf_counter()
        out = self.model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.pad,
            eos_token_id=self.eos or None,
            **self.options,
        )
        if out.device.type == "cuda":  # the clock stops when the GPU's work is done, as eesd's does
            import torch

            torch.cuda.synchronize(out.device)
        seconds = time.perf_counter() - started
        rows = [until_eos(row, set(self.eos)) for row in out[:, ids.shape[1] :].tolist()]
        return BatchOutput(rows, seconds, [seconds] * len(rows))

    def solo(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The greedy reply to ``prompt`` alone: the reference every batched row must equal."""
        import torch

        ids = torch.tensor([prompt], dtype=torch.long)
        return self.run(ids, torch.ones_like(ids), max_new_tokens).rows[0]


class EesdBatch:
    """A batched :class:`~eesd_core.SpeculativeDecoder`, kept for the whole run (controllers learn)."""

    def __init__(self, model: Any, spec: MethodSpec, settings: Any, pad: int) -> None:
        from eesd_bench.runners import eesd_kwargs
        from eesd_core import SpeculativeDecoder

        self.decoder = SpeculativeDecoder(model, **eesd_kwargs(spec, settings))
        self.pad, self.eos = pad, set(eos_ids(model))

    def run(self, ids: Any, mask: Any, max_new_tokens: int) -> BatchOutput:
        started = time.perf_counter()
        result: Any = self.decoder.generate(  # a BatchResult: ids and mask are [B, T]
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, temperature=0.0, pad_token_id=self.pad
        )
        seconds = time.perf_counter() - started
        rows = [until_eos(row, self.eos) for row in result.sequences[:, ids.shape[1] :].tolist()]
        per_row = result.stats.rows
        stats = {
            "rounds": result.stats.rounds,
            "row_rounds": sum(r.rounds for r in per_row),
            "drafted": sum(r.drafted for r in per_row),
            "accepted": sum(r.accepted for r in per_row),
            "withdrawn": sum(r.withdrawn for r in per_row),  # drafts taken back unverified
            "engine_new_tokens": sum(r.new_tokens for r in per_row),
        }
        return BatchOutput(rows, seconds, [r.total_time for r in per_row], stats)

    def cache_bytes(self, ids: Any, mask: Any, max_new_tokens: int) -> int:
        """Run once through ``stream`` and return the bytes its cache held."""
        generation = self.decoder.stream(ids, attention_mask=mask, max_new_tokens=max_new_tokens)
        for _ in generation:
            pass
        from eesd_bench.env import cache_bytes

        return cache_bytes(generation.cache)


def batched_methods(texts: list[str], registered: dict[str, list[str]]) -> tuple[list[MethodSpec], list[str]]:
    """The specs that can run batched, and notes on the ones left out."""
    specs, notes = expand_methods(texts, registered)
    kept = [s for s in specs if s.kind in BATCHED_KINDS]
    notes += [f"{s.name}: skipped, {s.kind} runs one row at a time" for s in specs if s not in kept]
    if not kept:
        raise ConfigError(f"None of {texts} runs batched: use hf, hf_static or eesd methods.")
    return kept, notes


def build(spec: MethodSpec, model: Any, settings: Any, pad: int) -> HFBatch | EesdBatch:
    if spec.kind == "eesd":
        return EesdBatch(model, spec, settings, pad)
    return HFBatch(model, pad, spec.generation_options())


# -- measuring --------------------------------------------------------------------------------------


def _sample(name: str, batch: Batch, repeat: int, out: BatchOutput) -> dict[str, Any]:
    new_tokens = sum(len(r) for r in out.rows)
    return {
        "method": name,
        "batch_size": batch.size,
        "repeat": repeat,
        "seconds": out.seconds,
        "new_tokens": new_tokens,
        "tokens_per_second": new_tokens / out.seconds if out.seconds > 0 else 0.0,
        "row_latency": median(out.row_seconds),
        "row_new_tokens": [len(r) for r in out.rows],
        "row_seconds": out.row_seconds,
        **out.stats,
    }


@contextmanager
def _gpu_peak() -> Iterator[dict[str, int]]:
    """On a CUDA GPU, fills ``peak_gpu_bytes``: the most memory the call allocated beyond what was
    allocated before it (the model, and nothing else the run keeps between calls)."""
    import torch

    found: dict[str, int] = {}
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        yield found
        return
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    yield found
    torch.cuda.synchronize()
    found["peak_gpu_bytes"] = torch.cuda.max_memory_allocated() - before


def measure(
    runners: dict[str, Any], batches: list[Batch], repeats: int, max_new_tokens: int
) -> tuple[list[dict[str, Any]], dict[tuple[str, int, int], list[list[int]]]]:
    """Samples of every method, batch and repeat (interleaved, rotating), and every row's tokens."""
    from eesd_bench.run import rotated

    samples, outputs = [], {}
    for index, batch in enumerate(batches):
        for runner in runners.values():  # one-time costs of this batch size (products, buffers)
            runner.run(batch.ids, batch.mask, min(max_new_tokens, WARMUP_TOKENS))
        for repeat in range(repeats):
            done = []
            for name in rotated(list(runners), index + repeat):
                with _gpu_peak() as peak:
                    out = runners[name].run(batch.ids, batch.mask, max_new_tokens)
                samples.append({**_sample(name, batch, repeat, out), **peak})
                outputs[name, batch.size, repeat] = out.rows
                done.append(f"{name} {samples[-1]['tokens_per_second']:.1f}")
            print(
                f"B={batch.size} repeat {repeat + 1}/{repeats}: {', '.join(done)} tokens/s", file=sys.stderr
            )
    return samples, outputs


def check(
    outputs: dict[tuple[str, int, int], list[list[int]]],
    batches: list[Batch],
    solo: dict[int, list[int]],
    checked: list[str],
    model: Any = None,
    prompts: list[list[int]] | None = None,
) -> list[dict[str, Any]]:
    """Every row of the ``checked`` methods' runs that differs from its solo greedy reply; in
    half precision a difference at a tie of the reference's top-2 logits is not one
    (:mod:`eesd_core.testing.agreement`)."""
    from eesd_bench.run import first_difference
    from eesd_core.testing.agreement import compare_greedy, logits_after

    rows_of = {b.size: b.rows for b in batches}
    wrong = []
    for (name, size, repeat), rows in outputs.items():
        for row, tokens in enumerate(rows if name in checked else []):
            index = rows_of[size][row]
            expected = solo[index]
            diff = first_difference(tokens, expected)
            if diff is not None and model is not None and prompts is not None:
                prompt = prompts[index]
                reference = lambda i, p=prompt, e=expected: logits_after(model, [*p, *e[:i]])  # noqa: E731
                if compare_greedy(expected, tokens, model.dtype, reference).tie:
                    continue
            if diff is not None:
                wrong.append(
                    dict(
                        method=name,
                        batch_size=size,
                        repeat=repeat,
                        row=row,
                        first_diff=diff,
                        tokens=tokens,
                        expected=expected,
                    )
                )
    return wrong


def _paired(samples: list[dict[str, Any]], size: int, name: str, other: str | None) -> float | None:
    """Median over repeats of ``name``'s throughput over ``other``'s in the same repeat."""
    tps = {(s["method"], s["repeat"]): s["tokens_per_second"] for s in samples if s["batch_size"] == size}
    ratios = [v / tps[other, r] for (m, r), v in tps.items() if m == name and tps.get((other, r))]
    return median(ratios) if ratios else None


def summarize(
    samples: list[dict[str, Any]], names: list[str], baseline: str | None, plain: str | None
) -> list[dict[str, Any]]:
    """One row per batch size and method: medians over repeats and the paired ratios."""
    table = []
    for size in sorted({s["batch_size"] for s in samples}):
        for name in names:
            mine = [s for s in samples if s["method"] == name and s["batch_size"] == size]
            rounds = sum(s.get("row_rounds", 0) for s in mine)
            table.append(
                {
                    "batch_size": size,
                    "method": name,
                    "repeats": len(mine),
                    "tokens_per_second": median(s["tokens_per_second"] for s in mine),
                    "seconds": median(s["seconds"] for s in mine),
                    "row_latency": median(s["row_latency"] for s in mine),
                    "new_tokens": median(s["new_tokens"] for s in mine),
                    "mean_accepted_tokens": sum(s["new_tokens"] for s in mine) / rounds if rounds else None,
                    "vs_baseline": _paired(samples, size, name, baseline),
                    "vs_plain": _paired(samples, size, name, plain),
                    "peak_gpu_bytes": _median_of(mine, "peak_gpu_bytes"),
                }
            )
    return table


def _median_of(samples: list[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return median(values) if values else None


def engine_notes(samples: list[dict[str, Any]]) -> list[str]:
    """Calls where the engine's own count of new tokens differs from the tokens it returned."""
    return [
        f"{s['method']} at B={s['batch_size']}, repeat {s['repeat']}: the engine counts "
        f"{s['engine_new_tokens']} new tokens, its sequences hold {s['new_tokens']} up to EOS"
        for s in samples
        if s.get("engine_new_tokens", s["new_tokens"]) != s["new_tokens"]
    ]


# -- memory -----------------------------------------------------------------------------------------


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; ``None`` where there is none (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def footprint(model: Any, size: int, width: int, settings: Any) -> int:
    """A generous estimate of the bytes a batch adds: KV cache, verify logits, prefill scores."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    slots = width + 2 * settings.max_new_tokens + 2 * (settings.max_draft_tokens + 1)
    kv = 2 * config.num_hidden_layers * kv_heads * head_dim * element * slots
    logits = 2 * (settings.max_draft_tokens + 1) * config.vocab_size * 4
    return size * (kv + logits + heads * width * width * 4)


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """The child's side: load, settle, generate once under :func:`eesd_bench.memory.peak_during`."""
    import torch
    from transformers import AutoModelForCausalLM

    from eesd_bench.memory import model_bytes, peak_during
    from eesd_bench.runners import BenchSettings

    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    dtype = getattr(torch, request.get("dtype", "float32"))
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=dtype).eval()
    settings = BenchSettings(**request["settings"])
    runner = build(parse_method(request["method"]), model, settings, request["pad"])
    with torch.inference_mode():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.sum()
    runner.run(*left_pad([request["prompts"][0][:8]], request["pad"]), 2)
    ids, mask = left_pad(request["prompts"], request["pad"])
    held: list[int] = []
    if isinstance(runner, EesdBatch):
        result = peak_during(lambda: held.append(runner.cache_bytes(ids, mask, settings.max_new_tokens)))
    else:
        result = peak_during(lambda: runner.run(ids, mask, settings.max_new_tokens))
    result.update(model_bytes=model_bytes(model), kv_cache_bytes=held[0] if held else None)
    return result


def probe_in_child(request: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """:func:`probe` in a fresh process; a failure comes back as ``{"error": ...}``."""
    from eesd_bench.memory import run_child

    return run_child("eesd_bench.batch", request, timeout)


# -- the page, the plot and the files ---------------------------------------------------------------


def _rss(memory: dict[str, Any], method: str | None, size: int) -> float | None:
    return (memory.get(method or "", {}).get(str(size)) or {}).get("peak_rss_delta_bytes")


def _table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    from eesd_bench.report import _fmt

    baseline, plain, memory = result["settings"]["baseline"], result["settings"]["plain"], result["memory"]
    header = ["B", "method", "tokens/s", f"x {baseline or 'hf'}", f"x {plain or 'eesd_plain'}"]
    header += ["row latency", "call", "new tokens", "mean accepted"]
    if memory:
        header += ["peak RSS delta", f"RSS x {baseline or 'hf'}"]
    gpu = any(row.get("peak_gpu_bytes") is not None for row in result["summary"])
    if gpu:
        header += ["peak GPU memory of the call"]
    rows = []
    for row in result["summary"]:
        cells = [str(row["batch_size"]), row["method"], _fmt(row["tokens_per_second"], ".1f")]
        cells += [_fmt(row["vs_baseline"], ".2f", "x"), _fmt(row["vs_plain"], ".2f", "x")]
        cells += [_fmt(row["row_latency"], ".3f", " s"), _fmt(row["seconds"], ".3f", " s")]
        cells += [_fmt(row["new_tokens"], ".0f"), _fmt(row["mean_accepted_tokens"])]
        if memory:
            mine, base = (
                _rss(memory, row["method"], row["batch_size"]),
                _rss(memory, baseline, row["batch_size"]),
            )
            cells += [
                _fmt(mine and mine / 2**20, ".1f", " MiB"),
                _fmt(mine / base if mine and base else None),
            ]
        if gpu:
            peak = row.get("peak_gpu_bytes")
            cells.append(_fmt(peak and peak / 2**20, ".1f", " MiB"))
        rows.append(cells)
    return header, rows


def markdown(result: dict[str, Any]) -> str:
    from eesd_bench.report import _table

    env, settings, wrong = result["environment"], result["settings"], result["mismatches"]
    lines = [
        f"# eesd batched benchmark: {env.get('model')}",
        "",
        f"{env.get('date')}; torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"{env.get('cpu')}, {env.get('threads')} threads; device {env.get('device')}, {env.get('dtype')}.",
        f"Greedy, {settings['max_new_tokens']} new tokens at most, {settings['prompts']} prompts in the "
        f"pool, {settings['repeats']} repeats (medians shown). Throughput counts each row's tokens up to "
        "its EOS; row latency is the median over rows of the time until a row finished; ratios are "
        "paired within a repeat.",
        *(
            [f"Short passes (eesd's products, chosen in this process): {env['products']}."]
            if env.get("products")
            else []
        ),
        "",
        "## Throughput and latency by batch size",
        "",
        *_table(*_table_rows(result)),
        "",
        "## Greedy equality",
        "",
        "Every row of every eesd run equals transformers' greedy reply to that row alone."
        if not wrong
        else f"Rows that differ from their solo greedy reply ({len(wrong)}): "
        + "; ".join(
            f"{w['method']} at B={w['batch_size']}, row {w['row']}, token {w['first_diff']}" for w in wrong
        ),
    ]
    lines += [line for note in result["notes"] for line in ("", f"Note: {note}")]
    return "\n".join(lines) + "\n"


def plot_throughput(summary: list[dict[str, Any]], path: Path) -> str | None:
    """Throughput against batch size, one line per method; return why not when not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'eesd[bench]'): no plot written"
    sizes = sorted({row["batch_size"] for row in summary})
    fig, ax = plt.subplots(figsize=(6.0, 4.5))
    for method in dict.fromkeys(row["method"] for row in summary):
        points = [(row["batch_size"], row["tokens_per_second"]) for row in summary if row["method"] == method]
        ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s (all rows)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    partial = path.with_name(f".{path.name}.partial")
    fig.savefig(partial, dpi=120, format="png")
    plt.close(fig)
    os.replace(partial, path)
    return None


def write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """``batch.json``, ``batch.md`` and, with matplotlib, ``batch.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "batch.json", out / "batch.md"]
    why_not = plot_throughput(result["summary"], out / "batch.png")
    if why_not:
        result["notes"].append(why_not)
    else:
        files.append(out / "batch.png")
    write_atomic(files[0], json.dumps(result, indent=1, default=str) + "\n")
    write_atomic(files[1], markdown(result))
    return files


# -- the command ------------------------------------------------------------------------------------


class BatchBench:
    """One batched benchmark: a model, its prompt pool and methods; :meth:`run` makes the result.

    The result is one JSON-ready dict: ``environment``, ``settings``, ``methods``, the question ids
    of each ``batches`` row, the ``summary`` (one row per batch size and method), the rows in
    ``mismatches``, ``memory`` when probed, ``notes`` and every raw ``samples`` record.
    """

    def __init__(
        self,
        model: Any,
        prompts: list[tuple[Question, list[int]]],
        specs: list[MethodSpec],
        settings: Any,
        pad: int,
        notes: list[str] | None = None,
        model_name: str | None = None,
    ) -> None:
        self.model, self.prompts, self.specs, self.settings, self.pad = model, prompts, specs, settings, pad
        self.notes = list(notes or [])
        self.model_name = model_name or str(getattr(model, "name_or_path", "") or type(model).__name__)
        self.batches: list[Batch] = []

    def plan(self, sizes: list[int]) -> list[Batch]:
        """A batch per size, leaving out (with a note) sizes that would not fit in memory."""
        batches, free = [], available_bytes()
        for size in sorted(set(sizes)):
            batch = make_batch([p for _, p in self.prompts], size, self.pad)
            need = footprint(self.model, size, batch.ids.shape[1], self.settings)
            if free is not None and need > free / 2:
                self.notes.append(
                    f"B={size} skipped: it may need {need / 2**30:.1f} GiB of {free / 2**30:.1f}"
                )
            else:
                batches.append(batch)
        if not batches:
            raise ConfigError("No batch size fits in the available memory: pass smaller --batch-sizes.")
        return batches

    def run(self, sizes: list[int], repeats: int = 3) -> dict[str, Any]:
        from eesd_bench.env import environment, products_of

        self.batches = self.plan(sizes)
        runners = {s.name: build(s, self.model, self.settings, self.pad) for s in self.specs}
        length = self.settings.max_new_tokens
        samples, outputs = measure(runners, self.batches, repeats, length)
        products = next(
            (products_of(r.decoder.adapter) for r in runners.values() if isinstance(r, EesdBatch)),
            None,
        )
        reference = HFBatch(self.model, self.pad)
        solo = {i: reference.solo(self.prompts[i][1], length) for b in self.batches for i in b.rows}
        eesd = [s.name for s in self.specs if s.kind == "eesd"]
        wrong = check(outputs, self.batches, solo, eesd, self.model, [p for _, p in self.prompts])
        names = [s.name for s in self.specs]
        baseline = "hf" if "hf" in names else None
        plain = next(
            (s.name for s in self.specs if s.kind == "eesd" and not s.decoder_kwargs()["drafter"]), None
        )
        return {
            "schema": SCHEMA,
            "environment": {**environment(self.model, self.model_name), "products": products},
            "settings": {
                **asdict(self.settings),
                "prompts": len(self.prompts),
                "batch_sizes": [b.size for b in self.batches],
                "repeats": repeats,
                "pad_token_id": self.pad,
                "eos_token_id": eos_ids(self.model),
                "baseline": baseline,
                "plain": plain,
            },
            "methods": [{"name": s.name, "kind": s.kind, "options": s.options} for s in self.specs],
            "batches": {str(b.size): [self.prompts[i][0].question_id for i in b.rows] for b in self.batches},
            "summary": summarize(samples, names, baseline, plain),
            "mismatches": wrong,
            "memory": None,
            "notes": [*self.notes, *engine_notes(samples)],
            "samples": samples,
        }

    def add_memory(self, result: dict[str, Any], model_path: str, dtype: str, threads: int | None) -> None:
        """``result["memory"][method][str(B)]``: a probe per method and batch size, each in a fresh
        process."""
        request = dict(
            model=model_path, pad=self.pad, settings=asdict(self.settings), dtype=dtype, threads=threads
        )
        result["memory"] = {}
        for spec in self.specs:
            for batch in self.batches:
                prompts = [self.prompts[i][1] for i in batch.rows]
                probed = probe_in_child({**request, "method": spec.name, "prompts": prompts})
                result["memory"].setdefault(spec.name, {})[str(batch.size)] = probed
                if "error" in probed:
                    result["notes"].append(
                        f"memory probe of {spec.name} at B={batch.size}: {probed['error']}"
                    )


def run_batch(args: argparse.Namespace) -> int:
    from eesd_bench.cli import _head, _load, _registered, benchmarks_dir
    from eesd_bench.runners import BenchSettings
    from eesd_core.tools import encode_prompt

    specs, notes = batched_methods(args.methods, _registered())
    questions = interleave(select(load_questions(args.questions), args.per_category, args.subset_seed))
    model, tokenizer, path = _load(args)
    head = _head(args.head, path, args.exit_layer)
    settings = BenchSettings(args.max_new_tokens, 0.0, 0, args.exit_layer, head, args.max_draft_tokens)
    prompts = [(q, encode_prompt(tokenizer, q.text)) for q in questions]
    bench = BatchBench(model, prompts, specs, settings, pad_id(tokenizer, model), notes, args.model)
    with attention_kernels(args.sdpa):
        result = bench.run(args.batch_sizes, args.repeats)
    result["settings"].update(
        model=str(path),
        sdpa=args.sdpa,
        dtype=args.dtype,
        questions=args.questions,
        per_category=args.per_category,
        subset_seed=args.subset_seed,
    )
    if args.memory and model.device.type != "cpu":
        result["notes"].append(CPU_ONLY_MEMORY)
    elif args.memory:
        bench.add_memory(result, str(path), args.dtype, args.threads)
    stamp = datetime.now().strftime("batch-%Y%m%d-%H%M%S")
    files = write(result, Path(args.out) if args.out else benchmarks_dir() / "out" / stamp)
    print(markdown(result))
    for file in files:
        print(f"wrote {file}", file=sys.stderr)
    for w in result["mismatches"]:
        print(
            f"mismatch: {w['method']} at B={w['batch_size']}, repeat {w['repeat'] + 1}, row {w['row']}: "
            f"first difference at token {w['first_diff']}",
            file=sys.stderr,
        )
    return 1 if result["mismatches"] else 0


def main() -> None:
    print(json.dumps(probe(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()
