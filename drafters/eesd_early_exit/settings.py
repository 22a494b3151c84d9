"""Training settings of ``eesd distill`` (import-light: the command line reads their defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings; the defaults are the recipe measured in our earlier runs."""

    epochs: int = 1
    lr: float = 1e-3
    warmup: float = 0.05
    batch_tokens: int = 300
    seed: int = 0
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    ce_weight: float = 0.0
    top_weight: float = 0.0
    checkpoint_every: int = 200
