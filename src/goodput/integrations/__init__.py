"""Integrations with the tools people already train with: Lightning, the Hugging Face Trainer, Prometheus.

Each lives in its own module and imports its framework only when that module is imported, so ``import goodput``
and ``import goodput.integrations`` pull in none of them. Install the extras you use::

    pip install 'goodput[lightning]'    # goodput.integrations.lightning: GoodputCallback, GoodputCheckpointIO
    pip install 'goodput[hf]'           # goodput.integrations.hf: GoodputTrainerCallback, ResumableTrainerLoader
    pip install 'goodput[prometheus]'   # goodput.integrations.prometheus: PrometheusExporter
"""

from __future__ import annotations

__all__: list[str] = []
