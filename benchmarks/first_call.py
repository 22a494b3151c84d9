"""The first `eesd generate` of a machine: how long until the first token, and what timing the
linear products cost.

Runs the `eesd generate` command of one or two installs (each a Python whose environment has eesd
installed, e.g. a virtualenv with another commit's tree) as a new user would: a fresh cache folder
(``EESD_CACHE_DIR``, so no decisions of earlier processes), the checkpoint given by path, greedy.
Each repeat runs, per install, a first call in a fresh cache folder, a second call in the same
folder (which finds the decisions the first left, and may time what the first left undecided),
``--later`` more calls there (what a process pays once the decisions have settled: reading them,
re-checking them, timing what earlier ones left) and one with ``EESD_PRODUCTS=standard``
(``F.linear``, nothing timed; an install that does not know the variable reads the decisions on
disk); the installs take turns. It reads the time
of the first byte the command writes to stdout (the first token, streamed) and of its exit, and
keeps what the command wrote to stderr. What the product timing cost is the first call's time to
the first token less the last's (both load the model and run the same prefill); the table shows
medians over repeats.

    python benchmarks/first_call.py --model ~/.cache/eesd/models/smollm2-135m-instruct \\
        --other /path/to/venv-of-base/bin/python --repeats 2 --json results/first-call.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PROMPT = "List three things to check before a long bicycle ride, one line each."


def first_call(
    python: str, model: str, cache: Path, new: int, threads: int, standard: bool
) -> dict[str, Any]:
    """One `eesd generate` through ``python``: seconds to its first stdout byte and to its exit."""
    command = [python, "-P", "-m", "eesd_core.cli", "generate", PROMPT, "--model", model]
    command += ["--max-new-tokens", str(new), "--temperature", "0"]
    env = dict(os.environ, EESD_CACHE_DIR=str(cache), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.pop("EESD_PRODUCTS_DIR", None)
    env.pop("EESD_PRODUCTS", None)
    if standard:
        env["EESD_PRODUCTS"] = "standard"
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    first, out, err = None, b"", b""
    streams = {process.stdout.fileno(): "out", process.stderr.fileno(): "err"}
    while streams:
        ready, _, _ = select.select(list(streams), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del streams[fd]
            elif streams[fd] == "out":
                first = time.perf_counter() - start if first is None and chunk.strip() else first
                out += chunk
            else:
                err += chunk
    code = process.wait()
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}:\n{err.decode(errors='replace')}")
    return {
        "first_token_s": first,
        "total_s": seconds,
        "stderr": err.decode(errors="replace").splitlines(),
        "text": out.decode(errors="replace"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--this", default=sys.executable, help="this install's Python (default: this one)")
    parser.add_argument("--other", default=None, help="another install's Python, run in turn with this one")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--later", type=int, default=3, help="calls after the second, in the same folder")
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = parser.parse_args()
    model = str(Path(args.model).expanduser().resolve())
    installs = {"this": args.this} | ({"other": args.other} if args.other else {})
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        order = list(installs) if repeat % 2 == 0 else list(reversed(installs))
        for name in order:
            with tempfile.TemporaryDirectory(prefix="eesd-first-call-") as cache:
                for call in ("first", "second", *["later"] * args.later, "standard"):
                    print(
                        f"repeat {repeat + 1}/{args.repeats}: {name}, {call} call",
                        file=sys.stderr,
                        flush=True,
                    )
                    got = first_call(
                        installs[name],
                        model,
                        Path(cache),
                        args.max_new_tokens,
                        args.threads,
                        call == "standard",
                    )
                    runs.append(dict(got, install=name, call=call, repeat=repeat))
                    for line in got["stderr"]:
                        print(f"    {line}", file=sys.stderr)
    summary: dict[str, Any] = {}
    for name in installs:

        def median(call: str, key: str, name: str = name) -> float:
            return statistics.median(r[key] for r in runs if (r["install"], r["call"]) == (name, call))

        costs = [
            first["first_token_s"] - standard["first_token_s"]
            for first, standard in zip(
                (r for r in runs if (r["install"], r["call"]) == (name, "first")),
                (r for r in runs if (r["install"], r["call"]) == (name, "standard")),
                strict=True,
            )
        ]
        later = [r for r in runs if (r["install"], r["call"]) == (name, "later")]
        # the last of the later calls of each repeat: what a process pays once settled
        last = [
            [r for r in later if r["repeat"] == repeat][-1]["first_token_s"]
            for repeat in range(args.repeats)
            if later
        ]
        summary[name] = {
            "first_call_first_token_s": median("first", "first_token_s"),
            "second_call_first_token_s": median("second", "first_token_s"),
            "last_call_first_token_s": statistics.median(last) if last else None,
            "standard_call_first_token_s": median("standard", "first_token_s"),
            "product_timing_s": statistics.median(costs),
            "first_call_total_s": median("first", "total_s"),
        }
        s = summary[name]
        print(
            f"{name:6s} first call: first token {s['first_call_first_token_s']:.1f} s; second call: "
            f"{s['second_call_first_token_s']:.1f} s; "
            + (f"call {args.later + 2}: {s['last_call_first_token_s']:.1f} s; " if args.later else "")
            + f"F.linear: {s['standard_call_first_token_s']:.1f} s; "
            f"product timing {s['product_timing_s']:.1f} s "
            f"(median of {args.repeats})"
        )
    texts = {r["text"] for r in runs}
    print("every output equal" if len(texts) == 1 else "OUTPUTS DIFFER")
    if args.json is not None:
        record = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "installs": installs,
            "settings": vars(args) | {"json": str(args.json), "model": model, "prompt": PROMPT},
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "cpus": os.cpu_count(),
            },
            "summary": summary,
            "runs": runs,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if len(texts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
