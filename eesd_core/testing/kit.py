"""Building decoders for tests: the kit's plug-in, and a recipe for fresh decoders.

The engine looks components up by name, so the kit lends it a plug-in manager that knows, besides
the plug-ins already loaded, the toy adapter and drafter and the components under test (given as
zero-argument factories and registered under :data:`SUBJECT`). :func:`installed` puts that manager
in place with :func:`~eesd_core.registry.reset_manager` and restores the previous one afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from eesd_core.config import validate
from eesd_core.engine import SpeculativeDecoder
from eesd_core.hookspecs import hookimpl
from eesd_core.registry import Manager, get_manager, reset_manager
from eesd_core.testing.toy import ToyAdapter, ToyDrafter, ToyDrafterOptions

TOY = "testing_toy"
SUBJECT = "testing_subject"
KIT_PLUGIN = "eesd_testing"

Component = str | Callable[[], Any]
"""A registered name, or a zero-argument factory of a fresh instance."""


class KitPlugin:
    """Registers the toy adapter and drafter, the subjects under test, and records every round."""

    def __init__(self, subjects: dict[str, Callable[[], Any]] | None = None) -> None:
        self.subjects = dict(subjects or {})
        self.rounds: list[Any] = []

    def _subject(self, kind: str, register: Any) -> None:
        if kind in self.subjects:
            register.add(SUBJECT, self.subjects[kind])

    @hookimpl
    def eesd_register_model_adapters(self, register: Any) -> None:
        register.add(TOY, ToyAdapter)

    @hookimpl
    def eesd_register_drafters(self, register: Any) -> None:
        register.add(TOY, ToyDrafter, options=ToyDrafterOptions)
        self._subject("drafter", register)

    @hookimpl
    def eesd_register_controllers(self, register: Any) -> None:
        self._subject("controller", register)

    @hookimpl
    def eesd_register_verifiers(self, register: Any) -> None:
        self._subject("verifier", register)

    @hookimpl
    def eesd_round_end(self, outcome: Any) -> None:
        self.rounds.append(outcome)


@contextmanager
def installed(subjects: dict[str, Callable[[], Any]] | None = None) -> Iterator[KitPlugin]:
    """The plug-ins already loaded plus the kit's, as the process-wide manager, for the ``with`` block."""
    previous = get_manager()
    manager = Manager()
    for name, loaded in previous.pm.list_name_plugin():
        info = previous.info.get(name)
        manager.register(loaded, name, info.distribution if info else None, info.version if info else None)
    plugin = KitPlugin(subjects)
    manager.register(plugin, KIT_PLUGIN)
    reset_manager(manager)
    try:
        yield plugin
    finally:
        reset_manager(previous)


def registered(kind: str, name: str, options: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A factory of fresh instances of an installed plug-in's component, options validated now."""
    entry = get_manager().registry(kind).get(name)
    if entry.options is None:
        return entry.factory
    validated = validate(entry.options, options or {}, f"{kind} options for {name!r}")
    return lambda: entry.factory(validated)


@dataclass(frozen=True)
class Setup:
    """How to build a fresh decoder over ``model``; each component by name or by factory.

    Use inside :func:`installed` (``with installed(setup.subjects()):``) so that factories and the
    toy components are registered.
    """

    model: Any
    drafter: Component | None = TOY
    controller: Component = "fixed"
    verifier: Component = "lossless"
    drafter_options: dict[str, Any] = field(default_factory=dict)
    controller_options: dict[str, Any] = field(default_factory=dict)
    verifier_options: dict[str, Any] = field(default_factory=dict)
    max_draft_tokens: int = 3
    adapter_options: dict[str, Any] = field(default_factory=dict)

    def subjects(self) -> dict[str, Callable[[], Any]]:
        parts = {"drafter": self.drafter, "controller": self.controller, "verifier": self.verifier}
        return {kind: value for kind, value in parts.items() if callable(value)}

    def _name(self, value: Component | None) -> str | None:
        return SUBJECT if callable(value) else value

    def build(self) -> SpeculativeDecoder:
        return SpeculativeDecoder(
            self.model,
            drafter=self._name(self.drafter),
            drafter_options=self.drafter_options,
            controller=self._name(self.controller) or "fixed",
            controller_options=self.controller_options,
            verifier=self._name(self.verifier) or "lossless",
            verifier_options=self.verifier_options,
            max_draft_tokens=self.max_draft_tokens,
            adapter_options=self.adapter_options,
        )
