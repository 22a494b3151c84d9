"""Timed replays: real rounds (every pass, every host step) on a model of the right shape, random
weights included, with what a recorded trace says in place of what those weights draft and accept.

:class:`TraceDrafter` wraps a drafter: each step runs the wrapped drafter's passes, then shows the
engine draft logits whose top-1 probability is the trace's at that output position and draft.
:class:`TraceVerifier` accepts as many of a round's drafts as the trace's accepted prefix there
allows (one read of the device for the round, as the lossless verifier). The controller therefore
decides on the trace's confidences and learns the trace's acceptance, while every round costs what
it costs on this machine: figures from here are REPLAYED, their acceptance is the trace's. Greedy
only; each prompt is made to start with its own token (:func:`replay_prompts`), which is how a row
finds its trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from eesd_bench.trace import PromptTrace
from eesd_core.devices import HOST
from eesd_core.protocols import Draft
from eesd_core.sampling import TorchRandom

FIRST_ID = 3  # prompt b starts with token FIRST_ID + b (ids below are often special)
UNSEEN_TOP1 = 0.01  # the confidence shown past the end of a trace's drafts


def replay_prompts(traces: Sequence[PromptTrace], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """One prompt per trace, as long as the recorded one, of random ids after its own first token."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for b, trace in enumerate(traces):
        rest = torch.randint(
            FIRST_ID + len(traces), vocab_size, (trace.prompt_length - 1,), generator=generator
        )
        prompts.append([FIRST_ID + b, *rest.tolist()])
    return prompts


class Cursor(TorchRandom):
    """A row's random source that also knows where the row is in its trace: ``t``, the number of
    tokens it has committed (the trace's position of its next round)."""

    def __init__(self, trace: PromptTrace, seed: int = 0) -> None:
        super().__init__(seed)
        self.trace, self.t = trace, 0

    def accepted(self, k: int) -> int:
        """How many of ``k`` drafts at the current position the trace accepted."""
        positions = self.trace.positions
        return min(k, positions[self.t].accepted) if self.t < len(positions) else 0


class TraceDrafter:
    """``inner``'s passes with the trace's confidences: the engine sees draft logits with all mass
    but the trace's top-1 probability spread evenly over the other tokens."""

    def __init__(self, inner: Any, traces: Sequence[PromptTrace], vocab_size: int) -> None:
        """``inner``: a drafter already attached to a target of ``vocab_size`` tokens."""
        self.inner, self.traces, self.vocab_size = inner, list(traces), vocab_size
        for name in ("shared_layers", "reads_top_states", "withdraws", "batches"):
            setattr(self, name, getattr(inner, name))
        self._step = 0  # draft index of the current round (rows draft in lockstep)

    def attach(self, adapter: Any) -> None:
        self.inner.attach(adapter)
        self.vocab_size = adapter.vocab_size
        for name in ("shared_layers", "reads_top_states"):
            setattr(self, name, getattr(self.inner, name))

    def describe(self) -> str:
        return f"{self.inner.describe()}, confidences replayed from a trace"

    def begin(self, cache: Any, layout: Any, hidden: Any) -> Any:
        self._step = 0
        return self.inner.begin(cache, layout, hidden)

    def step(self, state: Any, tokens: Any, slot: int, drafting: Sequence[bool], history: Any) -> Draft:
        draft = self.inner.step(state, tokens, slot, drafting, history)
        logits = torch.zeros(len(drafting), self.vocab_size, dtype=torch.float32)
        for b, asked in enumerate(drafting):
            if asked:
                row = history[b]
                trace = self.traces[int(row[0]) - FIRST_ID]
                t = len(row) - trace.prompt_length - self._step
                self._show(logits[b], trace, t, self._step)
        self._step += 1
        device = draft.logits.device if draft.logits is not None else HOST
        return Draft(logits=logits.to(device))

    def _show(self, row: torch.Tensor, trace: PromptTrace, t: int, i: int) -> None:
        position = trace.positions[t] if t < len(trace.positions) else None
        top = position.top1[i] if position is not None and i < len(position.top1) else UNSEEN_TOP1
        top = min(max(top, 1e-6), 1 - 1e-6)
        token = (t * 31 + i) % self.vocab_size
        row[token] = math.log(top * (self.vocab_size - 1) / (1 - top))  # the others' logits are 0

    def finish(self, state: Any, tokens: Any, slot: int) -> Any:
        self._step = 0
        return self.inner.finish(state, tokens, slot)

    def top_states(self, state: Any, hidden: Any, slot: int) -> None:
        self.inner.top_states(state, hidden, slot)

    def rollback(self, state: Any, slots: int) -> None:
        self.inner.rollback(state, slots)

    def relayout(self, state: Any, rows: Any, index: Any) -> None:
        self.inner.relayout(state, rows, index)


class TraceVerifier:
    """Accepts the trace's accepted prefix of each row's drafts (rows carry a :class:`Cursor` as
    their random source) and commits the target's argmax after them, read in one transfer."""

    def verify(self, drafts: Sequence[Any], qs: Sequence[Any], p: torch.Tensor, rngs: Sequence[Any]) -> list:
        ns = [rng.accepted(int(d.shape[0])) for d, rng in zip(drafts, rngs, strict=True)]
        picked = p[torch.arange(p.shape[0], device=p.device), torch.tensor(ns, device=p.device)]
        tokens = picked.argmax(-1).tolist()  # the one read
        for rng, n in zip(rngs, ns, strict=True):
            rng.t += n + 1
        return list(zip(ns, tokens, strict=True))
