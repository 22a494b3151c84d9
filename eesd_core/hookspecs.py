"""The hooks of project ``eesd``: what a plug-in module can implement.

A plug-in is a module (or object) listed under the ``eesd`` entry-point group; it implements any of
the hooks below with ``@eesd_core.hookimpl``. The built-in drafter, controllers, verifier, model
adapters and tools are plug-ins of exactly this kind, and they meet only through these hooks, never
by importing each other. This module imports nothing heavy on purpose: the types in the signatures
are read by type checkers only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import argparse

    from eesd_core.protocols import RoundOutcome
    from eesd_core.registry import Registrar
    from eesd_core.stats import GenerationStats

hookspec = pluggy.HookspecMarker("eesd")
hookimpl = pluggy.HookimplMarker("eesd")


@hookspec
def eesd_register_drafters(register: Registrar) -> None:
    """Register drafter factories.

    :param register: a typed registry; call ``register.add(name, factory, options=OptionsModel)``
        where ``factory(options)`` returns a :class:`~eesd_core.protocols.Drafter` and
        ``OptionsModel`` is a :class:`~eesd_core.config.PluginOptions` subclass (unknown keys are
        errors). A name already taken by another plug-in raises an error naming both.
    """


@hookspec
def eesd_register_controllers(register: Registrar) -> None:
    """Register controller factories; ``factory(options)`` returns a Controller.

    :param register: the typed registry, as in :func:`eesd_register_drafters`.
    """


@hookspec
def eesd_register_verifiers(register: Registrar) -> None:
    """Register verifier factories; ``factory(options)`` returns a Verifier.

    :param register: the typed registry, as in :func:`eesd_register_drafters`.
    """


@hookspec
def eesd_register_model_adapters(register: Registrar) -> None:
    """Register model adapter classes.

    :param register: the typed registry; ``register.add(name, adapter_class)`` where the class has
        ``supports(model) -> bool`` (a classmethod), ``model_types`` (names for error messages) and
        builds a :class:`~eesd_core.protocols.ModelAdapter` from a loaded model.
    """


@hookspec
def eesd_round_end(outcome: RoundOutcome) -> None:
    """Observe one finished round (tracing, metrics). Called only when some plug-in implements it.

    :param outcome: the :class:`~eesd_core.protocols.RoundOutcome` the controller learnt from:
        position, drafted k, accepted n, the committed tokens, draft and verify seconds, and the
        per-draft confidences the controller saw. It is frozen and shared: read it, keep it.
    """


@hookspec
def eesd_generation_end(stats: GenerationStats) -> None:
    """Observe one finished generation.

    :param stats: the :class:`~eesd_core.stats.GenerationStats` of the call.
    """


@hookspec(firstresult=True)
def eesd_resolve_model(name: str, cache_dir: str | None) -> str | None:
    """Turn a model name (``--model smollm2-135m-instruct``) into a local checkpoint directory.

    Asked only for what is not already a local directory; the first plug-in that knows the name
    answers, so tools never need to know which plug-in provides models.

    :param name: what the user typed.
    :param cache_dir: where the user asked fetched models to live; ``None`` for the plug-in's
        default.
    :return: the path of a Hugging Face checkpoint directory, ready to load (fetched and converted
        first if need be), or ``None`` when the plug-in does not know ``name``.
    """


@hookspec
def eesd_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add subcommands to the ``eesd`` command line.

    Called every time ``eesd`` builds its parser, ``eesd --help`` included: set up arguments only,
    and import anything heavy (torch, transformers) inside the command function.

    :param subparsers: the ``argparse`` sub-parser collection of ``eesd``; call
        ``subparsers.add_parser(name, help=...)`` and ``set_defaults(func=callable)``, where
        ``callable(args) -> int | None`` runs the command.
    """
