"""Every drafter, controller and verifier that eesd's own entry points register has a contract test.

A new built-in plug-in fails this test until a contract class in this folder covers it (the
registry-wide classes do that by themselves). Third-party plug-ins run the contracts in their own
test suites (see ``plugins/README.md``). Model adapters have no contract class.
"""

from __future__ import annotations

import importlib.metadata as metadata

import test_builtins

from eesd_core.registry import GROUP, Manager
from eesd_core.testing import ControllerContract, DrafterContract, VerifierContract

CONTRACTS = (ControllerContract, DrafterContract, VerifierContract)


def own_registrations() -> set[tuple[str, str]]:
    manager = Manager()
    manager.load_entry_points(
        ep for ep in metadata.entry_points(group=GROUP) if ep.dist and ep.dist.name == "eesd"
    )
    return {
        (kind, entry.name)
        for kind in ("drafter", "controller", "verifier")
        for entry in manager.registry(kind).entries()
    }


def covered() -> set[tuple[str, str]]:
    found = set()
    for value in vars(test_builtins).values():
        if isinstance(value, type) and issubclass(value, CONTRACTS) and value not in CONTRACTS:
            found |= {(value.plugin_kind, name) for name in value.covers}
    return found


def test_every_builtin_plugin_has_a_contract_test():
    missing = sorted(own_registrations() - covered())
    assert not missing, (
        f"No contract test covers {missing}: subclass the matching contract in tests/contract/."
    )


def test_the_builtins_are_found():
    assert {
        ("drafter", "early_exit"),
        ("controller", "fixed"),
        ("verifier", "lossless"),
    } <= own_registrations()
