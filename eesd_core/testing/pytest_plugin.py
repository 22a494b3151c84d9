"""pytest plug-in of the eesd test kit: Hypothesis profiles chosen by ``EESD_HYPOTHESIS_PROFILE``.

Profiles: ``ci`` (derandomized, so a run is reproducible; the default when ``CI`` is set), ``dev``
(random, the default otherwise), ``quick`` (a tenth of the examples, for a fast local loop) and
``thorough`` (ten times the examples, on demand); a project may register its own in a conftest.py
and name it in the variable. The contract classes scale their example counts from the profile's
``max_examples``, so the profile is loaded when this module is imported (pytest imports it before
any test module) and again at configuration, once conftest files have registered theirs.

The plug-in is loaded in every pytest run of an environment where eesd is installed; without
Hypothesis (the ``test`` extra) it does nothing.
"""

from __future__ import annotations

import os

from eesd_core.testing.errors import KitError

try:
    import hypothesis
except ImportError:  # pragma: no cover - eesd installed without its test extra
    hypothesis = None  # type: ignore[assignment]

PROFILE_VARIABLE = "EESD_HYPOTHESIS_PROFILE"


def _register() -> None:
    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow]
    settings.register_profile(
        "ci", derandomize=True, print_blob=True, deadline=None, suppress_health_check=slow
    )
    settings.register_profile("dev", deadline=None, suppress_health_check=slow)
    settings.register_profile("quick", max_examples=10, deadline=None, suppress_health_check=slow)
    settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=slow)


def _load(final: bool) -> None:
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    name = os.environ.get(PROFILE_VARIABLE) or ("ci" if os.environ.get("CI") else "dev")
    try:
        settings.get_profile(name)
    except InvalidArgument:
        if final:
            raise KitError(
                f"{PROFILE_VARIABLE}={name!r} names no Hypothesis profile. Use ci, dev, quick or "
                "thorough, or register it in a conftest.py with settings.register_profile()."
            ) from None
        return
    settings.load_profile(name)


if hypothesis is not None:
    _register()
    _load(final=False)


def pytest_configure(config: object) -> None:
    """Load the profile again: a conftest may have registered the one the variable names."""
    if hypothesis is not None:
        _load(final=True)


def pytest_report_header(config: object) -> str | None:
    if hypothesis is None:
        return None
    return f"eesd: hypothesis profile {hypothesis.settings.get_current_profile_name()!r} ({PROFILE_VARIABLE})"
