"""The eesd test kit, shipped for plug-in authors: strategies, exact oracles, contract classes.

Installed as a pytest plug-in (entry point ``pytest11: eesd``), so its Hypothesis profiles are
available in any test suite of an environment where eesd is installed. The kit needs the ``test``
extra (``pip install eesd[test]``: pytest, hypothesis, scipy).

* :mod:`~eesd_core.testing.contracts`: ``ControllerContract``, ``DrafterContract``,
  ``VerifierContract``; subclass one and give it one factory fixture.
* :mod:`~eesd_core.testing.oracles`: exact distributions of one verification step, of one round,
  of whole generations of the real engine, and of plain sampling.
* :mod:`~eesd_core.testing.statistical`: ``assert_same_distribution`` with a stated false-fail rate.
* :mod:`~eesd_core.testing.strategies`: Hypothesis strategies; :mod:`~eesd_core.testing.toy`: the
  toy target and drafter; :mod:`~eesd_core.testing.hf`: tiny random Hugging Face models.
* :mod:`~eesd_core.testing.agreement`: greedy agreement with a reference in any precision (the tie
  rule for bfloat16/float16).
* :mod:`~eesd_core.testing.syncs`: ``DeviceSyncs``, the host's waits for the device (reads of it,
  blocking copies onto it) counted on any machine.

Names are imported on first use, so that loading the pytest plug-in costs nothing and the
Hypothesis profile is in force before the contract classes are defined.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "agreement": ["GreedyAgreement", "compare_greedy", "logits_after", "tie_tolerance"],
    "checks": [
        "check_bounds",
        "check_greedy",
        "check_greedy_batch",
        "check_lossless",
        "check_lossless_batch",
        "check_round",
    ],
    "contracts": ["ControllerContract", "DrafterContract", "VerifierContract"],
    "controllers": ["ErraticController"],
    "errors": ["DistributionMismatch", "KitError", "ReplayError", "ToyInvariantError"],
    "kit": ["Setup", "installed", "registered"],
    "oracles": [
        "assert_distributions_equal",
        "autoregressive_distribution",
        "engine_batch_distribution",
        "engine_distribution",
        "independent_rows",
        "lossless_step",
        "round_distribution",
        "step_distribution",
    ],
    "randomness": ["EnumeratingRandom", "ScriptedRandom", "enumerate_runs"],
    "syncs": ["DeviceSyncs"],
    "statistical": ["assert_same_distribution"],
    "toy": ["ToyAdapter", "ToyDrafter", "ToyModel"],
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'eesd_core.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"eesd_core.testing.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
