"""What the bench plug-in's commands share on the command line: defaults shown in every ``--help``,
and docstrings turned into plain text for it."""

from __future__ import annotations

import argparse
import copy
import re


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Adds ``(default: ...)`` to an option's help unless the help already speaks of its default.

    A default of ``None`` is left to the help to explain (``None`` would tell a reader nothing);
    an option without help still shows its default; the description keeps its own line breaks.
    """

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and action.default is not None:
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.default is argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def plain_text(doc: str | None) -> str:
    """A docstring without reStructuredText markup: ``code`` and :role:`target` become their text."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return re.sub(r"``([^`]+)``", r"\1", text).strip()
