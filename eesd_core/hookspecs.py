"""The hooks of project ``eesd``: what a plug-in module can implement.

A plug-in is a module (or object) listed under the ``eesd`` entry-point group that implements any
of the hooks below with ``@eesd_core.hookimpl``; the built-ins are plug-ins of exactly this kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse

    from eesd_core.protocols import Register, RoundOutcome
    from eesd_core.stats import GenerationStats

hookspec = pluggy.HookspecMarker("eesd")
hookimpl = pluggy.HookimplMarker("eesd")


@hookspec
def eesd_register_drafters(register: Register) -> None:
    """Register drafter factories: ``register.add(name, factory, options=OptionsModel)``, where
    ``factory(options)`` returns a :class:`~eesd_core.protocols.Drafter` and ``OptionsModel`` is a
    :class:`~eesd_core.config.PluginOptions` subclass. A name another plug-in took is an error
    naming both; a class breaking its protocol is refused there and then."""


@hookspec
def eesd_register_controllers(register: Register) -> None:
    """Register controller factories (``factory(options)`` returns a Controller), as drafters."""


@hookspec
def eesd_register_verifiers(register: Register) -> None:
    """Register verifier factories (``factory(options)`` returns a Verifier), as drafters."""


@hookspec
def eesd_register_model_adapters(register: Register) -> None:
    """Register model adapter classes: ``register.add(name, adapter_class)``, the class having
    ``supports(model) -> bool`` and ``model_types`` and building a ModelAdapter from a model."""


@hookspec(firstresult=True)
def eesd_linear_products(adapter: Any, choice: str) -> Any:
    """How the linear layers of an adapter's passes multiply, asked once when a built-in adapter
    is made (``choice``: its ``products`` option). Return ``None`` where the plug-in does not apply,
    else an object with ``describe() -> str`` and ``product(rows)``: the ``(x, weight, bias)``
    product of a pass over ``rows`` positions, or ``None`` for ``F.linear``."""


@hookspec(firstresult=True)
def eesd_passes(adapter: Any, choice: str) -> Any:
    """How a built-in adapter runs its passes (``choice``: its ``compile`` option), asked once: an
    object whose ``new_cache(num_layers, capacity)`` makes the caches of its passes, or ``None``."""


@hookspec
def eesd_generation_keywords(decoder: Any, keywords: dict[str, Any]) -> None:
    """Turn ``generate()`` keywords the core does not know into ones it does, in ``keywords`` itself
    (``repetition_penalty`` into a ``logits_processor``, say), or raise an ``InputError``."""


@hookspec
def eesd_round_end(outcome: RoundOutcome) -> None:
    """Observe one row's finished round (tracing, metrics): the frozen
    :class:`~eesd_core.protocols.RoundOutcome` the controller learnt from."""


@hookspec
def eesd_generation_end(stats: GenerationStats) -> None:
    """Observe one finished generation (each row of a batch): its GenerationStats."""


@hookspec(firstresult=True)
def eesd_resolve_model(name: str, cache_dir: str | None) -> str | None:
    """Turn a model name (``--model smollm2-135m-instruct``) that is not a local directory into a
    checkpoint directory, ready to load (fetched into ``cache_dir``, or the plug-in's default, and
    converted if need be), or ``None`` when the plug-in does not know it; the first answer counts."""


@hookspec
def eesd_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add subcommands: ``subparsers.add_parser(name, help=...)`` and
    ``set_defaults(func=callable)``, ``callable(args) -> int | None`` running the command. Called
    whenever ``eesd`` builds its parser: import anything heavy inside the command function."""
