"""One runner per method: generate from a prompt, time the call, report what the method did.

Every runner times the whole ``generate`` call from the outside, prefill included, as Spec-Bench
does, so that no method is timed by its own clock. All runners share one loaded model, and every
``hf_assisted`` runner one loaded draft model.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eesd_bench.methods import MethodSpec, parse_method
from eesd_core.errors import ConfigError

HEAD_FORMAT = "eesd-exit-head"


@dataclass(frozen=True)
class BenchSettings:
    """How every method generates: the same length, temperature, seeds, exit layer and head.

    ``exit_layer`` and ``head`` go to every early-exit method as they are: ``head`` is a head
    file, ``None`` (the target's own norm and LM head) or ``"auto"`` (the head the early-exit
    drafter ships for this exact target, if any); ``exit_layer=None`` lets the drafter choose N.
    ``assistant`` is the checkpoint directory of ``hf_assisted``'s draft model.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    exit_layer: int | None = None
    head: str | None = None
    max_draft_tokens: int = 8
    assistant: str | None = None

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


def early_exit_decoder(model: Any, settings: BenchSettings) -> Any:
    """The ``eesd_default`` decoder: the early-exit drafter with the run's exit layer and head.

    The bench learns N (``drafter.shared_layers``) and what drafts (``drafter.describe()``) from
    it, so that the drafter alone decides how a head and an exit layer go together.
    """
    from eesd_core.engine import SpeculativeDecoder

    return SpeculativeDecoder(model, **eesd_kwargs(parse_method("eesd"), settings))


def resolve_exit_layer(model: Any, settings: BenchSettings) -> int:
    """N for every early-exit method: what the early-exit drafter makes of the run's settings."""
    return int(early_exit_decoder(model, settings).drafter.shared_layers)


def load_assistant(path: str | Path, model: Any) -> Any:
    """``hf_assisted``'s draft model, in the target's dtype and on its device."""
    from transformers import AutoModelForCausalLM

    assistant = AutoModelForCausalLM.from_pretrained(path, dtype=model.dtype)
    return assistant.to(model.device).eval()


def check_assistant(model: Any, assistant: Any) -> None:
    """A draft model must share the target's vocabulary: transformers compares their logits."""
    ours = model.config.get_text_config().vocab_size
    theirs = assistant.config.get_text_config().vocab_size
    if ours != theirs:
        raise ConfigError(
            f"The assistant model's vocabulary ({theirs} tokens) is not the target's ({ours}): "
            "pass an --assistant-model of the same family, with the same tokenizer."
        )


def assistant_record(assistant: Any, name: str | None = None) -> dict[str, Any]:
    """What a result says of the draft model: its name, checkpoint, size and dtype."""
    parameters = list(assistant.parameters())
    return {
        "name": name or str(getattr(assistant, "name_or_path", "") or type(assistant).__name__),
        "path": str(getattr(assistant, "name_or_path", "")),
        "parameters": sum(p.numel() for p in parameters),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in parameters),
        "dtype": str(parameters[0].dtype).removeprefix("torch."),
    }


def compiles(model: Any, options: dict[str, Any]) -> bool:
    """Whether transformers' ``generate()`` with ``options`` compiles the model's forward: a static
    cache's on GPUs, on other devices only where its ``CompileConfig`` says so."""
    config = options.get("compile_config")
    return config is not None and (model.device.type in ("cuda", "xpu") or bool(config._compile_all_devices))


def say_compiling() -> None:
    print(
        "eesd bench: transformers compiles the model's forward (torch.compile) at its first "
        "calls of each shape; on a CPU this can take minutes",
        file=sys.stderr,
        flush=True,
    )


