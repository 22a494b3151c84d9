"""How long a user waits for ``eesd controllers evaluate`` over every shipped trace, and what it says.

Runs the command ``--repeats`` times as a fresh process (Python's start, the imports, loading the
traces and profiles, every replay: what a user waits for), all registered controllers on all shipped
traces under the shipped profiles of each trace's model shape, and prints the median wall time and
its ratio to ``--target`` seconds. The leaderboards of the last run are kept: with ``--record`` one
result file per trace model, ``evaluate-controllers-<model>-<machine>.json``, in ``--results``.

    python benchmarks/evaluate_controllers.py --repeats 3 --record
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eesd_bench.env import cpu_name, git_commit
from eesd_bench.tracefile import eesd_version

ROOT = Path(__file__).resolve().parents[1]
MACHINES = {"AMD EPYC": "amd-epyc", "Intel Xeon": "intel-xeon"}


def run_once(out: Path) -> float:
    """Seconds of one ``eesd controllers evaluate`` run writing into ``out``."""
    command = [sys.executable, "-m", "eesd_core.cli", "controllers", "evaluate", "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def thompson_verdict(board: dict[str, Any]) -> dict[str, Any]:
    """Thompson's time per token over the best fixed k in hindsight, by category."""
    ratios = board["vs_best_fixed"].get("thompson", {})
    groups = [g for g in board["categories"] if g != "all"]
    return {
        "ratio_by_category": ratios,
        "categories_matched_or_beaten": sum(ratios[g] <= 1.0 for g in groups),
        "categories": len(groups),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=30.0, help="seconds the run should stay under")
    parser.add_argument("--record", action="store_true", help="write the result files")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        seconds = []
        for i in range(args.repeats):
            seconds.append(run_once(Path(tmp)))
            print(f"run {i + 1}: {seconds[-1]:.2f} s", file=sys.stderr, flush=True)
        boards = json.loads((Path(tmp) / "leaderboard.json").read_text())["boards"]
    median = statistics.median(seconds)
    share = median / args.target
    print(
        f"eesd controllers evaluate: median {median:.2f} s of {args.repeats} runs, "
        f"{share:.3f} of {args.target:g} s"
    )
    environment = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "eesd": eesd_version(),
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "command": " ".join(["python", *sys.argv]),
    }
    timing = {
        "seconds": seconds,
        "median_seconds": median,
        "target_seconds": args.target,
        "median_over_target": median / args.target,
    }
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for board in boards:
        by_trace.setdefault(board["trace"], []).append(board)
    machine = MACHINES.get(cpu_name(), "amd-epyc")
    for trace, chosen in by_trace.items():
        result = {
            "benchmark": "evaluate_controllers",
            "environment": environment,
            "evaluated_command": "eesd controllers evaluate",
            "timing": timing,
            "trace": trace,
            "boards": chosen,
            "thompson_vs_best_fixed": {b["profile"]: thompson_verdict(b) for b in chosen},
        }
        for board in chosen:
            verdict = thompson_verdict(board)
            print(
                f"{trace} under {board['profile']}: thompson matches or beats the best fixed k in "
                f"{verdict['categories_matched_or_beaten']} of {verdict['categories']} categories"
            )
        if args.record:
            path = args.results / f"evaluate-controllers-{trace}-{machine}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
