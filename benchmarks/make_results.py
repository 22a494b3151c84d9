"""Write ``benchmarks/results/RESULTS.md`` from the result files beside it.

Every result is a JSON file named ``<benchmark>-<model>-<machine>.json``: the current result of one
benchmark for one model on one kind of machine. A new run replaces its file and this script rebuilds
the page, so the tables are made from the data and cannot drift from it. Each benchmark has a small
formatter, chosen by the file name's prefix; a file that none knows is still listed, with the
summary it holds.

``--readme FILE`` also fills the block between ``<!-- results:start -->`` and
``<!-- results:end -->`` in FILE with one headline row per result that compares eesd with plain
decoding or with transformers, each row saying on which machine and when; a file without both
markers is left as it is.

    python benchmarks/make_results.py                     # rewrite benchmarks/results/RESULTS.md
    python benchmarks/make_results.py --check             # exit 1 if RESULTS.md is out of date
    python benchmarks/make_results.py --readme README.md  # also refresh README.md's results block
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"
MACHINES = {
    "amd-epyc": "AMD EPYC",
    "intel-xeon": "Intel Xeon",
    "nvidia-h100": "NVIDIA H100",
    "nvidia-h200": "NVIDIA H200",
}


@dataclass(frozen=True)
class Result:
    path: Path
    benchmark: str | None  # None when the name does not follow the convention
    model: str
    machine: str
    data: Any

    def recorded(self, key: str) -> str | None:
        """``key`` of the run's ``environment`` (``eesd bench``'s), else of the file's top level."""
        data = self.data if isinstance(self.data, dict) else {}
        env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
        value = env.get(key) or data.get(key)
        return str(value) if value else None

    @property
    def date(self) -> str:
        date = self.recorded("date")
        return date[:10] if date else "not recorded"


def x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# Spec-Bench with `eesd bench`: one sequence at a time.


def bench_speeds(r: Result) -> dict[str, float]:
    return {m: s["tokens_per_second"] for m, s in r.data["summary"]["overall"].items()}


def bench_row(r: Result) -> list[str]:
    tps, overall = bench_speeds(r), r.data["summary"]["overall"]
    equal = sum(s.get("equal") or 0 for s in overall.values())
    checked = sum(s.get("checked") or 0 for s in overall.values())
    reference = "hf" if "hf" in tps else r.data["summary"]["baseline"]
    fastest = max(tps, key=tps.__getitem__)
    return [
        str(r.data["settings"].get("prompts", "-")),
        x(ratio(tps.get("eesd_default"), tps.get("hf"))),
        x(ratio(tps.get("eesd_default"), tps.get("eesd_plain"))),
        x(ratio(tps.get("eesd_plain"), tps.get("hf"))),
        f"`{fastest}` {x(ratio(tps[fastest], tps[reference]))} `{reference}`",
        f"{equal} of {checked}" if checked else "not compared",
    ]


def bench_headline(r: Result) -> str | None:
    tps = bench_speeds(r)
    parts = [f"{x(ratio(tps.get('eesd_default'), tps.get(b)))} {name}" for b, name in BASES if b in tps]
    if "eesd_default" not in tps or not parts:
        return None
    fastest = max(tps, key=tps.__getitem__)
    if fastest != "eesd_default":  # a faster method run beside it is part of the headline
        parts.append(f"`{fastest}` {x(ratio(tps[fastest], tps['eesd_default']))} eesd default")
    return f"eesd default {', '.join(parts)}"


BASES = (("hf", "transformers"), ("eesd_plain", "eesd plain"))
BENCH_COLUMNS = [
    "prompts",
    "default / transformers",
    "default / eesd plain",
    "eesd plain / transformers",
    "fastest method",
    "outputs equal",
]


# Batches with `eesd bench-batch`.


def batch_ratios(r: Result, method: str, against: str) -> str:
    settings = r.data["settings"]
    key = {settings.get("baseline"): "vs_baseline", settings.get("plain"): "vs_plain"}.get(against)
    rows = [s for s in r.data["summary"] if s["method"] == method and key and s.get(key) is not None]
    cells = [f"B={s['batch_size']} {x(s[key])}" for s in rows]
    return ", ".join(cells) or "-"


