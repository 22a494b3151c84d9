"""``eesd --help`` and ``eesd plugins`` load every plug-in but none of the heavy machinery.

Both build the whole command line (every plug-in's ``eesd_cli_commands`` runs) and list every
registration, so they prove that the core and every installed plug-in stay import-light: torch,
transformers and the tools themselves load only when a command runs. Each check runs in a fresh
interpreter, since this test session has long imported torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "torch",
    "transformers",
    "eesd_core.engine",
    "eesd_bench.runners",
    "eesd_bench.session",
    "eesd_bench.trace",
    "eesd_models.fetch",
)

PROBE = """
import json, sys
from eesd_core.cli import main
try:
    code = main({argv!r})
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def imported_by(argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["plugins", "--json"]], ids=" ".join)
def test_the_command_line_loads_no_heavy_module(argv: list[str]) -> None:
    result = imported_by(argv)
    assert result["code"] in (0, None)
    assert result["loaded"] == [], f"`eesd {' '.join(argv)}` imported {result['loaded']}"
