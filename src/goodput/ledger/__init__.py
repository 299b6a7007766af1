"""The ledger and its report: where every second of a run went.

``ledger`` writes one append-only JSONL file per attempt and rank; ``accounting`` (with ``spans``) turns the
events of every rank into categories that tile wall time; ``report`` compares them with the planner and
gives advice (``advice``), as text (``text``), a timeline (``plot``) or live metrics (``exporters``).
The ledger learns of checkpoints and restarts only through events: nothing here imports ``run`` or
``checkpoint``.
"""

from goodput.ledger.ledger import Ledger, LedgerConfig, LedgerFile, ledger_files, read_events

__all__ = [
    "Ledger",
    "LedgerConfig",
    "LedgerFile",
    "ledger_files",
    "read_events",
]
