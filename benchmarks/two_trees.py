"""Two installs of eesd side by side: the same methods, prompts and model, taking turns.

A regression check across commits: one worker process per install (its own Python, e.g. a
virtualenv with another commit's tree installed), both alive for the whole run, each holding the
model; the driver asks them in turn, prompt after prompt and repeat after repeat, to decode one
prompt with one method, so that a drift of the machine's load falls on both alike. Every output
is compared token for token across the two installs. The table gives median tokens per second per
install and method, and the median over prompts of the per-prompt ratio (this install over the
other), each prompt's ratio the median of its repeats paired back to back.

    python benchmarks/two_trees.py --other /path/to/venv-of-base/bin/python \\
        --model smollm2-135m-instruct --methods plain default --prompts 8 --repeats 3

Exit status 1 if an output differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from never_slower import PROMPTS  # noqa: E402

WORKER = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from eesd_core import SpeculativeDecoder
from eesd_core.registry import resolve_model
path = resolve_model(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
methods = {"plain": dict(drafter=None), "default": {}}
decoders = {name: SpeculativeDecoder(model, **methods[name]) for name in sys.argv[3].split(",")}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    ids = tok.apply_chat_template([{"role": "user", "content": job["prompt"]}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    start = time.perf_counter()
    out = decoders[job["method"]].generate(ids, max_new_tokens=job["new"], temperature=0.0)
    seconds = time.perf_counter() - start
    tokens = out.sequences[0, len(ids):].tolist()
    print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)
"""


class Worker:
    """One install's process: decodes what it is sent, one job a line."""

    def __init__(self, python: str, model: str, threads: int, methods: list[str]) -> None:
        command = [python, "-P", "-c", WORKER, model, str(threads), ",".join(methods)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.read()

    def read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit(f"a worker stopped (exit {self.process.wait()}): see its messages above")
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self, method: str, prompt: str, new: int) -> dict[str, Any]:
        self.process.stdin.write(json.dumps({"method": method, "prompt": prompt, "new": new}) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", required=True, help="the Python executable of the other install")
    parser.add_argument("--this", default=sys.executable, help="this install's Python (default: this one)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="checkpoint directory or model name")
    parser.add_argument("--methods", nargs="+", default=["plain"], choices=["plain", "default"])
    parser.add_argument(
        "--prompts", type=int, default=8, help=f"how many of never_slower's {len(PROMPTS)} prompts"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = parser.parse_args()
    installs = {"this": args.this, "other": args.other}
    print(f"starting {', '.join(f'{k}: {v}' for k, v in installs.items())}", file=sys.stderr, flush=True)
    workers = {
        name: Worker(python, args.model, args.threads, args.methods) for name, python in installs.items()
    }
    prompts = PROMPTS[: args.prompts]
    for method in args.methods:  # warm-up: one-time costs (product timing, first passes) are not timed
        for worker in workers.values():
            worker.run(method, prompts[0][1], 8)
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for index, (_, text) in enumerate(prompts):
            for method in args.methods:
                order = list(workers) if (repeat + index) % 2 == 0 else list(reversed(workers))
                for name in order:
                    got = workers[name].run(method, text, args.max_new_tokens)
                    runs.append(dict(got, install=name, method=method, prompt=index, repeat=repeat))
            print(f"  repeat {repeat + 1}/{args.repeats}, prompt {index + 1}/{len(prompts)}", file=sys.stderr)
    for worker in workers.values():
        worker.process.stdin.close()  # type: ignore[union-attr]
        worker.process.wait()

    def speed(install: str, method: str, prompt: int, repeat: int) -> float:
        run = next(
            r
            for r in runs
            if (r["install"], r["method"], r["prompt"], r["repeat"]) == (install, method, prompt, repeat)
        )
        return len(run["tokens"]) / run["seconds"]

    mismatches = [
        f"{r['method']} prompt {r['prompt'] + 1}"
        for r in runs
        if r["install"] == "this"
        and r["tokens"]
        != next(
            o["tokens"]
            for o in runs
            if o["install"] == "other"
            and (o["method"], o["prompt"], o["repeat"]) == (r["method"], r["prompt"], r["repeat"])
        )
    ]
    summary: dict[str, Any] = {}
    for method in args.methods:
        ratios = [
            statistics.median(
                speed("this", method, p, r) / speed("other", method, p, r) for r in range(args.repeats)
            )
            for p in range(len(prompts))
        ]
        medians = {
            i: statistics.median(
                speed(i, method, p, r) for p in range(len(prompts)) for r in range(args.repeats)
            )
            for i in workers
        }
        summary[method] = {
            "this_over_other": statistics.median(ratios),
            "per_prompt": ratios,
            "tokens_per_second": medians,
        }
        print(
            f"{method:8s} this {medians['this']:.2f} tok/s, other {medians['other']:.2f} tok/s; "
            f"this/other median over prompts {statistics.median(ratios):.3f} "
            f"(prompts {min(ratios):.3f} .. {max(ratios):.3f})"
        )
    print("all outputs equal" if not mismatches else f"OUTPUT MISMATCH: {'; '.join(mismatches)}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "command": " ".join(sys.argv),
                    "installs": installs,
                    "settings": vars(args) | {"json": str(args.json), "other": args.other, "this": args.this},
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
                default=str,
            )
        )
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
