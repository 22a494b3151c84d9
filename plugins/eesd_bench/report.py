"""From raw samples to Spec-Bench's numbers, per method, overall and per task, and a Markdown page.

Speedup is Spec-Bench's: the mean over samples of a method's tokens per second divided by the
baseline's mean over the same samples. Mean accepted tokens is tokens committed per target pass
over all rounds of all samples (plain decoding: 1.00).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import fmean
from typing import Any


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _by_position(samples: Sequence[dict[str, Any]]) -> list[float]:
    drafted: list[int] = []
    accepted: list[int] = []
    for sample in samples:
        for i, (d, a) in enumerate(
            zip(sample.get("drafted_by_position", ()), sample.get("accepted_by_position", ()), strict=True)
        ):
            if i == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    return [a / d for a, d in zip(accepted, drafted, strict=True)]


def _total(samples: Iterable[dict[str, Any]], key: str) -> float:
    return sum(s.get(key) or 0 for s in samples)


def method_row(samples: Sequence[dict[str, Any]], baseline_tps: float | None) -> dict[str, Any]:
    """The summary of one method's samples against the baseline's mean tokens per second."""
    tps = fmean(s["tokens_per_second"] for s in samples)
    seconds = _total(samples, "seconds")
    timed_parts = any("draft_time" in s for s in samples)
    checked = [s["equal"] for s in samples if s.get("equal") is not None]
    ties = sum(1 for s in samples if s.get("tie"))
    return {
        "samples": len(samples),
        "new_tokens": fmean(s["new_tokens"] for s in samples),
        "tokens_per_second": tps,
        "speedup": _ratio(tps, baseline_tps) if baseline_tps else None,
        "mean_accepted_tokens": _ratio(_total(samples, "new_tokens"), _total(samples, "rounds")),
        "acceptance_rate": _ratio(_total(samples, "accepted"), _total(samples, "drafted")),
        "acceptance_by_position": _by_position(samples),
        "draft_share": _ratio(_total(samples, "draft_time"), seconds) if timed_parts else None,
        "verify_share": _ratio(_total(samples, "verify_time"), seconds) if timed_parts else None,
        "equal": sum(checked),
        "ties": ties,
        "checked": len(checked),
    }


def summarize(
    samples: Sequence[dict[str, Any]], methods: Sequence[str], baseline: str, group_key: str = "task"
) -> dict[str, Any]:
    """``overall`` and ``groups[name]``: each maps a method name to its :func:`method_row`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        groups.setdefault(str(sample[group_key]), []).append(sample)

    def rows(chosen: Sequence[dict[str, Any]]) -> dict[str, Any]:
        base = [s["tokens_per_second"] for s in chosen if s["method"] == baseline]
        base_tps = fmean(base) if base else None
        out = {}
        for method in methods:
            mine = [s for s in chosen if s["method"] == method]
            if mine:
                out[method] = method_row(mine, base_tps)
        return out

    return {
        "group_key": group_key,
        "baseline": baseline,
        "overall": rows(samples),
        "groups": {name: rows(members) for name, members in groups.items()},
    }


def mismatches(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The greedy outputs that differ from the baseline's, with where they first differ (a tie in
    half precision is not one: :func:`ties` lists those)."""
    return [
        {
            "method": s["method"],
            "run": s["run"],
            "question_id": s["question_id"],
            "first_diff": s["first_diff"],
            "new_tokens": s["new_tokens"],
        }
        for s in samples
        if s.get("equal") is False and not s.get("tie")
    ]


def ties(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Half-precision outputs that part from the baseline's where its top-2 logits tie."""
    return [
        {
            "method": s["method"],
            "question_id": s["question_id"],
            "first_diff": s["first_diff"],
            "gap": s["tie_gap"],
        }
        for s in samples
        if s.get("tie")
    ]


