"""The Prometheus exporter: scraped over HTTP on 127.0.0.1 in the middle of a real ``goodput.Run``."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import goodput as gp
from goodput.testing import free_port

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from goodput.integrations.prometheus import PrometheusExporter
from tests.helpers.exporting import run_with_exporter
from tests.helpers.groups import Group, set_clock


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_scrape_while_a_run_trains(tmp_path: os.PathLike[str]) -> None:
    run_dir = str(tmp_path)
    port = free_port()
    exporter = PrometheusExporter(run_dir, port=port, refresh_seconds=0)
    assert exporter.url == f"http://127.0.0.1:{port}/metrics"
    run, model, opt, loader = run_with_exporter(run_dir, exporter, total_steps=30, every=10)
    scraped = None
    for batch in run.batches(loader):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
        if run.step == 25:
            run.ledger.flush()  # the exporter accounts from the ledger file
            scraped = _scrape(exporter.url)
    run.close()
    assert scraped is not None
    assert scraped["goodput_step"][()] == 25
    assert scraped["goodput_last_durable_step"][()] == 20
    assert 0 <= scraped["goodput_seconds_since_durable"][()] < 600
    assert 0 < scraped["goodput_live_ratio"][()] <= 1
    assert 0 < scraped["goodput_run_ratio"][()] <= 1 and scraped["goodput_restarts"][()] == 0
    assert scraped["goodput_capacity_ratio"][()] == pytest.approx(scraped["goodput_run_ratio"][()])  # 1 of 1
    assert scraped["goodput_world_size"][()] == 1
    assert scraped["goodput_rollbacks"][()] == 0
    assert scraped["goodput_straggler_score"] == {(("rank", "0"),): 1.0}  # one rank: the fastest
    assert scraped["goodput_fetch_seconds_p95"][()] >= 0 and scraped["goodput_step_seconds"][()] > 0
    badput = {dict(labels)["category"]: v for labels, v in scraped["goodput_badput_seconds"].items()}
    assert "productive" not in badput and badput["checkpoint_stall"] > 0 and badput["init"] > 0
    with pytest.raises(OSError):  # closed with the run: nothing listens any more
        _scrape(f"http://127.0.0.1:{port}/metrics")


def test_a_warm_generation_in_the_same_process_keeps_serving(tmp_path: os.PathLike[str]) -> None:
    """A survivor of a warm restart goes on in its process with a new attempt (``begin_attempt("warm")``, as
    the warm agent's rejoin calls it): the endpoint must stay up for the new generation, and close with the run."""
    run_dir = str(tmp_path)
    exporter = PrometheusExporter(run_dir, port=free_port(), refresh_seconds=0)
    url = exporter.url
    assert url is not None
    config = gp.CheckpointConfig(root=os.path.join(run_dir, "ckpt"), strategy="torch_save", every=5)
    run = gp.Run(
        run_dir, checkpoint=config, total_steps=20, hang_timeout=None, progress=False, exporters=[exporter]
    )
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.restore(model=model, optimizer=opt)
    for _ in range(3):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        run.step_done()
    run.end_attempt("a peer died")
    run.begin_attempt("warm", began=time.time())
    run.ledger.flush()
    scraped = _scrape(url)  # the first generation's end must not shut the server down
    assert scraped["goodput_step"][()] == 3
    run.close()
    with pytest.raises(OSError):
        _scrape(url)


@pytest.mark.parametrize("taken", [0, 1])
def test_a_hot_spare_serves_only_once_it_has_taken_rank_0(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    """A spare runs the script up to ``Run`` with no rank (the agent's environment): it must not take the port
    rank 0 serves on, and serves once it is handed rank 0 (as ``goodput.warm.worker`` exports it)."""
    monkeypatch.setenv("GOODPUT_WARM_ROLE", "spare")
    monkeypatch.delenv("RANK", raising=False)
    port = free_port()
    spare = PrometheusExporter(str(tmp_path), port=port, refresh_seconds=0)
    rank0 = PrometheusExporter(str(tmp_path), port=port, refresh_seconds=0, rank=0)  # the port is free
    rank0.close()  # rank 0's process dies; the spare is handed a rank
    monkeypatch.setenv("GOODPUT_WARM_ROLE", "worker")
    monkeypatch.setenv("RANK", str(taken))
    try:
        spare.log(7, {"goodput": 0.5})
        if taken == 0:
            assert spare.url == f"http://127.0.0.1:{port}/metrics"
            assert _scrape(spare.url)["goodput_step"][()] == 7
        else:
            assert spare.url is None and spare.rank == 1
    finally:
        spare.close()


def test_only_rank_0_serves_and_a_taken_port_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    other = PrometheusExporter(str(tmp_path), port=free_port(), rank=1)
    assert other.url is None
    other.log(1, {"goodput": 0.5})
    other.close()
    first = PrometheusExporter(str(tmp_path), port=0)
    try:
        with pytest.raises(gp.ConfigError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            PrometheusExporter(str(tmp_path), port=first.port)
    finally:
        first.close()


def test_capacity_goodput_after_a_shrink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 s on 3 of 3 ranks, a shrink (0 s) and 10 s on 2: capacity (3 x 10 + 2 x 10) / (3 x 20), 2 ranks now."""
    clock = set_clock(monkeypatch)
    group = Group(tmp_path, clock, [0, 1], world=3, monkeypatch=monkeypatch)
    step = group.steps(1, 10)
    group.event(
        "shrink", generation=1, step=step, world_before=3, world_after=2, failed_ranks=[2], seconds=0.0
    )
    group.steps(step, 10)
    group.close()
    monkeypatch.undo()  # the exporter and the scrape on the real clock
    exporter = PrometheusExporter(str(tmp_path), port=free_port(), refresh_seconds=0, rank=0)
    try:
        assert exporter.url is not None
        scraped = _scrape(exporter.url)
    finally:
        exporter.close()
    assert scraped["goodput_run_ratio"][()] == pytest.approx(1.0)
    assert scraped["goodput_capacity_ratio"][()] == pytest.approx((3 * 10 + 2 * 10) / (3 * 20))
    assert scraped["goodput_world_size"][()] == 2
