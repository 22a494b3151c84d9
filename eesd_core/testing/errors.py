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