def batch_row(r: Result) -> list[str]:
    mismatches = len(r.data.get("mismatches") or [])
    return [
        ", ".join(str(b) for b in r.data["settings"]["batch_sizes"]),
        batch_ratios(r, "eesd_default", "hf"),
        batch_ratios(r, "eesd_default", "eesd_plain"),
        batch_ratios(r, "eesd_plain", "hf"),
        "all" if not mismatches else f"{mismatches} differ",
    ]


def batch_headline(r: Result) -> str | None:
    for against, name in BASES:
        cells = batch_ratios(r, "eesd_default", against)
        if cells != "-":
            return f"eesd default against {name}: {cells}"
    return None


BATCH_COLUMNS = [
    "batch sizes",
    "default / transformers",
    "default / eesd plain",
    "eesd plain / transformers",
    "rows equal to their solo reply",
]


# benchmarks/never_slower.py


def never_slower_row(r: Result) -> list[str]:
    config, summary = r.data["config"], r.data["summary"]
    mismatches = len(r.data.get("mismatches") or [])
    return [
        f"{len(config['prompts'])} x {config['repeats']} x {config['max_new_tokens']}",
        *(x(summary.get(name), 3) for name in NEVER_SLOWER_RATIOS),
        "all" if not mismatches else f"{mismatches} differ",
    ]


def never_slower_headline(r: Result) -> str:
    s = r.data["summary"]
    return (
        f"eesd default {x(s['default/transformers'])} transformers, {x(s['default/plain'])} eesd plain "
        "(medians over prompts)"
    )


NEVER_SLOWER_RATIOS = ("default/plain", "default/transformers", "always_no/plain", "plain/transformers")
NEVER_SLOWER_COLUMNS = ["prompts x repeats x tokens", *NEVER_SLOWER_RATIOS, "outputs equal"]


# benchmarks/vllm_serving.py


def vllm_cells(r: Result, method: str) -> str:
    levels = r.data["table"].get(method, {})
    return ", ".join(f"c={c} {x(row.get('vs_plain'), 3)}" for c, row in levels.items()) or "-"


def vllm_row(r: Result) -> list[str]:
    s, table = r.data["settings"], r.data["table"]
    others = [m for m in table if m not in ("plain", "eesd")]
    equal = all(row.get("greedy_equal") for levels in table.values() for row in levels.values())
    return [
        f"{s.get('schedule', 'waves')}, {s['prompts']} prompts x {s['rounds']} rounds",
        vllm_cells(r, "eesd"),
        "; ".join(f"`{m}` {vllm_cells(r, m)}" for m in others) or "-",
        "yes" if equal else "NO",
    ]


def vllm_headline(r: Result) -> str:
    return f"eesd proposer against plain vLLM: {vllm_cells(r, 'eesd')}"


VLLM_COLUMNS = ["requests", "eesd / plain vLLM", "other methods / plain vLLM", "greedy equal"]


# benchmarks/two_trees.py and benchmarks/first_call.py


def two_trees_row(r: Result) -> list[str]:
    s = r.data["settings"]
    cells = []
    for method, row in r.data["summary"].items():
        tps = row["tokens_per_second"]
        speeds = f"{tps['this']:.2f} / {tps['other']:.2f} tokens/s"
        cells.append(f"`{method}` {x(row['this_over_other'], 3)} ({speeds})")
    return [f"{s['prompts']} x {s['repeats']} x {s['max_new_tokens']}", "; ".join(cells)]


TWO_TREES_COLUMNS = ["prompts x repeats x tokens", "this tree / other tree, median over prompts"]


def first_call_row(r: Result) -> list[str]:
    s = r.data["summary"]
    keys = ("first_call_first_token_s", "second_call_first_token_s", "last_call_first_token_s")

    def cell(key: str) -> str:
        return " / ".join(
            "-" if s[i].get(key) is None else f"{s[i][key]:.1f} s" for i in ("this", "other") if i in s
        )

    return [cell(key) for key in (*keys, "standard_call_first_token_s")]


FIRST_CALL_COLUMNS = ["first call, first token", "second call", "last call", 'products="standard"']


# benchmarks/round_overhead.py


def round_overhead_rows(r: Result) -> list[list[str]]:
    d = r.data
    return [
        [
            f"{d['shape']} shape, {d['device']}",
            f"B={row['batch_size']}",
            row["method"],
            f"{row['ms_a_round']:.3f} ms",
            f"{row['vs_plain']:.3f}x",
            str(row["drafted"]),
        ]
        for row in d["rows"]
    ]


