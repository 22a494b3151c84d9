"""Real pretrained weights for eesd: ``eesd models fetch|list|verify``, and known model names on ``--model``.

A tool plug-in like any other: it adds its commands through ``eesd_cli_commands`` and answers
``eesd_resolve_model``, so every command that takes ``--model`` accepts the names listed in
:data:`eesd_models.sources.KNOWN_MODELS` without knowing this package. Importing it stays light: the
fetch machinery loads only when a name is resolved or a command runs.
"""

from __future__ import annotations

import argparse

from eesd_core.hookspecs import hookimpl

#: What ``eesd models fetch`` gets when no name is given.
DEFAULT_MODEL = "smollm2-135m-instruct"
#: The dtypes a fetched checkpoint can be saved in; float32 is the default.
DTYPES = ("float32", "bfloat16")


@hookimpl
def eesd_resolve_model(name: str, cache_dir: str | None) -> str | None:
    from eesd_models.sources import KNOWN_MODELS

    if name not in KNOWN_MODELS:
        return None
    from eesd_models.fetch import fetch_model

    return str(fetch_model(name, cache_dir))


@hookimpl
def eesd_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eesd_models.cli import add_models

    add_models(subparsers)
