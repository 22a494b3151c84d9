"""The eesd vLLM proposer alone, on vLLM's engine steps replayed from the target's greedy replies.

What a serving run spends splits in two: vLLM's passes, and the proposer's own time between them.
This replays the steps the proposer would see in vLLM (``propose`` with each request's sampled
tokens and all its tokens; for a top-input head, the last-layer states of what the step's pass
fed), and stands in for vLLM's pass: a step keeps the drafts that equal the target's greedy reply
and adds the reply's next token, as vLLM's greedy rejection sampler does, then sleeps for the pass's
modelled time, ``--pass-ms`` a + b * (tokens fed) (+ c when the step verifies drafts). The proposer's
controller thus sees the costs it would see in vLLM, from the same clock. The defaults are vLLM's CPU
build serving Qwen2.5-Coder-1.5B-Instruct on a 2-thread Intel Xeon (plain steps of 1 and 4 requests
took 261 and 300 ms, a step verifying 7.7 positions 389 ms); measure your own with
``vllm_serving.py``.

It needs no vLLM: the replies and the target's states come from transformers, once per prompt set,
kept in eesd's cache. Each concurrency level runs its prompts in waves of c requests, as
``vllm_serving.py`` does, and prints tokens per second against plain steps under the same model
(the proposer's time counted, the pass slept), the proposer's milliseconds per step, acceptance
and drafts per request-step; ``--profile`` adds cProfile's top functions of the proposer.

    python benchmarks/proposer_replay.py --model qwen2.5-coder-1.5b-instruct \\
        --questions benchmarks/results/qwen2.5-coder-1.5b-instruct-sampled-head-8pc-greedy-questions.jsonl \\
        --prompts 4 --concurrency 1 4 --max-tokens 64 --k 4
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_serving import encode  # noqa: E402


def replies(path: str, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], torch.Tensor]]:
    """Each prompt's greedy reply and the target's last-layer states (before its final norm) at
    every position of prompt + reply, from transformers; kept in eesd's cache."""
    from eesd_core.config import default_cache_dir

    key = hashlib.sha256(json.dumps([path, prompts, max_tokens]).encode()).hexdigest()[:20]
    store = default_cache_dir() / "replay" / f"{key}.pt"
    if store.is_file():
        return torch.load(store)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    seen: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda m, args, out: seen.append(args[0][0].clone()))
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            reply = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            reply = reply[0, len(prompt) :].tolist()
            seen.clear()
            model(torch.tensor([prompt + reply]))
            out.append((reply, seen[-1]))
            print(f"reply of {len(reply)} tokens", file=sys.stderr)
    hook.remove()
    store.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, store.with_suffix(".tmp"))
    store.with_suffix(".tmp").replace(store)
    return out


class Served:
    """The prompts' requests, vLLM's steps replayed."""

    def __init__(self, prompts: list[list[int]], data: list[tuple[list[int], torch.Tensor]], max_tokens: int):
        self.prompts, self.data, self.max_tokens = prompts, data, max_tokens
        self.made: list[list[int]] = [[] for _ in prompts]

    def admit(self, i: int) -> tuple[int, list[int]]:
        """Request i's prefill: its prompt fed, a first token sampled."""
        self.made[i] = [self.data[i][0][0]]
        return 0, list(self.prompts[i])

    def done(self, i: int) -> bool:
        """Request i has its max_tokens, or its whole reply (one that ended at an EOS)."""
        return len(self.made[i]) >= min(self.max_tokens, len(self.data[i][0]))

    def step_inputs(self, rows: list[int], fed: dict[int, tuple[int, list[int]]]) -> tuple:
        """What ``propose`` gets, and the forward the step's pass made (ids, positions, starts, states)."""
        lengths, ids, positions, starts, states = [], [], [], [0], []
        width = max(len(self.prompts[i]) + len(self.made[i]) for i in rows)
        table = np.zeros((len(rows), width + 8), dtype=np.int64)
        for j, i in enumerate(rows):
            tokens = self.prompts[i] + self.made[i]
            table[j, : len(tokens)] = tokens
            lengths.append(len(tokens))
            first, feed = fed[i]
            ids += feed
            positions += list(range(first, first + len(feed)))
            starts.append(starts[-1] + len(feed))
            got = self.data[i][1][first : first + len(feed)]
            if len(got) < len(feed):  # positions past the reply: rejected, states never read
                got = torch.cat([got, torch.zeros(len(feed) - len(got), got.shape[1])])
            states.append(got)
        forward = (np.array(ids), np.array(positions), np.array(starts), torch.cat(states))
        return np.array(lengths), table, forward


