"""Whether drafting shortens a static batch's call, as measured.

A batch call (``generate`` over B rows) returns when its last row is done, so what drafting is
worth there is how fast the row with fewest tokens advances, not the tokens of all rows. The cost
rule weighs each row's own expected tokens; rows that draft well finish early while the call
waits for the rest, and the row that trails is often the one whose drafts fail. So the gate
measures, per batch size, the call's progress per second (the growth of the fewest tokens among
the round's rows, over the round's time) in rounds that drafted and in plain ones, and shuts
drafting at that size while drafted rounds advance the call more slowly than plain ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from eesd_core.protocols import RoundOutcome

LEAST_DRAFTED = 8  # rounds with drafts before the gate may shut
LEAST_PLAIN = 4  # plain rounds before the gate may shut


class _Progress:
    """Progress and seconds summed over rounds of one kind."""

    def __init__(self) -> None:
        self.tokens = self.seconds = self.rounds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens, self.seconds, self.rounds = self.tokens + tokens, self.seconds + seconds, self.rounds + 1

    def shrink(self, factor: float) -> None:
        self.tokens, self.seconds = factor * self.tokens, factor * self.seconds
        self.rounds *= factor

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class BatchGate:
    """One batch size's measured call progress, with drafts and without; see the module."""

    def __init__(self) -> None:
        self.drafted, self.plain = _Progress(), _Progress()
        self._tokens: dict[int, int] = {}  # row -> tokens committed this generation
        self._before: dict[int, int] = {}  # the same at the end of the round before
        self._round: set[int] = set()  # rows reported this round
        self._drafts = False  # whether the round made a draft step
        self._seconds = 0.0

    def start(self, keep: float = 1.0) -> None:
        """A new generation: rows count their tokens afresh, and what was measured counts
        ``keep`` times as much (as the posterior's evidence shrinks at each start), so that the
        gate opens again to measure once it rests on too few rounds."""
        self._tokens, self._before, self._round = {}, {}, set()
        self.drafted.shrink(keep)
        self.plain.shrink(keep)

    def observe_round(self, outcomes: Sequence[RoundOutcome]) -> None:
        """The outcomes of every row of one round."""
        for outcome in outcomes:
            self._round.add(outcome.row)
            self._tokens[outcome.row] = self._tokens.get(outcome.row, 0) + len(outcome.tokens)
            self._drafts |= outcome.drafted > 0 or outcome.withdrawn is not None
            self._seconds = outcome.draft_time + outcome.verify_time  # the whole batch round's
        self._end_round()

    def _end_round(self) -> None:
        rows = [row for row in self._round if row in self._before]
        if rows:  # the fewest tokens among the rows of both rounds: rows that left do not count
            gained = min(self._tokens[r] for r in rows) - min(self._before[r] for r in rows)
            (self.drafted if self._drafts else self.plain).add(gained, self._seconds)
        self._before = {row: self._tokens[row] for row in self._round}
        self._round, self._drafts = set(), False

    @property
    def measuring(self) -> bool:
        """Whether rounds with drafts are measured and plain ones not yet: the next rounds are
        plain, to measure them (a drafter that pays for every row may leave none plain)."""
        return self.drafted.rounds >= LEAST_DRAFTED and self.plain.rounds < LEAST_PLAIN

    @property
    def shut(self) -> bool:
        """Whether rounds with drafts have advanced the call more slowly than plain rounds."""
        if self.drafted.rounds < LEAST_DRAFTED or self.plain.rounds < LEAST_PLAIN:
            return False
        return self.drafted.rate < self.plain.rate
