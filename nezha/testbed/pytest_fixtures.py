"""pytest fixtures for tests that need the testbed; they skip with the reason when it cannot run here.

Register them for the whole suite with `pytest_plugins = ["nezha.testbed.pytest_fixtures"]` in
tests/conftest.py, or import the fixture names into a test module.
"""

from __future__ import annotations

import pytest

from .availability import testbed_available
from .testbed import Testbed


@pytest.fixture
def testbed_factory():
    """make(hosts=..., rails=..., rates=..., mptcp=...) -> an up Testbed with a unique prefix, torn down after."""
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    made = []

    def make(**kwargs) -> Testbed:
        testbed = Testbed(**kwargs)
        made.append(testbed)
        return testbed.up()

    yield make
    for testbed in made:
        testbed.down()


@pytest.fixture
def testbed(testbed_factory) -> Testbed:
    """2 hosts x 2 unshaped rails."""
    return testbed_factory(hosts=2, rails=2)
