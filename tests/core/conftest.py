import pytest

from tests.core.factories import make_state


@pytest.fixture
def state():
    return make_state()
