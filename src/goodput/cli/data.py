"""``goodput data write SRC URL``: turn a local folder (one sample per file) into a sharded dataset at any URL;
``goodput data inspect URL``: what a dataset at a URL is (format, samples, shards, columns) and its first sample.

Credentials come from the environment (e.g. ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``) or the store's usual
configuration, never from the command line, where other users could read them.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from goodput.errors import AccessRefused, ConfigError, StorageError
from goodput.units import parse_bytes

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser("data", help="prepare datasets for remote storage")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    write = actions.add_parser(
        "write",
        help="write a local folder (one sample per file) as shards at a URL",
        description="Write the files of SRC (sorted by path, one sample each) as goodput shards at URL "
        "(any fsspec URL: s3://bucket/prefix, gs://..., a local folder). The index is written last and keeps "
        "each sample's key, its path relative to SRC (ShardedDataset.key(i)), so labels in file names survive. "
        "Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or the store's "
        "usual configuration.",
    )
    write.add_argument("src", help="local folder whose files are the samples")
    write.add_argument("url", help="destination, e.g. s3://bucket/datasets/train")
    write.add_argument("--shard-size", default="64MiB", help="target bytes per shard (default 64MiB)")
    _add_endpoint_and_json(write, "print the index summary as one JSON object")
    write.set_defaults(handler=_write)
    _add_inspect(actions)


def _add_endpoint_and_json(parser: argparse.ArgumentParser, json_help: str) -> None:
    """The options write and inspect share: the S3 endpoint, and JSON output."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    parser.add_argument(
        "--endpoint-url", default=endpoint, help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL)"
    )
    parser.add_argument("--json", action="store_true", help=json_help)


def _add_inspect(actions: Any) -> None:
    from goodput.data._detect import FORMATS

    inspect = actions.add_parser(
        "inspect",
        help="show a dataset's format, samples, shards and columns, and time its first sample",
        description="Detect the format of the dataset at URL (goodput shards, a save_to_disk or .arrow folder, "
        "Parquet files, .bin/.npy token files, a folder of files), open it as training would and read sample "
        "0. Credentials come from the environment, as for 'goodput data write'.",
    )
    inspect.add_argument("url", help="a dataset folder or file: a local path, s3://bucket/prefix, ...")
    inspect.add_argument("--format", choices=[f.name for f in FORMATS], help="skip detection")
    inspect.add_argument("--seq-len", type=int, help="tokens per sequence (token files)")
    inspect.add_argument("--dtype", help="token dtype of .bin files, e.g. uint16 (token files)")
    inspect.add_argument("--columns", help="comma-separated columns to read (Parquet, Arrow)")
    inspect.add_argument("--split", help="a Hub split's files only, e.g. train (Parquet)")
    _add_endpoint_and_json(inspect, "print one JSON object")
    inspect.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    import time

    from goodput.data._detect import open_dataset
    from goodput.errors import DataError

    options: dict[str, Any] = {}
    if args.endpoint_url and args.url.startswith(("s3://", "s3a://")):
        options["client_kwargs"] = {"endpoint_url": args.endpoint_url}
    columns = None if args.columns is None else [c.strip() for c in args.columns.split(",") if c.strip()]
    start = time.perf_counter()
    try:
        entry, dataset = open_dataset(
            args.url,
            format=args.format,
            storage_options=options,
            seq_len=args.seq_len,
            dtype=args.dtype,
            columns=columns,
            split=args.split,
        )
        opened = time.perf_counter()
        sample = dataset[0]
        first = time.perf_counter()
    except AccessRefused:
        raise  # a ConfigError already: its line says where credentials are read from
    except (DataError, StorageError, PermissionError) as err:
        raise ConfigError(str(err)) from None
    describe = getattr(dataset, "describe", None)
    summary: dict[str, Any] = {"url": args.url, "format": entry.name, "samples": len(dataset)}
    sizes = getattr(dataset, "shard_sizes", None)  # a folder has no shards: each file is one
    summary.update(describe() if callable(describe) else {"shards": len(dataset if sizes is None else sizes)})
    summary["format"] = entry.name
    summary.update(open_seconds=opened - start, first_sample_seconds=first - start, sample=_preview(sample))
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            shown = ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else value
            if key.endswith("_seconds"):
                shown = f"{value * 1e3:.1f} ms"
            print(f"{key:21} {shown}")
    return 0


def _preview(sample: Any, width: int = 100) -> str:
    text = repr(sample)
    return text if len(text) <= width else text[: width - 3] + "..."


def _write(args: argparse.Namespace) -> int:
    from goodput.data.shards import write_folder_shards

    shard_bytes = parse_bytes(args.shard_size, what="--shard-size")
    if shard_bytes < 1:
        raise ConfigError(f"--shard-size must be positive, got {args.shard_size!r}")
    options: dict[str, Any] = {}
    if args.endpoint_url and args.url.startswith(("s3://", "s3a://")):
        options["client_kwargs"] = {"endpoint_url": args.endpoint_url}
    try:
        index = write_folder_shards(args.src, args.url, shard_bytes=shard_bytes, storage_options=options)
    except AccessRefused:
        raise  # a ConfigError already: its line says where credentials are read from
    except (StorageError, PermissionError) as err:
        raise ConfigError(str(err)) from None
    summary = {
        "url": args.url,
        "samples": index["samples"],
        "shards": len(index["shards"]),
        "bytes": sum(s["bytes"] for s in index["shards"]),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {summary['samples']} samples in {summary['shards']} shards ({summary['bytes']} bytes) to {args.url}"
        )
    return 0
