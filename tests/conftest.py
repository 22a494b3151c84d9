"""Shared test set-up; tiny models come from :mod:`tinymodels` (this folder is on sys.path)."""

from __future__ import annotations

import os

import pytest
from tinymodels import make_tiny

USER_PRODUCTS_DIR = os.environ.get("EESD_PRODUCTS_DIR")  # as the suite found it


@pytest.fixture(scope="session", autouse=True)
def _own_product_decisions(tmp_path_factory: pytest.TempPathFactory):
    """The suite keeps its calibrations of linear products (:mod:`eesd_products.products`)
    in a folder of its own: it neither reads the user's decisions nor leaves its own behind. Tests
    of real checkpoints opt back in (``real_checkpoint``), as they use the user's models."""
    os.environ["EESD_PRODUCTS_DIR"] = str(tmp_path_factory.mktemp("products"))
    yield
    if USER_PRODUCTS_DIR is None:
        os.environ.pop("EESD_PRODUCTS_DIR", None)
    else:
        os.environ["EESD_PRODUCTS_DIR"] = USER_PRODUCTS_DIR


@pytest.fixture(scope="module")
def real_checkpoint():
    """For a module of tests on real checkpoints, set up as users run them: torch's threads on
    every core (the tiny models keep one), and calibrations of short-pass products kept where eesd
    keeps them for the user (a model measured once on this machine is not timed again)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    with pytest.MonkeyPatch.context() as patch:
        if USER_PRODUCTS_DIR is None:
            patch.delenv("EESD_PRODUCTS_DIR", raising=False)
        else:
            patch.setenv("EESD_PRODUCTS_DIR", USER_PRODUCTS_DIR)
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny():
    return make_tiny
