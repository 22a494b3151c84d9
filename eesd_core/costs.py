"""Measured costs of draft steps and verification passes, for controllers that weigh time.

One tracker per batch size (a :class:`CostBook`), shared by a decoder's generations in any thread,
keeps a moving average per k (or m = k + 1) and a least-squares line where unmeasured. A lower
measurement, or one of a cost stale for ``STALE`` rounds, replaces it (load only slows passes), and
the draft step's line leaves out stale times while fresher ones make one (a k no longer drafted).
"""

from __future__ import annotations

import threading

from eesd_core.protocols import Costs

STALE = 32


def _line(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line; a flat line through one point."""
    if len(points) <= 1:
        return (points[0][1], 0.0) if points else None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, max(slope, 0.0)


class CostTracker:
    """Smoothed proposal time by k, verification time by m, and the peek of withdrawn drafts."""

    def __init__(self, max_k: int, smoothing: float = 0.2, batch_size: int = 1) -> None:
        self.smoothing = smoothing
        self.batch_size = batch_size
        self.propose: list[float | None] = [None] * (max_k + 1)
        self.verify: list[float | None] = [None] * (max_k + 2)
        self.peek: float | None = None
        self.rounds = 0
        self._measured: dict[tuple[str, int], int] = {}  # (what, k or m) -> round last measured
        self._snapshot: Costs | None = None
        self._lock = threading.Lock()

    def observe(self, k: int, propose_time: float, verify_time: float, withdrawn: bool = False) -> None:
        """A round of k verified drafts; ``withdrawn``: its last draft step was taken back, so its
        drafting time is k drafts' plus the peek (and no finish), which is what it teaches."""
        with self._lock:
            if withdrawn:
                kept, verify = self.snapshot().round_time(k), self.snapshot().verify(k + 1)
                if kept is not None and verify is not None:
                    self.peek = self._smooth(self.peek, max(propose_time - (kept - verify), 0.0), ("peek", 0))
            else:
                self.propose[k] = self._smooth(self.propose[k], propose_time, ("propose", k))
            self.verify[k + 1] = self._smooth(self.verify[k + 1], verify_time, ("verify", k + 1))
            self.rounds += 1
            self._snapshot = None

    def _smooth(self, old: float | None, new: float, what: tuple[str, int]) -> float:
        last, self._measured[what] = self._measured.get(what, -STALE), self.rounds
        take = old is None or new < old or self.rounds - last >= STALE
        return new if take else old + self.smoothing * (new - old)

    def snapshot(self) -> Costs:
        """The current :class:`Costs`, rebuilt only after new observations."""
        if (snapshot := self._snapshot) is None:
            snapshot = self._snapshot = self._build()
        return snapshot

    def _build(self) -> Costs:
        proposals = [(k, t) for k, t in enumerate(self.propose) if t is not None]
        fresh = [(k, t) for k, t in proposals if self.rounds - self._measured[("propose", k)] < STALE]
        line = _line(fresh if len(fresh) >= 2 else proposals)
        draft_step = line[1] if line and len(proposals) >= 2 else None
        base = self.propose[0] if self.propose[0] is not None else (line[0] if line else None)
        vline = _line([(m, t) for m, t in enumerate(self.verify) if t is not None])
        measured = list(self.verify)

        def verify(m: int) -> float | None:
            if 0 <= m < len(measured) and measured[m] is not None:
                return measured[m]
            return None if vline is None else max(vline[0] + vline[1] * m, 0.0)

        return Costs(draft_step, base, verify, self.batch_size, self.peek)  # the fields in order


class CostBook:
    """The cost trackers of one decoder (or proposer), one per batch size rounded up to a power
    of two; 1 is a lone sequence's."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.trackers: dict[int, CostTracker] = {}
        self._lock = threading.Lock()

    def __call__(self, batch_size: int) -> CostTracker:
        bucket = 1 << max(batch_size - 1, 0).bit_length()
        if (tracker := self.trackers.get(bucket)) is None:
            with self._lock:
                tracker = self.trackers.setdefault(bucket, CostTracker(self.max_k, batch_size=bucket))
        return tracker
