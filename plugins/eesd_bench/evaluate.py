"""A controller leaderboard from traces and a cost profile, in modelled time, without the model.

For each trace and profile, every controller is replayed (:func:`~eesd_bench.trace.replay`) over the
trace's prompts in their order, one controller serving them all as one decoder would, and learning
the profile's costs as it goes. Its time per token is set, by category and over all prompts, beside
plain decoding (the profile's plain step per token), the best fixed k in hindsight of that category
and the per-round oracle (:func:`~eesd_bench.trace.oracle_time`).

What the replay models and what it does not: greedy decoding of one sequence at a time (batch size
one), where a round of k drafts commits min(k, a) + 1 tokens for the recorded accepted prefix a and
costs ``propose_base + k * draft_step + verify[k]``. Sampled decoding accepts drafts at random
(a trace of greedy acceptances stands for it only roughly), batches share rounds (a profile's
larger batch sizes are costs only: rows still replay one at a time), and time the engine spends
outside the measured passes (controller time beyond the profile's) is not charged; the prefill's
token is charged a plain step.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from eesd_bench.profiles import CostProfile
from eesd_bench.trace import (
    ControllerSpec,
    ReplayResult,
    Trace,
    best_fixed,
    build_controller,
    oracle_time,
    replay,
)
from eesd_core.errors import ConfigError, InputError

ALL = "all"


def under(trace: Trace, profile: CostProfile, batch_size: int = 1) -> Trace:
    """``trace`` with ``profile``'s costs at ``batch_size`` in place of the costs it was recorded with."""
    costs = profile.at(batch_size)
    if len(costs.verify) < trace.max_k + 1:
        raise InputError(
            f"The cost profile {profile.meta.get('name', '')!r} prices rounds up to k = "
            f"{len(costs.verify) - 1}, but the trace drafts up to {trace.max_k}: measure a profile "
            f"with --max-draft-tokens {trace.max_k}."
        )
    return replace(trace, costs=replace(costs, verify=costs.verify[: trace.max_k + 1]))


def categories(trace: Trace) -> dict[str, Trace]:
    """The trace's prompts by category, in the order categories first appear."""
    groups: dict[str, list[Any]] = {}
    for prompt in trace.prompts:
        groups.setdefault(prompt.category or "uncategorised", []).append(prompt)
    return {name: replace(trace, prompts=tuple(members)) for name, members in groups.items()}


def parse_controller(text: str) -> tuple[str, ControllerSpec]:
    """``NAME``, ``NAME={"k": 2}`` (registered, with options) or ``package.module:factory``."""
    name, sep, options = text.partition("=")
    if sep:
        try:
            parsed = json.loads(options)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ConfigError(f'Controller {text!r}: write options as a JSON object, e.g. fixed={{"k": 2}}.')
        return text, (name, parsed)
    if ":" in text:
        module, _, attr = text.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"Cannot import the controller factory {text!r} ({exc}).") from None
        return attr, factory
    return text, (text, {})


def registered_controllers() -> list[str]:
    from eesd_core.registry import get_manager

    return get_manager().registry("controller").names()


@dataclass
class Cell:
    """One method in one category: modelled seconds per token and how it compares."""

    time_per_token: float
    speedup: float
    vs_oracle: float
    mean_accepted_tokens: float | None = None
    acceptance: float | None = None
    k: int | None = None


def leaderboard(
    trace: Trace,
    profile: CostProfile,
    controllers: Mapping[str, ControllerSpec],
    batch_size: int = 1,
) -> dict[str, Any]:
    """Rows ``plain``, ``oracle``, ``best fixed k`` and one per controller, each a :class:`Cell`
    per category and for ``all``; ``beats_best_fixed`` compares every controller with the best
    fixed k in hindsight of each category (time per token of the controller over the fixed k's)."""
    trace = under(trace, profile, batch_size)
    plain = profile.plain_step(batch_size)
    groups = {**categories(trace), ALL: trace}
    oracle = {name: oracle_time(sub) for name, sub in groups.items()}

    def cell(name: str, tpt: float, result: ReplayResult | None = None, k: int | None = None) -> Cell:
        accepted = result.mean_accepted_tokens if result else None
        acceptance = result.acceptance if result else None
        return Cell(tpt, plain / tpt, tpt / oracle[name], accepted, acceptance, k)

    rows: dict[str, dict[str, Cell]] = {
        "plain": {name: cell(name, plain) for name in groups},
        "oracle": {name: cell(name, oracle[name]) for name in groups},
        "best fixed k": {
            name: cell(name, best_fixed(sub)[1], k=best_fixed(sub)[0]) for name, sub in groups.items()
        },
    }
    for label, spec in controllers.items():
        rows[label] = _replayed(trace, groups, spec, cell)
    fixed = rows["best fixed k"]
    versus = {
        label: {g: row[g].time_per_token / fixed[g].time_per_token for g in groups}
        for label, row in rows.items()
        if label in controllers
    }
    return {
        "trace": trace.meta.get("name", ""),
        "profile": profile.meta.get("name", ""),
        "batch_size": batch_size,
        "categories": list(groups),
        "prompts": {g: len(sub.prompts) for g, sub in groups.items()},
        "tokens": {g: sum(len(p.tokens) for p in sub.prompts) for g, sub in groups.items()},
        "rows": {label: {g: vars(c) for g, c in row.items()} for label, row in rows.items()},
        "vs_best_fixed": versus,
    }


