"""Traces as files: what made them, whether they still hold, and the ones eesd ships.

A trace is only as good as the drafter that made it: the accepted prefixes belong to one model and
one exit head. :func:`describe_recording` names both (the head by its file's SHA-256) and the eesd
version; :func:`check_fresh` refuses a trace whose head file has changed or gone. The shipped
traces live in ``eesd_bench/traces/`` as gzip JSON (:meth:`Trace.save`), one per model.
"""

from __future__ import annotations

import hashlib
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eesd_bench.trace import PromptTrace, Trace, measure_costs, record_prompt
from eesd_core.errors import EESDError, InputError

SHIPPED_TRACES = Path(__file__).parent / "traces"
FORMAT = "eesd-trace/2"


class StaleTraceError(EESDError):
    """A trace recorded with an exit head that is no longer the one it names."""


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def eesd_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eesd")
    except PackageNotFoundError:
        return "unknown"


def describe_recording(decoder: Any, model_name: str, max_new_tokens: int) -> dict[str, Any]:
    """The ``meta`` of a trace: model, head (name, path, SHA-256), drafter, eesd version, machine."""
    drafter = decoder.drafter
    head_path = getattr(drafter, "head_path", None)
    adapter = decoder.adapter
    return {
        "format": FORMAT,
        "model": model_name,
        "model_shape": {
            "architecture": adapter.model_type,
            "layers": adapter.num_layers,
            "hidden_size": adapter.hidden_size,
            "vocab_size": adapter.vocab_size,
            "dtype": str(next(adapter.model.parameters()).dtype).removeprefix("torch."),
        },
        "drafter": decoder.config.drafter,
        "drafter_described": drafter.describe() if hasattr(drafter, "describe") else type(drafter).__name__,
        "exit_layer": getattr(drafter, "shared_layers", None),
        "head": None if head_path is None else head_path.name,
        "head_path": None if head_path is None else str(head_path),
        "head_sha256": None if head_path is None else file_digest(head_path),
        "eesd_version": eesd_version(),
        "max_new_tokens": max_new_tokens,
        "machine": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def plugin_folder(kind: str, name: str) -> Path | None:
    """The package folder of the registered ``kind`` ``name`` (where it keeps shipped files)."""
    from eesd_core.errors import UnknownPluginError
    from eesd_core.registry import get_manager

    try:
        factory = get_manager().registry(kind).get(name).factory
    except UnknownPluginError:
        return None
    module = sys.modules.get(getattr(factory, "__module__", ""))
    return Path(module.__file__).parent if module is not None and module.__file__ else None


def head_candidates(meta: dict[str, Any]) -> list[Path]:
    """Where a trace's head may be now: its recorded path, then a head of the same name that the
    drafter ships (in a ``heads/`` folder of its package)."""
    paths = [Path(meta["head_path"])] if meta.get("head_path") else []
    folder = plugin_folder("drafter", meta.get("drafter") or "")
    return paths if folder is None else [*paths, folder / "heads" / meta["head"]]


def check_fresh(trace: Trace, source: str = "the trace") -> None:
    """Raise :class:`StaleTraceError` if the head that made ``trace`` changed since it was recorded.

    A trace of an untrained exit or of a drafter without a head is always fresh; one that names no
    head digest (an older trace) cannot be checked and is taken as it is.
    """
    meta = trace.meta
    if not meta.get("head") or not meta.get("head_sha256"):
        return
    found = [p for p in head_candidates(meta) if p.is_file()]
    if not found:
        raise StaleTraceError(
            f"{source} was recorded with the exit head {meta['head']}, which is no longer installed: "
            "record the trace again with `eesd trace record` (or pass --allow-stale to use it anyway)."
        )
    if all(file_digest(p) != meta["head_sha256"] for p in found):
        raise StaleTraceError(
            f"{source} was recorded with another version of the exit head {meta['head']} "
            f"(SHA-256 {meta['head_sha256'][:12]}..., now {file_digest(found[0])[:12]}...): its accepted "
            "counts no longer hold. Record the trace again with `eesd trace record` "
            "(or pass --allow-stale to use it anyway)."
        )


def shipped_traces() -> dict[str, Path]:
    """The shipped traces by name (the file name without ``.json.gz``)."""
    return {p.name.removesuffix(".json.gz"): p for p in sorted(SHIPPED_TRACES.glob("*.json.gz"))}


def shipped_or_file(name_or_path: str, shipped: dict[str, Path], what: str) -> Path:
    """The shipped file of that name, else that file, else an error listing the shipped names."""
    path = shipped.get(name_or_path, Path(name_or_path))
    if not path.is_file():
        names = ", ".join(shipped) or "none"
        raise InputError(f"No {what} {name_or_path!r}: name a {what} file or a shipped one ({names}).")
    return path


def load_trace(name_or_path: str, allow_stale: bool = False) -> Trace:
    """A shipped trace by name, or a trace file; stale ones are refused unless ``allow_stale``."""
    path = shipped_or_file(name_or_path, shipped_traces(), "trace")
    trace = Trace.load(path)
    if not allow_stale:
        check_fresh(trace, f"The trace {path.name}")
    return trace


Prompt = tuple[str, str, list[int]]  # (category, name, token ids)


def record_prompts(
    decoder: Any,
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    out: Path,
    meta: dict[str, Any],
    resume: bool = False,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Trace:
    """Record every prompt into ``out``, saving after each one, in the order given; with ``resume``,
    keep the prompts a previous run of the same settings already saved there. Costs are measured on
    the first prompt."""
    done: dict[str, PromptTrace] = {}
    trace: Trace | None = None
    if resume and out.is_file():
        trace = Trace.load(out)
        same = (
            trace.meta.get("head_sha256") == meta.get("head_sha256")
            and trace.max_k == decoder.config.max_draft_tokens
        )
        if not same or trace.meta.get("max_new_tokens") != max_new_tokens:
            raise InputError(
                f"{out} was recorded with other settings: drop --resume or choose another --out."
            )
        done = {p.name: p for p in trace.prompts}
    if trace is None:
        say(f"measuring costs on the first prompt ({decoder.config.max_draft_tokens + 1} values of k)")
        trace = Trace(decoder.config.max_draft_tokens, measure_costs(decoder, prompts[0][2]), (), meta)
    order = {name: i for i, (_, name, _) in enumerate(prompts)}
    kept = list(done.values())
    for i, (category, name, ids) in enumerate(prompts, 1):
        if name in done:
            continue
        say(f"[{i}/{len(prompts)}] {category} {name}: {len(ids)} prompt tokens")
        start = time.perf_counter()
        recorded = replace(record_prompt(decoder, ids, max_new_tokens), category=category, name=name)
        kept = sorted([*kept, recorded], key=lambda p: order.get(p.name, -1))  # in the order asked
        trace = replace(trace, prompts=tuple(kept), meta={**meta, "recorded": trace.meta.get("recorded")})
        trace.save(out)
        took = time.perf_counter() - start
        say(f"[{i}/{len(prompts)}] {category} {name}: {len(recorded.tokens)} tokens in {took:.0f} s")
    return trace
