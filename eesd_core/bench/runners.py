"""One runner per method: generate from a prompt, time the call, report what the method did.

Every runner times the whole ``generate`` call from the outside, prefill included, as Spec-Bench
does, so that no method is timed by its own clock. All runners share one loaded model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_core.bench.methods import MethodSpec
from eesd_core.errors import ConfigError

HEAD_FORMAT = "eesd-exit-head"


@dataclass(frozen=True)
class BenchSettings:
    """How every method generates: the same length, temperature, seeds, exit layer and head."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    exit_layer: int | None = None
    head: str | None = None
    max_draft_tokens: int = 8

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Output:
    """New tokens, seconds of the call, and the method's counters (target passes = ``rounds``)."""

    tokens: list[int]
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)


def head_metadata(path: str | Path) -> dict[str, str] | None:
    """The metadata of an exit-head file, or ``None`` if ``path`` is not one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:
        return None
    return metadata if metadata.get("format") == HEAD_FORMAT else None


def find_head(model_dir: str | Path, exit_layer: int | None = None) -> str | None:
    """``--head auto``: an exit-head file in the checkpoint directory or its ``heads/`` folder.

    The first one (by name) distilled at ``exit_layer``, or at any layer when it is ``None``; the
    drafter checks on loading that it was distilled from this very model.
    """
    root = Path(model_dir)
    for path in sorted([*root.glob("*.safetensors"), *root.glob("heads/*.safetensors")]):
        metadata = head_metadata(path)
        if metadata and (exit_layer is None or metadata.get("exit_layer") == str(exit_layer)):
            return str(path)
    return None


def shipped_head(model: Any, exit_layer: int | None = None) -> str | None:
    """``--head auto`` without a head beside the checkpoint: the one the early-exit drafter ships
    for this exact model (matched by weight fingerprint), if that drafter is installed."""
    try:
        from eesd_early_exit.headfile import find_shipped_head, read_metadata
    except ImportError:
        return None
    from eesd_core.models import find_adapter

    path = find_shipped_head(find_adapter(model))
    if path is None or (exit_layer is not None and read_metadata(path)["exit_layer"] != str(exit_layer)):
        return None
    return str(path)


def resolve_exit_layer(settings: BenchSettings, num_layers: int) -> int:
    """N for every early-exit method: ``--exit-layer``, else the head's, else a quarter of the layers."""
    if settings.head is not None:
        metadata = head_metadata(settings.head)
        if metadata is None:
            raise ConfigError(f"{settings.head!r} is not an eesd exit-head file: pass --head none or a head.")
        head_layer = int(metadata["exit_layer"])
        if settings.exit_layer not in (None, head_layer):
            raise ConfigError(
                f"--exit-layer {settings.exit_layer} but the head was distilled at layer "
                f"{head_layer}: drop --exit-layer or pass another head."
            )
        return head_layer
    return settings.exit_layer if settings.exit_layer is not None else max(1, num_layers // 4)


class HFRunner:
    """transformers' ``generate()``, plain or with ``assistant_early_exit``; counts target passes."""

    def __init__(self, model: Any, exit_layer: int | None = None) -> None:
        self.model = model
        self.exit_layer = exit_layer
        self.base_config = getattr(model, model.base_model_prefix).config
        self.num_layers = self.base_config.num_hidden_layers

    def _generation_config(self, settings: BenchSettings) -> Any:
        from transformers import GenerationConfig

        own = self.model.generation_config
        eos = own.eos_token_id
        pad = own.pad_token_id if own.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
        sampling = {} if settings.greedy else dict(temperature=settings.temperature, top_k=0, top_p=1.0)
        return GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            do_sample=not settings.greedy,
            eos_token_id=eos,
            pad_token_id=pad,
            bos_token_id=own.bos_token_id,
            assistant_early_exit=self.exit_layer,
            **sampling,
        )

    def generate(self, prompt: list[int], settings: BenchSettings, seed: int) -> Output:
        config = self._generation_config(settings)
        ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)
        passes = [0]

        def count(module: Any, args: Any) -> None:
            passes[0] += self.base_config.num_hidden_layers == self.num_layers

        hook = self.model.register_forward_pre_hook(count)
        torch.manual_seed(seed)
        try:
            started = time.perf_counter()
            out = self.model.generate(ids, generation_config=config, attention_mask=torch.ones_like(ids))
            seconds = time.perf_counter() - started
        finally:
            hook.remove()
        tokens = out[0, len(prompt) :].tolist()
        return Output(tokens, seconds, {"rounds": passes[0]})


class EesdRunner:
    """A :class:`~eesd_core.engine.SpeculativeDecoder` kept for the whole run (controllers learn)."""

    def __init__(self, model: Any, kwargs: dict[str, Any]) -> None:
        from eesd_core.engine import SpeculativeDecoder

        self.decoder = SpeculativeDecoder(model, **kwargs)

    def generate(self, prompt: list[int], settings: BenchSettings, seed: int) -> Output:
        started = time.perf_counter()
        result = self.decoder.generate(
            prompt, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=seed
        )
        seconds = time.perf_counter() - started
        stats = result.stats
        counters = {
            key: getattr(stats, key)
            for key in (
                "rounds",
                "drafted",
                "accepted",
                "drafted_by_position",
                "accepted_by_position",
                "draft_time",
                "verify_time",
                "prefill_time",
                "stopped_by",
            )
        }
        counters["drafted_by_position"] = list(counters["drafted_by_position"])
        counters["accepted_by_position"] = list(counters["accepted_by_position"])
        return Output(result.sequences[0, len(prompt) :].tolist(), seconds, counters)


def eesd_kwargs(spec: MethodSpec, settings: BenchSettings, num_layers: int) -> dict[str, Any]:
    """Decoder keywords of an ``eesd`` spec; an early-exit drafter gets the run's exit layer and head."""
    kwargs = spec.decoder_kwargs(settings.max_draft_tokens)
    if kwargs["drafter"] == "early_exit":
        options = kwargs["drafter_options"]
        options.setdefault("head", settings.head)
        if options["head"] == settings.head:
            options.setdefault("exit_layer", resolve_exit_layer(settings, num_layers))
    return kwargs


def build_runner(spec: MethodSpec, model: Any, settings: BenchSettings) -> HFRunner | EesdRunner:
    num_layers = getattr(model, model.base_model_prefix).config.num_hidden_layers
    if spec.kind == "hf":
        return HFRunner(model)
    if spec.kind == "hf_early_exit":
        return HFRunner(model, spec.options.get("exit_layer") or resolve_exit_layer(settings, num_layers))
    if spec.kind == "eesd":
        return EesdRunner(model, eesd_kwargs(spec, settings, num_layers))
    raise ConfigError(f"Method {spec.name!r} ({spec.kind}) is not run per prompt.")
