"""pytest plug-in of the eesd test kit: Hypothesis profiles chosen by ``EESD_HYPOTHESIS_PROFILE``.

Profiles: ``ci`` (derandomized, so a run is reproducible; the default when ``CI`` is set), ``dev``
(random, the default otherwise) and ``thorough`` (many more examples, on demand).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def pytest_configure(config: object) -> None:
    default = "ci" if os.environ.get("CI") else "dev"
    settings.load_profile(os.environ.get("EESD_HYPOTHESIS_PROFILE", default))
