"""What a generation reports: the totals of a call (per row of a batch), summed from its rounds'
:class:`RoundOutcome` s."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from eesd_core.protocols import RoundOutcome


@dataclass
class GenerationStats:
    """Totals of one ``generate``/``stream`` call; times in seconds."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    withdrawn: int = 0  # drafts taken back before verification (Controller.keep)
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0
    stopped_by: str = ""

    def add_round(self, round_: RoundOutcome) -> None:
        self.rounds += 1
        self.drafted += round_.drafted
        self.accepted += round_.accepted
        self.withdrawn += round_.withdrawn is not None
        self.draft_time += round_.draft_time
        self.verify_time += round_.verify_time
        grow = [0] * max(0, round_.drafted - len(self.drafted_by_position))
        self.drafted_by_position += grow
        self.accepted_by_position += grow
        for i in range(round_.drafted):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += int(i < round_.accepted)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens committed per target forward pass (1.0 for plain decoding)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        rates = ("mean_accepted_tokens", "acceptance_rate", "tokens_per_second")
        return asdict(self) | {name: getattr(self, name) for name in rates}


@dataclass
class BatchStats:
    """Totals of a batched call: ``rows`` holds each row's own :class:`GenerationStats` (its
    ``total_time`` runs until that row finished); ``rounds`` counts batch rounds."""

    rows: list[GenerationStats] = field(default_factory=list)
    rounds: int = 0
    prefill_time: float = 0.0
    total_time: float = 0.0
    relayouts: int = 0

    new_tokens = property(lambda self: sum(row.new_tokens for row in self.rows))
    drafted = property(lambda self: sum(row.drafted for row in self.rows))
    accepted = property(lambda self: sum(row.accepted for row in self.rows))

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        names = "rounds new_tokens drafted accepted prefill_time total_time relayouts tokens_per_second"
        return {"rows": [row.to_dict() for row in self.rows]} | {n: getattr(self, n) for n in names.split()}