# -- Markdown --------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _overall_table(summary: dict[str, Any], memory: dict[str, Any] | None) -> list[str]:
    header = [
        "method",
        "tokens/s",
        "speedup",
        "mean accepted",
        "acceptance",
        "draft share",
        "verify share",
        "greedy equal",
    ]
    if memory:
        header.append("peak RSS delta")
    rows = []
    for method, row in summary["overall"].items():
        cells = [
            method,
            _fmt(row["tokens_per_second"]),
            _fmt(row["speedup"], ".2f", "x"),
            _fmt(row["mean_accepted_tokens"]),
            _fmt(row["acceptance_rate"]),
            _fmt(row["draft_share"], ".0%"),
            _fmt(row["verify_share"], ".0%"),
            f"{row['equal']}/{row['checked']}" if row["checked"] else "n/a",
        ]
        if memory:
            probe = memory.get(method) or {}
            cells.append(
                _fmt(
                    probe.get("peak_rss_delta_bytes") and probe["peak_rss_delta_bytes"] / 2**20, ".1f", " MiB"
                )
            )
        rows.append(cells)
    return _table(header, rows)


def _group_table(summary: dict[str, Any], key: str, spec: str, suffix: str = "") -> list[str]:
    groups = list(summary["groups"])
    rows = []
    for method in summary["overall"]:
        cells = [_fmt(summary["groups"][g].get(method, {}).get(key), spec, suffix) for g in groups]
        rows.append([method, *cells, _fmt(summary["overall"][method][key], spec, suffix)])
    return _table(["method", *groups, "overall"], rows)


def _position_table(summary: dict[str, Any]) -> list[str]:
    rows = [
        (m, r["acceptance_by_position"]) for m, r in summary["overall"].items() if r["acceptance_by_position"]
    ]
    if not rows:
        return []
    width = max(len(p) for _, p in rows)
    return _table(
        ["method", *(str(i + 1) for i in range(width))],
        [[m, *(_fmt(p[i]) if i < len(p) else "-" for i in range(width))] for m, p in rows],
    )


def markdown(result: dict[str, Any], sections: Iterable[Sequence[str]] = ()) -> str:
    """The results page: environment, overall and per-task tables, checks, then ``sections``."""
    env, settings, summary = result["environment"], result["settings"], result["summary"]
    lines = [
        f"# eesd benchmark: {env.get('model')}",
        "",
        f"{env.get('date')}; torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"{env.get('cpu')}, {env.get('threads')} threads; device {env.get('device')}, {env.get('dtype')}.",
        f"Settings: {', '.join(f'{k}={v}' for k, v in settings.items())}.",
        "",
        f"## Overall (speedup vs `{summary['baseline']}`)",
        "",
        *_overall_table(summary, result.get("memory")),
        "",
        f"## Speedup by {summary['group_key']}",
        "",
        *_group_table(summary, "speedup", ".2f", "x"),
        "",
        f"## Mean accepted tokens by {summary['group_key']}",
        "",
        *_group_table(summary, "mean_accepted_tokens", ".2f"),
    ]
    positions = _position_table(summary)
    if positions:
        lines += ["", "## Acceptance by draft position (accepted / drafted at position i)", "", *positions]
    lines += ["", "## Greedy equality", ""]
    wrong = result.get("mismatches") or []
    if not settings.get("temperature"):
        lines.append(
            "Every output equals the baseline's token for token."
            if not wrong
            else f"{len(wrong)} outputs differ from the baseline's: "
            + "; ".join(
                f"{w['method']} on question {w['question_id']} from token {w['first_diff']}" for w in wrong
            )
        )
        tied = result.get("ties") or []
        if tied:
            lines.append(
                f"{len(tied)} outputs part from the baseline's at a tie of its top-2 logits (half "
                "precision; within 4 units in the last place, so not a mismatch): "
                + "; ".join(
                    f"{t['method']} on question {t['question_id']} at token {t['first_diff']}" for t in tied
                )
            )
    else:
        lines.append(
            "Not checked: sampled runs differ by design; losslessness at temperature > 0 is a "
            "distribution test (tests/statistical)."
        )
    for section in sections:
        lines += ["", *section]
    for note in result.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"
