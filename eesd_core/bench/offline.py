"""Numbers from recorded traces rather than clocks: round costs, and the oracle bound by replay.

Both use :mod:`eesd_core.trace` when it offers what they need, and say so when it does not. The
oracle decodes every prompt once with the early-exit drafter drafting the most it may, records at
every position how many of those drafts the target accepts, and then picks the best draft length
per round in hindsight: no controller can beat it with that drafter and those costs.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from eesd_core.bench.methods import MethodSpec, parse_method
from eesd_core.bench.modelled import RoundCosts
from eesd_core.bench.prompts import Question
from eesd_core.bench.runners import BenchSettings, eesd_kwargs

NEEDED = ("measure_costs", "record_prompt", "compare_controllers", "Trace")


def trace_module() -> Any | None:
    """:mod:`eesd_core.trace` if it has every function used here, else ``None``."""
    try:
        module = importlib.import_module("eesd_core.trace")
    except ImportError:
        return None
    return module if all(hasattr(module, name) for name in NEEDED) else None


def early_exit_decoder(model: Any, settings: BenchSettings) -> Any:
    """The ``eesd_default`` decoder: early-exit drafter with the run's exit layer and head."""
    from eesd_core.engine import SpeculativeDecoder

    num_layers = getattr(model, model.base_model_prefix).config.num_hidden_layers
    return SpeculativeDecoder(model, **eesd_kwargs(parse_method("eesd"), settings, num_layers))


def measure_round_costs(decoder: Any, prompt: list[int]) -> RoundCosts | None:
    """Propose and verify seconds by k, measured on ``prompt``; ``None`` without the trace module."""
    trace = trace_module()
    return None if trace is None else RoundCosts.of(trace.measure_costs(decoder, prompt))


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
) -> dict[str, Any] | None:
    """Modelled speedups of plain, best fixed k, the per-round oracle and the replayed controllers.

    ``None`` without the trace module. Greedy only: a trace records greedy drafts.
    """
    trace = trace_module()
    if trace is None:
        return None
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
