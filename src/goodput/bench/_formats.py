"""``goodput bench data --format F``: an in-place format against its native loader, on the same files.

    goodput bench data --format parquet,arrow,hf,tokens,wds,mds [--rows 1048576] [--position 1000000] [--json]

For each format the benchmark writes ``--rows`` samples with the format's own library into a temporary folder
(local disk, so the files sit in the page cache: the warm-cache case) and measures, side by side:

* resume: a ResumableLoader restoring a position at sample ``--position`` (JSON text) to its first batch,
  against the native loader restoring its own state taken at the same sample (see ``_native``); the ratio is
  native seconds / goodput seconds, and both states' sizes are printed;
* throughput: samples per second over the first ``--epoch-samples`` of an epoch, goodput's over the native
  loader's, in the same order kind (both shuffled, or both in file order as a stream reads).

``BENCHES`` is the table: a format adds one ``FormatBench``. A row whose native peer cannot run here (Mosaic
Streaming without its venv) reports why instead of figures (``_native_tar_mds.PeerUnavailable``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from goodput.bench import _native
from goodput.bench import _native_tar_mds as _tm

__all__ = ["BENCHES", "FormatBench", "run_formats"]

_RESUME_BATCH, _EPOCH_BATCH, _REPEATS, _SEQ_LEN = 64, 256, 5, 15


@dataclass(frozen=True)
class FormatBench:
    """One format: how to write ``rows`` samples, goodput's dataset over them, and the native baseline.

    ``native_resume(root, position, repeats)`` and ``native_batches(root)`` (an iterable of batches) measure
    the native loader, or ``native_epoch(root, samples)`` (seconds) where it runs in another process;
    ``shuffle`` says whether both sides read in a shuffled order or in file order.
    """

    name: str
    native: str
    write: Callable[[str, int], str]
    ours: Callable[[str], Any]
    native_resume: Callable[[str, int, int], dict[str, Any]]
    native_batches: Callable[[str], Any] | None
    shuffle: bool
    needs: tuple[str, ...] = ("pyarrow", "datasets", "torchdata")  # modules both sides import
    native_epoch: Callable[[str, int], float] | None = None


def _table(rows: int) -> Any:
    import pyarrow as pa

    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {"id": ids, "text": pa.array([f"sample {i} of the benchmark corpus" for i in range(rows)])}
    )


def _write_parquet(folder: str, rows: int) -> str:
    import pyarrow.parquet as pq

    root = os.path.join(folder, "parquet")
    os.makedirs(os.path.join(root, "data"))
    table, parts = _table(rows), 4
    bounds = np.linspace(0, rows, parts + 1).astype(int)
    for k in range(parts):
        name = os.path.join(root, "data", f"train-{k:05d}-of-{parts:05d}.parquet")
        pq.write_table(table.slice(bounds[k], bounds[k + 1] - bounds[k]), name, row_group_size=10_000)
    return root


def _write_saved(folder: str, rows: int) -> str:
    import datasets

    root = os.path.join(folder, "saved")
    datasets.Dataset(_table(rows)).save_to_disk(root, num_shards=4)
    return root


def _write_tokens(folder: str, rows: int) -> str:
    path = os.path.join(folder, "train.bin")
    tokens = np.arange(rows * (_SEQ_LEN + 1), dtype=np.int64) % 50_000
    tokens.astype(np.uint16).tofile(path)
    return path


def _parquet_stream(root: str) -> Any:
    import datasets

    files = sorted(
        os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(".parquet")
    )
    return datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)


def _hf_map(root: str) -> Any:
    import datasets

    return datasets.load_from_disk(root)


def _hf_stream(root: str) -> Any:
    return _hf_map(root).to_iterable_dataset(num_shards=4)


def _in_process(
    name: str,
    native: str,
    write: Callable[[str, int], str],
    ours: Callable[[str], Any],
    make: Callable[[str], Any],
    *,
    stream: bool,
) -> FormatBench:
    """A format whose native loader runs here over ``make(root)``: a ``datasets`` IterableDataset read in file
    order (``stream``), or a map-style dataset under torchdata's StatefulDataLoader, shuffled."""

    def batches(root: str) -> Any:
        from torch.utils.data import DataLoader

        return DataLoader(
            make(root), batch_size=_EPOCH_BATCH, shuffle=not stream, collate_fn=_native.keep_batch
        )

    def resume(root: str, at: int, repeats: int) -> dict[str, Any]:
        if stream:
            return _native.hf_iterable_resume(lambda: make(root), at, repeats)
        return _native.stateful_loader_resume(make(root), at, _RESUME_BATCH, repeats, True)

    return FormatBench(name, native, write, ours, resume, batches, shuffle=not stream)


def _tokens_native(root: str) -> Any:
    return _native.TokenWindows(root, _SEQ_LEN, "uint16")


def _ours_parquet(root: str) -> Any:
    from goodput.data import ParquetDataset

    return ParquetDataset(root, split="train")


def _ours_arrow(root: str) -> Any:
    from goodput.data import ArrowDataset

    return ArrowDataset(root)


def _ours_hf(root: str) -> Any:
    from goodput.data import ArrowDataset

    return ArrowDataset.from_hf(_hf_map(root))


def _ours_tokens(root: str) -> Any:
    from goodput.data import TokenDataset

    return TokenDataset(root, seq_len=_SEQ_LEN, dtype="uint16")


