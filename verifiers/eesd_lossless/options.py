"""Options of the lossless verifier (import-light: read when plug-ins are listed)."""

from __future__ import annotations

from eesd_core.config import PluginOptions


class LosslessOptions(PluginOptions):
    """The lossless verifier has no knobs: anything else would change the output distribution."""
