"""Bench and trace tests run torch on one thread: their tiny models gain nothing from more, and a
busy machine makes multi-threaded kernels wait on each other."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
