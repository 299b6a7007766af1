"""The ``nodeloss`` fault: it names a node, applies to every rank of that node only, and is checked."""

from __future__ import annotations

import pytest

from goodput.errors import ConfigError
from goodput.faults import FaultPlan, parse_faults


def test_a_node_loss_names_its_node_and_no_rank() -> None:
    (fault,) = parse_faults("nodeloss@step=21,node=1")
    assert (fault.action, fault.step, fault.node, fault.rank) == ("nodeloss", 21, 1, None)
    with pytest.raises(ConfigError, match="names the node it loses"):
        parse_faults("nodeloss@step=21")
    with pytest.raises(ConfigError, match="names the node it loses"):
        parse_faults("nodeloss@step=21,node=1,rank=0")


def test_a_node_loss_applies_to_every_rank_of_that_node_only() -> None:
    faults = parse_faults("nodeloss@step=21,node=1")
    on_node = [FaultPlan(faults, rank=r, world_size=4, node=1) for r in (2, 3)]
    elsewhere = [FaultPlan(faults, rank=r, world_size=4, node=0) for r in (0, 1)]
    assert all(on_node) and not any(elsewhere)
