"""Shared test set-up; tiny models come from :mod:`tinymodels` (this folder is on sys.path)."""

from __future__ import annotations

import pytest
from tinymodels import make_tiny


@pytest.fixture
def tiny():
    return make_tiny
