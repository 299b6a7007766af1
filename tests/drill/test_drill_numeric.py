"""The drill's numeric and straggler scenarios (real processes): a NaN, a spike and a flipped bit are rolled back in
place and the run ends bit for bit equal to the uninterrupted one; a straggler changes nothing that is trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.drill.scenario import Reference, registered
from tests.helpers import drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["nan", "spike", "bitflip"])
def test_a_numeric_fault_is_rolled_back_and_changes_nothing(
    name: str, drill_reference: Reference, tmp_path: Path
) -> None:
    result = registered()[name].run(drill.context(str(tmp_path), drill_reference))
    assert result.met, result
    assert result.outcome == "completed" and result.exactly_once and result.identical
    assert "(1 rollback)" in result.injected or "rollbacks)" in result.injected, result.injected


def test_a_straggler_changes_nothing_it_trains(drill_reference: Reference, tmp_path: Path) -> None:
    # the time it costs is not asserted: a few short steps made twice as long are inside the start-up's noise
    result = registered()["slow"].run(drill.context(str(tmp_path), drill_reference))
    assert result.met, result
    assert result.outcome == "completed" and result.exactly_once and result.identical
