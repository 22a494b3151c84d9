"""Record what a drafter would propose at every position, then replay controllers offline.

At temperature 0 a greedy drafter's k-th draft does not depend on how many drafts the round will
have, so drafting ``K`` tokens at a position tells what any k <= K would have had accepted:
min(k, a) where a is the accepted prefix of the K drafts. :func:`record_trace` therefore decodes
with K drafts per round but commits a single token per round (the target's own, so the output is
still the target's greedy text): every position t of the output gets its drafts' confidences and
their accepted prefix a_t (but position 0, whose token the prefill draws with no drafts, as in
the engine). Costs are measured in a second short run that cycles k through 0 .. K, and kept as
the means of the observed times (a replay adds round times up, so it needs what a round costs on
average, slow ones included, not a typical one).

:func:`replay` then runs any controller against a :class:`Trace` through a
:class:`~eesd_core.control.Control`, as the engine does: it shows the controller the recorded
confidences, commits min(k, a_t) + 1 tokens, charges the modelled round time and moves on, exactly
as the engine would. :func:`oracle_time` is the per-round ideal (dynamic programming over
positions) and :func:`compare_controllers` tabulates controllers against it::

    dec = SpeculativeDecoder(model, drafter="early_exit", controller="fixed", max_draft_tokens=8)
    trace = record_trace(dec, prompts, max_new_tokens=64)
    trace.save("trace.json")
    rows = compare_controllers(trace, {"thompson": ("thompson", {}), "heuristic": ("heuristic", {})})
    print(format_table(rows))
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_core.config import validate
from eesd_core.control import Control, RowDrafts, row_outcome
from eesd_core.costs import CostTracker
from eesd_core.errors import InputError
from eesd_core.guards import Guarded
from eesd_core.protocols import (
    Confidence,
    Controller,
    Costs,
    DraftStep,
    Request,
    RoundOutcome,
    RoundStart,
    SamplingParams,
)
from eesd_core.round import Generation

# -- the record ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Position:
    """The drafts proposed at one output position: how many, how many the target accepted, and
    the drafter's confidence in each (empty where the drafter reports none)."""

    drafts: int
    accepted: int
    top1: tuple[float, ...] = ()
    prob: tuple[float, ...] = ()
    entropy: tuple[float, ...] = ()


@dataclass(frozen=True)
class CostModel:
    """Measured seconds: ``verify[m - 1]`` is one target pass over m = k + 1 positions."""

    draft_step: float
    propose_base: float
    verify: tuple[float, ...]

    def round_time(self, k: int) -> float:
        return self.propose_base + k * self.draft_step + self.verify[k]

    @classmethod
    def mean(cls, models: Sequence[CostModel]) -> CostModel:
        """Each cost averaged over ``models`` (timed at different moments: the machine drifts)."""
        return cls(
            statistics.fmean(m.draft_step for m in models),
            statistics.fmean(m.propose_base for m in models),
            tuple(map(statistics.fmean, zip(*(m.verify for m in models), strict=True))),
        )

    @property
    def plain_step(self) -> float:
        return self.round_time(0)

    def as_costs(self) -> Costs:
        verify = self.verify

        def verify_time(m: int) -> float | None:
            return verify[m - 1] if 0 < m <= len(verify) else None

        return Costs(self.draft_step, self.propose_base, verify_time)


@dataclass(frozen=True)
class PromptTrace:
    """One prompt's greedy output and a :class:`Position` for each of its tokens; ``category`` and
    ``name`` say where the prompt came from (a Spec-Bench category and question id, say)."""

    prompt_length: int
    tokens: tuple[int, ...]
    positions: tuple[Position, ...]
    category: str = ""
    name: str = ""


