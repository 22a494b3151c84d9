"""The decoder: plug-ins chosen by name, input checked, one :class:`~eesd_core.round.Generation` per call.

:class:`SpeculativeDecoder` holds what outlives a call (the adapter, the plug-ins, measured costs);
each call decodes its own generation (one sequence as a batch of one), so calls may run in threads.
"""

from __future__ import annotations

import operator
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from eesd_core.config import DecoderConfig, generation_config, validate
from eesd_core.costs import CostBook
from eesd_core.devices import HOST
from eesd_core.errors import ConfigError, InputError
from eesd_core.guards import Guarded
from eesd_core.models import find_adapter
from eesd_core.protocols import RandomSource
from eesd_core.registry import get_manager
from eesd_core.round import Generation, Parts
from eesd_core.sampling import TorchRandom
from eesd_core.stats import BatchStats, GenerationStats


@dataclass
class GenerationResult:
    """``sequences``: prompt and new tokens ``[1, T + n]``, like transformers (in host memory,
    wherever the model runs); ``stats``: totals."""

    sequences: torch.Tensor
    stats: GenerationStats
    logprobs: list[float] | None = None  # with logprobs=True: each new token's, under p
    top_logprobs: list[list[tuple[int, float]]] | None = None  # with top_logprobs=n: n best


@dataclass
class BatchResult:
    """``sequences``: ``[B, T + n]`` for a padded tensor batch (rows that stopped early padded
    with ``pad_token_id``), or a list of 1-D tensors for a list of prompts; ``stats``: per row."""

    sequences: torch.Tensor | list[torch.Tensor]
    stats: BatchStats
    logprobs: list[list[float]] | None = None  # per row, as GenerationResult's
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None


