"""Whether drafting steps beat plain ones, measured: the proposer's guard against drafting at a loss.

The controller chooses each request's drafts from what it learnt of acceptance and from its cost
model, which prices a step by its longest round. Inside vLLM a step costs otherwise: every draft
adds a position to one packed pass, a step that verifies any draft pays a fixed price for it, and
the proposer's own pass serves every drafting request at once. Where drafting is close to break-even
(several concurrent requests on a CPU) the controller's choices can then lose a few percent to plain
decoding, which a serving engine's users would rather not pay.

So the gate measures what the controller cannot: per batch size, the steps in which some request
drafted are scored by the plain time of the tokens they committed, ``tokens * plain_step / rows``,
against the time they took, the proposer's (catching up included) and vLLM's. ``gain`` is the
ratio of the two sums, older steps weighing less (``decay`` per step scored): above 1, drafting
steps were faster than plain ones would have been. Below 1, after at least ``min_steps`` scored
steps, the gate closes: no request of a step of that batch size drafts, except in probes, after
``first_probe`` closed steps and then after twice as many each time, so that a drafter that got
better, or a bad stretch, is noticed at a cost that shrinks as the evidence grows. Probes are
rare because they are dear: a request that has not drafted for a while must first run every
token since through the proposer's layers. Steps the gate closes are plain, and measure the
plain step the score relies on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Score:
    saved: float = 0.0  # plain time of the committed tokens, decayed
    spent: float = 0.0  # time of the drafting steps, decayed
    steps: int = 0
    closed: int = 0  # steps the gate closed since it last opened
    next_probe: int = 0  # the closed step that probes next

    @property
    def gain(self) -> float | None:
        return self.saved / self.spent if self.spent > 0 else None


class DraftGate:
    """Per batch size: whether this step may draft (:meth:`open`) and what drafting steps gained
    (:meth:`score`)."""

    def __init__(self, decay: float = 0.95, min_steps: int = 12, first_probe: int = 32) -> None:
        self.decay, self.min_steps, self.first_probe = decay, min_steps, first_probe
        self.scores: dict[int, _Score] = {}
        self.closed_steps = 0
        self.probed_steps = 0

    def score(self, size: int, tokens: int, rows: int, seconds: float, plain_step: float | None) -> None:
        """A step of batch size ``size`` in which some request drafted: ``tokens`` committed by its
        ``rows`` requests in ``seconds``, a plain step of that size taking ``plain_step``."""
        if plain_step is None or plain_step <= 0 or seconds <= 0 or rows <= 0:
            return
        held = self.scores.setdefault(size, _Score())
        held.saved = self.decay * held.saved + tokens * plain_step / rows
        held.spent = self.decay * held.spent + seconds
        held.steps += 1
        if (held.gain or 0.0) >= 1.0:
            held.closed, held.next_probe = 0, 0

    def gain(self, size: int) -> float | None:
        held = self.scores.get(size)
        return None if held is None else held.gain

    def open(self, size: int) -> bool:
        """Whether a step of batch size ``size`` may draft: yes until drafting steps were measured
        slower than plain ones, then only as a probe."""
        held = self.scores.get(size)
        if held is None or held.steps < self.min_steps or (held.gain or 0.0) >= 1.0:
            return True
        held.closed += 1
        if held.next_probe == 0:
            held.next_probe = self.first_probe
        if held.closed >= held.next_probe:
            held.next_probe = 2 * held.closed
            self.probed_steps += 1
            return True
        self.closed_steps += 1
        return False