@dataclass(frozen=True)
class Trace:
    """One decoder's positions for several prompts, plus the costs they are replayed with."""

    max_k: int
    costs: CostModel
    prompts: tuple[PromptTrace, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; positions are stored as columns."""
        data = asdict(self)
        for prompt, stored in zip(self.prompts, data["prompts"], strict=True):
            stored["positions"] = _columns(prompt.positions)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trace:
        costs = data["costs"]
        prompts = tuple(
            PromptTrace(
                p["prompt_length"],
                tuple(p["tokens"]),
                _positions(p["positions"]),
                p.get("category", ""),
                str(p.get("name", "")),
            )
            for p in data["prompts"]
        )
        cost_model = CostModel(costs["draft_step"], costs["propose_base"], tuple(costs["verify"]))
        return cls(data["max_k"], cost_model, prompts, dict(data.get("meta", {})))

    def save(self, path: str | Path) -> None:
        """JSON, gzip-compressed when the name ends in ``.gz``."""
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        path = Path(path)
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            path.write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"No trace at {str(path)!r}: record one with `eesd trace record`.")
        raw = path.read_bytes()
        try:
            text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
            return cls.from_dict(json.loads(text))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{str(path)!r} is not an eesd trace ({exc!r}): record it again.") from None


_COLUMNS = ("drafts", "accepted", "top1", "prob", "entropy")


def _columns(positions: Sequence[Position]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"drafts": [p.drafts for p in positions]}
    out["accepted"] = [p.accepted for p in positions]
    for key in _COLUMNS[2:]:
        out[key] = [list(getattr(p, key)) for p in positions]
    return out


def _positions(data: Any) -> tuple[Position, ...]:
    """Positions from columns, or from the older list of one mapping per position."""
    if isinstance(data, Mapping):
        rows = zip(*(data[key] for key in _COLUMNS), strict=True)
        return tuple(Position(d, a, tuple(t), tuple(p), tuple(e)) for d, a, t, p, e in rows)
    return tuple(_position(q) for q in data)


def _position(data: Mapping[str, Any]) -> Position:
    confidences = (tuple(data.get(key, ())) for key in ("top1", "prob", "entropy"))
    return Position(data["drafts"], data["accepted"], *confidences)


# -- recording -------------------------------------------------------------------------------------


class _Recorder:
    """Controller that drafts as much as allowed (or cycles k round by round, every row of a round
    alike) and keeps every round's outcome."""

    def __init__(self, cycle: int | None = None) -> None:
        self.cycle = cycle
        self.outcomes: list[RoundOutcome] = []
        self.rounds = 0  # rounds begun
        self.k = 0  # this round's drafts, when cycling

    def start(self, request: Request) -> None:
        return None

    def begin_round(self, state: None, round: RoundStart) -> None:
        if self.cycle is not None:
            self.k = self.rounds % (self.cycle + 1)
        self.rounds += 1

    def should_continue(self, state: None, step: DraftStep) -> bool:
        return self.cycle is None or step.index < self.k

    def update(self, state: None, outcomes: Sequence[RoundOutcome]) -> None:
        self.outcomes.extend(outcomes)


class _OneToken:
    """Verifier that notes how many drafts the real one accepts, then commits one target token."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.accepted: list[int] = []

    def verify(
        self, drafts: Sequence[torch.Tensor], qs: Sequence[Any], p: torch.Tensor, rngs: Sequence[Any]
    ) -> list[tuple[int, int]]:
        self.accepted.extend(n for n, _ in self.inner.verify(drafts, qs, p, rngs))
        return self.inner.verify([d[:0] for d in drafts], [None] * len(drafts), p[:, :1], rngs)


def _recorded(
    decoder: Any, controller: Any, prompt: Sequence[int], rows: int = 1, **settings: Any
) -> tuple[Generation, _OneToken]:
    """One greedy generation of ``prompt`` (in each of ``rows`` rows) by ``decoder``'s engine,
    ``controller`` deciding and one target token committed per round; the decoder itself is left
    as it is."""
    prompts = [list(prompt)] * rows
    asked = prompts[0] if rows == 1 else prompts
    checked = decoder.stream(asked, temperature=0.0, **settings)  # the decoder's checks and defaults
    verifier = _OneToken(decoder.verifier)
    parts = dataclasses.replace(decoder.parts(), controller=controller, verifier=verifier, withdraws=False)
    generation = Generation(parts, prompts, checked.config, checked.rngs, single=rows == 1)
    for _ in generation:
        pass
    return generation, verifier


def record_prompt(decoder: Any, prompt: Sequence[int], max_new_tokens: int) -> PromptTrace:
    """The positions of one greedy generation; ``decoder`` must have a greedy-capable drafter."""
    if decoder.drafter is None:
        raise InputError("A trace needs a decoder with a drafter; this one decodes plainly.")
    recorder = _Recorder()
    generation, verifier = _recorded(decoder, recorder, prompt, max_new_tokens=max_new_tokens)
    # the first token is the prefill's, drawn with no drafts: its position has none
    positions = [Position(0, 0)]
    for n, outcome in zip(verifier.accepted[1:], recorder.outcomes, strict=True):
        seen = [c for c in outcome.confidences if c is not None]  # every draft was drawn: all are here
        top1, prob, entropy = (
            tuple(c.top1 for c in seen),
            tuple(c.prob or 0.0 for c in seen),
            tuple(c.entropy for c in seen),
        )
        positions.append(Position(outcome.drafted, n, top1, prob, entropy))
    tokens = tuple(generation.sequence[len(prompt) :])
    return PromptTrace(len(prompt), tokens, tuple(positions[: len(tokens)]))


def measure_costs(decoder: Any, prompt: Sequence[int], cycles: int = 4, batch_size: int = 1) -> CostModel:
    """Mean propose and verify times per k over ``cycles`` rounds of each k = 0 .. K, every row of
    a batch of ``batch_size`` copies of ``prompt`` drafting k (a round's times are the batch's).

    The first cycle warms up and is left out. ``draft_step`` is the least-squares slope of the
    proposal time over k, ``propose_base`` its intercept; a k the drafter never reached (it may
    propose fewer drafts than asked) gets the verification time of the nearest k measured.
    """
    k_max = decoder.config.max_draft_tokens
    recorder = _Recorder(cycle=k_max)
    rounds = (cycles + 1) * (k_max + 1)
    _recorded(decoder, recorder, prompt, batch_size, max_new_tokens=rounds + k_max + 1, eos_token_id=[])
    kept = [o for o in recorder.outcomes if o.row == 0][k_max + 1 : rounds]
    by_k = {k: [o for o in kept if o.drafted == k] for k in range(k_max + 1)}
    propose = {k: statistics.fmean(o.draft_time for o in got) for k, got in by_k.items() if got}
    verify = {k: statistics.fmean(o.verify_time for o in got) for k, got in by_k.items() if got}
    base, slope = _line(propose)
    nearest = [verify[min(verify, key=lambda j: abs(j - k))] for k in range(k_max + 1)]
    return CostModel(slope, propose.get(0, base), tuple(nearest))


def _line(points: Mapping[int, float]) -> tuple[float, float]:
    """(intercept, slope >= 0) of the least-squares line through ``points``; flat through one."""
    mean_x = statistics.fmean(points)
    mean_y = statistics.fmean(points.values())
    spread = sum((x - mean_x) ** 2 for x in points)
    if not spread:
        return mean_y, 0.0
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / spread)
    return mean_y - slope * mean_x, slope


def record_trace(decoder: Any, prompts: Iterable[Sequence[int]], max_new_tokens: int = 64) -> Trace:
    """Costs from the first prompt, then the positions of every prompt (see the module docstring)."""
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise InputError("record_trace needs at least one prompt.")
    costs = measure_costs(decoder, prompts[0])
    traces = tuple(record_prompt(decoder, p, max_new_tokens) for p in prompts)
    return Trace(decoder.config.max_draft_tokens, costs, traces, {"drafter": decoder.config.drafter})


# -- replay ----------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Totals of a replay; ``time`` is modelled seconds."""

    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    withdrawn: int = 0
    time: float = 0.0

    @property
    def time_per_token(self) -> float:
        return self.time / self.tokens if self.tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens committed per target pass (1.0 for plain decoding)."""
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def add(self, other: ReplayResult) -> None:
        for name in ("tokens", "rounds", "drafted", "accepted", "withdrawn", "time"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def replay(
    trace: Trace,
    controller: Controller,
    learn_costs: bool = True,
    withdraws: bool = True,
    by_prompt: list[ReplayResult] | None = None,
) -> ReplayResult:
    """Run ``controller`` over every prompt of ``trace`` as the engine would, in modelled time.

    A recorded prompt's first token is the prefill's: it is charged a plain step, and the
    controller is neither asked nor told about it, as in the engine. With ``learn_costs`` the
    controller sees costs the way a fresh decoder measures them (nothing until observed, then the
    modelled times of the rounds it ran); otherwise the full cost model.
    With ``withdraws`` a controller that declares ``withdraws`` is asked ``keep``, as the engine
    asks it; a withdrawn draft costs the peek, ``draft_step - propose_base``. A trace keeps no
    draft tokens: the controller sees ``DraftStep.token`` None. ``by_prompt``, when given, receives
    each prompt's own totals in the trace's order (one controller serves them all, in turn).
    """
    tracker = CostTracker(trace.max_k, smoothing=1.0)
    fixed = trace.costs.as_costs()
    peek = max(trace.costs.draft_step - trace.costs.propose_base, 0.0)
    guard = Guarded(0, None, type(controller).__name__, "replay")
    result = ReplayResult()
    for prompt in trace.prompts:
        costs = tracker.snapshot() if learn_costs else fixed
        n_tokens = len(prompt.tokens)
        request = Request(
            prompt_length=prompt.prompt_length,
            max_new_tokens=n_tokens,
            max_draft_tokens=trace.max_k,
            sampling=SamplingParams(),
            costs=costs,
            withdraws=withdraws and getattr(controller, "withdraws", False) is True,
        )
        control = Control(controller, guard, request)
        part, t = ReplayResult(), 0
        if n_tokens and prompt.positions[0].drafts == 0:  # the prefill's token, as the engine commits it
            part.add(ReplayResult(1, 1, time=trace.costs.round_time(0)))
            t = 1
        while t < n_tokens:
            costs = tracker.snapshot() if learn_costs else fixed
            k, n, taken_back = _round(control, prompt, t, costs, trace.costs)
            extra = peek if taken_back else 0.0
            propose = trace.costs.propose_base + k * trace.costs.draft_step + extra
            tracker.observe(k, propose, trace.costs.verify[k], withdrawn=taken_back)
            committed = min(n + 1, n_tokens - t)
            part.add(ReplayResult(committed, 1, k, n, int(taken_back), trace.costs.round_time(k) + extra))
            t += committed
        result.add(part)
        if by_prompt is not None:
            by_prompt.append(part)
    return result


_NO_LOGITS = torch.empty(0)  # a replayed draft taken back is judged by the trace, not by logits


def _round(
    control: Control, prompt: PromptTrace, t: int, costs: Costs, model: CostModel
) -> tuple[int, int, bool]:
    """One round at recorded position t: (k drafted, n accepted, whether a draft was taken back),
    after the controller's update."""
    pos = prompt.positions[t]
    control.begin([0], costs, [pos.drafts], [True])
    drafts = RowDrafts()
    while control.ask(0, drafts):
        k = len(drafts.tokens)
        seen = _seen(pos, k + 1, drawn=False)
        if not control.keep(0, k, seen):  # None: the trace has no confidences
            drafts.withdrawn = (seen or Confidence(None, 1.0, 0.0), None, _NO_LOGITS)
            break
        drafts.add(None, _seen(pos, k + 1, drawn=True))  # a replay has no draft tokens
    k = len(drafts.tokens)
    n = min(k, pos.accepted)
    # a draft taken back after k accepted ones would have been accepted if the trace's a_t > k
    judge = float(pos.accepted > k) if drafts.withdrawn is not None and pos.accepted >= k else None
    times = (model.propose_base + k * model.draft_step, model.verify[k])
    tokens = prompt.tokens[t : t + n + 1]
    position = prompt.prompt_length + t - 1
    control.end([row_outcome(position, drafts, n, tokens, times, control.costs, 0, judge)])
    return k, n, drafts.withdrawn is not None


def _seen(pos: Position, k: int, drawn: bool) -> Confidence | None:
    """The confidence the drafter reported of draft k (from 1) at ``pos``, as the engine shows it
    (no q(d) before the draft is drawn); None where the trace has none."""
    top1 = _at(pos.top1, k)
    if top1 is None:
        return None
    entropy = _at(pos.entropy, k)
    return Confidence(_at(pos.prob, k) if drawn else None, top1, 0.0 if entropy is None else entropy)


def _at(values: tuple[float, ...], k: int) -> float | None:
    return values[k - 1] if k <= len(values) else None


# -- oracles and comparison ------------------------------------------------------------------------


def oracle_time(trace: Trace) -> float:
    """Least modelled time per token: the best k chosen at every round, in hindsight."""
    total, tokens = 0.0, 0
    for prompt in trace.prompts:
        n_tokens = len(prompt.tokens)
        best = [0.0] * (n_tokens + 1)
        for t in range(n_tokens - 1, -1, -1):
            pos = prompt.positions[t]
            best[t] = min(
                trace.costs.round_time(k) + best[min(n_tokens, t + min(k, pos.accepted) + 1)]
                for k in range(pos.drafts + 1)
            )
        total += best[0]
        tokens += n_tokens
    return total / tokens if tokens else 0.0


def fixed_time(trace: Trace, k: int) -> float:
    """Modelled time per token of drafting k tokens every round (fewer where fewer were recorded)."""
    total, tokens = 0.0, 0
    for prompt in trace.prompts:
        n_tokens, t = len(prompt.tokens), 0
        while t < n_tokens:
            pos = prompt.positions[t]
            drafted = min(k, pos.drafts)
            total += trace.costs.round_time(drafted)
            t += min(drafted, pos.accepted) + 1
        tokens += n_tokens
    return total / tokens if tokens else 0.0


def best_fixed(trace: Trace) -> tuple[int, float]:
    """The fixed k with the least modelled time per token, and that time."""
    times = [fixed_time(trace, k) for k in range(trace.max_k + 1)]
    k = min(range(len(times)), key=times.__getitem__)
    return k, times[k]


ControllerSpec = Callable[[], Controller] | tuple[str, Mapping[str, Any]]


def build_controller(spec: ControllerSpec) -> Controller:
    """A fresh controller from a zero-argument factory or a registered (name, options) pair."""
    if callable(spec):
        return spec()
    from eesd_core.registry import get_manager

    name, options = spec
    entry = get_manager().registry("controller").get(name)
    if entry.options is None:
        return entry.factory()
    return entry.factory(validate(entry.options, dict(options), f"controller options for {name!r}"))


def compare_controllers(trace: Trace, controllers: Mapping[str, ControllerSpec]) -> list[dict[str, Any]]:
    """One row per controller, plus plain decoding, the best fixed k and the per-round oracle.

    Columns: ``mean_accepted_tokens`` (per target pass), ``acceptance`` (accepted / drafted),
    ``time_per_token`` (modelled seconds), ``speedup`` (vs plain decoding) and ``vs_oracle``
    (time per token over the oracle's; 1.0 is ideal).
    """
    oracle = oracle_time(trace)
    plain = trace.costs.plain_step
    k, fixed_time = best_fixed(trace)

    def row(name: str, tpt: float, result: ReplayResult | None = None) -> dict[str, Any]:
        return {
            "controller": name,
            "mean_accepted_tokens": result.mean_accepted_tokens if result else None,
            "acceptance": result.accepted / result.drafted if result and result.drafted else None,
            "time_per_token": tpt,
            "speedup": plain / tpt if tpt else None,
            "vs_oracle": tpt / oracle if oracle else None,
        }

    rows = [row("plain", plain), row(f"best fixed k={k}", fixed_time), row("oracle per round", oracle)]
    for name, spec in controllers.items():
        result = replay(trace, build_controller(spec))
        rows.append(row(name, result.time_per_token, result))
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`compare_controllers` rows."""
    header = ("controller", "tokens/pass", "accept", "ms/token", "speedup", "vs oracle")
    lines = ["{:<24} {:>11} {:>7} {:>9} {:>8} {:>10}".format(*header)]
    for r in rows:
        mat, acc = r["mean_accepted_tokens"], r["acceptance"]
        lines.append(
            "{:<24} {:>11} {:>7} {:>9.3f} {:>8.3f} {:>10.3f}".format(
                r["controller"],
                "-" if mat is None else f"{mat:.2f}",
                "-" if acc is None else f"{acc:.2f}",
                1000 * r["time_per_token"],
                r["speedup"],
                r["vs_oracle"],
            )
        )
    return "\n".join(lines)
