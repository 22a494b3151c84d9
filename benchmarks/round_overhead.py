"""What a round that drafts nothing costs beyond a plain step, on a model whose step is all overhead.

A random Llama makes a decoding step short enough that the engine's own work per round shows: by
default 8 layers of hidden width 128 (a step of a few milliseconds on one CPU thread), or, with
``--shape smollm2``, SmolLM2-135M's shape (30 layers, width 576), which a GPU runs in about as
much time as it takes to launch its kernels. Three decoders on the same model, interleaved over
repeats, medians of the time per round:

* ``plain``: ``drafter=None``, one target pass per token;
* ``always_no``: the early-exit drafter (untrained exit) with a controller that never drafts, so
  every round is a plain step taken through the drafter's path (the target pass split at the
  exit layer, the layer-N states kept for later);
* ``thompson``: the default Thompson controller over the same drafter, which learns quickly that
  an untrained exit does not pay (the ``drafted`` column says how many tokens it drafted).

``--batch-size`` decodes that many ragged prompts (10 to 59 tokens, left-padded) in one call; 1
is a lone sequence. On a CUDA device every method also makes one untimed call with
``torch.cuda.set_sync_debug_mode("warn")`` on, and the table gives the operations per round that
waited for the device: where a step is bound by launching kernels, each of them leaves the device
idle while the host does the work that follows it.

    python benchmarks/round_overhead.py            # one sequence, 15 repeats of 200 tokens
    python benchmarks/round_overhead.py --batch-size 16 64 --max-new-tokens 64 --repeats 7
    python benchmarks/round_overhead.py --device cuda --dtype bfloat16 --shape smollm2 \\
        --batch-size 1 16 64 --max-new-tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from eesd_core import SpeculativeDecoder
from eesd_core.devices import resolve_device, resolve_dtype
from eesd_core.tools import add_device_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_curves import SHAPES as MODEL_SHAPES  # noqa: E402
from cost_curves import build_model  # noqa: E402

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": (
        "LlamaForCausalLM",
        dict(
            vocab_size=2000,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
        ),
    ),
    "smollm2": MODEL_SHAPES["smollm2-135m"],  # SmolLM2-135M's shape, random weights
}
EXIT_LAYER = {"tiny": 2, "smollm2": 6}


def ragged_prompts(rows: int, vocab: int) -> list[list[int]]:
    """``rows`` prompts of 10 to 59 random tokens, the same for a given ``rows``."""
    g = torch.Generator().manual_seed(rows)
    lengths = torch.randint(10, 60, (rows,), generator=g).tolist()
    return [torch.randint(5, vocab - 100, (n,), generator=g).tolist() for n in lengths]


def syncs_per_round(decoder: SpeculativeDecoder, prompt: Any, max_new_tokens: int) -> float:
    """Operations that waited for the CUDA device in one call, per round."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = decoder.generate(prompt, max_new_tokens=max_new_tokens, eos_token_id=[])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    waits = sum("synchroniz" in str(w.message) for w in seen)
    return waits / result.stats.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1], help="rows decoded together")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    add_device_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default: 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    shape = SHAPES[args.shape]
    model = build_model(shape, shape[1]["num_hidden_layers"], device, resolve_dtype(args.dtype))
    cuda = device.type == "cuda"
    early_exit = {"exit_layer": EXIT_LAYER[args.shape], "head": None}
    decoders = {
        "plain": SpeculativeDecoder(model, drafter=None),
        "always_no": SpeculativeDecoder(
            model, drafter_options=early_exit, controller="fixed", controller_options={"k": 0}
        ),
        "thompson": SpeculativeDecoder(model, drafter_options=early_exit),
    }
    print(f"{args.shape} shape, {device} {args.dtype}, {args.max_new_tokens} tokens, {args.repeats} repeats")
    table: list[dict[str, Any]] = []
    for rows in args.batch_size:
        prompts = ragged_prompts(rows, model.config.vocab_size)
        prompt: Any = prompts[0] if rows == 1 else prompts
        for dec in decoders.values():
            dec.generate(prompt, max_new_tokens=min(50, args.max_new_tokens), eos_token_id=[])
        per_round: dict[str, list[float]] = {name: [] for name in decoders}
        drafted = dict.fromkeys(decoders, 0)
        for _ in range(args.repeats):
            for name, dec in decoders.items():
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                result = dec.generate(prompt, max_new_tokens=args.max_new_tokens, eos_token_id=[])
                if cuda:
                    torch.cuda.synchronize()
                per_round[name].append((time.perf_counter() - start) / result.stats.rounds)
                drafted[name] += result.stats.drafted
        base = statistics.median(per_round["plain"])
        for name, times in per_round.items():
            m = statistics.median(times)
            line = (
                f"B={rows:<3d} {name:10s} {m * 1e3:8.3f} ms a round, {m / base:.3f}x plain, "
                f"{1e6 * (m - base):+6.0f} us, drafted {drafted[name]}"
            )
            row = dict(batch_size=rows, method=name, ms_a_round=m * 1e3, vs_plain=m / base)
            table.append(row | dict(drafted=drafted[name], repeats=[t * 1e3 for t in times]))
            if cuda:
                table[-1]["waits_a_round"] = syncs_per_round(decoders[name], prompt, args.max_new_tokens)
                line += f", {table[-1]['waits_a_round']:.1f} waits a round"
            print(line)
    if args.json is not None:
        summary = dict(shape=args.shape, device=str(device), dtype=args.dtype, threads=args.threads)
        summary |= dict(max_new_tokens=args.max_new_tokens, repeats=args.repeats, rows=table)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        args.json.write_text(
            json.dumps({"date": stamp, "command": " ".join(sys.argv)} | summary, indent=1) + "\n"
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
