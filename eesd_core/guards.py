"""Containment of plug-in faults: a misbehaving plug-in fails with an error that names it.

Every call from the engine into a plug-in goes through :class:`Guarded`, which turns exceptions
and contract breaches (a non-bool decision, drafts outside the vocabulary, draft logits of the
wrong shape, more accepted tokens than drafted, a cache left at the wrong length) into
:class:`~eesd_core.errors.PluginFault`. The decoder stays usable: each call starts from fresh state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.errors import EESDError, PluginFault
from eesd_core.protocols import Draft, DraftStep, RandomSource, Verifier


class Guarded:
    """Checks on the answers of the drafter, controller and verifier named at construction."""

    def __init__(self, vocab_size: int, drafter: str | None, controller: str, verifier: str) -> None:
        self.vocab_size = vocab_size
        self.names = {"drafter": drafter, "controller": controller, "verifier": verifier}

    def fault(self, kind: str, message: str) -> PluginFault:
        return PluginFault(
            f"{kind} {self.names[kind]!r} {message}. This is a bug in that plug-in: report it to its "
            f"authors, or choose another {kind}."
        )

    def _call(self, kind: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except EESDError:
            raise
        except Exception as exc:
            raise self.fault(kind, f"raised {type(exc).__name__}: {exc} in {what}()") from exc

    def call_controller(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._call("controller", what, fn, *args)

    def call_drafter(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._call("drafter", what, fn, *args)

    def asker(self, controller: Any, max_draft_tokens: int) -> Callable[[DraftStep], bool]:
        """The controller's decision, bounded by ``max_draft_tokens`` whatever it says."""

        def ask(step: DraftStep) -> bool:
            if step.index >= max_draft_tokens:
                return False
            decision = self.call_controller("should_continue", controller.should_continue, step)
            return self._decision("should_continue", decision)

        return ask

    def keeper(self, controller: Any) -> Callable[[DraftStep], bool] | None:
        """The controller's ``keep`` (whether to verify a draft it has seen the q of), checked like
        ``should_continue``; ``None`` for a controller that has none."""
        keep = getattr(controller, "keep", None)
        if not callable(keep):
            return None

        def ask(step: DraftStep) -> bool:
            return self._decision("keep", self.call_controller("keep", keep, step))

        return ask

    def _decision(self, what: str, decision: Any) -> bool:
        if decision is not True and decision is not False:
            if type(decision).__name__ == "bool_":  # numpy.bool_
                return bool(decision)
            raise self.fault("controller", f"returned {decision!r} from {what}(), not a bool")
        return decision

    def check_drafter(self, drafter: Any, num_layers: int) -> None:
        """The drafter's declared members, once it is attached to the target."""
        shared = getattr(drafter, "shared_layers", None)
        if not isinstance(shared, int) or not 0 <= shared <= num_layers:
            raise self.fault("drafter", f"declares shared_layers={shared!r}, not an int in [0, {num_layers}]")
        if not isinstance(getattr(drafter, "reads_top_states", None), bool):
            raise self.fault("drafter", "does not declare reads_top_states (a bool)")

    def check_draft(self, draft: Any) -> None:
        if not isinstance(draft, Draft):
            raise self.fault("drafter", f"returned {type(draft).__name__} from step(), not a Draft")
        if draft.logits is not None:
            if tuple(draft.logits.shape) != (self.vocab_size,):
                raise self.fault(
                    "drafter",
                    f"returned draft logits of shape {tuple(draft.logits.shape)}, not ({self.vocab_size},)",
                )
        elif any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
            for t in draft.tokens
        ):
            raise self.fault("drafter", f"proposed tokens outside [0, {self.vocab_size})")

    def check_batch_logits(self, logits: Any, rows: int) -> None:
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (rows, self.vocab_size):
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise self.fault(
                "drafter", f"returned {shape} from step_batch(), not ({rows}, {self.vocab_size})"
            )

    def check_hidden(
        self, hidden: torch.Tensor | None, k: int, shared_layers: int, num_layers: int, rows: int = 1
    ) -> None:
        """``finish`` returns the states of the round's k + 1 inputs after N layers (None if N = 0)."""
        if shared_layers == 0:
            if hidden is not None:
                raise self.fault("drafter", "returned hidden states from finish() but shares no layers")
            return
        if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != (rows, k + 1):
            shape = None if hidden is None else tuple(hidden.shape)
            raise self.fault("drafter", f"returned hidden states of shape {shape} for {k + 1} inputs")

    def check_cache(self, cache: KVCache, start: int, position: int, k: int) -> None:
        """Layers [start, L) must hold exactly the committed tokens before verification."""
        if any(length != position for length in cache.lengths[start:]):
            raise self.fault(
                "drafter", f"left the target cache at {cache.lengths[start]} tokens, not {position}"
            )
        if start and cache.lengths[start - 1] != position + k + 1:
            raise self.fault("drafter", f"left layers [0, {start}) of the cache at the wrong length")

    def verify(
        self,
        verifier: Verifier,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        rng: RandomSource,
    ) -> tuple[int, int]:
        result = self._call("verifier", "verify", verifier.verify, draft_tokens, q, p, rng)
        return self._checked(result, int(draft_tokens.shape[0]), "verify")

    def verify_batch(
        self,
        verifier: Verifier,
        drafts: list[torch.Tensor],
        qs: list[torch.Tensor | None],
        p: torch.Tensor,
        rngs: list[RandomSource],
    ) -> list[tuple[int, int]]:
        """Each row's (n, token): in one call where the verifier has ``verify_batch``."""
        if not hasattr(verifier, "verify_batch"):
            rows = enumerate(zip(drafts, qs, rngs, strict=True))
            return [self.verify(verifier, d, q, p[b, : len(d) + 1], r) for b, (d, q, r) in rows]
        results = self._call("verifier", "verify_batch", verifier.verify_batch, drafts, qs, p, rngs)
        if not isinstance(results, (list, tuple)) or len(results) != len(drafts):
            raise self.fault("verifier", f"returned {results!r} from verify_batch(), not an (n, token) a row")
        return [self._checked(r, len(d), "verify_batch") for r, d in zip(results, drafts, strict=True)]

    def _checked(self, result: Any, k: int, what: str) -> tuple[int, int]:
        try:
            n, token = int(result[0]), int(result[1])
        except (TypeError, ValueError, IndexError):
            raise self.fault("verifier", f"returned {result!r} from {what}(), not (n, token)") from None
        if not 0 <= n <= k:
            raise self.fault("verifier", f"accepted {n} tokens out of {k} drafted")
        if not 0 <= token < self.vocab_size:
            raise self.fault("verifier", f"emitted token {token} outside [0, {self.vocab_size})")
        return n, token
