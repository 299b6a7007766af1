"""The generation-end watch of warm restarts, against a real TCP store: once the agent writes
``gen/<g>/next``, the watch marks the generation ended and every optimizer step of the process refuses to run
(with an error a survivor reads as a peer's failure), so no rank applies gradients of a step that a dead rank
never finished. (Its NCCL abort runs only where GPUs exist: tests/warm/test_warm_nccl.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from goodput.job.folder import is_peer_failure
from goodput.warm.watch import EndWatch, install_optimizer_guard


def _sgd() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.ones(2, 3)).sum().backward()
    return model, opt


def test_the_agents_word_ends_the_generation_and_stops_the_optimizer(
    tcp_store: tuple[str, dist.TCPStore],
) -> None:
    address, server = tcp_store
    watch = EndWatch(address, "job-a", gen=4)
    ours, theirs = dist.PrefixStore("job-a", server), dist.PrefixStore("job-b", server)
    install_optimizer_guard(watch)
    try:
        model, opt = _sgd()
        opt.step()  # the generation is alive: the step applies
        before = model.weight.detach().clone()
        theirs.set("gen/4/next", "{}")  # another job's namespace: not ours
        ours.set("gen/3/next", "{}")  # an earlier generation of ours: not this one
        assert not watch.ended.wait(0.5)
        ours.set("gen/4/next", '{"gen": 5}')
        assert watch.ended.wait(10)
        with pytest.raises(dist.DistBackendError) as caught:
            opt.step()
        assert is_peer_failure(caught.value)
        assert torch.equal(model.weight, before)  # nothing applied
    finally:
        watch.stop()
        install_optimizer_guard(None)
    assert not watch._thread.is_alive()
    opt.step()  # the guard is gone with the generation
    assert not torch.equal(model.weight, before)


def test_a_stopped_watch_ends_nothing(tcp_store: tuple[str, dist.TCPStore]) -> None:
    address, server = tcp_store
    watch = EndWatch(address, "", gen=0)
    install_optimizer_guard(watch)
    watch.stop()
    assert not watch._thread.is_alive()
    server.set("gen/0/next", "{}")  # the generation was left before the agent ended it
    assert not watch.ended.is_set()
    model, opt = _sgd()
    before = model.weight.detach().clone()
    opt.step()
    assert not torch.equal(model.weight, before)
    install_optimizer_guard(None)