def _replayed(
    trace: Trace, groups: Mapping[str, Trace], spec: ControllerSpec, cell: Callable[..., Cell]
) -> dict[str, Cell]:
    parts: list[ReplayResult] = []
    replay(trace, build_controller(spec), by_prompt=parts)
    out = {}
    for name in groups:
        total = ReplayResult()
        for prompt, part in zip(trace.prompts, parts, strict=True):
            if name == ALL or (prompt.category or "uncategorised") == name:
                total.add(part)
        out[name] = cell(name, total.time_per_token, total)
    return out


def format_board(board: Mapping[str, Any]) -> str:
    """Three tables, a row per category: the speedup over plain decoding of every method (the best
    fixed k's k beside it), time per token over the per-round oracle's, and each controller's time
    per token over the best fixed k's (below 1: faster than every fixed schedule of that category)."""
    groups, rows, ratios = board["categories"], board["rows"], board["vs_best_fixed"]
    width = max(12, *(len(label) + 2 for label in rows))
    label_width = max(16, *(len(g) + 2 for g in groups))

    def table(title: str, labels: Sequence[str], value: Callable[[str, str], str]) -> list[str]:
        head = [f"{title:<{label_width}}" + "".join(f"{label:>{width}}" for label in labels)]
        body = [
            f"{g:<{label_width}}" + "".join(f"{value(label, g):>{width}}" for label in labels) for g in groups
        ]
        return [*head, *body, ""]

    def speedup(label: str, group: str) -> str:
        cell = rows[label][group]
        return f"{cell['speedup']:.3f}" + (f" k={cell['k']}" if cell["k"] is not None else "")

    title = f"trace {board['trace']}, cost profile {board['profile']}, batch size {board['batch_size']}"
    lines = [title, "", *table("speedup vs plain", list(rows), speedup)]
    others = [label for label in rows if label != "plain"]
    lines += table("time / oracle", others, lambda label, g: f"{rows[label][g]['vs_oracle']:.3f}")
    lines += table("time / best fixed", list(ratios), lambda label, g: f"{ratios[label][g]:.3f}")
    return "\n".join(lines).rstrip()


def plot_summary(board: Mapping[str, Any]) -> dict[str, Any]:
    """The leaderboard in the shape :func:`eesd_bench.plot.plot_speedups` draws."""
    groups = [g for g in board["categories"] if g != ALL]
    tables = {
        g: {label: {"speedup": row[g]["speedup"]} for label, row in board["rows"].items() if label != "plain"}
        for g in [*groups, ALL]
    }
    return {"groups": {g: tables[g] for g in groups}, "overall": tables[ALL], "baseline": "plain decoding"}


def evaluate(
    traces: Mapping[str, Trace],
    profiles: Mapping[str, CostProfile],
    controllers: Mapping[str, ControllerSpec],
    pairs: Sequence[tuple[str, str]] | None = None,
    batch_size: int = 1,
) -> list[dict[str, Any]]:
    """A leaderboard for every (trace, profile) pair asked for (default: every pair)."""
    chosen = pairs or [(t, p) for t in traces for p in profiles]
    boards = []
    for trace_name, profile_name in chosen:
        trace = replace(traces[trace_name], meta={**traces[trace_name].meta, "name": trace_name})
        profile = profiles[profile_name]
        profile = replace(profile, meta={**profile.meta, "name": profile_name})
        boards.append(leaderboard(trace, profile, controllers, batch_size))
    return boards


def matching_profiles(trace: Trace, profiles: Mapping[str, CostProfile]) -> list[str]:
    """The profiles measured on the trace's model shape (layers, hidden size, vocabulary)."""
    keys = ("layers", "hidden_size", "vocab_size")
    shape = trace.meta.get("model_shape", {})
    return [
        name
        for name, profile in profiles.items()
        if all(profile.meta.get("model_shape", {}).get(k) == shape.get(k) for k in keys)
    ]
