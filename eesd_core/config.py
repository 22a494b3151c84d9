"""Validated configuration: the decoder's, the generation's, and each plug-in's options.

Every model forbids unknown keys, so a typo is an error that names the key, never a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eesd_core.errors import ConfigError, InputError

MAX_DRAFT_TOKENS_LIMIT = 64


def number(value: Any, what: str) -> Any:
    """A Python number for a numpy or torch scalar (lists element-wise); a bool is no number."""
    if isinstance(value, (list, tuple)):
        return type(value)(number(item, what) for item in value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        raise ValueError(f"{what} takes numbers, not the bool {value}")
    return value


def default_cache_dir() -> Path:
    """Where eesd keeps files: ``$EESD_CACHE_DIR``, else ``$XDG_CACHE_HOME/eesd``, else
    ``~/.cache/eesd`` (empty variables count as unset)."""
    if os.environ.get("EESD_CACHE_DIR"):
        return Path(os.environ["EESD_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "eesd"
    return Path.home() / ".cache" / "eesd"


class PluginOptions(BaseModel):
    """Base of every plug-in's options model: frozen, unknown keys forbidden."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class DecoderConfig(BaseModel):
    """Which plug-ins a :class:`~eesd_core.engine.SpeculativeDecoder` uses, and the draft cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    drafter: str | None = "early_exit"
    drafter_options: dict[str, Any] = Field(default_factory=dict)
    controller: str = "thompson"
    controller_options: dict[str, Any] = Field(default_factory=dict)
    verifier: str = "lossless"
    verifier_options: dict[str, Any] = Field(default_factory=dict)
    max_draft_tokens: int = Field(8, ge=1, le=MAX_DRAFT_TOKENS_LIMIT)


class GenerationConfig(BaseModel):
    """Arguments of one ``generate``/``stream`` call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(128, gt=0)
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | tuple[int, ...] | None = None
    eos_token_id: tuple[int, ...] = ()
    min_new_tokens: int = Field(0, ge=0)
    logits_processor: tuple[Callable[..., Any], ...] = ()  # (input_ids [1, T], scores [1, V]) -> scores
    stopping_criteria: tuple[Callable[..., Any], ...] = ()  # (input_ids [1, T], None) -> bool
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    keywords: ClassVar = ("attention_mask", "pad_token_id", "rng", "streamer")  # taken by generate()

    @model_validator(mode="before")
    @classmethod
    def _numbers(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        return {k: v if k == "logprobs" else number(v, k) for k, v in values.items()}

    @field_validator("eos_token_id", mode="before")
    @classmethod
    def _as_tuple(cls, value: Any) -> Any:
        if value is None or isinstance(value, int):
            return () if value is None else (value,)
        return tuple(value) if isinstance(value, (list, tuple)) else value


def explain(error: ValidationError, where: str) -> str:
    """One readable line per problem, naming the offending key."""
    lines = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "(value)"
        if problem["type"] == "extra_forbidden":
            lines.append(f"unknown option {key!r}")
        else:
            got = f" (got {problem.get('input')!r})" if problem["loc"] else ""
            lines.append(f"{key}: {problem['msg']}{got}")
    return f"Invalid {where}: " + "; ".join(lines) + "."


def validate(model: type[BaseModel], values: Any, where: str, error: type[Exception] = ConfigError) -> Any:
    """``model(**values)``, with validation failures turned into an EESDError subclass."""
    if values is None:
        values = {}
    if isinstance(values, model):
        return values
    if not isinstance(values, dict):
        raise error(f"Invalid {where}: expected a dict of options, got {type(values).__name__}.")
    try:
        return model(**values)
    except ValidationError as exc:
        fields = ", ".join(sorted([*model.model_fields, *getattr(model, "keywords", ())])) or "none"
        raise error(f"{explain(exc, where)} Valid options: {fields}.") from None


def generation_config(**values: Any) -> GenerationConfig:
    return validate(GenerationConfig, values, "generation arguments", InputError)
