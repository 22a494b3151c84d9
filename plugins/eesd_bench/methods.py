"""What a benchmark compares: method specs, their named presets and groups.

A spec is ``KIND`` or ``KIND:key=value,...`` with KIND one of

- ``hf``: transformers' ``generate()``, plain decoding (the baseline);
- ``hf_early_exit``: transformers' ``generate(assistant_early_exit=N)``; key ``exit_layer``
  (default: the N the early-exit drafter chooses for the run's head);
- ``hf_assisted``: transformers' ``generate(assistant_model=draft)`` with the separate draft model
  of ``--assistant-model``; keys ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and
  ``assistant_confidence_threshold`` set the draft's generation config (transformers' defaults:
  20, ``constant``, 0.4);
- ``hf_prompt_lookup``: transformers' ``generate(prompt_lookup_num_tokens=k)``; keys ``k`` (default
  10, as transformers' docs suggest) and ``max_ngram`` (its ``max_matching_ngram_size``, default 2);
- ``hf_static``: transformers' ``generate(cache_implementation="static")``, plain decoding on a
  cache allocated once, which transformers compiles (``torch.compile``, its ``CompileConfig``) where
  it would on its own (GPUs); key ``compile``: ``auto`` (that rule, the default), ``true`` (compile
  on any device, CPUs included) or ``false`` (never);
- ``eesd``: a :class:`~eesd_core.engine.SpeculativeDecoder`; keys ``drafter`` (``none`` for plain
  decoding), ``controller``, ``verifier``, ``max_draft_tokens``, ``products`` (how the model
  adapter's linear layers multiply: ``auto``, ``standard``, ``transposed`` or ``onednn``), ``skip_padding``
  (``false``: batched passes multiply padding positions too) and ``compile`` (how passes run:
  ``auto``, ``off`` or ``static``, buffers allocated once); ``drafter.X`` and
  ``controller.X`` set plug-in options, and any other key is a controller option, so
  ``eesd:controller=fixed,k=4`` drafts four tokens a round;
- ``oracle``: not run, but replayed from a recorded trace (the best draft length in hindsight).

Values are read as JSON where they parse (``4``, ``0.5``, ``true``), ``none`` as ``None``, and as
strings otherwise. An ``hf`` kind refuses keys it does not know. Plug-ins are named, never imported:
the registry builds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from eesd_core.errors import ConfigError

KINDS = ("hf", "hf_early_exit", "hf_assisted", "hf_prompt_lookup", "hf_static", "eesd", "oracle")
DECODER_KEYS = ("drafter", "controller", "verifier", "max_draft_tokens")
ASSISTANT_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
HF_KEYS: dict[str, tuple[str, ...]] = {
    "hf": (),
    "hf_early_exit": ("exit_layer",),
    "hf_assisted": (
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
    ),
    "hf_prompt_lookup": ("k", "max_ngram"),
    "hf_static": ("compile",),
}

PRESETS: dict[str, str] = {
    "hf": "hf",
    "hf_early_exit": "hf_early_exit",
    "hf_assisted": "hf_assisted",
    "hf_prompt_lookup": "hf_prompt_lookup",
    "hf_static": "hf_static",
    "hf_compiled": "hf_static:compile=true",
    "eesd_plain": "eesd:drafter=none",
    "eesd_plain_standard": "eesd:drafter=none,products=standard",
    "eesd_default_standard": "eesd:products=standard",
    "eesd_default": "eesd",
    "eesd_default_dense": "eesd:skip_padding=false",
    "eesd_plain_dense": "eesd:drafter=none,skip_padding=false",
    "eesd_plain_graphs": "eesd:drafter=none,compile=graphs",
    "eesd_default_graphs": "eesd:compile=graphs",
    "eesd_fixed_k1": "eesd:controller=fixed,k=1",
    "eesd_fixed_k2": "eesd:controller=fixed,k=2",
    "eesd_fixed_k4": "eesd:controller=fixed,k=4",
    "eesd_heuristic": "eesd:controller=heuristic",
    "eesd_confidence": "eesd:controller=confidence",
    "eesd_ema": "eesd:controller=ema",
    "eesd_ucb": "eesd:controller=ucb",
    "eesd_thompson_calibration": "eesd:controller=thompson,variant=calibration",
    "eesd_thompson_bernoulli": "eesd:controller=thompson,stop_rule=bernoulli",
    "eesd_prompt_lookup": "eesd:drafter=prompt_lookup,controller=thompson",
    "eesd_prompt_lookup_k4": "eesd:drafter=prompt_lookup,controller=fixed,k=4",
    "oracle": "oracle",
}

GROUPS: dict[str, tuple[str, ...]] = {
    "default": (
        "hf",
        "hf_early_exit",
        "eesd_plain_standard",
        "eesd_plain",
        "eesd_default",
        "eesd_prompt_lookup",
    ),
    "controllers": (
        "eesd_fixed_k1",
        "eesd_fixed_k2",
        "eesd_fixed_k4",
        "eesd_heuristic",
        "eesd_confidence",
        "eesd_ema",
        "eesd_ucb",
        "eesd_thompson_calibration",
        "eesd_thompson_bernoulli",
    ),
}
GROUPS["all"] = (
    GROUPS["default"] + GROUPS["controllers"] + ("eesd_prompt_lookup_k4", "hf_prompt_lookup", "oracle")
)


@dataclass(frozen=True)
class MethodSpec:
    """A method as parsed: its report ``name``, ``kind`` and the ``options`` its text gave."""

    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def decoder_kwargs(self, max_draft_tokens: int = 8) -> dict[str, Any]:
        """``SpeculativeDecoder`` keywords of an ``eesd`` spec (drafter options not yet completed)."""
        kwargs: dict[str, Any] = {
            "drafter": "early_exit",
            "controller": "thompson",
            "verifier": "lossless",
            "max_draft_tokens": max_draft_tokens,
        }
        drafter_options: dict[str, Any] = {}
        controller_options: dict[str, Any] = {}
        for key, value in self.options.items():
            if key in DECODER_KEYS:
                kwargs[key] = value
            elif key in ("products", "skip_padding", "compile"):
                kwargs.setdefault("adapter_options", {})[key] = value
            elif key.startswith("drafter."):
                drafter_options[key.removeprefix("drafter.")] = value
            else:
                controller_options[key.removeprefix("controller.")] = value
        kwargs.update(drafter_options=drafter_options, controller_options=controller_options)
        return kwargs

    def generation_options(self) -> dict[str, Any]:
        """Checked ``GenerationConfig`` keywords of an ``hf_prompt_lookup``, ``hf_static`` or
        ``hf_assisted`` spec.

        transformers reads those of ``hf_assisted`` from the draft model's own generation config.
        """
        if self.kind == "hf_static":
            return self._static_options()
        if self.kind == "hf_prompt_lookup":
            return {
                "prompt_lookup_num_tokens": self._whole("k", 10),
                "max_matching_ngram_size": self._whole("max_ngram", 2),
            }
        if self.kind != "hf_assisted":
            return {}
        self._whole("num_assistant_tokens", 20)
        if self.options.get("num_assistant_tokens_schedule", "constant") not in ASSISTANT_SCHEDULES:
            schedules = ", ".join(ASSISTANT_SCHEDULES)
            raise ConfigError(f"Method {self.name!r}: num_assistant_tokens_schedule is one of {schedules}.")
        threshold = self.options.get("assistant_confidence_threshold", 0.4)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            raise ConfigError(f"Method {self.name!r}: assistant_confidence_threshold is a number in [0, 1].")
        return dict(self.options)

    def _static_options(self) -> dict[str, Any]:
        from transformers import CompileConfig

        choice = self.options.get("compile", "auto")
        if choice != "auto" and not isinstance(choice, bool):
            raise ConfigError(f"Method {self.name!r}: compile is auto, true or false, not {choice!r}.")
        if choice is False:
            return {"cache_implementation": "static", "disable_compile": True}
        config = CompileConfig()
        if choice is True:
            config._compile_all_devices = True  # type: ignore[assignment]  # transformers' switch off GPUs
        return {"cache_implementation": "static", "compile_config": config}

    def _whole(self, key: str, default: int) -> int:
        value = self.options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"Method {self.name!r}: {key} is a whole number of at least 1, not {value!r}.")
        return value

    def plugins(self) -> list[tuple[str, str]]:
        """The (kind, name) pairs of registered plug-ins this method needs."""
        if self.kind == "oracle" or (self.kind == "hf_early_exit" and "exit_layer" not in self.options):
            return [("drafter", "early_exit")]
        if self.kind != "eesd":
            return []
        kwargs = self.decoder_kwargs()
        needed = [("controller", kwargs["controller"]), ("verifier", kwargs["verifier"])]
        if kwargs["drafter"] is not None:
            needed.insert(0, ("drafter", kwargs["drafter"]))
        return needed


def _value(text: str) -> Any:
    if text.lower() == "none":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_method(text: str) -> MethodSpec:
    """A preset's name or a ``KIND:key=value,...`` string (see the module docstring)."""
    name = text.strip()
    spec = PRESETS.get(name, name)
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise ConfigError(
            f"Unknown benchmark method {text!r}: use one of {', '.join(PRESETS)}, a group "
            f"({', '.join(GROUPS)}), or KIND:key=value,... with KIND in {', '.join(KINDS)}."
        )
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"Method {text!r}: {item!r} is not key=value.")
        options[key.strip()] = _value(value.strip())
    unknown = sorted(set(options) - set(HF_KEYS.get(kind, options)))
    if unknown:
        known = ", ".join(HF_KEYS[kind]) or "none"
        raise ConfigError(f"Method {text!r}: {kind} has no key {', '.join(unknown)} (its keys: {known}).")
    return MethodSpec(name, kind, options)


def expand_methods(texts: list[str], registered: dict[str, list[str]]) -> tuple[list[MethodSpec], list[str]]:
    """Specs for ``texts`` (groups expanded, duplicates dropped) and notes on what was left out.

    ``registered`` maps a plug-in kind to its registered names. A group member that needs a
    missing plug-in is left out with a note; a method named on its own is an error.
    """
    specs: list[MethodSpec] = []
    notes: list[str] = []
    for text in texts:
        in_group = text in GROUPS
        for member in GROUPS.get(text, (text,)):
            spec = parse_method(member)
            missing = [
                f"{kind} {name!r}" for kind, name in spec.plugins() if name not in registered.get(kind, [])
            ]
            if missing and in_group:
                notes.append(f"{spec.name}: skipped, {', '.join(missing)} is not registered")
            elif missing:
                raise ConfigError(
                    f"Method {spec.name!r} needs {', '.join(missing)}, which is not registered; "
                    "see `eesd plugins`."
                )
            elif all(s.name != spec.name for s in specs):
                specs.append(spec)
    return specs, notes
