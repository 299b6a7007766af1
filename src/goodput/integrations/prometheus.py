"""Prometheus: live goodput metrics served by rank 0 (``pip install 'goodput[prometheus]'``).

    exporter = PrometheusExporter(port=9464)          # run folder: $GOODPUT_RUN_DIR or run_dir=
    run = gp.Run("runs/exp1", exporters=[exporter])   # or Progress(..., exporters=[exporter])

A :class:`~goodput.ledger.exporters.MetricsExporter`: :class:`~goodput.run.progress.Progress` feeds it each step's
``goodput`` and ``fetch_seconds``; everything that needs the whole run (badput seconds by category, restarts,
the last durable checkpoint) is accounted from the run's ledger, the same source as ``goodput report``, at most
once every ``refresh_seconds`` and on the scrape's thread, never on the training loop's.

Metrics (gauges)::

    goodput_live_ratio                  this attempt's step compute over its time so far
    goodput_step                        the last step done
    goodput_step_seconds                mean wall time per step since the previous update
    goodput_fetch_seconds_p95           95th percentile of the wait for a batch over the last ``window`` steps
    goodput_run_ratio                   goodput of the whole run so far (all attempts, from the ledger)
    goodput_capacity_ratio              capacity goodput of the run so far: productive rank-seconds over
                                        reserved rank-seconds (below goodput_run_ratio after a shrink)
    goodput_world_size                  the ranks training now (after the latest shrink or grow)
    goodput_badput_seconds{category}    seconds per category of ``goodput report`` but productive, between_launches
    goodput_productive_seconds          productive seconds of the whole run
    goodput_restarts                    restarts so far
    goodput_rollbacks                   rollbacks in place after numeric faults so far (goodput.run.numeric)
    goodput_last_durable_step           the newest checkpoint known to be committed (-1: none yet)
    goodput_seconds_since_durable       seconds since that commit (-1: none yet)

Only rank 0 serves (the ledger account is rank 0's); on other ranks the exporter does nothing. The server
listens on ``host`` (127.0.0.1 by default: put a reverse proxy or the scrape agent on the same host). Under
``goodput launch --restart warm`` a hot spare runs the script up to ``Run`` before it has a rank: an exporter it
builds there waits for its first figures, and serves then if the rank it took is 0 (the rank 0 process it
replaced is gone, and with it the port).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from goodput._env import RUN_DIR, WARM_ROLE
from goodput.errors import ConfigError
from goodput.ledger.accounting import account
from goodput.ledger.ledger import ledger_files, read_events

__all__ = ["PrometheusExporter"]


class PrometheusExporter:
    """Serves goodput's live metrics on ``http://host:port/metrics`` from rank 0.

    Args:
        run_dir: the run folder whose ledger is accounted (None: ``$GOODPUT_RUN_DIR``).
        port: the TCP port (0: any free port; read ``exporter.port``).
        host: the address to listen on.
        rank: this process's rank (None: ``$RANK`` or 0; in a hot spare, the rank it takes); only rank 0 serves.
        refresh_seconds: least time between two accountings of the ledger.
        window: steps over which the fetch p95 is taken.

    Raises:
        ConfigError: a bad argument, or the port cannot be bound.
    """

    def __init__(
        self,
        run_dir: str | None = None,
        *,
        port: int = 9464,
        host: str = "127.0.0.1",
        rank: int | None = None,
        refresh_seconds: float = 15.0,
        window: int = 1000,
    ) -> None:
        run_dir = run_dir or RUN_DIR.get() or None
        if not run_dir:
            raise ConfigError("PrometheusExporter needs a run folder: pass run_dir or set GOODPUT_RUN_DIR")
        if not (isinstance(port, int) and 0 <= port < 65536):
            raise ConfigError(f"PrometheusExporter port must be in 0..65535, got {port!r}")
        if refresh_seconds < 0 or window < 1:
            raise ConfigError(
                f"refresh_seconds must be >= 0 and window >= 1, got {refresh_seconds}, {window}"
            )
        self.run_dir = run_dir
        self._collector = _Collector(run_dir, refresh_seconds, window)
        self._server: Any = None
        self.port, self._host = port, host
        # a hot spare has no rank until it takes one (goodput.warm): it serves from its first figures, if 0
        self._waiting = rank is None and WARM_ROLE.get() == "spare"
        self.rank = -1 if self._waiting else int(os.environ.get("RANK", "0")) if rank is None else rank
        if not self._waiting:
            self._serve()

    def _serve(self) -> None:
        if self.rank != 0:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        try:
            self._server, _thread = start_http_server(self.port, addr=self._host, registry=registry)
        except OSError as err:
            raise ConfigError(
                f"PrometheusExporter cannot listen on {self._host}:{self.port} ({err.strerror}): pick another"
                " port"
            ) from None
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str | None:
        """The metrics URL (None on ranks other than 0)."""
        return None if self._server is None else f"http://127.0.0.1:{self.port}/metrics"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's figures (``goodput``, ``fetch_seconds``, the straggler detector's
        ``straggler_score_rankN``; others are ignored)."""
        if self._waiting:  # a spare's first figures: it has its rank now
            self._waiting = False
            self.rank = int(os.environ.get("RANK", "0"))
            self._serve()
        if self._server is not None:
            self._collector.update(step, metrics, time.monotonic())

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()


