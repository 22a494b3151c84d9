"""The one error hierarchy of eesd: every error a user can act on is an :class:`EESDError`, whose
message says what went wrong and what to do about it."""

from __future__ import annotations


class EESDError(Exception):
    """Base class of every error raised on purpose by eesd."""


class ConfigError(EESDError, ValueError):
    """A configuration or option value is invalid (unknown key, wrong type, out of range)."""


class InputError(EESDError, ValueError):
    """An argument of a call is invalid: an empty prompt, a negative length, a bad token id."""


class PluginError(EESDError):
    """A plug-in is missing, malformed, registered twice, or misbehaved at run time."""


class PluginLoadError(PluginError):
    """An entry point of the ``eesd`` group could not be imported or registered."""


class UnknownPluginError(PluginError, KeyError):
    """No plug-in of the requested kind is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PluginFault(PluginError):
    """A plug-in broke its contract while decoding (raised, returned garbage, overstepped bounds)."""


class UnsupportedModelError(EESDError):
    """The model's architecture has no adapter."""


class HeadError(EESDError):
    """An exit-head file is unreadable, corrupted, or was made for another model."""


class NumericalError(EESDError, FloatingPointError):
    """NaN or infinite values appeared in logits or probabilities."""


class ModelFetchError(EESDError):
    """A model could not be downloaded, verified or converted."""
