"""Every call from the engine into a plug-in goes through :class:`Guarded`, which turns exceptions
and contract breaches into a :class:`~eesd_core.errors.PluginFault` naming the plug-in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.errors import EESDError, PluginFault
from eesd_core.protocols import Draft, RandomSource, Verifier, contract_breaches


class Guarded:
    """Checks on the answers of the drafter, controller and verifier named at construction."""

    def __init__(self, vocab_size: int, drafter: str | None, controller: str, verifier: str) -> None:
        self.vocab_size = vocab_size
        self.names = {"drafter": drafter, "controller": controller, "verifier": verifier}

    def fault(self, kind: str, message: str) -> PluginFault:
        advice = f"This is a bug in that plug-in: report it to its authors, or choose another {kind}."
        return PluginFault(f"{kind} {self.names[kind]!r} {message}. {advice}")

    def call(self, kind: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except EESDError:
            raise
        except Exception as exc:
            raise self.fault(kind, f"raised {type(exc).__name__}: {exc} in {what}()") from exc

    def decide(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        """The controller's answer ``fn(*args)``, which must be a bool (numpy's bools count)."""
        decision = self.call("controller", what, fn, *args)
        if decision is True or decision is False:
            return decision
        if type(decision).__module__ == "numpy" and type(decision).__name__ in ("bool", "bool_"):
            return bool(decision)
        raise self.fault("controller", f"returned {decision!r} from {what}(), not a bool")

    def check_contract(self, kind: str, component: Any) -> None:
        """A built component has its protocol's methods and declares its capabilities as bools."""
        if breaches := contract_breaches(kind, component):
            raise self.fault(kind, "breaks its protocol: " + "; ".join(breaches))

    def check_drafter(self, drafter: Any, num_layers: int) -> None:
        """The drafter's declared members, once it is attached to the target."""
        shared = getattr(drafter, "shared_layers", None)
        if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared <= num_layers:
            raise self.fault("drafter", f"declares shared_layers={shared!r}, not an int in [0, {num_layers}]")
        if not isinstance(getattr(drafter, "reads_top_states", None), bool):
            raise self.fault("drafter", "does not declare reads_top_states (a bool)")

    def check_draft(self, draft: Any, drafting: Sequence[bool]) -> None:
        rows, vocab = len(drafting), self.vocab_size
        if not isinstance(draft, Draft):
            raise self.fault("drafter", f"returned {type(draft).__name__} from step(), not a Draft")
        if (logits := draft.logits) is not None:
            if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (rows, vocab):
                shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise self.fault("drafter", f"returned draft logits of shape {shape}, not ({rows}, {vocab})")
            return
        tokens = draft.tokens
        if any(tokens) and len(tokens) != rows:
            raise self.fault("drafter", f"proposed fixed tokens for {len(tokens)} rows, not {rows}")
        if any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for row in tokens for t in row
        ):
            raise self.fault("drafter", f"proposed tokens outside [0, {vocab})")

    def check_hidden(self, hidden: torch.Tensor | None, k: int, shared_layers: int, rows: int) -> None:
        """``finish`` returns the states of the round's k + 1 inputs after N layers (None if N = 0)."""
        if shared_layers == 0:
            if hidden is not None:
                raise self.fault("drafter", "returned hidden states from finish() but shares no layers")
            return
        if hidden is None or hidden.dim() != 3 or hidden.shape[:2] != (rows, k + 1):
            shape = None if hidden is None else tuple(hidden.shape)
            raise self.fault(
                "drafter", f"returned hidden states of shape {shape} for {rows} x {k + 1} inputs"
            )

    def check_cache(self, cache: KVCache, start: int, slots: int, m: int) -> None:
        """Before verification, layers [start, L) hold exactly the ``slots`` committed slots, and
        layers [0, start) those and the round's ``m`` inputs."""
        if any(length != slots for length in cache.lengths[start:]):
            raise self.fault("drafter", f"left the target cache at {cache.lengths[start]} slots, not {slots}")
        if start and cache.lengths[start - 1] != slots + m:
            raise self.fault("drafter", f"left layers [0, {start}) of the cache at the wrong length")

    def verify(
        self,
        verifier: Verifier,
        drafts: Sequence[torch.Tensor],
        qs: Sequence[torch.Tensor | None],
        p: torch.Tensor,
        rngs: Sequence[RandomSource],
    ) -> list[tuple[int, int]]:
        """Each row's (n, token), checked."""
        results = self.call("verifier", "verify", verifier.verify, drafts, qs, p, rngs)
        if not isinstance(results, (list, tuple)) or len(results) != len(drafts):
            raise self.fault("verifier", f"returned {results!r} from verify(), not an (n, token) per row")
        return [self._checked(r, len(d)) for r, d in zip(results, drafts, strict=True)]

    def _checked(self, result: Any, k: int) -> tuple[int, int]:
        try:
            n, token = int(result[0]), int(result[1])
        except (TypeError, ValueError, IndexError):
            raise self.fault("verifier", f"returned {result!r} from verify(), not (n, token)") from None
        if not 0 <= n <= k:
            raise self.fault("verifier", f"accepted {n} tokens out of {k} drafted")
        if not 0 <= token < self.vocab_size:
            raise self.fault("verifier", f"emitted token {token} outside [0, {self.vocab_size})")
        return n, token
