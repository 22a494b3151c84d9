"""The plug-in kit works from outside: each package in plugins/ installs, is found, passes its tests.

Each package is pip-installed (not editable, no dependencies) from a copy of its sources, so the
build leaves nothing behind, into a temporary folder that only child processes put on their path,
so this test session and the venv stay as they were. The children then look the
plug-in up through its own distribution's entry point and run the package's own test suite,
contract tests included, with pytest.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PACKAGES = {
    "template": ("eesd-my-controller", "my_controller"),
    "examples/eesd-entropy-stop": ("eesd-entropy-stop", "entropy_stop"),
}

DISCOVER = """
from eesd_core.registry import get_manager, reset_manager
reset_manager()
manager = get_manager()
info = manager.info[{name!r}]
assert info.distribution == {dist!r}, info
assert "eesd_register_controllers" in info.hooks, info
assert {name!r} in manager.registry("controller").names()
print("found", info.name, info.distribution, info.version)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    target, copies = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("sources")
    sources = [str(shutil.copytree(PLUGINS / folder, copies / folder)) for folder in PACKAGES]
    # Offline with the venv's setuptools when it has one (fast); else pip fetches a build backend.
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            *offline,
            "--target",
            str(target),
            *sources,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def child(site, *args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("folder", PACKAGES)
def test_found_through_its_own_entry_point(site, folder, tmp_path):
    dist, name = PACKAGES[folder]
    done = child(site, "-c", DISCOVER.format(name=name, dist=dist), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"found {name} {dist} 0.1.0" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("folder", PACKAGES)
def test_passes_its_own_tests(site, folder, tmp_path):
    done = child(
        site, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PLUGINS / folder / "tests"), cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