ROUND_OVERHEAD_COLUMNS = ["model", "rows", "method", "a round (median)", "vs plain", "drafted"]


# benchmarks/timed_replay.py: one row per batch size.


def timed_replay_rows(r: Result) -> list[list[str]]:
    d = r.data
    where = f"{d['shape']} shape ({d['layers']} layers), {d['device']} {d['dtype']}"
    return [
        [where, f"B={size}", ", ".join(f"{name} {value:.3f}x" for name, value in found.items())]
        for size, found in d["ratios"].items()
    ]


TIMED_REPLAY_COLUMNS = ["model", "rows", "ratios (time per token, the first over the second)"]


# benchmarks/cost_curves.py


def cost_row(r: Result) -> list[str]:
    d = r.data
    best = {n: e["best"][0] for n, e in d["modelled"]["by_exit_layer"].items()}
    return [
        f"{d['dtype']}, {d.get('compile', 'off')}",
        f"{1e3 * d['timings']['plain_step']['median']:.2f} ms",
        f"{1e3 * d['timings']['hf_forward']['median']:.2f} ms",
        ", ".join(f"N={n} {x(b['speedup'])} (k={b['k']})" for n, b in best.items()),
        "; ".join(f"{c['measure']} {c['ratio']:.3f} {'pass' if c['pass'] else 'FAIL'}" for c in d["checks"]),
    ]


def cost_columns(results: list[Result]) -> list[str]:
    alphas = {r.data["modelled"]["alphas"][0] for r in results}
    alpha = alphas.pop() if len(alphas) == 1 else "the first alpha"
    return [
        "dtype, passes",
        "plain step",
        "transformers forward",
        f"modelled speedup at alpha {alpha}",
        "checks",
    ]


# benchmarks/exit_sweep.py: one row per head.


def exit_sweep_rows(r: Result) -> list[list[str]]:
    return [
        [
            f"`{h['file']}`",
            str(h["exit_layer"]),
            str(h.get("vocab_subset") or "all"),
            f"{h['top1']:.3f}",
            f"{h['mean_accepted_tokens']:.2f}",
            f"{x(h['modelled_speedup'])} (k={h['best_k']})",
        ]
        for h in r.data["heads"]
    ]


EXIT_SWEEP_COLUMNS = ["head", "N", "vocabulary", "top-1", "mean accepted", "modelled speedup"]


# benchmarks/evaluate_controllers.py: one row per cost profile.


def evaluate_rows(r: Result) -> list[list[str]]:
    rows, timing = [], r.data["timing"]
    for board in r.data["boards"]:
        cells = board["rows"]
        groups = [g for g in board["categories"] if g != "all"]
        versus = board["vs_best_fixed"].get("thompson", {})
        fixed = cells["best fixed k"]
        rows.append(
            [
                f"`{board['profile']}`",
                x(cells["thompson"]["all"]["speedup"], 3) if "thompson" in cells else "-",
                f"{x(fixed['all']['speedup'], 3)} (k={fixed['all']['k']})",
                x(cells["oracle"]["all"]["speedup"], 3),
                f"{sum(versus.get(g, 2.0) <= 1.0 for g in groups)} of {len(groups)}",
                ", ".join(f"{g} {versus[g]:.3f} (k={fixed[g]['k']})" for g in groups if g in versus),
                f"{timing['median_seconds']:.1f} s",
            ]
        )
    return rows


EVALUATE_COLUMNS = [
    "cost profile",
    "thompson",
    "best fixed k",
    "oracle",
    "thompson <= best fixed k",
    "thompson / best fixed k by category (that category's k)",
    "all traces evaluated in",
]


# benchmarks/offline_vs_online.py: one row per controller.


def offline_rows(r: Result) -> list[list[str]]:
    d = r.data
    setting = f"{len(d['prompts'])} prompts x {d['max_new_tokens']} tokens"
    return [
        [
            setting,
            f"`{row['controller']}`",
            x(row["modelled"], 3),
            x(row["measured"], 3),
            f"{100 * row['error']:+.1f}%",
            ", ".join(f"{row['replayed'][k]}/{row['online'][k]}" for k in ("rounds", "drafted", "accepted")),
        ]
        for row in d["rows"]
    ]


