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

from eesd_core.batch import BatchGeneration, BatchStats
from eesd_core.config import DecoderConfig, generation_config, validate
from eesd_core.costs import CostTracker
from eesd_core.devices import HOST
from eesd_core.errors import ConfigError, InputError
from eesd_core.generation import Generation
from eesd_core.guards import Guarded
from eesd_core.models import find_adapter
from eesd_core.models.products import EXACT_ROWS
from eesd_core.protocols import RandomSource, RoundOutcome
from eesd_core.registry import get_manager
from eesd_core.sampling import TorchRandom
from eesd_core.stats import GenerationStats

PREPARED_ROWS = EXACT_ROWS  # wider passes take the product of their bucket of row counts


@dataclass
class GenerationResult:
    """``sequences``: prompt and new tokens ``[1, T + n]``, like transformers (in host memory,
    wherever the model runs); ``stats``: totals."""

    sequences: torch.Tensor
    stats: GenerationStats


@dataclass
class BatchResult:
    """``sequences``: ``[B, T + n]`` for a padded tensor batch (each row's new tokens after its
    prompt columns, rows that stopped early padded with ``pad_token_id``), or a list of 1-D
    tensors (prompt and new tokens) for a list of prompts; ``stats``: per row and totals."""

    sequences: torch.Tensor | list[torch.Tensor]
    stats: BatchStats