class HFRunner:
    """transformers' ``generate()``; counts target passes.

    Plain, or with ``assistant_early_exit`` (``exit_layer``), a separate draft model
    (``assistant``, whose generation config gets ``assistant_options``) or other
    ``GenerationConfig`` keywords (``options``: prompt lookup's, a static cache's).
    """

    def __init__(
        self,
        model: Any,
        exit_layer: int | None = None,
        *,
        options: dict[str, Any] | None = None,
        assistant: Any = None,
        assistant_options: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.exit_layer = exit_layer
        self.options = dict(options or {})
        self.assistant = assistant
        self.base_config = getattr(model, model.base_model_prefix).config
        self.num_layers = self.base_config.num_hidden_layers
        self.compiles = compiles(model, self.options)
        if assistant is not None:
            check_assistant(model, assistant)
            # transformers writes the "heuristic" schedule's draft length back into this config:
            # each runner keeps its own, so methods sharing the draft model do not steer each other.
            self.assistant_config = copy.deepcopy(assistant.generation_config)
            self.assistant_config.update(**(assistant_options or {}))

    def _generation_config(self, settings: BenchSettings) -> Any:
        """The run's settings, the rest neutral.

        ``generate()`` fills every field left unset from the checkpoint's own generation config, so
        a default there that changes the tokens (Qwen's repetition penalty) is set back here.
        """
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
            repetition_penalty=1.0,
            assistant_early_exit=self.exit_layer,
            **sampling,
            **self.options,
        )

    def generate(self, prompt: list[int], settings: BenchSettings, seed: int) -> Output:
        config = self._generation_config(settings)
        ids = torch.tensor([prompt], dtype=torch.long, device=self.model.device)
        extra: dict[str, Any] = {}
        if self.assistant is not None:
            self.assistant.generation_config = self.assistant_config
            extra["assistant_model"] = self.assistant
        passes = [0]

        def count(module: Any, args: Any) -> None:
            passes[0] += self.base_config.num_hidden_layers == self.num_layers

        if self.compiles:
            say_compiling()
            self.compiles = False
        hook = self.model.register_forward_pre_hook(count)
        torch.manual_seed(seed)
        try:
            started = time.perf_counter()
            out = self.model.generate(
                ids, generation_config=config, attention_mask=torch.ones_like(ids), **extra
            )
            if out.device.type == "cuda":  # stop the clock when the GPU is done, as eesd's does
                torch.cuda.synchronize(out.device)
            seconds = time.perf_counter() - started
        finally:
            hook.remove()
        tokens = out[0, len(prompt) :].tolist()
        return Output(tokens, seconds, {"rounds": passes[0]})


class EesdRunner:
    """A :class:`~eesd_core.engine.SpeculativeDecoder` kept for the whole run (controllers learn).

    ``generation`` is the latest call's :class:`~eesd_core.generation.Generation`, for probes that
    look at what a call held (the memory probe reads its cache).
    """

    COUNTERS = (
        "rounds",
        "drafted",
        "accepted",
        "withdrawn",
        "drafted_by_position",
        "accepted_by_position",
        "draft_time",
        "verify_time",
        "prefill_time",
        "stopped_by",
    )

    def __init__(self, model: Any, kwargs: dict[str, Any]) -> None:
        from eesd_core.engine import SpeculativeDecoder

        self.decoder = SpeculativeDecoder(model, **kwargs)
        self.generation: Any = None

    def generate(self, prompt: list[int], settings: BenchSettings, seed: int) -> Output:
        started = time.perf_counter()
        self.generation = self.decoder.stream(
            prompt, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=seed
        )
        tokens = [token for chunk in self.generation for token in chunk]
        seconds = time.perf_counter() - started
        counters = {key: getattr(self.generation.stats, key) for key in self.COUNTERS}
        counters["drafted_by_position"] = list(counters["drafted_by_position"])
        counters["accepted_by_position"] = list(counters["accepted_by_position"])
        return Output(tokens, seconds, counters)


def eesd_kwargs(spec: MethodSpec, settings: BenchSettings) -> dict[str, Any]:
    """Decoder keywords of an ``eesd`` spec; an early-exit drafter gets the run's exit layer and head."""
    kwargs = spec.decoder_kwargs(settings.max_draft_tokens)
    if kwargs["drafter"] == "early_exit":
        options = kwargs["drafter_options"]
        options.setdefault("head", settings.head)
        if options["head"] == settings.head and settings.exit_layer is not None:
            options.setdefault("exit_layer", settings.exit_layer)
    return kwargs


def build_runner(
    spec: MethodSpec, model: Any, settings: BenchSettings, assistant: Any = None
) -> HFRunner | EesdRunner:
    """The runner of ``spec``; ``hf_assisted`` uses ``assistant``, else loads ``settings.assistant``."""
    if spec.kind == "hf":
        return HFRunner(model)
    if spec.kind == "hf_early_exit":
        return HFRunner(model, spec.options.get("exit_layer") or resolve_exit_layer(model, settings))
    if spec.kind in ("hf_prompt_lookup", "hf_static"):
        return HFRunner(model, options=spec.generation_options())
    if spec.kind == "hf_assisted":
        options = spec.generation_options()
        if assistant is None and settings.assistant is None:
            raise ConfigError(
                f"Method {spec.name!r} drafts with a separate model: name it with --assistant-model "
                "(a checkpoint directory or a known model of the target's family)."
            )
        draft = assistant if assistant is not None else load_assistant(str(settings.assistant), model)
        return HFRunner(model, assistant=draft, assistant_options=options)
    if spec.kind == "eesd":
        return EesdRunner(model, eesd_kwargs(spec, settings))
    raise ConfigError(f"Method {spec.name!r} ({spec.kind}) is not run per prompt.")
