"""The warm-restart store against a real TCP store on 127.0.0.1: what the agent publishes its workers read back
typed, a spare or a generation is handed on once however many agents race for it, a payload that goodput's
format does not describe is refused with the key named, and every operation is counted."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from goodput.errors import ProtocolMismatch
from goodput.warm import protocol
from goodput.warm.protocol import Assignment, Complete, Generation
from goodput.warm.store import WarmStore, operations


def _assignment(rank: int) -> Assignment:
    return Assignment(
        rank=rank, local_rank=rank, world_size=4, local_world_size=4, group_rank=0, gen=3, restart_count=1
    )


def test_a_published_generation_reads_back_typed_in_another_process_connection(
    tcp_store: tuple[str, dist.TCPStore],
) -> None:
    address, base = tcp_store
    agent = WarmStore(dist.PrefixStore("job-a/", base))
    shrink = Generation(
        gen=5,
        kind="shrink",
        failed=[1],
        from_gen=4,
        nodes={0: [0], 1: [1, 2]},
        ranks={0: 0, 2: 1, 3: 2},
        world_size=3,
        world_before=4,
        detected_wall=1700000000.25,
        handover_wall=1700000000.5,
    )
    agent.publish(shrink)
    worker = WarmStore.connect(address, "job-a/")
    assert worker.current() == 5
    read = worker.generation(5)
    assert read == shrink
    assert read.ranks is not None and read.ranks[2] == 1  # int keys, as the agent wrote them
    assert read.live and not Generation(gen=6, kind="cold").live
    # the job's namespace, not another job's in the same (rendezvous) store
    assert dist.PrefixStore("job-a/", base).check(["gen/current"])
    assert not dist.PrefixStore("job-b/", base).check(["gen/current"])


def test_two_agents_racing_for_one_spare_assign_it_once(tcp_store: tuple[str, dist.TCPStore]) -> None:
    address, _ = tcp_store
    clients = [WarmStore.connect(address, "") for _ in range(2)]
    results: dict[int, bool] = {}
    start = threading.Barrier(2)

    def assign(rank: int) -> None:
        start.wait()
        results[rank] = clients[rank].assign_spare("0-0", _assignment(rank))

    threads = [threading.Thread(target=assign, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results.values()) == [False, True]
    winner = next(rank for rank, won in results.items() if won)
    spare = WarmStore.connect(address, "")
    assert spare.wait_for_assignment("0-0") == _assignment(winner)  # the spare sees the winner's, whole


def test_a_generation_ends_once_and_its_survivors_learn_the_winner(
    tcp_store: tuple[str, dist.TCPStore],
) -> None:
    address, _ = tcp_store
    first, second = WarmStore.connect(address, ""), WarmStore.connect(address, "")
    survivor = WarmStore.connect(address, "")
    assert (
        survivor.wait_for_successor(2, timeout=0.2) is None
    )  # not ended yet: no successor within the timeout
    assert first.new_generation() == 1 and second.new_generation() == 2  # one counter: distinct numbers
    assert first.end_generation(0, 1)
    assert not second.end_generation(0, 2)  # another node's agent ended generation 0 first
    assert survivor.ended(0) and not survivor.ended(1)
    assert survivor.wait_for_successor(0, timeout=5) == 1


def test_the_job_s_completion_is_said_once_the_first_rank_s_word_stands(
    tcp_store: tuple[str, dist.TCPStore],
) -> None:
    address, _ = tcp_store
    agent, first, second = (WarmStore.connect(address, "") for _ in range(3))
    assert agent.complete() is None  # no rank closed at the last step yet
    first.mark_complete(Complete(rank=1, step=40, gen=2))
    second.mark_complete(Complete(rank=0, step=40, gen=2))  # a second rank closing at the same step
    assert agent.complete() == Complete(rank=1, step=40, gen=2)


def test_the_last_rank_to_arrive_completes_the_generation(tcp_store: tuple[str, dist.TCPStore]) -> None:
    address, _ = tcp_store
    ranks = [WarmStore.connect(address, "") for _ in range(3)]
    for store in ranks[:2]:
        store.arrive(7, world_size=3)
        assert not store.everyone_arrived(7)
    ranks[2].arrive(7, world_size=3)
    assert all(store.everyone_arrived(7) for store in ranks)
    assert not ranks[0].everyone_arrived(8)


@pytest.mark.parametrize(
    "written",
    [
        '{"kind": "warm", "gen": 3, "failed": [1]}',  # an older goodput: untagged JSON
        '{"format": 2, "payload": "generation", "kind": "warm", "gen": 3}',  # a newer format
        '{"format": 1, "payload": "successor", "gen": 4}',  # another payload under this key
        '{"format": 1, "payload": "generation", "gen": 3, "kind": "warm", "spare_count": 2}',  # fields goodput has not
        "not json at all",
    ],
)
def test_a_payload_of_a_foreign_writer_is_refused_with_the_key_named(
    tcp_store: tuple[str, dist.TCPStore], written: str
) -> None:
    address, base = tcp_store
    base.set(protocol.info_key(3), written)
    with pytest.raises(ProtocolMismatch, match="'gen/3/info'"):
        WarmStore.connect(address, "").generation(3)


def test_an_assignment_lost_to_a_foreign_value_is_refused(tcp_store: tuple[str, dist.TCPStore]) -> None:
    address, base = tcp_store
    base.set(protocol.spare_assign_key("1-0"), '{"rank": 2, "gen": 3}')
    with pytest.raises(ProtocolMismatch, match=r"'spare/1-0/assign'.*same goodput version"):
        WarmStore.connect(address, "").assign_spare("1-0", _assignment(0))


def test_every_operation_is_counted_as_a_read_a_write_or_a_wait(tcp_store: tuple[str, dist.TCPStore]) -> None:
    address, _ = tcp_store
    store = WarmStore.connect(address, "")

    def delta(before: dict[str, int]) -> tuple[int, int, int]:
        after = operations()
        return tuple(after[kind] - before[kind] for kind in ("reads", "writes", "waits"))  # type: ignore[return-value]

    before = operations()
    store.publish(Generation(gen=1, kind="warm"))  # the info, then the number
    assert delta(before) == (0, 2, 0)
    before = operations()
    store.recovered(1)  # a counter bumped
    assert store.recovered_count(1) == 1  # a counter read
    assert store.spare_ready("0-0") is False
    assert delta(before) == (2, 1, 0)
    store.end_generation(1, 2)
    before = operations()
    assert store.wait_for_successor(1, timeout=5) == 2  # a wait, then a read
    assert delta(before) == (1, 0, 1)


def _ops() -> int:
    return sum(operations().values())


def test_a_rank_waiting_for_its_group_to_form_costs_the_store_a_few_operations_however_long_it_waits(
    tcp_store: tuple[str, dist.TCPStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 arrives and waits while rank 1 takes a second (its imports, or a survivor's collective timeout):
    it blocks on the store instead of reading it every few milliseconds, so a re-form's store load grows with
    the ranks, not with the ranks times the slowest one's delay."""
    from goodput.warm.worker import WarmWorker

    address, _ = tcp_store
    env = {"GOODPUT_WARM_STORE": address, "GOODPUT_WARM_PREFIX": "", "GOODPUT_WARM_GEN": "11"}
    for name, value in {**env, "GOODPUT_WARM_ROLE": "worker", "RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    worker = WarmWorker()
    late = threading.Timer(1.0, WarmStore.connect(address, "").arrive, args=(11, 2))
    before = _ops()
    late.start()
    try:
        worker._wait_for_all()
    finally:
        late.join()
    # the waiter's arrival, wait and check; the late rank's add and two sets: nothing per moment waited
    assert _ops() - before <= 7, _ops() - before
    assert worker.store.everyone_arrived(11)


def test_a_generation_the_agent_ends_before_it_formed_wakes_its_waiting_ranks(
    tcp_store: tuple[str, dist.TCPStore],
) -> None:
    address, _ = tcp_store
    waiting, agent = WarmStore.connect(address, ""), WarmStore.connect(address, "")
    waiting.arrive(12, world_size=3)  # one of three: a rank died before it arrived
    assert waiting.wait_settled(12, timeout=0.2) is None  # neither formed nor ended yet
    ended = threading.Timer(0.5, agent.end_generation, args=(12, 13))
    ended.start()
    try:
        assert waiting.wait_settled(12, timeout=30) is False
    finally:
        ended.join()
    assert not agent.end_generation(12, 14)  # ended once
