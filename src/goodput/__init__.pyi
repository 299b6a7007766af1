"""Generated from goodput._api by tests/test_exports.py: the names type checkers see in goodput."""

from goodput.checkpoint import CheckpointConfig as CheckpointConfig
from goodput.checkpoint import CheckpointManager as CheckpointManager
from goodput.checkpoint import MemoryTier as MemoryTier
from goodput.checkpoint import TrainingState as TrainingState
from goodput.checkpoint import list_checkpoints as list_checkpoints
from goodput.checkpoint import rank_seed as rank_seed
from goodput.data import ArrowDataset as ArrowDataset
from goodput.data import CacheConfig as CacheConfig
from goodput.data import DevicePrefetcher as DevicePrefetcher
from goodput.data import FolderDataset as FolderDataset
from goodput.data import MDSDataset as MDSDataset
from goodput.data import ParquetDataset as ParquetDataset
from goodput.data import ResumableLoader as ResumableLoader
from goodput.data import ShardedDataset as ShardedDataset
from goodput.data import TokenDataset as TokenDataset
from goodput.data import WebDataset as WebDataset
from goodput.data import sample_np_rng as sample_np_rng
from goodput.data import sample_rng as sample_rng
from goodput.data import sample_seed as sample_seed
from goodput.distributed import init_distributed as init_distributed
from goodput.errors import AccessRefused as AccessRefused
from goodput.errors import CheckpointCorrupt as CheckpointCorrupt
from goodput.errors import CheckpointError as CheckpointError
from goodput.errors import ConfigError as ConfigError
from goodput.errors import CrashLoop as CrashLoop
from goodput.errors import DataError as DataError
from goodput.errors import FingerprintMismatch as FingerprintMismatch
from goodput.errors import GoodputError as GoodputError
from goodput.errors import NoValidCheckpoint as NoValidCheckpoint
from goodput.errors import NumericFault as NumericFault
from goodput.errors import SaveFailed as SaveFailed
from goodput.errors import StateMismatch as StateMismatch
from goodput.errors import StorageError as StorageError
from goodput.errors import StragglerStop as StragglerStop
from goodput.faults import Fault as Fault
from goodput.faults import FaultPlan as FaultPlan
from goodput.faults import parse_faults as parse_faults
from goodput.integrations.hf import GoodputTrainer as GoodputTrainer
from goodput.integrations.hf import GoodputTrainerCallback as GoodputTrainerCallback
from goodput.integrations.lightning import GoodputCallback as GoodputCallback
from goodput.integrations.lightning import GoodputCheckpointIO as GoodputCheckpointIO
from goodput.integrations.lightning import GoodputDDPStrategy as GoodputDDPStrategy
from goodput.integrations.prometheus import PrometheusExporter as PrometheusExporter
from goodput.ledger import Ledger as Ledger
from goodput.ledger import LedgerConfig as LedgerConfig
from goodput.ledger import read_events as read_events
from goodput.ledger.accounting import account as account
from goodput.ledger.exporters import MetricsExporter as MetricsExporter
from goodput.ledger.exporters import MLflowExporter as MLflowExporter
from goodput.ledger.exporters import TensorBoardExporter as TensorBoardExporter
from goodput.ledger.exporters import available_exporters as available_exporters
from goodput.ledger.report import Report as Report
from goodput.ledger.report import build_report as build_report
from goodput.ledger.report import load_report as load_report
from goodput.planning import Costs as Costs
from goodput.planning import PlanInputs as PlanInputs
from goodput.planning import goodput_daly as goodput_daly
from goodput.planning import optimal_interval as optimal_interval
from goodput.planning import young_interval as young_interval
from goodput.planning.simulation import simulate_goodput as simulate_goodput
from goodput.run import Run as Run
from goodput.run.hooks import RunHook as RunHook
from goodput.run.numeric import NumericConfig as NumericConfig
from goodput.run.stragglers import StragglerConfig as StragglerConfig
from goodput.units import format_duration as format_duration
from goodput.units import parse_bytes as parse_bytes
from goodput.units import parse_duration as parse_duration

__version__: str = "0.1.0"

__all__ = [
    "AccessRefused",
    "ArrowDataset",
    "CacheConfig",
    "CheckpointConfig",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "Costs",
    "CrashLoop",
    "DataError",
    "DevicePrefetcher",
    "Fault",
    "FaultPlan",
    "FingerprintMismatch",
    "FolderDataset",
    "GoodputError",
    "Ledger",
    "LedgerConfig",
    "MDSDataset",
    "MLflowExporter",
    "MemoryTier",
    "MetricsExporter",
    "NoValidCheckpoint",
    "NumericConfig",
    "NumericFault",
    "ParquetDataset",
    "PlanInputs",
    "Report",
    "ResumableLoader",
    "Run",
    "RunHook",
    "SaveFailed",
    "ShardedDataset",
    "StateMismatch",
    "StorageError",
    "StragglerConfig",
    "StragglerStop",
    "TensorBoardExporter",
    "TokenDataset",
    "TrainingState",
    "WebDataset",
    "__version__",
    "account",
    "available_exporters",
    "build_report",
    "format_duration",
    "goodput_daly",
    "init_distributed",
    "list_checkpoints",
    "load_report",
    "optimal_interval",
    "parse_bytes",
    "parse_duration",
    "parse_faults",
    "rank_seed",
    "read_events",
    "sample_np_rng",
    "sample_rng",
    "sample_seed",
    "simulate_goodput",
    "young_interval",
]
