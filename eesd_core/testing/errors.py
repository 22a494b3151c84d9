"""Failures the test kit reports: each is an :class:`~eesd_core.errors.EESDError`.

:class:`DistributionMismatch` is also an ``AssertionError``, so pytest shows it as a failed
assertion; the others mean a test could not be carried out as written.
"""

from __future__ import annotations

from eesd_core.errors import EESDError


class KitError(EESDError):
    """Base of the test kit's errors."""


class DistributionMismatch(KitError, AssertionError):
    """Decoding did not produce the distribution it must (exactly, or within a stated error rate)."""


class ReplayError(KitError):
    """A run took different random choices when replayed: it draws randomness the kit cannot see."""


class ToyInvariantError(KitError):
    """The toy model saw a cache or hidden state that breaks the engine's invariants."""


class ContractBreach(KitError, AssertionError):
    """A plug-in broke a rule of its protocol: the message names the rule and the value it got."""


def breach(rule: str, value: object) -> ContractBreach:
    """A :class:`ContractBreach` saying ``rule, got value (type)``."""
    return ContractBreach(f"{rule}, got {value!r} ({type(value).__name__})")


def must(ok: bool, rule: str, value: object) -> None:
    """Raise :func:`breach` of ``rule`` by ``value`` unless ``ok``."""
    if not ok:
        raise breach(rule, value)
