"""The ``wds`` and ``mds`` rows of ``goodput bench data --format``: writers, goodput's datasets, native peers.

WebDataset: the files are tar shards written by the ``webdataset`` package's ``TarWriter``; the native loader is
its own ``WebDataset`` pipeline in file order. It keeps no resumable state (its maintainers recommend resampling
over exact resume), so its resume is what a user does: a fresh pipeline skipping the samples already seen, and
its "state" is that sample count.

MDS: the files are written by Mosaic Streaming's ``MDSWriter`` and read natively by its ``StreamingDataset``
(``state_dict``/``load_state_dict`` for resume). Mosaic runs in its own venv (see ``_mosaic_venv``; made with
``goodput bench cache --make-mosaic-venv .venv-mosaic``), found at ``$GOODPUT_MOSAIC_PYTHON`` or
``.venv-mosaic/bin/python``; without it the row reports why instead of figures (the files cannot be written
either, so goodput's side is not measured).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from typing import Any

from goodput._env import MOSAIC_PYTHON
from goodput.bench import _native

__all__ = ["PeerUnavailable", "mds_epoch_seconds", "mds_resume", "wds_resume", "write_mds", "write_wds"]

_SCRIPT = os.path.join(os.path.dirname(__file__), "_mosaic_formats.py")
_WDS_SHARDS, _MDS_SHARD_BYTES = 8, 16 << 20


class PeerUnavailable(Exception):
    """The native peer of a format cannot run here; the message says why and what to do."""


def write_wds(folder: str, rows: int) -> str:
    import webdataset as wds

    root = os.path.join(folder, "wds")
    os.makedirs(root)
    per_shard = -(-rows // _WDS_SHARDS)
    for k in range(_WDS_SHARDS):
        with wds.TarWriter(os.path.join(root, f"shard-{k:06d}.tar")) as sink:
            for i in range(k * per_shard, min(rows, (k + 1) * per_shard)):
                sink.write({"__key__": f"{i:09d}", "txt": f"sample {i} of the benchmark corpus", "cls": i})
    return root


def _tars(root: str) -> list[str]:
    return sorted(os.path.join(root, name) for name in os.listdir(root) if name.endswith(".tar"))


def wds_pipeline(root: str) -> Any:
    import webdataset as wds

    return wds.WebDataset(_tars(root), shardshuffle=False, empty_check=False)


def wds_resume(root: str, position: int, repeats: int) -> dict[str, Any]:
    """A fresh ``webdataset`` pipeline skipping ``position`` samples to the next one (its only resume)."""
    times = []
    for _ in range(repeats):
        pipeline = wds_pipeline(root)
        start = time.perf_counter()
        sample = next(itertools.islice(iter(pipeline), position, None))
        times.append(time.perf_counter() - start)
        if int(sample["cls"]) != position:
            raise RuntimeError(f"webdataset resumed at sample {int(sample['cls'])}, expected {position}")
    text = json.dumps({"skip": position})
    return {"seconds": min(times), "state_bytes": len(text), "state_encoding": "json (skip count)"}


def ours_wds(root: str) -> Any:
    from goodput.data import WebDataset

    return WebDataset(root)


def wds_batches(root: str) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(wds_pipeline(root), batch_size=256, collate_fn=_native.keep_batch)


def mosaic_python() -> str:
    """The Mosaic venv's python, or PeerUnavailable saying how to make it."""
    path = MOSAIC_PYTHON.get()
    if not os.path.exists(path):
        raise PeerUnavailable(
            f"peer unavailable: no Mosaic Streaming venv at {path} (make one with "
            "`goodput bench cache --make-mosaic-venv .venv-mosaic`, or set GOODPUT_MOSAIC_PYTHON)"
        )
    return path


def _mosaic(*argv: str) -> dict[str, Any]:
    done = subprocess.run(
        [mosaic_python(), _SCRIPT, *argv], capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"Mosaic Streaming step {argv[0]} failed: {done.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def write_mds(folder: str, rows: int) -> str:
    root = os.path.join(folder, "mds")
    _mosaic("write", root, str(rows), str(_MDS_SHARD_BYTES))
    return root


def ours_mds(root: str) -> Any:
    from goodput.data import MDSDataset

    return MDSDataset(root)


def mds_resume(root: str, position: int, repeats: int) -> dict[str, Any]:
    """StreamingDataset's state at ``position`` restored into fresh datasets (one process each), first sample."""
    text = json.dumps(_mosaic("state", root, str(position)))
    runs = [_mosaic("resume", root, text) for _ in range(repeats)]
    for run in runs:
        if run["first_id"] != position:
            raise RuntimeError(f"Mosaic Streaming resumed at sample {run['first_id']}, expected {position}")
    return {"seconds": min(r["seconds"] for r in runs), "state_bytes": len(text), "state_encoding": "json"}


def mds_epoch_seconds(root: str, samples: int, batch: int, repeats: int) -> float:
    return min(_mosaic("epoch", root, str(samples), str(batch))["seconds"] for _ in range(repeats))
