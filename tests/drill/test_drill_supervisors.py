"""The drill's ``agent`` and ``launcher`` scenarios: goodput's own processes SIGKILLed mid-run under
``--restart warm`` (real processes): nothing of the job is left, and the same command again resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.drill.scenario import Reference, registered
from goodput.drill.supervisors import ram_folders
from tests.helpers import drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("victim", ["agent", "launcher"])
def test_a_sigkilled_supervisor_leaves_nothing_and_the_relaunch_resumes_exactly(
    victim: str, drill_reference: Reference, tmp_path: Path
) -> None:
    result = registered()[victim].run(drill.context(str(tmp_path), drill_reference))
    assert result.met, result
    assert result.exactly_once and result.identical
    assert "first launch" in result.injected and "completed" not in result.injected.split(":")[-1], result
    assert ram_folders(str(tmp_path / "run")) == []
