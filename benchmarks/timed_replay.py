"""eesd plain against eesd default on a model shape with random weights, acceptance REPLAYED from a
recorded trace: every pass and every host step of every round run for real (eagerly or captured,
``--compile``), while the trace says what the drafts' confidences are and how many the target
accepts (:mod:`eesd_bench.timed`). Methods run side by side in one process, interleaved, at each
batch size; each batch's rows are the trace's prompts (cycled), as long as recorded and decoded for
as many tokens as the trace holds.

On a CUDA GPU, the 1.5B shape with the shipped trace's code prompts, eager and graphed::

    python benchmarks/timed_replay.py --shape qwen2.5-1.5b --device cuda --dtype bfloat16 \\
        --compile off graphs --categories own_code coding --batch-sizes 1 4 16 64 \\
        --out benchmarks/results/timed-replay-qwen2.5-1.5b-nvidia-h200.json

On a CPU, the plumbing on four layers::

    python benchmarks/timed_replay.py --shape qwen2.5-1.5b --layers 4 --compile off static --repeats 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from eesd_bench.env import environment, products_of
from eesd_bench.timed import Cursor, TraceDrafter, TraceVerifier, replay_prompts
from eesd_bench.trace import Trace
from eesd_early_exit.head import ExitHead
from eesd_early_exit.headfile import save_head

from eesd_core import SpeculativeDecoder
from eesd_core.devices import resolve_device, resolve_dtype

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent / "plugins" / "eesd_bench" / "traces" / "qwen2.5-coder-1.5b-instruct.json.gz"


def cost_curves() -> Any:
    """``benchmarks/cost_curves.py``, for its model shapes and its device clock."""
    spec = importlib.util.spec_from_file_location("cost_curves", HERE / "cost_curves.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def head_file(model: Any, trace: Trace, args: argparse.Namespace, folder: Path) -> Path:
    """An exit head shaped like the trace's (its exit layer; top input, a vocabulary subset and the
    MLP width as asked), random, written where the drafter can load it."""
    adapter = SpeculativeDecoder(model, drafter=None).adapter
    exit_layer = min(int(trace.meta.get("exit_layer", 4)), adapter.num_layers - 1)
    vocab = None
    if 0 < args.subset < adapter.vocab_size:
        vocab = torch.randperm(adapter.vocab_size, generator=torch.Generator().manual_seed(2))[: args.subset]
    with torch.inference_mode(False):
        head = ExitHead(adapter, exit_layer, vocab_ids=vocab, top_input=True, mlp_width=args.exit_mlp_width)
    return save_head(head.eval(), adapter, folder / "head.safetensors", dtype=adapter.dtype)


def decoders(model: Any, trace: Trace, args: argparse.Namespace, head: Path) -> dict[str, Any]:
    """``plain-<compile>`` and ``default-<compile>`` for each ``--compile`` choice; the defaults'
    drafter and verifier replaced by the trace's (:mod:`eesd_bench.timed`)."""
    found = {}
    for choice in args.compile:
        adapter = {"compile": choice}
        found[f"plain-{choice}"] = SpeculativeDecoder(model, drafter=None, adapter_options=adapter)
        controller = {"controller": args.controller, "controller_options": args.controller_options}
        dec = SpeculativeDecoder(
            model, drafter_options={"head": str(head)}, **controller, adapter_options=adapter
        )
        dec.drafter = TraceDrafter(dec.drafter, trace.prompts, dec.adapter.vocab_size)
        dec.verifier = TraceVerifier()
        found[f"default-{choice}"] = dec
    return found


def run(
    dec: Any, prompts: list[list[int]], traces: Sequence[Any], tokens: int, clock: Any
) -> tuple[float, float]:
    """Seconds of one greedy call over ``prompts`` (a batch where there are several), and the
    tokens its rows committed per round (mean over rows)."""
    cursors = [Cursor(trace) for trace in traces]
    batch = prompts if len(prompts) > 1 else prompts[0]
    rng = cursors if len(prompts) > 1 else cursors[0]
    start = clock()
    stats = dec.generate(batch, max_new_tokens=tokens, eos_token_id=[], rng=rng).stats
    seconds = clock() - start
    rows = getattr(stats, "rows", [stats])
    return seconds, statistics.fmean(row.new_tokens / max(row.rounds, 1) for row in rows)