_SCORE = "straggler_score_rank"  # the straggler detector's per-rank scores (goodput.run.stragglers)


class _Collector:
    """Builds the metric families at each scrape (internal)."""

    def __init__(self, run_dir: str, refresh_seconds: float, window: int) -> None:
        self._run_dir = run_dir
        self._refresh = refresh_seconds
        self._lock = threading.Lock()
        self._fetches: collections.deque[float] = collections.deque(maxlen=window)
        self._step: int | None = None
        self._live: float | None = None
        self._step_seconds: float | None = None
        self._last: tuple[int, float] | None = None
        self._account: dict[str, Any] | None = None
        self._accounted_at = -float("inf")
        self._scores: dict[str, float] = {}

    def update(self, step: int, metrics: Mapping[str, float], now: float) -> None:
        scores = {k[len(_SCORE) :]: float(v) for k, v in metrics.items() if k.startswith(_SCORE)}
        if scores:  # a straggler window's scores, not a step
            with self._lock:
                self._scores.update(scores)
            return
        with self._lock:
            if self._last is not None and step > self._last[0]:
                self._step_seconds = (now - self._last[1]) / (step - self._last[0])
            self._last = (step, now)
            self._step = step
            if "goodput" in metrics:
                self._live = float(metrics["goodput"])
            if "fetch_seconds" in metrics:
                self._fetches.append(float(metrics["fetch_seconds"]))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            live, step, step_seconds = self._live, self._step, self._step_seconds
            fetches = sorted(self._fetches)
            scores = dict(self._scores)
        for name, doc, value in (
            ("goodput_live_ratio", "this attempt's step compute over its time so far", live),
            ("goodput_step", "the last step done", step),
            ("goodput_step_seconds", "mean wall time per step since the previous update", step_seconds),
            ("goodput_fetch_seconds_p95", "95th percentile of the wait for a batch", _p95(fetches)),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value))
        if scores:
            family = GaugeMetricFamily(
                "goodput_straggler_score",
                "each rank's own time against the fastest rank's (1: as fast; under the threshold: a straggler)",
                labels=["rank"],
            )
            for rank, value in sorted(scores.items(), key=lambda kv: int(kv[0])):
                family.add_metric([rank], value)
            yield family
        yield from self._from_ledger()

    def _from_ledger(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        if now - self._accounted_at >= self._refresh:
            self._account = _account(self._run_dir)
            self._accounted_at = now
        figures = self._account
        if figures is None:
            return
        badput = GaugeMetricFamily(
            "goodput_badput_seconds", "seconds of the run per badput category", labels=["category"]
        )
        for category, seconds in figures["categories"].items():
            if category not in (
                "productive",
                "between_launches",
            ):  # the time between launches is not the job's
                badput.add_metric([category], seconds)
        yield badput
        since = time.time() - figures["durable_wall"] if figures["durable_wall"] is not None else -1.0
        for name, doc, value in (
            ("goodput_run_ratio", "goodput of the whole run so far", figures["goodput"]),
            (
                "goodput_capacity_ratio",
                "productive rank-seconds over reserved rank-seconds of the run so far",
                figures["capacity_goodput"],
            ),
            ("goodput_world_size", "the ranks training now", figures["world_size"]),
            (
                "goodput_productive_seconds",
                "productive seconds of the run",
                figures["categories"]["productive"],
            ),
            ("goodput_restarts", "restarts so far", figures["restarts"]),
            ("goodput_rollbacks", "rollbacks in place after numeric faults", figures["rollbacks"]),
            ("goodput_last_durable_step", "the newest committed checkpoint's step", figures["durable_step"]),
            ("goodput_seconds_since_durable", "seconds since the newest commit", since),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(0.95 * len(values)))]


def _account(run_dir: str) -> dict[str, Any] | None:
    """The ledger's figures for the gauges; None while there is no ledger yet."""
    if not ledger_files(run_dir):
        return None
    events = read_events(run_dir)
    summary = account(events)
    durable = [e for e in events if e.get("event") == "checkpoint_durable" and isinstance(e.get("step"), int)]
    last = max(durable, key=lambda e: e["step"], default=None)
    return {
        "categories": dict(summary.categories),
        "goodput": summary.goodput,
        "capacity_goodput": summary.capacity_goodput,
        "world_size": summary.world[-1].world if summary.world else 1,
        "restarts": summary.restarts,
        "rollbacks": sum(1 for e in events if e.get("event") == "rollback"),
        "durable_step": last["step"] if last is not None else -1,
        "durable_wall": float(last["wall"]) if last is not None else None,
    }
