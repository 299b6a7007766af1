"""A resized generation's random streams: the records a node offers, the one a new rank takes, and the bytes
they travel as. The whole path (a shrink with dropout against a cold reference) is in
tests/verify/test_verify_shrink.py and tests/warm/test_shrink.py."""

from __future__ import annotations

import os

from goodput.warm.record import RecordFiles
from goodput.warm.streams import chosen, offered, pack, unpack


def test_a_node_offers_each_rank_s_record_of_the_step_also_after_a_later_one(
    tmp_path: os.PathLike[str],
) -> None:
    folder = os.path.join(str(tmp_path), "rec")
    dead = RecordFiles(
        folder, rank=1
    )  # a rank that died after step 5 and its next step's pre-optimizer record
    dead.write(5, b"rank1@5")
    dead.write(6, b"rank1@6-before-optimizer")
    RecordFiles(folder, rank=0).write(5, b"rank0@5")
    assert offered(folder, range(3), 5) == {0: (5, b"rank0@5"), 1: (5, b"rank1@5")}  # rank 2 has none here


def test_a_new_rank_takes_its_number_s_record_of_the_step_from_whichever_node_holds_it() -> None:
    node_a = {0: (5, b"old0"), 1: (4, b"old1@4")}  # rank 1's record of step 5 was torn on this node
    node_b = {1: (5, b"old1@5"), 2: (5, b"old2")}
    assert [chosen([node_a, node_b], rank, 5) for rank in (0, 1, 2)] == [b"old0", b"old1@5", b"old2"]
    assert (
        chosen([node_a], 1, 5) == b"old1@4"
    )  # no record of the step anywhere: the newest, as a warm restart
    assert chosen([node_a, node_b], 3, 5) is None  # nobody holds it: the rank is seeded as a new one


def test_offers_travel_as_bytes_and_come_back_the_same() -> None:
    offer = {2: (7, b"\x00GRNG" * 3), 0: (6, b"")}
    assert unpack(pack(offer)) == offer
    assert unpack(pack({})) == {}
