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
steps were faster than plain ones would have been. The gate closes when the gain is below 1 by
more than ``z`` standard errors (from the spread of the steps' own ratios, after at least
``min_steps``), so that the noisy first steps of a controller still learning, at one request
where a step commits one token or five, do not close it; or when the gain is below ``floor``
whatever the spread (many requests, where one that starts drafting first catches up on its whole
prompt, make steps' times spiky and the spread wide); or, after ``quick_steps`` only, when it is
below ``quick_floor`` (at sixteen requests on SmolLM2 a step whose requests first drafted took
four plain steps' time, and such steps were too few in a wave to reach ``min_steps``). Then no
request of a step of that batch
size drafts, except in probes, after ``probe_every * size`` closed steps and then after twice as
many each time, so that a drafter that got better, or a bad stretch, is noticed at a cost that
shrinks as the evidence grows. Probes are dear, and dearer with more requests: a request that has
not drafted for a while must first run every token since (its prompt too, if it never drafted)
through the proposer's layers, which at four requests on a 2-core CPU cost a second or more. The
gate reopens only when the gain itself is back at 1 or above, not merely within a standard error
of it. Steps the gate closes are plain, and measure the plain step the score relies on.

From ``proof_from`` requests on (by default, from one), drafting must show its gain rather than
merely not show a loss: after ``min_steps`` the gate closes unless the gain is above 1 by a
standard error, and reopens only then. Break-even drafting still loses to plain decoding, through
what the score leaves out: vLLM schedules every step synchronously once a custom proposer is
loaded, while plain vLLM overlaps scheduling with its passes; requests finish at different steps,
and in a wave the last ones run alone at nearly the cost of all. At one request on SmolLM2 in
vLLM's CPU build, drafting steps broke even (41.2 ms a token against plain vLLM's 40 to 47) and a
gate asking only for no loss let them run for 261 steps; asking for a gain, it closes after
twelve. A head that pays is not held back: on Qwen2.5-Coder-1.5B's code prompts the gain at one
request was 1.4 to 1.6, several standard errors above 1. ``proof_from`` above 1 keeps the gentler
rule for fewer requests, where a step's pass is bound by reading the weights and drafting is
cheapest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class _Score:
    saved: float = 0.0  # plain time of the committed tokens, decayed
    spent: float = 0.0  # time of the drafting steps, decayed
    steps: int = 0
    shut: bool = False  # closed: drafting steps lost; reopened when the gain is back at 1
    closed: int = 0  # steps the gate closed since it last opened
    next_probe: int = 0  # the closed step that probes next
    weight: float = 0.0  # decayed sums over the steps' own ratios: of 1, 1 squared, r and r^2
    weight2: float = 0.0
    first: float = 0.0
    second: float = 0.0

    @property
    def gain(self) -> float | None:
        return self.saved / self.spent if self.spent > 0 else None

    @property
    def error(self) -> float:
        """The standard error of the gain, from the spread of the steps' ratios."""
        if self.weight <= 0:
            return math.inf
        mean = self.first / self.weight
        spread = max(self.second / self.weight - mean * mean, 0.0)
        effective = self.weight**2 / self.weight2
        return math.sqrt(spread / effective)


class DraftGate:
    """Per batch size: whether this step may draft (:meth:`open`) and what drafting steps gained
    (:meth:`score`)."""

    def __init__(
        self,
        decay: float = 0.95,
        min_steps: int = 12,
        z: float = 1.0,
        floor: float = 0.9,
        quick_steps: int = 3,
        quick_floor: float = 0.75,
        probe_every: int = 64,
        proof_from: int = 1,
    ) -> None:
        self.decay, self.min_steps, self.z, self.probe_every = decay, min_steps, z, probe_every
        self.proof_from = proof_from
        self.floor, self.quick_steps, self.quick_floor = floor, quick_steps, quick_floor
        self.scores: dict[int, _Score] = {}
        self.closed_steps = 0
        self.probed_steps = 0

    def score(self, size: int, tokens: int, rows: int, seconds: float, plain_step: float | None) -> None:
        """A step of batch size ``size`` in which some request drafted: ``tokens`` committed by its
        ``rows`` requests in ``seconds``, a plain step of that size taking ``plain_step``."""
        if plain_step is None or plain_step <= 0 or seconds <= 0 or rows <= 0:
            return
        held, d = self.scores.setdefault(size, _Score()), self.decay
        saved = tokens * plain_step / rows
        held.saved, held.spent = d * held.saved + saved, d * held.spent + seconds
        ratio = saved / seconds
        held.weight, held.weight2 = d * held.weight + 1.0, d * d * held.weight2 + 1.0
        held.first, held.second = d * held.first + ratio, d * held.second + ratio * ratio
        held.steps += 1
        gain, error = held.gain or 0.0, self.z * held.error
        # from proof_from requests on, the gain less an error must reach 1 (drafting must show
        # that it pays); below, the gain itself to reopen, the gain plus an error to stay open
        proof = size >= self.proof_from
        if held.shut and (gain - error if proof else gain) >= 1.0:
            held.shut, held.closed, held.next_probe = False, 0, 0
        elif not held.shut and held.steps >= self.min_steps:
            held.shut = gain < self.floor or (gain - error if proof else gain + error) < 1.0
        elif not held.shut and held.steps >= self.quick_steps:
            held.shut = gain < self.quick_floor

    def summary(self) -> dict[int, dict[str, float | int | bool | None]]:
        """Per batch size: the gain, its standard error, the steps scored and whether it is shut."""
        return {
            size: {"gain": held.gain, "error": held.error, "steps": held.steps, "shut": held.shut}
            for size, held in sorted(self.scores.items())
        }

    def gain(self, size: int) -> float | None:
        held = self.scores.get(size)
        return None if held is None else held.gain

    def open(self, size: int, plain_known: bool = True) -> bool:
        """Whether a step of batch size ``size`` may draft: not before a plain step of that size
        was measured (``plain_known``: the score's yardstick, which a modelled value would not
        be), then yes until drafting steps were measured slower than plain ones, then only as a
        probe."""
        if not plain_known:
            return False
        held = self.scores.get(size)
        if held is None or not held.shut:
            return True
        held.closed += 1
        if held.next_probe == 0:
            held.next_probe = self.probe_every * size
        if held.closed >= held.next_probe:
            held.next_probe = 2 * held.closed
            self.probed_steps += 1
            return True
        self.closed_steps += 1
        return False
