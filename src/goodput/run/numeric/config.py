"""What the numeric guard checks and how far it goes (:class:`NumericConfig`; docs/numeric-faults.md)."""

from __future__ import annotations

import dataclasses
import math

from goodput.errors import ConfigError

__all__ = ["NumericConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class NumericConfig:
    """What the numeric guard checks and how far it goes.

    Args:
        grads: check the gradients before the optimizer step (a NaN/Inf one is never applied).
        grads_every: check them every this many steps (1: every step); on the others a NaN/Inf gradient reaches
            the parameters and is found later: at the next loss it makes non-finite, or at the next replica check.
        spike_k: a step's mean loss above its recent level + ``spike_k`` x its noise is a spike (None: no spike
            rule): 6 is six sigma of its noise (the ledger's ``spike_rule`` says the rise that takes).
        spike_window: the recent steps whose losses form the window.
        spike_warmup: steps with a loss before the rule applies: after a start of every process (a warm
            restart's hot spare takes the survivors' window); a rollback keeps the steps up to the one it restored.
        spike_min_rise: a spike is also at least this fraction above the level (a flat loss has no noise).
        check_every: fingerprint the parameters and compare the replicas every this many steps (None: never).
        max_rollbacks: rollbacks within ``rollback_window`` steps (of one attempt) after which the run stops.
        rollback_window: the window of steps for ``max_rollbacks``.
        skip_steps: steps of data skipped when a fault comes back (None: from the restored step to the fault).
    """

    grads: bool = True
    grads_every: int = 4
    spike_k: float | None = 6.0
    spike_window: int = 100
    spike_warmup: int = 20
    spike_min_rise: float = 0.1
    check_every: int | None = 50
    max_rollbacks: int = 3
    rollback_window: int = 1000
    skip_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("grads_every", "spike_window", "spike_warmup", "max_rollbacks", "rollback_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"NumericConfig.{name} must be an integer >= 1, got {value!r}")
        for name in ("check_every", "skip_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"NumericConfig.{name} must be an integer >= 1 or None, got {value!r}")
        if self.spike_k is not None and not (math.isfinite(self.spike_k) and self.spike_k > 0):
            raise ConfigError(
                f"NumericConfig.spike_k must be a positive number or None, got {self.spike_k!r}"
            )
        if not (math.isfinite(self.spike_min_rise) and self.spike_min_rise >= 0):
            raise ConfigError(f"NumericConfig.spike_min_rise must be >= 0, got {self.spike_min_rise!r}")
        if self.spike_warmup > self.spike_window:
            raise ConfigError(
                f"NumericConfig.spike_warmup ({self.spike_warmup}) must not exceed spike_window "
                f"({self.spike_window}): the rule would never apply"
            )