OFFLINE_COLUMNS = [
    "prompts",
    "controller",
    "modelled speedup",
    "measured speedup",
    "modelled / measured - 1",
    "rounds, drafts, accepted: replayed / online",
]


# Any other file: the scalars of its summary.


def generic_row(r: Result) -> list[str]:
    summary = r.data.get("summary") if isinstance(r.data, dict) else None
    return [", ".join(f"{k} {_scalar(v)}" for k, v in _flat(summary)) if isinstance(summary, dict) else "-"]


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in d.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key} ")
        elif isinstance(value, (int, float, str, bool)):
            out.append((f"{prefix}{key}", value))
    return out


def _scalar(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Benchmark:
    title: str
    about: str
    columns: Callable[[list[Result]], list[str]]
    rows: Callable[[Result], list[list[str]]]
    headline: Callable[[Result], str | None] = lambda r: None


def one(row: Callable[[Result], list[str]]) -> Callable[[Result], list[list[str]]]:
    return lambda r: [row(r)]


def fixed(columns: list[str]) -> Callable[[list[Result]], list[str]]:
    return lambda results: columns


BENCHMARKS = {
    "bench": Benchmark(
        "Spec-Bench, one sequence (`eesd bench`)",
        "Greedy; speed ratios are mean tokens/s over mean tokens/s on the same prompts.",
        fixed(BENCH_COLUMNS),
        one(bench_row),
        bench_headline,
    ),
    "bench-sampled": Benchmark(
        "Spec-Bench, one sequence, sampled (`eesd bench --temperature`)",
        "Speed only: losslessness when sampling is a distribution test, not a token comparison.",
        fixed(BENCH_COLUMNS),
        one(bench_row),
        bench_headline,
    ),
    "bench-batch": Benchmark(
        "Batches (`eesd bench-batch`)",
        "Ratios of batch throughput per batch size B.",
        fixed(BATCH_COLUMNS),
        one(batch_row),
        batch_headline,
    ),
    "never-slower": Benchmark(
        "Never slower (`benchmarks/never_slower.py`)",
        "Medians over prompts of per-prompt speed ratios, on prompts of our own.",
        fixed(NEVER_SLOWER_COLUMNS),
        one(never_slower_row),
        never_slower_headline,
    ),
    "vllm-serving": Benchmark(
        "vLLM serving (`benchmarks/vllm_serving.py`)",
        "Throughput against plain vLLM at c concurrent requests.",
        fixed(VLLM_COLUMNS),
        one(vllm_row),
        vllm_headline,
    ),
    "two-trees": Benchmark(
        "Two trees (`benchmarks/two_trees.py`)",
        "This tree against another install, taking turns on the same prompts.",
        fixed(TWO_TREES_COLUMNS),
        one(two_trees_row),
    ),
    "first-call": Benchmark(
        "First call (`benchmarks/first_call.py`)",
        "Seconds to the first token of `eesd generate`, this tree / the other install.",
        fixed(FIRST_CALL_COLUMNS),
        one(first_call_row),
    ),
    "round-overhead": Benchmark(
        "Round overhead (`benchmarks/round_overhead.py`)",
        "A round that drafts nothing (always_no) against a plain step, medians over interleaved repeats.",
        fixed(ROUND_OVERHEAD_COLUMNS),
        round_overhead_rows,
    ),
    "timed-replay": Benchmark(
        "Timed replays (`benchmarks/timed_replay.py`)",
        "Random weights; every pass and host step run, acceptance and confidences REPLAYED from a trace.",
        fixed(TIMED_REPLAY_COLUMNS),
        timed_replay_rows,
    ),
    "cost-curves": Benchmark(
        "Cost curves (`benchmarks/cost_curves.py`)",
        "Model shapes with random weights; speedups are MODELLED from measured costs, not timed.",
        cost_columns,
        one(cost_row),
    ),
    "exit-sweep": Benchmark(
        "Exit heads side by side (`benchmarks/exit_sweep.py`)",
        "Held-out evaluation stored in each head file; costs measured here; speedups MODELLED.",
        fixed(EXIT_SWEEP_COLUMNS),
        exit_sweep_rows,
    ),
    "evaluate-controllers": Benchmark(
        "Controllers offline (`eesd controllers evaluate`, `benchmarks/evaluate_controllers.py`)",
        "Speedups over plain decoding are MODELLED: every registered controller replayed through a "
        "shipped trace under a cost profile; ratios below 1 are time per token under the best fixed "
        "k in hindsight's.",
        fixed(EVALUATE_COLUMNS),
        evaluate_rows,
    ),
    "offline-vs-online": Benchmark(
        "Offline against online (`benchmarks/offline_vs_online.py`)",
        "Speedups over plain decoding of each controller, modelled from a trace and a profile measured "
        "in the same process, beside the speedup measured online on the same prompts.",
        fixed(OFFLINE_COLUMNS),
        offline_rows,
    ),
}
OTHER = Benchmark(
    "Other results", "Files named outside the convention.", fixed(["summary"]), one(generic_row)
)


def parse(path: Path) -> tuple[str, str, str] | None:
    """``(benchmark, model, machine)`` from ``<benchmark>-<model>-<machine>.json``, else None."""
    stem = path.stem
    machine = next((m for m in MACHINES if stem.endswith(f"-{m}")), None)
    benchmark = next((b for b in sorted(BENCHMARKS, key=len, reverse=True) if stem.startswith(f"{b}-")), None)
    if machine is None or benchmark is None:
        return None
    model = stem[len(benchmark) + 1 : -len(machine) - 1]
    return (benchmark, model, machine) if model else None


def load(folder: Path = RESULTS) -> list[Result]:
    results = []
    for path in sorted(folder.glob("*.json")):
        key = parse(path)
        benchmark, model, machine = key or (None, "-", "-")
        results.append(Result(path, benchmark, model, machine, json.loads(path.read_text(encoding="utf-8"))))
    return results


def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def section(benchmark: Benchmark, results: list[Result]) -> list[str]:
    rows = []
    for r in results:
        label = [f"[{r.model}]({r.path.name})", MACHINES.get(r.machine, r.machine), r.date]
        rows += [label + cells for cells in benchmark.rows(r)]
    lines = [f"## {benchmark.title}", "", benchmark.about, ""]
    lines += table(["model", "machine", "date", *benchmark.columns(results)], rows)
    commands = [f"- `{r.path.name}`: `{r.recorded('command')}`" for r in results if r.recorded("command")]
    return lines + (["", "Commands as recorded:", "", *commands] if commands else []) + [""]


def render(folder: Path = RESULTS) -> str:
    results = load(folder)
    lines = [
        "# Benchmark results",
        "",
        "The current result of each benchmark for each model and kind of machine: one JSON file each,",
        "named `<benchmark>-<model>-<machine>.json`. A new run replaces its file (git keeps the history).",
        "This page is made from those files by `python benchmarks/make_results.py`; do not edit it by hand.",
        "",
    ]
    for name, benchmark in [*BENCHMARKS.items(), (None, OTHER)]:
        chosen = [r for r in results if r.benchmark == name]
        if chosen:
            lines += section(benchmark, chosen)
    return "\n".join(lines)


def headline_block(folder: Path, readme: Path) -> str:
    rows, results = [], load(folder)
    for name, benchmark in BENCHMARKS.items():
        for r in (r for r in results if r.benchmark == name):
            line = benchmark.headline(r)
            if line:
                rows.append([f"`{name}`", r.model, MACHINES[r.machine], r.date, line])
    page = Path(os.path.relpath(folder / "RESULTS.md", readme.resolve().parent)).as_posix()
    lines = table(["benchmark", "model", "machine", "date", "headline"], rows)
    return "\n".join([*lines, "", f"Every table, command and raw number: [{page}]({page})."])


def fill(text: str, block: str) -> str:
    """``text`` with the lines between the markers replaced by ``block``; unchanged without them."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        return text
    return text[: start + len(START)] + "\n" + block + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of result files")
    parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md is out of date")
    parser.add_argument("--readme", type=Path, help=f"also fill the block between {START} and {END}")
    args = parser.parse_args(argv)
    page, target = render(args.results), args.results / "RESULTS.md"
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != page:
            print(f"{target} is out of date: run python benchmarks/make_results.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(page, encoding="utf-8")
    print(f"wrote {target}")
    if args.readme is not None:
        text = args.readme.read_text(encoding="utf-8")
        filled = fill(text, headline_block(args.results, args.readme))
        if filled != text:
            args.readme.write_text(filled, encoding="utf-8")
            print(f"filled the results block of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
