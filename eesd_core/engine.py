"""The decoder: plug-ins chosen by name, input checked, one :class:`Generation` per call.

:class:`SpeculativeDecoder` holds what outlives a call: the model's adapter, the drafter,
controller and verifier, and the measured costs. Each ``generate``/``stream`` call gets a
:class:`~eesd_core.generation.Generation` of its own (:mod:`eesd_core.generation` runs the rounds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from eesd_core.config import DecoderConfig, generation_config, validate
from eesd_core.costs import CostTracker
from eesd_core.errors import ConfigError, InputError
from eesd_core.generation import Generation
from eesd_core.guards import Guarded
from eesd_core.models import find_adapter
from eesd_core.protocols import RandomSource, RoundOutcome
from eesd_core.registry import get_manager
from eesd_core.sampling import TorchRandom
from eesd_core.stats import GenerationStats


@dataclass
class GenerationResult:
    """``sequences``: prompt and new tokens ``[1, T + n]``, like transformers; ``stats``: totals."""

    sequences: torch.Tensor
    stats: GenerationStats


class SpeculativeDecoder:
    """Lossless speculative decoding of a Hugging Face causal LM with pluggable parts.

    ``drafter=None`` decodes plainly (one target pass per token), the reference for every speedup.
    ``adapter_options`` go to the model adapter (e.g. ``{"matmul": "standard"}``: how its short
    passes multiply, :mod:`eesd_core.models`). Nothing per call is kept here: each call owns a
    :class:`~eesd_core.generation.Generation`.
    """

    def __init__(
        self,
        model: Any,
        *,
        drafter: str | None = "early_exit",
        drafter_options: dict[str, Any] | None = None,
        controller: str = "thompson",
        controller_options: dict[str, Any] | None = None,
        verifier: str = "lossless",
        verifier_options: dict[str, Any] | None = None,
        max_draft_tokens: int = 8,
        adapter_options: dict[str, Any] | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.config: DecoderConfig = validate(
            DecoderConfig,
            dict(
                drafter=drafter,
                drafter_options=drafter_options or {},
                controller=controller,
                controller_options=controller_options or {},
                verifier=verifier,
                verifier_options=verifier_options or {},
                max_draft_tokens=max_draft_tokens,
            ),
            "decoder configuration",
        )
        self.model = model
        self.tokenizer = tokenizer
        self.manager = get_manager()
        self.adapter = find_adapter(model, adapter_options)
        cfg = self.config
        self.guard = Guarded(self.adapter.vocab_size, cfg.drafter, cfg.controller, cfg.verifier)
        self.drafter = self._build("drafter", cfg.drafter, cfg.drafter_options) if cfg.drafter else None
        if self.drafter is not None:
            self.guard.call_drafter("attach", self.drafter.attach, self.adapter)
            self.guard.check_drafter(self.drafter, self.adapter.num_layers)
        self.controller = self._build("controller", cfg.controller, cfg.controller_options)
        self.verifier = self._build("verifier", cfg.verifier, cfg.verifier_options)
        self.costs = CostTracker(cfg.max_draft_tokens)
        self.clock = time.perf_counter  # seconds; the test kit substitutes a deterministic clock
        self._prepared = False
        self._round_observers = self.manager.has_observers("eesd_round_end")
        self._end_observers = self.manager.has_observers("eesd_generation_end")

    @classmethod
    def from_pretrained(
        cls, path: str, *, dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> SpeculativeDecoder:
        """Load a local HF checkpoint (never remote code) and its tokenizer, then build a decoder."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise InputError(
                f"Could not load a causal LM checkpoint from {path!r}: {exc}. Pass a directory "
                "with config.json and safetensors weights (`eesd models fetch` makes one)."
            ) from None
        model.eval()
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = None
        kwargs.setdefault("tokenizer", tokenizer)
        return cls(model, **kwargs)

    def _build(self, kind: str, name: str, options: dict[str, Any]) -> Any:
        entry = self.manager.registry(kind).get(name)
        if entry.options is None:
            if options:
                raise ConfigError(f"{kind} {name!r} takes no options, got {sorted(options)}.")
            return entry.factory()
        return entry.factory(validate(entry.options, options, f"{kind} options for {name!r}"))

    # -- public API ---------------------------------------------------------------------------

    def generate(self, input_ids: Any, *, rng: RandomSource | None = None, **kwargs: Any) -> GenerationResult:
        """Generate up to ``max_new_tokens`` after ``input_ids`` (``[1, T]``, ``[T]`` or a list).

        Keywords: ``max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None,
        eos_token_id=None`` (``None``: the model's own EOS ids, as transformers uses them; ``[]``:
        never stop early). At temperature 0 the tokens equal the target's greedy decoding.
        ``rng``: draw every random choice from this RandomSource instead of ``TorchRandom(seed)``
        (the test kit enumerates all outcomes through it).
        """
        generation = self.stream(input_ids, rng=rng, **kwargs)
        for _ in generation:
            pass
        sequences = torch.tensor([generation.sequence], dtype=torch.long)
        return GenerationResult(sequences=sequences, stats=generation.stats)

    def stream(self, input_ids: Any, *, rng: RandomSource | None = None, **kwargs: Any) -> Generation:
        """A :class:`Generation`: iterate it for the new tokens of each round as they are
        committed; its ``stats`` hold the totals so far. Same keywords as :meth:`generate`."""
        if kwargs.get("eos_token_id") is None:
            kwargs["eos_token_id"] = self._default_eos()
        config = generation_config(**kwargs)
        prompt = self._prompt(input_ids)
        self._check_length(len(prompt), config.max_new_tokens)
        return Generation(self, prompt, config, rng if rng is not None else TorchRandom(config.seed))

    def _default_eos(self) -> list[int]:
        """The model's own end-of-sequence ids, as transformers' ``generate()`` uses them."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    # -- what generations share -----------------------------------------------------------------

    def prepare(self) -> None:
        """Let the adapter choose how its short passes run (once; it may time a few passes)."""
        if not self._prepared:
            rows = self.config.max_draft_tokens + 1 if self.drafter is not None else 1
            self.adapter.prepare(rows)
            self._prepared = True

    def cache_capacity(self, prompt_length: int, max_new_tokens: int) -> int:
        """Cache slots to reserve: enough for a typical reply, so the buffers rarely grow."""
        return prompt_length + min(max_new_tokens, 512) + self.config.max_draft_tokens + 1

    def round_ended(self, outcome: RoundOutcome) -> None:
        if self._round_observers:
            self.manager.pm.hook.eesd_round_end(outcome=outcome)

    def generation_ended(self, stats: GenerationStats) -> None:
        if self._end_observers:
            self.manager.pm.hook.eesd_generation_end(stats=stats)

    # -- input checks ---------------------------------------------------------------------------

    def _prompt(self, input_ids: Any) -> list[int]:
        if isinstance(input_ids, torch.Tensor):
            if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
                raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
            if input_ids.dim() == 2:
                if input_ids.shape[0] != 1:
                    raise InputError(
                        f"eesd decodes one sequence at a time; input_ids has batch size "
                        f"{input_ids.shape[0]}. Call generate() once per prompt."
                    )
                input_ids = input_ids[0]
            elif input_ids.dim() != 1:
                raise InputError(f"input_ids must be [1, T] or [T], got shape {tuple(input_ids.shape)}.")
            ids = input_ids.tolist()
        elif isinstance(input_ids, (list, tuple)):
            ids = list(input_ids)
        else:
            raise InputError(f"input_ids must be a tensor or a list of ints, got {type(input_ids).__name__}.")
        if not ids:
            raise InputError("The prompt is empty: give at least one token (e.g. the BOS token).")
        vocab = self.adapter.vocab_size
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise InputError(
                    f"Token id {token!r} is not an integer in [0, {vocab}): check the tokenizer."
                )
        return ids

    def _check_length(self, prompt_length: int, max_new_tokens: int) -> None:
        limit = getattr(self.adapter.config, "max_position_embeddings", None)
        if limit is not None and prompt_length + max_new_tokens > limit:
            raise InputError(
                f"Prompt ({prompt_length} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                f"the model's context of {limit} tokens: shorten the prompt or lower max_new_tokens."
            )
