"""Options of the Thompson-sampling controller: every choice the EESD paper leaves open."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from eesd_core.config import PluginOptions

DEFAULT_EDGES = {
    "top1": (0.2, 0.4, 0.6, 0.8, 0.9),
    "prob": (0.2, 0.4, 0.6, 0.8, 0.9),
    "entropy": (0.25, 0.5, 1.0, 2.0, 3.0),
}


class ThompsonOptions(PluginOptions):
    """How the controller models acceptance and when it stops drafting.

    - ``variant``: ``"beta"`` keeps one Beta posterior over theta, the probability that a draft is
      accepted; ``"calibration"`` (default) also keeps one Beta posterior per confidence bucket of
      the drafter (``signal`` and ``edges``), so a doubtful draft ends the round early. A bucket's
      prior is centred on the overall posterior mean, so sparse buckets cost nothing when the
      confidence says little, and replays show it no slower than Beta-TS when it says nothing.
    - ``stop_rule``: ``"cost"`` (default) drafts only while the expected committed tokens per
      second, under the sampled theta and the measured costs, beat plain decoding and shorter
      rounds; ``"bernoulli"`` is the paper's rule: draft another token while chi ~ Bernoulli(theta)
      is 1. Until costs are measured, the cost rule drafts one token in one round and none in the
      next, which is all the engine needs to measure them.
    - ``failures``: the posterior's failures per round: ``"first"`` counts only the first rejection
      (later drafts are never judged by the verifier, so they are censored), ``"all"`` counts every
      rejected draft (k - n). Confidence buckets always count the first rejection only.
    - ``resample``: draw theta once per round (``"round"``, genuine Thompson sampling) or before
      every draft (``"step"``).
    - ``alpha0``, ``beta0``: the Beta prior; the default Beta(1, 2) (mean 1/3) and ``carry=16``
      were chosen by replays on prompts that are not Spec-Bench's
      (``benchmarks/tune_thompson.py``), where they had the smallest worst case against the best
      fixed k over the early-exit drafter, trained and untrained, and prompt lookup.
    - ``scope``: ``"request"`` resets the posterior at every generation (the paper's per-instance
      reading), ``"global"`` (default: fewer probes of a drafter that rarely pays) carries it
      across generations, shrinking the evidence by ``decay`` at each start and to at most
      ``carry`` observations (``None``: no limit), so that a generation on another kind of text
      soon outweighs what earlier ones taught.
    - ``signal``, ``edges``: the drafter confidence that Calibration-TS conditions on (``top1`` or
      ``prob`` of the latest draft, or its ``entropy`` in nats) and the increasing bucket edges
      (default per signal).
    - ``probe_tokens``: with the cost rule, the most drafts of a round that drafts although the
      posterior mean says drafting does not pay (a probe: one draft already tells whether the
      drafter is right); ``None`` lets the sampled theta decide alone.
    - ``explore``: the chance that a round of a static batch whose ``gate`` is shut probes, over
      1 + the plain rounds the gate has measured.
    - ``withdraw``: with the cost rule and Calibration-TS, where the engine allows it (one
      sequence, a drafter that can take a draft back), see each draft's q before committing to
      verify it (:meth:`~eesd_core.protocols.Controller.keep`): a draft whose confidence bucket
      says it would not repay its verification is taken back, having cost only its draft step.
      A round may then also *look*: draft one token although drafting does not pay on average,
      because the confident buckets, weighted by how often first drafts land in them, repay the
      step. A taken-back draft that followed only accepted ones is still judged by the round's
      target pass, so the posteriors learn from looks at the price of a draft step.
    - ``refresh``: with the cost rule, after this many rounds without a plain one at a batch
      size, a round is plain, so that the cost of plain decoding, which drafting is weighed
      against, is measured again (the engine's costs replace a figure that old rather than
      average it). Likewise, after this many rounds without a verified draft while drafts are
      taken back (``withdraw``), the next draft made is kept, so that the costs of verifying
      drafts, which decide what is taken back, are measured again. And while the measured costs
      say drafting could not pay even if every draft were accepted, a round drafts one token
      after this many rounds without a draft step, then after twice as many each time, up to
      1,024: costs that a loaded machine overstated are measured again, and a drafter too slow
      to ever pay costs one probe per 1,024 rounds. ``None``: never.
    - ``gate``: with the cost rule, in a batch call (a static batch: the call returns when its
      last row is done), measure per batch size how fast the row with fewest tokens advances in
      rounds with drafts and in plain ones, and keep rounds plain while drafting advances it
      more slowly (:mod:`eesd_thompson.gate`); such rounds still probe ever more rarely
      (``explore``). What it measured shrinks by ``decay`` at each start (``scope="request"``:
      it starts afresh), so it measures again once it rests on too few rounds. ``False``: the
      cost rule alone.
    - ``max_draft_tokens``: an own cap on drafts per round, below the engine's.
    - ``seed``: the controller's own random stream; with ``scope="request"`` it restarts at every
      generation, so a generation's decisions depend only on the seed and on what it observes.
      The stream decides only speed, never output: the verifier keeps decoding lossless.
    """

    variant: Literal["beta", "calibration"] = "calibration"
    stop_rule: Literal["cost", "bernoulli"] = "cost"
    failures: Literal["first", "all"] = "first"
    resample: Literal["round", "step"] = "round"
    alpha0: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    beta0: float = Field(2.0, gt=0.0, allow_inf_nan=False)
    scope: Literal["request", "global"] = "global"
    decay: float = Field(0.9, gt=0.0, le=1.0)
    carry: float | None = Field(16.0, ge=0.0)
    signal: Literal["top1", "prob", "entropy"] = "top1"
    edges: tuple[float, ...] | None = None
    probe_tokens: int | None = Field(1, ge=1)
    explore: float = Field(0.3, ge=0.0, le=1.0)
    withdraw: bool = True
    refresh: int | None = Field(32, ge=2)
    gate: bool = True
    max_draft_tokens: int | None = Field(None, ge=0)
    seed: int = 0

    @field_validator("edges")
    @classmethod
    def _increasing(cls, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if value is not None and any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise ValueError("bucket edges must be strictly increasing")
        return value

    @model_validator(mode="after")
    def _default_edges(self) -> ThompsonOptions:
        if self.edges is None:
            object.__setattr__(self, "edges", DEFAULT_EDGES[self.signal])
        return self