def run_level(
    proposer, prompts, data, c: int, max_tokens: int, pass_ms: tuple[float, float, float], in_flight: bool
):
    """Every prompt served at concurrency c: in waves of c requests, or (``in_flight``) with a
    new request admitted whenever one finishes. Prefills cost nothing here, for either method."""
    a, b, extra = pass_ms
    totals = dict(tokens=0, seconds=0.0, plain_seconds=0.0, steps=0, propose=0.0)
    served = Served(prompts, data, max_tokens)
    queue = list(range(len(prompts)))
    rows: list[int] = []
    fed: dict[int, tuple[int, list[int]]] = {}
    sampled: dict[int, list[int]] = {}
    began = time.perf_counter()
    while queue or rows:
        if (in_flight and len(rows) < c) or not rows:
            while queue and len(rows) < c:
                i = queue.pop(0)
                fed[i] = served.admit(i)
                sampled[i] = list(served.made[i])
                rows.append(i)
        lengths, table, forward = served.step_inputs(rows, fed)
        proposer.observe_forward(*forward)
        t0 = time.perf_counter()
        out = proposer.propose([sampled[i] for i in rows], lengths, table)
        totals["propose"] += time.perf_counter() - t0
        # vLLM's pass: each row's pending token and its drafts
        positions = sum(1 + len(d) for d in out)
        time.sleep((a + b * positions + (extra if any(out) else 0.0)) / 1000)
        for i, drafts in zip(rows, out, strict=True):
            reply, done = served.data[i][0], len(served.made[i])
            kept = 0
            while kept < len(drafts) and done + kept < len(reply) and drafts[kept] == reply[done + kept]:
                kept += 1
            new = reply[done : done + kept + 1][: max_tokens - done]
            fed[i] = (len(served.prompts[i]) + done - 1, [(served.prompts[i] + served.made[i])[-1], *drafts])
            served.made[i] += new
            sampled[i] = new
        totals["steps"] += 1
        rows = [i for i in rows if not served.done(i)]
    totals["seconds"] = time.perf_counter() - began
    totals["tokens"] = sum(len(m) for m in served.made)
    # plain vLLM under the same admission: a request takes a step per token after its first
    needs = [min(max_tokens, len(reply)) - 1 for reply, _ in data]
    queue, live = list(range(len(prompts))), []  # type: list[int], list[int]
    while queue or live:
        if (in_flight and len(live) < c) or not live:
            while queue and len(live) < c:
                live.append(queue.pop(0))
        totals["plain_seconds"] += (a + b * len(live)) / 1000
        for i in live:
            needs[i] -= 1
        live = [i for i in live if needs[i] > 0]
    for i, made in enumerate(served.made):
        if made != served.data[i][0][:max_tokens]:  # up to max_tokens, or to its EOS
            raise AssertionError(f"request {i}: the replayed reply differs from the greedy one")
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--questions", default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--pass-ms", nargs=3, type=float, default=[245.0, 14.0, 35.0], metavar=("A", "B", "C")
    )
    parser.add_argument("--options", default="{}", help="eesd proposer options (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--in-flight", action="store_true", help="admit a request whenever one finishes (not in waves)"
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    path, prompts = encode(args.model, args.prompts, args.seed, args.questions)
    data = replies(path, prompts, args.max_tokens)
    from eesd_vllm.options import ProposerOptions
    from eesd_vllm.proposer import EarlyExitProposer

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=args.k),
        model_config=SimpleNamespace(max_model_len=2048, model=path, dtype=torch.float32, enforce_eager=True),
    )
    proposer = EarlyExitProposer(config, ProposerOptions(**json.loads(args.options)))
    print(proposer.describe(), file=sys.stderr)
    table = {}
    profiler = cProfile.Profile() if args.profile else None
    for c in args.concurrency:
        warm = min(c, 2)
        run_level(proposer, prompts[:warm], data[:warm], c, 16, tuple(args.pass_ms), args.in_flight)
        rows = []
        for _ in range(args.repeats):
            before = dict(proposer.stats)
            if profiler:
                profiler.enable()
            got = run_level(proposer, prompts, data, c, args.max_tokens, tuple(args.pass_ms), args.in_flight)
            if profiler:
                profiler.disable()
            stats = {k: proposer.stats[k] - before[k] for k in before}
            rows.append(
                dict(
                    vs_plain=got["plain_seconds"] / got["seconds"],
                    propose_ms_per_step=1000 * got["propose"] / got["steps"],
                    tokens_per_step=got["tokens"] / got["steps"],
                    acceptance=stats["accepted"] / max(stats["drafted"], 1),
                    drafts_per_request_step=stats["drafted"] / max(stats["rows"], 1),
                    joined_rounds=stats["joined_rounds"],
                )
            )
        summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        table[c] = dict(summary, repeats=rows)
        print(
            f"c={c}: {summary['vs_plain']:.3f}x plain (repeats "
            + ", ".join(f"{r['vs_plain']:.3f}" for r in rows)
            + f"), proposer {summary['propose_ms_per_step']:.1f} ms/step, acceptance "
            f"{summary['acceptance']:.2f}, drafts/request-step {summary['drafts_per_request_step']:.2f}",
        )
        if proposer.gate is not None:
            print(
                "  gate: "
                + "; ".join(
                    f"size {size}: gain {g['gain'] or 0:.3f} +- {min(g['error'], 9):.3f}, {g['steps']} steps"
                    + (", shut" if g["shut"] else "")
                    for size, g in proposer.gate.summary().items()
                )
                + f"; closed steps {proposer.gate.closed_steps}, probes {proposer.gate.probed_steps}"
            )
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    if args.out:
        result = dict(command=sys.argv, settings=vars(args), table=table)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
