"""Numbers from recorded traces rather than clocks: round costs, and the oracle bound by replay.

The oracle decodes every prompt once with the early-exit drafter drafting the most it may, records
at every position how many of those drafts the target accepts (:mod:`eesd_bench.trace`), and then
picks the best draft length per round in hindsight: no controller can beat it with that drafter
and those costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eesd_bench import trace
from eesd_bench.methods import MethodSpec
from eesd_bench.modelled import RoundCosts
from eesd_bench.prompts import Question


def measure_round_costs(decoder: Any, prompt: list[int]) -> RoundCosts:
    """Propose and verify seconds by k, measured on ``prompt``."""
    return RoundCosts.of(trace.measure_costs(decoder, prompt))


def _replayed(methods: Sequence[MethodSpec]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The early-exit methods whose controllers a trace can replay, as (controller, options)."""
    out = {}
    for spec in methods:
        if spec.kind == "eesd":
            kwargs = spec.decoder_kwargs()
            if kwargs["drafter"] == "early_exit" and not kwargs["drafter_options"]:
                out[spec.name] = (kwargs["controller"], kwargs["controller_options"])
    return out


def oracle_report(
    decoder: Any,
    prompts: Sequence[tuple[Question, list[int]]],
    methods: Sequence[MethodSpec],
    max_new_tokens: int,
    group_key: str = "task",
) -> dict[str, Any]:
    """Modelled speedups of plain, best fixed k, the per-round oracle and the replayed controllers.

    Greedy only: a trace records greedy drafts.
    """
    costs = trace.measure_costs(decoder, prompts[0][1])
    recorded = [(q, trace.record_prompt(decoder, p, max_new_tokens)) for q, p in prompts]
    controllers = _replayed(methods)
    groups: dict[str, list[Any]] = {}
    for question, prompt_trace in recorded:
        groups.setdefault(str(getattr(question, group_key)), []).append(prompt_trace)

    def rows(members: list[Any]) -> list[dict[str, Any]]:
        chosen = trace.Trace(decoder.config.max_draft_tokens, costs, tuple(members), {})
        return trace.compare_controllers(chosen, controllers)

    return {
        "max_k": decoder.config.max_draft_tokens,
        "costs": RoundCosts.of(costs).__dict__,
        "overall": rows([t for _, t in recorded]),
        "groups": {name: rows(members) for name, members in groups.items()},
    }


def oracle_markdown(report: dict[str, Any]) -> list[str]:
    rows = report["overall"]
    groups = list(report["groups"])
    lines = [
        "## Replayed bound (modelled time from a recorded trace, greedy)",
        "",
        f"Early-exit drafts recorded with k = {report['max_k']} at every position; speedups are "
        "modelled (measured round costs), not timed.",
        "",
        "| controller | " + " | ".join(groups) + " | overall | mean accepted | vs oracle |",
        "|---|" + "---|" * (len(groups) + 3),
    ]
    for i, row in enumerate(rows):
        per_group = [report["groups"][g][i]["speedup"] for g in groups]
        cells = [f"{s:.2f}x" if s is not None else "-" for s in [*per_group, row["speedup"]]]
        mat = "-" if row["mean_accepted_tokens"] is None else f"{row['mean_accepted_tokens']:.2f}"
        vs = "-" if row["vs_oracle"] is None else f"{row['vs_oracle']:.2f}"
        lines.append(f"| {row['controller']} | " + " | ".join(cells) + f" | {mat} | {vs} |")
    return lines
