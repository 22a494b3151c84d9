"""Cost profiles: what one machine's passes cost for one model shape, as a small JSON file.

A profile holds, per batch size, a :class:`~eesd_bench.trace.CostModel` (a draft step, a round's
drafting beyond its steps, and verification of m = 1 .. K + 1 positions) and the time of a plain
decoding step (a decoder without a drafter), and names the machine, model shape, precision and
date. :func:`measure_profile` times them on this machine with the real model (``eesd costs
measure``); :func:`from_cost_curves` derives one from a GPU's ``benchmarks/cost_curves.py`` result.
The shipped profiles live in ``eesd_bench/costs/``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eesd_bench.trace import CostModel, measure_costs
from eesd_bench.tracefile import shipped_or_file
from eesd_core.errors import InputError

SHIPPED_PROFILES = Path(__file__).parent / "costs"
FORMAT = "eesd-costs/1"


@dataclass(frozen=True)
class CostProfile:
    """Costs per batch size (``batches[B]``), plain decoding steps per batch size (``plain[B]``),
    and what they were measured on."""

    batches: Mapping[int, CostModel]
    plain: Mapping[int, float]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def at(self, batch_size: int = 1) -> CostModel:
        if batch_size not in self.batches:
            raise InputError(
                f"The cost profile {self.meta.get('name', '')!r} has no batch size {batch_size}: "
                f"it has {sorted(self.batches)}."
            )
        return self.batches[batch_size]

    def plain_step(self, batch_size: int = 1) -> float:
        """A plain decoder's step; the drafter's k = 0 round where none was measured."""
        return self.plain.get(batch_size) or self.at(batch_size).plain_step

    def to_dict(self) -> dict[str, Any]:
        batches = {
            str(b): {"draft_step": c.draft_step, "propose_base": c.propose_base, "verify": list(c.verify)}
            for b, c in sorted(self.batches.items())
        }
        plain = {str(b): s for b, s in sorted(self.plain.items())}
        return {"format": FORMAT, **self.meta, "plain_step": plain, "batches": batches}

    @classmethod
    def mean(cls, profiles: Sequence[CostProfile]) -> CostProfile:
        """Profiles of one machine and model timed at different moments, averaged; the first's
        description is kept."""
        sizes = set(profiles[0].batches)
        if any(set(p.batches) != sizes or set(p.plain) != set(profiles[0].plain) for p in profiles):
            raise InputError("Only profiles of the same batch sizes can be averaged.")
        batches = {b: CostModel.mean([p.batches[b] for p in profiles]) for b in sorted(sizes)}
        plain = {b: statistics.fmean(p.plain[b] for p in profiles) for b in sorted(profiles[0].plain)}
        return cls(batches, plain, dict(profiles[0].meta))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostProfile:
        meta = {k: v for k, v in data.items() if k not in ("batches", "plain_step")}
        batches = {
            int(b): CostModel(c["draft_step"], c["propose_base"], tuple(c["verify"]))
            for b, c in data["batches"].items()
        }
        plain = {int(b): float(s) for b, s in data.get("plain_step", {}).items()}
        return cls(batches, plain, meta)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except OSError as exc:
            raise InputError(f"Cannot read the cost profile {str(path)!r} ({exc}).") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(
                f"{str(path)!r} is not an eesd cost profile ({exc!r}): write one with `eesd costs measure`."
            ) from None


def shipped_profiles() -> dict[str, Path]:
    return {p.stem: p for p in sorted(SHIPPED_PROFILES.glob("*.json"))}


def load_profile(name_or_path: str) -> CostProfile:
    """A shipped profile by name, or a profile file."""
    path = shipped_or_file(name_or_path, shipped_profiles(), "cost profile")
    profile = CostProfile.load(path)
    name = path.name.removesuffix(".json")
    return CostProfile(profile.batches, profile.plain, {"name": name, **profile.meta})


def measure_plain_step(plain_decoder: Any, prompt: Sequence[int], steps: int, batch_size: int = 1) -> float:
    """Mean seconds between the rounds of a plain decoder's greedy stream of ``batch_size``
    copies of ``prompt`` (the prefill left out)."""
    times: list[float] = []
    asked = list(prompt) if batch_size == 1 else [list(prompt)] * batch_size
    last = time.perf_counter()
    for i, _ in enumerate(plain_decoder.stream(asked, max_new_tokens=steps + 1, eos_token_id=[])):
        now = time.perf_counter()
        if i:
            times.append(now - last)
        last = now
    return statistics.fmean(times)


def measure_profile(
    decoder: Any,
    plain_decoder: Any,
    prompt: Sequence[int],
    meta: Mapping[str, Any],
    cycles: int = 4,
    say: Callable[[str], None] = lambda line: None,
    batch_sizes: Sequence[int] = (1,),
) -> CostProfile:
    """Each of ``batch_sizes`` on this machine: the drafter's costs by k (:func:`measure_costs`,
    cycling k through 0 .. K, every row alike) and a plain decoder's step, the two interleaved
    twice and averaged: means, like the totals a replay predicts, so that slow rounds count."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise InputError(f"A cost profile needs batch sizes of at least 1, not {list(batch_sizes)}.")
    batches, plain = {}, {}
    for size in sorted(set(batch_sizes)):
        models, plains = [], []
        for attempt in range(2):
            at = f"batch size {size}, " if size > 1 or len(batch_sizes) > 1 else ""
            say(f"timing rounds with k = 0 .. {decoder.config.max_draft_tokens} ({at}{attempt + 1}/2)")
            models.append(measure_costs(decoder, prompt, cycles, size))
            say(f"timing plain decoding steps ({at}{attempt + 1}/2)")
            plains.append(measure_plain_step(plain_decoder, prompt, 8 * cycles, size))
        batches[size] = CostModel.mean(models)
        plain[size] = statistics.fmean(plains)
    return CostProfile(batches, plain, dict(meta))


