from __future__ import annotations

import pytest

from goodput.drill.scenario import Reference
from tests.helpers import drill


@pytest.fixture(scope="session")
def drill_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One uninterrupted run of the drill script for every drill test."""
    return drill.reference(str(tmp_path_factory.mktemp("drill")))
