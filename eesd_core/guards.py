"""Containment of plug-in faults: a misbehaving plug-in fails with an error that names it.

Every call from the engine into a plug-in goes through :class:`Guarded`, which turns exceptions
and contract breaches (a non-bool decision, drafts outside the vocabulary, q that is not a
distribution, more accepted tokens than drafted, a cache left at the wrong length) into
:class:`~eesd_core.errors.PluginFault`. The decoder stays usable: each call starts from fresh state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from eesd_core.cache import KVCache
from eesd_core.errors import EESDError, PluginFault
from eesd_core.protocols import DraftStep, Proposal, RandomSource, Verifier
from eesd_core.sampling import check_finite


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

    def asker(self, controller: Any, max_tokens: int) -> Callable[[DraftStep], bool]:
        """``ctx.ask``: the controller's decision, bounded by ``max_tokens`` whatever it says."""

        def ask(step: DraftStep) -> bool:
            if step.index >= max_tokens:
                return False
            decision = self.call_controller("should_continue", controller.should_continue, step)
            if decision is not True and decision is not False:
                if type(decision).__name__ == "bool_":  # numpy.bool_
                    return bool(decision)
                raise self.fault("controller", f"returned {decision!r} from should_continue(), not a bool")
            return decision

        return ask

    def check_proposal(self, proposal: Proposal, max_k: int, num_layers: int) -> None:
        if not isinstance(proposal, Proposal):
            raise self.fault("drafter", f"returned {type(proposal).__name__} from propose(), not a Proposal")
        k = proposal.k
        if k > max_k:
            raise self.fault("drafter", f"proposed {k} drafts where at most {max_k} were allowed")
        tokens = proposal.tokens
        if k and (
            tokens.dtype != torch.long or int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size
        ):
            raise self.fault("drafter", f"proposed tokens outside [0, {self.vocab_size})")
        if not 0 <= proposal.layers_done <= num_layers:
            raise self.fault("drafter", f"claims layers_done={proposal.layers_done} of {num_layers}")
        if proposal.hidden is not None and proposal.layers_done and proposal.hidden.shape[1] != k + 1:
            raise self.fault(
                "drafter", f"returned hidden states for {proposal.hidden.shape[1]} inputs, not {k + 1}"
            )
        if proposal.q is not None and k:
            self._check_q(proposal.q, k)

    def _check_q(self, q: torch.Tensor, k: int) -> None:
        if q.shape[0] != k or q.shape[-1] != self.vocab_size:
            raise self.fault("drafter", f"returned q of shape {tuple(q.shape)}, not ({k}, {self.vocab_size})")
        check_finite(q, "Draft")
        sums = q.sum(-1, dtype=torch.float64)
        if bool((q < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise self.fault("drafter", "returned q rows that are not probability distributions")

    def check_cache(self, cache: KVCache, start: int, position: int, k: int) -> None:
        """Layers [start, L) must hold exactly the committed tokens before verification."""
        if any(length != position for length in cache.lengths[start:]):
            raise self.fault(
                "drafter", f"left the target cache at {cache.lengths[start]} tokens, not {position}"
            )
        if start and cache.lengths[start - 1] != position + k + 1:
            raise self.fault("drafter", f"left layers [0, {start}) of the cache at the wrong length")

    def verify(
        self, verifier: Verifier, proposal: Proposal, p: torch.Tensor, rng: RandomSource
    ) -> tuple[int, int]:
        result = self._call("verifier", "verify", verifier.verify, proposal.tokens, proposal.q, p, rng)
        try:
            n, token = int(result[0]), int(result[1])
        except (TypeError, ValueError, IndexError):
            raise self.fault("verifier", f"returned {result!r} from verify(), not (n, token)") from None
        if not 0 <= n <= proposal.k:
            raise self.fault("verifier", f"accepted {n} tokens out of {proposal.k} drafted")
        if not 0 <= token < self.vocab_size:
            raise self.fault("verifier", f"emitted token {token} outside [0, {self.vocab_size})")
        return n, token
