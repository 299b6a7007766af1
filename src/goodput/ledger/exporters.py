"""Optional metric exporters: TensorBoard scalars and MLflow metrics, when those packages are installed.

Neither package is a dependency of goodput: each exporter imports its package when it is created and raises
ConfigError naming the package to install when it is missing. :class:`goodput.run.progress.Progress` feeds every
exporter it is given the step's ``fetch_seconds``, ``goodput`` and ``capacity_goodput`` (live) and ``loss``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, Protocol

from goodput.errors import ConfigError

__all__ = ["MLflowExporter", "MetricsExporter", "TensorBoardExporter", "available_exporters"]


class MetricsExporter(Protocol):
    """Where per-step metrics go."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def available_exporters() -> list[str]:
    """The exporters whose package is importable here: a subset of ``["mlflow", "tensorboard"]``."""
    return [name for name in ("mlflow", "tensorboard") if importlib.util.find_spec(name) is not None]


class TensorBoardExporter:
    """Scalars ``goodput/<metric>`` in a TensorBoard log folder (torch's SummaryWriter).

    Raises:
        ConfigError: when the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("TensorBoardExporter needs the tensorboard package: pip install tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._writer: Any = SummaryWriter(log_dir=log_dir)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(f"goodput/{name}", value, step)

    def close(self) -> None:
        self._writer.close()


class MLflowExporter:
    """Metrics ``goodput.<metric>`` in the active MLflow run (or one it starts).

    Raises:
        ConfigError: when the ``mlflow`` package is not installed.
    """

    def __init__(self) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise ConfigError("MLflowExporter needs the mlflow package: pip install mlflow")
        import mlflow

        self._mlflow: Any = mlflow

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._mlflow.log_metrics({f"goodput.{k}": float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        """Nothing to close: the MLflow run belongs to the caller."""