BENCHES: dict[str, FormatBench] = {
    b.name: b
    for b in (
        _in_process(
            "parquet",
            "datasets streaming IterableDataset (parquet)",
            _write_parquet,
            _ours_parquet,
            _parquet_stream,
            stream=True,
        ),
        _in_process(
            "arrow",
            "torchdata StatefulDataLoader over datasets.Dataset (save_to_disk)",
            _write_saved,
            _ours_arrow,
            _hf_map,
            stream=False,
        ),
        _in_process(
            "hf",
            "datasets IterableDataset (Dataset.to_iterable_dataset)",
            _write_saved,
            _ours_hf,
            _hf_stream,
            stream=True,
        ),
        _in_process(
            "tokens",
            "torchdata StatefulDataLoader over a memory-mapped .bin (nanoGPT windows)",
            _write_tokens,
            _ours_tokens,
            _tokens_native,
            stream=False,
        ),
        FormatBench(
            "wds",
            "webdataset.WebDataset pipeline (its resume: skip the samples seen)",
            _tm.write_wds,
            _tm.ours_wds,
            lambda root, at, n: _tm.wds_resume(root, at, 1),  # a skip re-reads every sample: once
            _tm.wds_batches,
            shuffle=False,
            needs=("webdataset",),
        ),
        FormatBench(
            "mds",
            "Mosaic Streaming StreamingDataset (state_dict / load_state_dict), own venv",
            _tm.write_mds,
            _tm.ours_mds,
            _tm.mds_resume,
            None,
            shuffle=False,
            needs=(),
            native_epoch=lambda root, samples: _tm.mds_epoch_seconds(root, samples, _EPOCH_BATCH, 2),
        ),
    )
}


def _our_resume(bench: FormatBench, root: str, position: int) -> dict[str, Any]:
    from goodput.data import ResumableLoader

    times, size = [], 0
    for _ in range(_REPEATS):
        loader = ResumableLoader(
            bench.ours(root),
            batch_size=_RESUME_BATCH,
            seed=1,
            shuffle=bench.shuffle,
            collate_fn=_native.keep_batch,
        )
        text = json.dumps({**loader.state_dict(), "consumed": position})
        start = time.perf_counter()
        loader.load_state_dict(json.loads(text))
        next(iter(loader))
        times.append(time.perf_counter() - start)
        size = len(text)
    return {"seconds": min(times), "state_bytes": size, "state_encoding": "json"}


def _our_batches(bench: FormatBench, dataset: Any) -> Callable[[], Any]:
    from goodput.data import ResumableLoader

    return lambda: ResumableLoader(
        dataset, batch_size=_EPOCH_BATCH, seed=0, shuffle=bench.shuffle, collate_fn=_native.keep_batch
    )


def bench_format(bench: FormatBench, rows: int, position: int, samples: int) -> dict[str, Any]:
    """Resume and throughput of one format against its native loader, on files written for this run."""
    with tempfile.TemporaryDirectory(prefix=f"goodput-bench-{bench.name}-") as folder:
        try:
            root = bench.write(folder, rows)
        except _tm.PeerUnavailable as why:
            return {"native": bench.native, "unavailable": str(why)}
        ours_resume = _our_resume(bench, root, position)
        native_resume = bench.native_resume(root, position, _REPEATS)
        ours = _native.epoch_seconds(_our_batches(bench, bench.ours(root)), samples, 2)
        native = _native_epoch(bench, root, samples)
    return {
        "native": bench.native,
        "order": "shuffled" if bench.shuffle else "file order",
        "resume": {"goodput": ours_resume, "native": native_resume},
        "samples_per_second": {"goodput": samples / ours, "native": samples / native},
        "ratios": {
            "native_resume_over_goodput_resume": native_resume["seconds"] / ours_resume["seconds"],
            "goodput_throughput_over_native": native / ours,
        },
    }


def _native_epoch(bench: FormatBench, root: str, samples: int) -> float:
    if bench.native_epoch is not None:
        return bench.native_epoch(root, samples)
    make = bench.native_batches
    assert make is not None, f"{bench.name} has neither native_batches nor native_epoch"
    return _native.epoch_seconds(lambda: make(root), samples, 2)


def run_formats(names: list[str], rows: int, position: int, samples: int) -> dict[str, Any]:
    return {
        "config": {
            "rows": rows,
            "position": position,
            "epoch_samples": samples,
            "resume_batch": _RESUME_BATCH,
        },
        "formats": {name: bench_format(BENCHES[name], rows, position, samples) for name in names},
    }


def print_table(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"goodput bench data --format: {cfg['rows']:,} samples on local disk (warm), resume at sample "
        f"{cfg['position']:,}, throughput over {cfg['epoch_samples']:,} samples"
    )
    for name, r in report["formats"].items():
        if "unavailable" in r:
            print(f"{name} against {r['native']}: {r['unavailable']}")
            continue
        ours, native = r["resume"]["goodput"], r["resume"]["native"]
        print(f"{name} ({r['order']}) against {r['native']}:")
        print(
            f"  resume: goodput {ours['seconds'] * 1e3:.2f} ms, state {ours['state_bytes']} B; native "
            f"{native['seconds'] * 1e3:.2f} ms, state {native['state_bytes']} B ({native['state_encoding']}); "
            f"native/goodput {r['ratios']['native_resume_over_goodput_resume']:.1f}x"
        )
        rate = r["samples_per_second"]
        print(
            f"  throughput: goodput {rate['goodput']:,.0f}/s, native {rate['native']:,.0f}/s; "
            f"goodput/native {r['ratios']['goodput_throughput_over_native']:.2f}x"
        )