def measure(decs: dict[str, Any], trace: Trace, args: argparse.Namespace, clock: Any) -> dict[str, Any]:
    """Per batch size, each method's seconds per token (median over repeats of every batch)."""
    picked = [p for p in trace.prompts if not args.categories or p.category in args.categories]
    prompts = replay_prompts(picked, next(iter(decs.values())).adapter.vocab_size)
    tokens = min(len(p.positions) for p in picked)
    # a row's prompt starts with FIRST_ID + its index among the picked traces
    for dec in decs.values():
        if isinstance(dec.drafter, TraceDrafter):
            dec.drafter.traces = picked
    results: dict[str, Any] = {}
    for size in args.batch_sizes:
        rows = [i % len(picked) for i in range(size)]
        batches = [rows] if size > 1 else [[i] for i in range(len(picked))]
        names = list(decs)
        for name in names:  # warm-up: each method captures its shapes (and times its products)
            run(decs[name], [prompts[i] for i in batches[0]], [picked[i] for i in batches[0]], tokens, clock)
        times: dict[str, list[float]] = {name: [] for name in names}
        per_round: dict[str, list[float]] = {name: [] for name in names}
        for repeat in range(args.repeats):
            for batch in batches:
                order = names[repeat % len(names) :] + names[: repeat % len(names)]
                for name in order:
                    rows = [prompts[i] for i in batch], [picked[i] for i in batch]
                    seconds, committed = run(decs[name], *rows, tokens, clock)
                    times[name].append(seconds / (tokens * len(batch)))
                    per_round[name].append(committed)
        per_token = {name: statistics.median(t) for name, t in times.items()}
        tokens_per_round = {name: statistics.fmean(c) for name, c in per_round.items()}
        results[str(size)] = {
            "seconds_per_token": per_token,
            "tokens_per_round": tokens_per_round,
            "times": times,
        }
    return {"prompts": [p.name or p.category for p in picked], "tokens": tokens, "by_batch": results}


def ratios(measured: dict[str, Any], choices: Sequence[str]) -> dict[str, dict[str, float]]:
    """default / plain per ``--compile`` choice, and each method captured against eager."""
    out: dict[str, dict[str, float]] = {}
    for size, entry in measured["by_batch"].items():
        t = entry["seconds_per_token"]
        found = {f"default/plain {c}": t[f"plain-{c}"] / t[f"default-{c}"] for c in choices}
        for c in choices[1:]:
            for kind in ("plain", "default"):
                found[f"{kind} {c}/{choices[0]}"] = t[f"{kind}-{choices[0]}"] / t[f"{kind}-{c}"]
        out[size] = found
    return out


def parse_args(argv: Sequence[str] | None, shapes: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(shapes), default="qwen2.5-1.5b")
    parser.add_argument("--layers", type=int, help="keep only the first L decoder layers (default: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--trace", type=Path, default=TRACE, help="a trace recorded with the real model")
    parser.add_argument(
        "--categories", nargs="*", default=[], help="the trace's prompts of these (default: all)"
    )
    parser.add_argument(
        "--compile", nargs="+", default=["off"], help="adapter compile choices, first the reference"
    )
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--controller", default="thompson", help="the default methods' controller")
    parser.add_argument("--controller-options", type=json.loads, default={}, help="a JSON object")
    parser.add_argument("--subset", type=int, default=8192, help="LM-head rows of the exit head (0: all)")
    parser.add_argument("--exit-mlp-width", type=int, help="hidden units of the exit layer's MLP")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    args.device, args.dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    if min(args.batch_sizes) < 1 or args.repeats < 1:
        parser.error("--batch-sizes and --repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    curves = cost_curves()
    args = parse_args(argv, list(curves.SHAPES))
    if args.threads:
        torch.set_num_threads(args.threads)
    trace = Trace.load(args.trace)
    full = curves.SHAPES[args.shape][1]["num_hidden_layers"]
    model = curves.build_model(args.shape, args.layers or full, args.device, args.dtype)
    clock = curves.Clock(args.device)
    with tempfile.TemporaryDirectory() as folder:
        decs = decoders(model, trace, args, head_file(model, trace, args, Path(folder)))
        measured = measure(decs, trace, args, clock)
    result = {
        "benchmark": "timed_replay",
        "shape": args.shape,
        "layers": args.layers or full,
        "device": str(args.device),
        "dtype": str(args.dtype).removeprefix("torch."),
        "trace": {"file": args.trace.name, **{k: trace.meta.get(k) for k in ("model", "head", "recorded")}},
        "categories": args.categories,
        "compile": args.compile,
        "controller": [args.controller, args.controller_options],
        "repeats": args.repeats,
        "passes": {name: products_of(dec.adapter) for name, dec in decs.items()},
        "environment": environment(model, args.shape),
        **measured,
        "ratios": ratios(measured, args.compile),
        "note": "acceptance and draft confidences REPLAYED from the trace; every pass and host step run here",
    }
    for size, found in result["ratios"].items():
        print(f"batch {size}: " + ", ".join(f"{name} {value:.3f}x" for name, value in found.items()))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
