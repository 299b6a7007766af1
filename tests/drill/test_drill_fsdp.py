"""The drill's ``rank`` scenario on a model-sharded job (FSDP2 over 2 gloo ranks, real SIGKILLs): no rank holds
a replica, so every restart reads every shard back from DCP, and the run still ends bit for bit equal to the
uninterrupted one with every sample once."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.drill.process import restored_steps
from goodput.drill.scenario import registered
from tests.helpers import drill
from tests.helpers.paths import FSDP_TRAIN

pytestmark = pytest.mark.slow

SCRIPT = (FSDP_TRAIN, "--steps", "12", "--every", "3")


def test_rank_sigkills_of_an_fsdp2_job_resume_every_shard_exactly(tmp_path: Path) -> None:
    ref = drill.reference(str(tmp_path), SCRIPT)
    assert ref.saves == (3, 6, 9, 12) and not ref.async_saves, ref
    work = tmp_path / "rank"
    result = registered()["rank"].run(drill.context(str(work), ref, script=SCRIPT))
    assert result.met, result
    assert result.exactly_once and result.identical
    assert "phase=checkpoint_write" in result.injected and "phase=restore" in result.injected, result.injected
    restored = restored_steps(str(work / "run"))
    assert restored and all(step in ref.saves for step in restored), restored