class SpeculativeDecoder:
    """Lossless speculative decoding of a Hugging Face causal LM with pluggable parts.

    ``drafter=None`` decodes plainly (one target pass per token), the reference for every speedup.
    ``adapter_options`` go to the model adapter (e.g. ``{"products": "standard"}``: how its linear
    layers multiply, :mod:`eesd_core.models`). Nothing per call is kept here.
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
        values: dict[str, Any] = dict(drafter=drafter, controller=controller, verifier=verifier)
        values.update(drafter_options=drafter_options or {}, controller_options=controller_options or {})
        values.update(verifier_options=verifier_options or {}, max_draft_tokens=max_draft_tokens)
        self.config: DecoderConfig = validate(DecoderConfig, values, "decoder configuration")
        self.model, self.tokenizer, self.manager = model, tokenizer, get_manager()
        self.adapter = find_adapter(model, adapter_options)
        cfg = self.config
        self.guard = Guarded(self.adapter.vocab_size, cfg.drafter, cfg.controller, cfg.verifier)
        self.drafter = self._build("drafter", cfg.drafter, cfg.drafter_options) if cfg.drafter else None
        if self.drafter is not None:
            self.guard.call("drafter", "attach", self.drafter.attach, self.adapter)
            self.guard.check_drafter(self.drafter, self.adapter.num_layers)
        self.controller = self._build("controller", cfg.controller, cfg.controller_options)
        self.verifier = self._build("verifier", cfg.verifier, cfg.verifier_options)
        self.costs = CostBook(cfg.max_draft_tokens)  # per batch size: self.costs(B)
        self.clock = time.perf_counter  # seconds; the test kit substitutes a deterministic clock

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
        ``dtype`` is the precision of the weights, ``device`` (default the CPU) where they live
        and every pass runs; both are checked before the weights are read."""
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from eesd_core.devices import resolve_device, resolve_dtype

        dtype, where = resolve_dtype(dtype), resolve_device(device)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
        except (OSError, ValueError, SafetensorError) as exc:
            raise InputError(
                f"Could not load a causal LM checkpoint from {path!r}: {type(exc).__name__}: {exc}. Pass a "
                "directory with config.json and whole safetensors weights (`eesd models fetch` makes one)."
            ) from None
        model.to(where).eval()  # type: ignore[arg-type]
        try:
            kwargs.setdefault("tokenizer", AutoTokenizer.from_pretrained(path))
        except (OSError, ValueError):
            kwargs.setdefault("tokenizer", None)
        return cls(model, **kwargs)

    def _build(self, kind: str, name: str, options: dict[str, Any]) -> Any:
        entry = self.manager.registry(kind).get(name)
        if entry.options is None and options:
            raise ConfigError(f"{kind} {name!r} takes no options, got {sorted(options)}.")
        checked = entry.options and validate(entry.options, options, f"{kind} options for {name!r}")
        args = () if entry.options is None else (checked,)
        built = self.guard.call(kind, "__init__", entry.factory, *args)
        self.guard.check_contract(kind, built)
        return built

    def generate(
        self,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        pad_token_id: int | None = None,
        rng: RandomSource | list[RandomSource] | None = None,
        streamer: Any = None,
        **kwargs: Any,
    ) -> GenerationResult | BatchResult:
        """Generate up to ``max_new_tokens`` after ``input_ids``: one sequence (``[1, T]``, ``[T]``,
        a list of ids; a :class:`GenerationResult`), or a batch (``[B, T]`` with ``attention_mask``,
        left padding as transformers takes it, or a list of id lists; a :class:`BatchResult`), each
        row decoded exactly as alone. Keywords: ``max_new_tokens=128, temperature=0.0, top_k=0,
        top_p=1.0, seed=None, eos_token_id=None`` (``None``: the model's; ``[]``: never stop early).
        Row b draws from ``rng[b]``, else ``TorchRandom(seed + b)`` (or a list of seeds), so its
        tokens do not depend on other rows; ``pad_token_id`` fills rows that stopped early;
        ``streamer``: a transformers streamer. transformers' keywords: ``docs/generate.md``."""
        if pad_token_id is not None:
            self._token(pad_token_id, "pad_token_id")
        generation = self.stream(input_ids, attention_mask=attention_mask, rng=rng, **kwargs)
        if streamer is not None and not generation.single:
            raise InputError("streamer= takes one sequence, as transformers' streamers do.")
        put = (lambda tokens: None) if streamer is None else (lambda t: streamer.put(torch.tensor(t)))
        put(generation.sequence)  # the prompt first, as transformers' generate() streams it
        for tokens in generation:
            put(tokens)
        if streamer is not None:
            streamer.end()
        logprobs, top = generation.logprobs, generation.top_logprobs
        if generation.single:
            sequences = torch.tensor([generation.sequence], dtype=torch.long, device=HOST)
            first = logprobs[0] if logprobs else None
            return GenerationResult(sequences, generation.stats, first, top[0] if top else None)
        return BatchResult(self._batch_sequences(generation, pad_token_id), generation.stats, logprobs, top)

    def stream(
        self,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        rng: RandomSource | list[RandomSource] | None = None,
        **kwargs: Any,
    ) -> Generation:
        """A :class:`~eesd_core.round.Generation`: iterate it for the tokens each round commits
        (a list of new tokens, or for a batch one list per row; the first item is the prefill's
        one token); its ``stats`` hold the totals so far. Same arguments as :meth:`generate`."""
        self.manager.pm.hook.eesd_generation_keywords(decoder=self, keywords=kwargs)
        if kwargs.get("eos_token_id") is None:
            kwargs["eos_token_id"] = self._default_eos()
        config = generation_config(**kwargs)
        prompts, padded, single = self._prompts(input_ids, attention_mask)
        limit, longest = getattr(self.adapter.config, "max_position_embeddings", None), max(map(len, prompts))
        if limit is not None and longest + config.max_new_tokens > limit:
            raise InputError(
                f"Prompt ({longest} tokens) plus max_new_tokens ({config.max_new_tokens}) exceeds "
                f"the model's context of {limit} tokens: shorten the prompt or lower max_new_tokens."
            )
        if single:
            if isinstance(config.seed, tuple) or isinstance(rng, (list, tuple)):
                raise InputError("seed and rng take one value for one sequence, not a list.")
            source = rng if rng is not None else TorchRandom(config.seed)
            return Generation(self.parts(), prompts, config, [source], single=True)
        if len(prompts) > 1 and not getattr(self.drafter, "batches", self.drafter is None):
            raise ConfigError(
                f"drafter {self.config.drafter!r} drafts for one sequence at a time (batches=False): "
                "decode batches with drafter=None or with a drafter that drafts for batches."
            )
        generation = Generation(self.parts(), prompts, config, self._row_rngs(len(prompts), config.seed, rng))
        generation.padded = padded
        return generation

    def parts(self) -> Parts:
        """What a generation of this decoder uses, as it is now (a tool may replace parts of it)."""
        parts = {"drafter": self.drafter, "controller": self.controller, "verifier": self.verifier}
        for kind, part in parts.items():
            if part is not None:
                self.guard.check_contract(kind, part)
        hook, has = self.manager.pm.hook, self.manager.has_observers
        withdraws = all(getattr(part, "withdraws", False) is True for part in (self.drafter, self.controller))
        observe = (lambda outcome: hook.eesd_round_end(outcome=outcome)) if has("eesd_round_end") else None
        ended = (lambda stats: hook.eesd_generation_end(stats=stats)) if has("eesd_generation_end") else None
        plugins = (self.adapter, self.drafter, self.controller, self.verifier, self.guard, self.costs)
        return Parts(*plugins, self.config.max_draft_tokens, withdraws, self.clock, observe, ended)

    def _row_rngs(self, rows: int, seeds: Any, rng: Any) -> list[RandomSource]:
        if rng is not None:
            if not isinstance(rng, (list, tuple)) or len(rng) != rows:
                raise InputError(f"A batch of {rows} rows needs rng as a list of {rows} RandomSources.")
            return list(rng)
        if isinstance(seeds, tuple):
            if len(seeds) != rows:
                raise InputError(f"seed must be an int or a list of {rows} ints for a batch of {rows} rows.")
            return [TorchRandom(s) for s in seeds]
        return [TorchRandom(None if seeds is None else seeds + row) for row in range(rows)]

    def _batch_sequences(self, generation: Generation, pad_token_id: int | None) -> Any:
        rows, padded = generation.sequences, generation.padded
        if padded is None:
            return [torch.tensor(row, dtype=torch.long, device=HOST) for row in rows]
        new = [row[length:] for row, length in zip(rows, generation.prompt_lengths, strict=True)]
        width, columns = max(len(tokens) for tokens in new), padded.shape[1]
        pad = self._pad_id(pad_token_id) if any(len(tokens) < width for tokens in new) else 0
        out = torch.full((padded.shape[0], columns + width), pad, dtype=torch.long, device=HOST)
        out[:, :columns] = padded
        for row, tokens in enumerate(new):
            out[row, columns : columns + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=HOST)
        return out

    def _pad_id(self, pad_token_id: int | None) -> int:
        sources = (getattr(self.model, "generation_config", None), self.adapter.config)
        found = [pad_token_id, *(getattr(source, "pad_token_id", None) for source in sources)]
        found = [*(f for f in found if f not in (None, [], ())), *self._default_eos()]
        if not found:
            raise InputError(
                "Rows stopped at different lengths and the model names no pad or EOS id: pass pad_token_id."
            )
        return int(found[0][0] if isinstance(found[0], (list, tuple)) else found[0])  # type: ignore[arg-type]

    def _default_eos(self) -> list[int]:
        """The model's own end-of-sequence ids, as transformers' ``generate()`` uses them."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def _prompts(
        self, input_ids: Any, attention_mask: Any
    ) -> tuple[list[list[int]], torch.Tensor | None, bool]:
        """The prompts without their padding, a tensor batch as given (for padded output), and
        whether the input is one sequence."""
        first = input_ids[0] if isinstance(input_ids, (list, tuple)) and input_ids else None
        if isinstance(first, (list, tuple, torch.Tensor)):
            if attention_mask is not None:
                raise InputError("A list of prompts is padded by eesd: pass no attention_mask with it.")
            rows = [row.tolist() if isinstance(row, torch.Tensor) else row for row in input_ids]
            return [self._row(row, b) for b, row in enumerate(rows)], None, False
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            if attention_mask is not None:
                raise InputError("attention_mask goes with input_ids of shape [B, T].")
            return [self._prompt(input_ids)], None, True
        if input_ids.shape[0] == 1 and attention_mask is None:
            return [self._prompt(input_ids)], None, True
        self._check_ids(input_ids)
        if input_ids.shape[0] == 0:
            raise InputError("The batch is empty: give at least one row.")
        padded = torch.as_tensor(input_ids[:, 0] == getattr(self.adapter.config, "pad_token_id", None))
        if attention_mask is None and bool(padded.any()) and not bool(padded.all()):
            message = "Some rows of input_ids start with the pad token and no attention_mask was given: "
            warnings.warn(message + "that padding is read as prompt. Pass attention_mask.", stacklevel=4)
        given = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask
        try:
            mask = torch.as_tensor(given)
        except (TypeError, ValueError, RuntimeError):
            raise InputError(
                f"attention_mask must be a tensor of 0 and 1 shaped like input_ids, got {attention_mask!r}."
            ) from None
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
        rows = [self._row(input_ids[b][mask[b]].tolist(), b) for b in range(input_ids.shape[0])]
        return rows, input_ids.detach().to("cpu", torch.long), False

    def _row(self, ids: list[int], row: int) -> list[int]:
        if not ids:
            raise InputError(f"Row {row} of the batch is empty: give every row at least one token (BOS).")
        try:
            return self._prompt(ids)
        except InputError as exc:
            raise InputError(f"Row {row} of the batch: {exc}") from None

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")

    def _prompt(self, input_ids: Any) -> list[int]:
        if isinstance(input_ids, torch.Tensor):
            self._check_ids(input_ids)
            if input_ids.dim() not in (1, 2) or (input_ids.dim() == 2 and input_ids.shape[0] != 1):
                raise InputError(f"input_ids must be [1, T] or [T], got shape {tuple(input_ids.shape)}.")
            ids = input_ids.reshape(-1).tolist()
        elif isinstance(input_ids, (list, tuple)):
            ids = list(input_ids)
        else:
            raise InputError(f"input_ids must be a tensor or a list of ints, got {type(input_ids).__name__}.")
        if not ids:
            raise InputError("The prompt is empty: give at least one token (e.g. the BOS token).")
        return [self._token(token, "Token id") for token in ids]

    def _token(self, token: Any, what: str) -> int:
        vocab = self.adapter.vocab_size
        try:
            ok = not isinstance(token, bool) and 0 <= operator.index(token) < vocab
        except TypeError:
            ok = False
        if not ok:
            raise InputError(f"{what} {token!r} is not an integer in [0, {vocab}): check the tokenizer.")
        return operator.index(token)