def machine_meta(decoder: Any, model_name: str, note: str = "") -> dict[str, Any]:
    """Machine, model shape, precision and date of a profile measured here."""
    import torch

    from eesd_bench.env import cpu_name

    adapter = decoder.adapter
    gpu = torch.cuda.get_device_name(adapter.device) if adapter.device.type == "cuda" else None
    return {
        "machine": gpu or cpu_name() or platform.processor(),
        "device": str(adapter.device),
        "threads": torch.get_num_threads(),
        "model": model_name,
        "model_shape": {
            "architecture": adapter.model_type,
            "layers": adapter.num_layers,
            "hidden_size": adapter.hidden_size,
            "vocab_size": adapter.vocab_size,
        },
        "exit_layer": getattr(decoder.drafter, "shared_layers", None),
        "precision": str(next(adapter.model.parameters()).dtype).removeprefix("torch."),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "eesd costs measure" + (f" ({note})" if note else ""),
    }


def from_cost_curves(data: Mapping[str, Any], exit_layer: int, source: str) -> CostProfile:
    """A batch-size-1 profile from a ``benchmarks/cost_curves.py`` result at one exit layer: its
    modelled round costs (passes timed alone plus the engine's measured per-round overhead) and
    its timed plain step."""
    layers = data["modelled"]["by_exit_layer"]
    if str(exit_layer) not in layers:
        raise InputError(f"{source} has no exit layer {exit_layer}: it has {', '.join(layers)}.")
    costs = layers[str(exit_layer)]["costs"]
    env = data.get("environment", {})
    meta = {
        "machine": env.get("gpu") or env.get("cpu") or data.get("device"),
        "device": data.get("device"),
        "model": data.get("shape"),
        "model_shape": {
            "architecture": data.get("model_class"),
            "layers": data.get("layers"),
            "hidden_size": data.get("config", {}).get("hidden_size"),
            "vocab_size": data.get("config", {}).get("vocab_size"),
        },
        "exit_layer": exit_layer,
        "precision": data.get("dtype"),
        "date": env.get("date"),
        "source": f"derived from {source}",
    }
    model = CostModel(costs["draft_step"], costs["propose_base"], tuple(costs["verify"]))
    return CostProfile({1: model}, {1: data["timings"]["plain_step"]["median"]}, meta)