@dataclass(frozen=True)
class _Batch:
    prompts: list[list[int]]
    padded: torch.Tensor | None  # the input as given, for a tensor batch


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
        self._batch_costs: dict[int, CostTracker] = {}
        self.clock = time.perf_counter  # seconds; the test kit substitutes a deterministic clock
        self._prepared = 0  # the most rows a pass was prepared for
        self._round_observers = self.manager.has_observers("eesd_round_end")
        self._end_observers = self.manager.has_observers("eesd_generation_end")

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: str | torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> SpeculativeDecoder:
        """Load a local HF checkpoint (never remote code) and its tokenizer, then build a decoder.

        ``dtype`` (``torch.bfloat16`` or ``"bfloat16"``) is the precision of the weights;
        ``device`` (``"cuda"``, default the CPU) is where they live and every pass runs. Both are
        checked before the weights are read.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from eesd_core.devices import resolve_device, resolve_dtype

        dtype, where = resolve_dtype(dtype), resolve_device(device)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise InputError(
                f"Could not load a causal LM checkpoint from {path!r}: {exc}. Pass a directory "
                "with config.json and safetensors weights (`eesd models fetch` makes one)."
            ) from None
        model.to(where).eval()
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

    def generate(
        self,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        pad_token_id: int | None = None,
        rng: RandomSource | list[RandomSource] | None = None,
        **kwargs: Any,
    ) -> GenerationResult | BatchResult:
        """Generate up to ``max_new_tokens`` after ``input_ids``.

        One sequence: ``[1, T]``, ``[T]`` or a list of ids; returns a :class:`GenerationResult`.
        A batch: ``[B, T]`` with ``attention_mask`` ``[B, T]`` (left padding, as transformers
        takes it; without a mask every column is a token), or a list of id lists of any lengths;
        returns a :class:`BatchResult`. Rows are decoded together but each exactly as alone.

        Keywords: ``max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None,
        eos_token_id=None`` (``None``: the model's own EOS ids, as transformers uses them; ``[]``:
        never stop early). At temperature 0 the tokens equal the target's greedy decoding.
        ``rng``: draw every random choice from this RandomSource instead of ``TorchRandom(seed)``
        (the test kit enumerates all outcomes through it). In a batch each row draws from its
        own source: ``TorchRandom(seed + b)`` for row b (``seed`` may be a list, one per row),
        or ``rng[b]``; so a row's tokens do not depend on the other rows. ``pad_token_id`` fills
        rows that stopped early (default: the model's pad id, else its first EOS).
        """
        generation = self.stream(input_ids, attention_mask=attention_mask, rng=rng, **kwargs)
        for _ in generation:
            pass
        if isinstance(generation, Generation):
            sequences = torch.tensor([generation.sequence], dtype=torch.long, device=HOST)
            return GenerationResult(sequences=sequences, stats=generation.stats)
        return BatchResult(self._batch_sequences(generation, pad_token_id), generation.stats)

    def stream(
        self,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        rng: RandomSource | list[RandomSource] | None = None,
        **kwargs: Any,
    ) -> Generation | BatchGeneration:
        """A :class:`Generation` (or, for a batch, a :class:`BatchGeneration`, which yields a
        list of new tokens per row): iterate it for the tokens each round commits (the first
        item is the prefill's one token); its ``stats`` hold the totals so far. Same arguments as
        :meth:`generate`."""
        if kwargs.get("eos_token_id") is None:
            kwargs["eos_token_id"] = self._default_eos()
        seeds = kwargs.pop("seed", None)
        batch = self._batch(input_ids, attention_mask)
        config = generation_config(seed=seeds if not isinstance(seeds, (list, tuple)) else None, **kwargs)
        if batch is None:
            if isinstance(seeds, (list, tuple)) or isinstance(rng, (list, tuple)):
                raise InputError("seed and rng take one value for one sequence, not a list.")
            prompt = self._prompt(input_ids)
            self._check_length(len(prompt), config.max_new_tokens)
            return Generation(self, prompt, config, rng if rng is not None else TorchRandom(config.seed))
        for prompt in batch.prompts:
            self._check_length(len(prompt), config.max_new_tokens)
        rngs = self._row_rngs(len(batch.prompts), seeds, rng)
        return BatchGeneration(self, batch.prompts, config, rngs, batch.padded)

    def _row_rngs(self, rows: int, seeds: Any, rng: Any) -> list[RandomSource]:
        if rng is not None:
            sources = list(rng) if isinstance(rng, (list, tuple)) else None
            if sources is None or len(sources) != rows:
                raise InputError(f"A batch of {rows} rows needs rng as a list of {rows} RandomSources.")
            return sources
        if isinstance(seeds, (list, tuple)):
            if len(seeds) != rows or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
                raise InputError(f"seed must be an int or a list of {rows} ints for a batch of {rows} rows.")
            return [TorchRandom(s) for s in seeds]
        if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int)):
            raise InputError(f"seed must be an int or a list of ints, got {seeds!r}.")
        return [TorchRandom(None if seeds is None else seeds + row) for row in range(rows)]

    def _batch_sequences(self, generation: BatchGeneration, pad_token_id: int | None) -> Any:
        rows = generation.sequences
        padded = generation.padded
        if padded is None:
            return [torch.tensor(row, dtype=torch.long, device=HOST) for row in rows]
        new = [row[length:] for row, length in zip(rows, generation.prompt_lengths, strict=True)]
        width = max(len(tokens) for tokens in new)
        if any(len(tokens) < width for tokens in new):
            pad_token_id = self._pad_id(pad_token_id)
        out = torch.full(
            (padded.shape[0], padded.shape[1] + width), pad_token_id or 0, dtype=torch.long, device=HOST
        )
        out[:, : padded.shape[1]] = padded
        for row, tokens in enumerate(new):
            out[row, padded.shape[1] : padded.shape[1] + len(tokens)] = torch.tensor(
                tokens, dtype=torch.long, device=HOST
            )
        return out

    def _pad_id(self, pad_token_id: int | None) -> int:
        if pad_token_id is None:
            for source in (getattr(self.model, "generation_config", None), self.adapter.config):
                pad_token_id = getattr(source, "pad_token_id", None)
                if pad_token_id is not None:
                    break
        if pad_token_id is None:
            eos = self._default_eos()
            pad_token_id = eos[0] if eos else None
        if isinstance(pad_token_id, (list, tuple)):
            pad_token_id = pad_token_id[0] if pad_token_id else None
        if pad_token_id is None:
            raise InputError(
                "Rows stopped at different lengths and the model names no pad or EOS id: pass pad_token_id."
            )
        return int(pad_token_id)

    def _default_eos(self) -> list[int]:
        """The model's own end-of-sequence ids, as transformers' ``generate()`` uses them."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    # -- what generations share -----------------------------------------------------------------

    def prepare(self, batch_size: int = 1) -> None:
        """Let the adapter choose how its short passes run (it may time a few passes the first
        time a row count is met). A batch's passes have B times the rows, counted up to
        ``PREPARED_ROWS``; wider ones are decided by bucket (:func:`~eesd_core.models.products.plan_for`)."""
        per_row = self.config.max_draft_tokens + 1 if self.drafter is not None else 1
        rows = per_row if batch_size == 1 else min(batch_size * per_row, PREPARED_ROWS)
        if rows > self._prepared:
            self.adapter.prepare(rows)
            self._prepared = rows

    def costs_for(self, batch_size: int) -> CostTracker:
        """The cost tracker of a batch size (rounded up to a power of two; 1 is the solo one)."""
        if batch_size <= 1:
            return self.costs
        bucket = 1 << (batch_size - 1).bit_length()
        tracker = self._batch_costs.get(bucket)
        if tracker is None:
            tracker = self._batch_costs[bucket] = CostTracker(self.config.max_draft_tokens, batch_size=bucket)
        return tracker

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

    def _batch(self, input_ids: Any, attention_mask: Any) -> _Batch | None:
        """The rows of a batch input, each without its padding; ``None`` for one sequence."""
        if (
            isinstance(input_ids, (list, tuple))
            and input_ids
            and isinstance(input_ids[0], (list, tuple, torch.Tensor))
        ):
            if attention_mask is not None:
                raise InputError("A list of prompts is padded by eesd: pass no attention_mask with it.")
            rows = [row.tolist() if isinstance(row, torch.Tensor) else row for row in input_ids]
            return _Batch([self._row(row, b) for b, row in enumerate(rows)], None)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            if attention_mask is not None:
                raise InputError("attention_mask goes with input_ids of shape [B, T].")
            return None
        if input_ids.shape[0] == 1 and attention_mask is None:
            return None
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
        if input_ids.shape[0] == 0:
            raise InputError("The batch is empty: give at least one row.")
        if attention_mask is None:
            mask = torch.ones_like(input_ids, dtype=torch.bool)
        else:
            mask = torch.as_tensor(attention_mask)
            if tuple(mask.shape) != tuple(input_ids.shape):
                raise InputError(
                    f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}: "
                    "give one mask entry per token."
                )
            if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
                raise InputError("attention_mask must hold 0 (padding) and 1 (token) integers or bools.")
            mask = mask.bool()
        if bool((mask[:, 1:] < mask[:, :-1]).any()):
            raise InputError(
                "attention_mask has padding after a token (right padding): eesd, like transformers' "
                "generate(), needs left padding (set tokenizer.padding_side = 'left')."
            )
        rows = []
        for b in range(input_ids.shape[0]):
            ids = input_ids[b][mask[b]].tolist()
            rows.append(self._row(ids, b))
        return _Batch(rows, input_ids.detach().to("cpu", torch.long))

    def _row(self, ids: list[int], row: int) -> list[int]:
        if not ids:
            raise InputError(
                f"Row {row} of the batch is empty: give every row at least one token (e.g. BOS)."
            )
        try:
            return self._prompt(ids)
        except InputError as exc:
            raise InputError(f"Row {row} of the batch: {exc}") from None

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
