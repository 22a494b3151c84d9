"""One class: eesd's contract proves the controller keeps decoding lossless."""

import pytest

from eesd_core.testing import ControllerContract, registered


class TestMyController(ControllerContract):
    @pytest.fixture
    def make_controller(self):
        return registered("controller", "my_controller")
