"""The hooks of project ``eesd``: what a plug-in module can implement.

A plug-in is a module (or object) listed under the ``eesd`` entry-point group; it implements any of
the hooks below with ``@eesd_core.hookimpl``. The built-in drafter, controllers, verifier and model
adapters are plug-ins of exactly this kind. This module imports nothing heavy on purpose.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("eesd")
hookimpl = pluggy.HookimplMarker("eesd")


@hookspec
def eesd_register_drafters(register: Any) -> None:
    """Register drafter factories.

    :param register: a typed registry; call ``register.add(name, factory, options=OptionsModel)``
        where ``factory(options)`` returns a :class:`~eesd_core.protocols.Drafter` and
        ``OptionsModel`` is a :class:`~eesd_core.config.PluginOptions` subclass (unknown keys are
        errors). A name already taken by another plug-in raises an error naming both.
    """


@hookspec
def eesd_register_controllers(register: Any) -> None:
    """Register controller factories; ``factory(options)`` returns a Controller.

    :param register: the typed registry, as in :func:`eesd_register_drafters`.
    """


@hookspec
def eesd_register_verifiers(register: Any) -> None:
    """Register verifier factories; ``factory(options)`` returns a Verifier.

    :param register: the typed registry, as in :func:`eesd_register_drafters`.
    """


@hookspec
def eesd_register_model_adapters(register: Any) -> None:
    """Register model adapter classes.

    :param register: the typed registry; ``register.add(name, adapter_class)`` where the class has
        ``supports(model) -> bool`` (a classmethod), ``model_types`` (names for error messages) and
        builds a :class:`~eesd_core.protocols.ModelAdapter` from a loaded model.
    """


@hookspec
def eesd_round_end(stats: Any) -> None:
    """Observe one finished round (tracing, metrics). Called only when some plug-in implements it.

    :param stats: a :class:`~eesd_core.engine.RoundStats`: position, drafted k, accepted n, the
        committed tokens, draft and verify seconds, and the controller's per-draft confidences.
    """


@hookspec
def eesd_generation_end(stats: Any) -> None:
    """Observe one finished generation.

    :param stats: the :class:`~eesd_core.engine.GenerationStats` of the call.
    """


@hookspec
def eesd_cli_commands(subparsers: Any) -> None:
    """Add subcommands to the ``eesd`` command line.

    :param subparsers: the ``argparse`` sub-parser collection of ``eesd``; call
        ``subparsers.add_parser(name, help=...)`` and ``set_defaults(func=callable)``, where
        ``callable(args) -> int | None`` runs the command.
    """
