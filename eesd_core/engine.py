"""The decoding engine: prefill, then rounds of draft -> verify -> accept -> roll back.

The cache holds every committed token but the last one, the *pending* token, which the next round
feeds first. A round with k drafts runs the target once over [pending, d_1..d_k] and commits
n + 1 tokens (n accepted drafts and one token from p); a round with k = 0 is a plain decoding step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.config import DecoderConfig, GenerationConfig, generation_config, validate
from eesd_core.costs import CostTracker
from eesd_core.errors import ConfigError, InputError
from eesd_core.guards import Guarded
from eesd_core.kernels import MatmulPlan, plan_for
from eesd_core.models import find_adapter
from eesd_core.protocols import (
    DraftContext,
    Proposal,
    RandomSource,
    Request,
    RoundOutcome,
    SamplingParams,
)
from eesd_core.registry import get_manager
from eesd_core.sampling import TorchRandom, check_finite, process_logits
from eesd_core.stats import GenerationStats, RoundStats


@dataclass
class GenerationResult:
    """``sequences``: prompt and new tokens ``[1, T + n]``, like transformers; ``stats``: totals."""

    sequences: torch.Tensor
    stats: GenerationStats


@dataclass
class _Generation:
    """The state of one call: committed tokens (the pending one last), cache, randomness, stats."""

    history: list[int]
    prompt_length: int
    config: GenerationConfig
    sampling: SamplingParams
    cache: KVCache
    rng: RandomSource
    stats: GenerationStats
    done: bool = False

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - (len(self.history) - self.prompt_length)


class SpeculativeDecoder:
    """Lossless speculative decoding of a Hugging Face causal LM with pluggable parts.

    ``drafter=None`` decodes plainly (one target pass per token), the reference for every speedup.
    ``matmul`` picks the product of the linear layers in the passes over a few positions (decoding
    steps, draft steps, verification): ``"auto"`` (default) measures on the first generation, on
    CPUs, whether ``(W @ x.T).T`` beats ``F.linear`` for each number of positions and keeps the
    faster (:mod:`eesd_core.kernels`); ``"standard"`` and ``"transposed"`` force one.
    ``matmul_plan`` holds the choice.
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
        matmul: str = "auto",
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
                matmul=matmul,
            ),
            "decoder configuration",
        )
        self.model = model
        self.tokenizer = tokenizer
        self.manager = get_manager()
        self.adapter = find_adapter(model)
        cfg = self.config
        self.drafter = self._build("drafter", cfg.drafter, cfg.drafter_options) if cfg.drafter else None
        if self.drafter is not None:
            self.drafter.attach(self.adapter)
        # a drafter may ask for the target's last-layer states of every position it verifies
        self._top_states = bool(getattr(self.drafter, "wants_top_states", False))
        self._last_top: torch.Tensor | None = None
        self.controller = self._build("controller", cfg.controller, cfg.controller_options)
        self.verifier = self._build("verifier", cfg.verifier, cfg.verifier_options)
        self.guard = Guarded(self.adapter.vocab_size, cfg.drafter, cfg.controller, cfg.verifier)
        if self._top_states and not callable(getattr(self.drafter, "top_states", None)):
            raise self.guard.fault("drafter", "sets wants_top_states but has no top_states() method")
        self.costs = CostTracker(cfg.max_draft_tokens)
        self.clock = time.perf_counter  # seconds; the test kit substitutes a deterministic clock
        self.last_stats: GenerationStats | None = None
        self.state: _Generation | None = None
        self.matmul_plan: MatmulPlan | None = None
        self._observe = self.manager.has_observers("eesd_round_end")

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
        prompt = self._prompt(input_ids)
        new: list[int] = []
        for chunk in self.stream(prompt, rng=rng, **kwargs):
            new.extend(chunk)
        sequences = torch.tensor([prompt + new], dtype=torch.long)
        assert self.last_stats is not None
        return GenerationResult(sequences=sequences, stats=self.last_stats)

    def stream(
        self, input_ids: Any, *, rng: RandomSource | None = None, **kwargs: Any
    ) -> Iterator[list[int]]:
        """Yield the new tokens of each round as soon as they are committed."""
        if kwargs.get("eos_token_id") is None:
            kwargs["eos_token_id"] = self._default_eos()
        config = generation_config(**kwargs)
        prompt = self._prompt(input_ids)
        self._check_length(len(prompt), config.max_new_tokens)
        return self._run(prompt, config, rng if rng is not None else TorchRandom(config.seed))

    def _default_eos(self) -> list[int]:
        """The model's own end-of-sequence ids, as transformers' ``generate()`` uses them."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    # -- one generation -----------------------------------------------------------------------

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

    def _run(self, prompt: list[int], config: GenerationConfig, rng: RandomSource) -> Iterator[list[int]]:
        if self.matmul_plan is None:
            rows = self.config.max_draft_tokens + 1 if self.drafter is not None else 1
            self.matmul_plan = plan_for(self.adapter, self.config.matmul, rows)
        started = self.clock()
        sampling = SamplingParams(config.temperature, config.top_k, config.top_p)
        g = _Generation(
            history=list(prompt),
            prompt_length=len(prompt),
            config=config,
            sampling=sampling,
            cache=self.adapter.new_cache(capacity=self._capacity(len(prompt), config.max_new_tokens)),
            rng=rng,
            stats=GenerationStats(prompt_tokens=len(prompt)),
        )
        self.last_stats, self.state = g.stats, g
        request = Request(
            len(prompt), config.max_new_tokens, self.config.max_draft_tokens, sampling, self.costs.snapshot()
        )
        with torch.inference_mode():
            with self.matmul_plan.active():
                self._prefill(g)
            if self.drafter is not None:
                self.guard.call_controller("start", self.controller.start, request)
            g.stats.prefill_time = self.clock() - started
            while not g.done:
                committed = self._round(g)
                g.stats.total_time = self.clock() - started
                if committed:
                    yield committed
        if self.manager.has_observers("eesd_generation_end"):
            self.manager.pm.hook.eesd_generation_end(stats=g.stats)

    def _capacity(self, prompt_length: int, max_new_tokens: int) -> int:
        """Cache slots to reserve: enough for a typical reply, so the buffers rarely grow."""
        return prompt_length + min(max_new_tokens, 512) + self.config.max_draft_tokens + 1

    def _prefill(self, g: _Generation) -> None:
        """Fill every cache with the prompt but its last token, which becomes the pending one."""
        tokens = torch.tensor(g.history[:-1], dtype=torch.long, device=self.adapter.device)
        shared = self.drafter.shared_layers if self.drafter is not None else 0
        hidden = None
        if tokens.numel():
            hidden = self.adapter.embed(tokens)
            rotary = self.adapter.rotary(hidden, 0)
            hidden = self.adapter.run_layers(hidden, 0, shared, g.cache, 0, rotary)
        if self.drafter is not None:
            self.drafter.prefill(g.cache, tokens, hidden if shared else None)
        if hidden is not None:
            top = self.adapter.run_layers(hidden, shared, self.adapter.num_layers, g.cache, 0, rotary)
            if self._top_states and self.drafter is not None:
                self.guard.call_drafter("top_states", self.drafter.top_states, top, 0)

    def _round(self, g: _Generation) -> list[int]:
        position = len(g.history) - 1
        pending = g.history[-1]
        costs = self.costs.snapshot()
        t0 = self.clock()
        proposal = self._propose(
            g, pending, position, min(self.config.max_draft_tokens, g.remaining - 1), costs
        )
        t1 = self.clock()
        p = self._target(g, pending, proposal, position)  # [k+1, V]
        n, token = self.guard.verify(self.verifier, proposal, p, g.rng)
        if self._top_states and self.drafter is not None:
            self.guard.call_drafter("top_states", self.drafter.top_states, self._last_top, position)
        t2 = self.clock()
        committed = proposal.tokens[:n].tolist() + [token]
        self._rollback(g, position + n + 1)
        self.costs.observe(proposal.k, t1 - t0, t2 - t1)
        round_ = RoundStats(
            position,
            proposal.k,
            n,
            tuple(committed),
            t1 - t0,
            t2 - t1,
            _probs(proposal),
            proposal.top1,
            proposal.entropies,
        )
        if self.drafter is not None:
            outcome = RoundOutcome(
                proposal.k, n, round_.probs, proposal.top1, proposal.entropies, t1 - t0, t2 - t1, costs
            )
            self.guard.call_controller("update", self.controller.update, outcome)
        committed = self._commit(g, committed)
        g.stats.add_round(round_)
        if self._observe:
            self.manager.pm.hook.eesd_round_end(stats=round_)
        return committed

    def _propose(self, g: _Generation, pending: int, position: int, max_k: int, costs: Any) -> Proposal:
        if self.drafter is None:
            return Proposal(tokens=torch.empty(0, dtype=torch.long), q=None, hidden=None, layers_done=0)
        ctx = DraftContext(
            position=position,
            max_tokens=max_k,
            sampling=g.sampling,
            rng=g.rng,
            ask=self.guard.asker(self.controller, max_k),
            costs=costs,
            cache=g.cache,
            history=torch.tensor(g.history, dtype=torch.long),
        )
        assert self.matmul_plan is not None
        with self.matmul_plan.active():
            proposal = self.guard.call_drafter("propose", self.drafter.propose, pending, ctx)
        self.guard.check_proposal(proposal, max_k, self.adapter.num_layers)
        return proposal

    def _target(self, g: _Generation, pending: int, proposal: Proposal, position: int) -> torch.Tensor:
        """The target's p over [pending, d_1..d_k], running only the layers the drafter did not."""
        start = proposal.layers_done if proposal.hidden is not None else 0
        if start == 0 or proposal.hidden is None:
            inputs = torch.cat([torch.tensor([pending], dtype=torch.long), proposal.tokens.cpu()])
            hidden = self.adapter.embed(inputs.to(self.adapter.device))
        else:
            hidden = proposal.hidden
        self.guard.check_cache(g.cache, start, position, proposal.k)
        assert self.matmul_plan is not None
        with self.matmul_plan.active():
            hidden = self.adapter.run_layers(hidden, start, self.adapter.num_layers, g.cache, position)
            logits = self.adapter.logits(self.adapter.norm(hidden))  # [k+1, V]
        if self._top_states:
            self._last_top = hidden  # [1, k+1, H], before the final norm
        check_finite(logits, "Target")
        return process_logits(logits, g.sampling)

    def _rollback(self, g: _Generation, length: int) -> None:
        g.cache.crop(length)
        if self.drafter is not None:
            self.guard.call_drafter("rollback", self.drafter.rollback, length)

    def _commit(self, g: _Generation, tokens: list[int]) -> list[int]:
        """Append the round's tokens, cut at the first EOS or at max_new_tokens."""
        eos = g.config.eos_token_id
        for i, token in enumerate(tokens):
            if token in eos:
                tokens, g.done, g.stats.stopped_by = tokens[: i + 1], True, "eos"
                break
        if len(tokens) >= g.remaining:
            tokens, g.done = tokens[: g.remaining], True
            g.stats.stopped_by = g.stats.stopped_by or "max_new_tokens"
        g.history.extend(tokens)
        g.stats.new_tokens += len(tokens)
        return tokens


def _probs(proposal: Proposal) -> tuple[float, ...]:
    if proposal.q is None:
        return (1.0,) * proposal.k
    picked = proposal.q.gather(-1, proposal.tokens.view(-1, 1).to(proposal.q.device))
    return tuple(picked.view(-1).tolist())
