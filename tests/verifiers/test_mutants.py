"""The kit must report verifiers with planted bugs (:mod:`mutants`).

The mutants run against the real ``VerifierContract`` in a child pytest, one test class per
mutant, under a Hypothesis profile that skips shrinking: a failure is all this test needs, and
shrinking a failing enumeration takes minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from mutants import MUTANTS, Unmutated

from eesd_core.testing import VerifierContract

HERE = Path(__file__).parent

CONFTEST = """
import sys
from hypothesis import Phase, settings
sys.path.insert(0, {here!r})
settings.register_profile("mutants", settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate])
"""

TESTS = """
import pytest
from eesd_core.testing import VerifierContract
from mutants import MUTANTS

for mutant in MUTANTS:
    fixture = pytest.fixture(lambda self, mutant=mutant: mutant, name="make_verifier")
    name = "Test" + mutant.__name__
    globals()[name] = type(name, (VerifierContract,), {{"make": fixture}})
"""

# the engine-level check is the fixed one: which examples Hypothesis draws for the broader engine
# test changes with its code, and an example without a verified draft cannot catch a verifier bug
CHECKS = ["test_one_round_is_lossless", "test_lossless_in_the_engine_drafting_every_round"]


def test_the_unmutated_base_passes():
    """The mutants' common base is the lossless verifier itself, so each bug is the only change."""
    VerifierContract().test_one_round_is_lossless(make_verifier=Unmutated)


def test_the_contract_catches_every_mutant(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST.format(here=str(HERE)))
    (tmp_path / "test_planted.py").write_text(TESTS.format())
    report = tmp_path / "report.xml"
    env = {**os.environ, "EESD_HYPOTHESIS_PROFILE": "mutants"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "-k",
            " or ".join(CHECKS + ["test_greedy_is_exact_match"]),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=300,
    )
    failures = {}
    for case in ET.parse(report).iter("testcase"):
        failed = case.find("failure")
        failures[(case.get("classname").split(".")[-1], case.get("name"))] = failed
    for mutant in MUTANTS:
        for check in CHECKS:
            failure = failures[("Test" + mutant.__name__, check)]
            assert failure is not None, f"{check} did not catch {mutant.__name__}"
            assert "KitError" in failure.get("message", "") or "DistributionMismatch" in failure.get(
                "message", ""
            ), failure.get("message")
    assert failures[("TestAlwaysAccept", "test_greedy_is_exact_match")] is not None
