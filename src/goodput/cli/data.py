"""``goodput data write SRC URL``: turn a local folder (one sample per file) into a sharded dataset at any URL.

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
    write.add_argument(
        "--endpoint-url",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL)",
    )
    write.add_argument("--json", action="store_true", help="print the index summary as one JSON object")
    write.set_defaults(handler=_write)


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
