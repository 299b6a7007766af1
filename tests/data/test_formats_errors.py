"""Each kind of bad file in the in-place formats is refused with one line naming the file (and, where it can
be known, the samples affected); ``goodput data inspect`` detects every format and turns these into exit 2."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import ROOT

pytest.importorskip("pyarrow")
pytest.importorskip("datasets")
pytest.importorskip("webdataset")

from goodput.cli import main
from goodput.data import ArrowDataset, ParquetDataset, TokenDataset, write_shards
from goodput.errors import ConfigError, DataError
from tests.helpers.formats import BUILDERS, SEQ_LEN, one_line

N = 60


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_parquet_errors(tmp_path: Path) -> None:
    root = Path(BUILDERS[0].write(str(tmp_path), N))
    one_line(
        ConfigError,
        r"has no column 'nope'; its columns are id, text, label",
        lambda: ParquetDataset(str(root), columns=["id", "nope"]),
    )
    victim = root / "data" / "train-00002-of-00003.parquet"
    _cut(victim, -100)  # the footer is at the end
    one_line(
        DataError,
        rf"{re.escape(str(victim))} is not a Parquet file or is truncated",
        lambda: ParquetDataset(str(root)),
    )
    victim.write_bytes(b"id,text\n1,a\n")  # a CSV named .parquet
    one_line(DataError, "is not a Parquet file", lambda: ParquetDataset(str(root), split="train"))
    one_line(
        DataError,
        "holds no .parquet files for split 'validation'",
        lambda: ParquetDataset(str(root), split="validation"),
    )


def test_a_damaged_row_group_names_its_samples(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "damaged.parquet"
    table = pa.table({"id": list(range(1000)), "text": [f"row {i}" for i in range(1000)]})
    pq.write_table(table, path, row_group_size=100, compression="zstd")
    chunk = pq.read_metadata(path).row_group(3).column(1)
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset + 20
    data[start : chunk.data_page_offset + chunk.total_compressed_size - 4] = b"U" * (
        chunk.total_compressed_size - 24
    )
    path.write_bytes(bytes(data))  # same size, same footer: only row group 3's text column is garbage
    dataset = ParquetDataset(str(path))
    assert dataset[299] == {"id": 299, "text": "row 299"}
    one_line(
        DataError, r"damaged\.parquet: block 3 \(samples 300\.\.399\) cannot be read", lambda: dataset[350]
    )


def test_arrow_errors(tmp_path: Path) -> None:
    root = Path(BUILDERS[1].write(str(tmp_path), N))
    one_line(ConfigError, "has no column 'label'", lambda: ArrowDataset(str(root), columns=["label"]))
    victim = root / "data-00001-of-00003.arrow"
    _cut(victim, os.path.getsize(victim) // 2)
    one_line(
        DataError, rf"{re.escape(str(victim))} is truncated after \d+ rows", lambda: ArrowDataset(str(root))
    )
    victim.write_bytes(b"PAR1 not arrow at all" * 10)
    one_line(DataError, "is not an Arrow IPC file", lambda: ArrowDataset(str(root)))
    (root / "state.json").write_text(json.dumps({"other": 1}))
    one_line(DataError, "not a datasets save_to_disk state", lambda: ArrowDataset(str(root)))


def test_token_file_errors(tmp_path: Path) -> None:
    root = Path(BUILDERS[2].write(str(tmp_path), N))
    npy = root / "b.npy"
    one_line(
        ConfigError,
        r"a\.bin is a raw \.bin token file: pass dtype=",
        lambda: TokenDataset(str(root), seq_len=SEQ_LEN),
    )
    one_line(
        DataError,
        r"holds uint16 tokens but dtype='int32'",
        lambda: TokenDataset(str(npy), seq_len=SEQ_LEN, dtype="int32"),
    )
    _cut(npy, os.path.getsize(npy) - 8 * 2 * 3 - 1)  # three windows and one byte short
    # a.bin holds samples 0..19, b.npy 20..59: its last 3 windows (57..59) are lost, 56 is cut short
    one_line(
        DataError,
        r"b\.npy is truncated: .* \(samples 56\.\.59 affected\)",
        lambda: TokenDataset(str(root), seq_len=SEQ_LEN, dtype="uint16"),
    )
    npy.write_bytes(b"\x00" * 200)
    one_line(
        DataError,
        r"b\.npy is not a \.npy file",
        lambda: TokenDataset(str(root), seq_len=SEQ_LEN, dtype="uint16"),
    )
    bin_file = root / "a.bin"
    _cut(bin_file, os.path.getsize(bin_file) - 1)
    one_line(
        DataError,
        r"a\.bin is \d+ bytes, not a whole number of uint16 tokens",
        lambda: TokenDataset(str(bin_file), seq_len=SEQ_LEN, dtype="uint16"),
    )
    one_line(ConfigError, "seq_len must be", lambda: TokenDataset(str(root), seq_len=0))


def _inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | str]:
    code = main(["data", "inspect", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else err


def test_inspect_detects_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urls = {b.name: b.write(str(tmp_path), N) for b in BUILDERS}
    write_shards([b"x" * 10] * 5, str(tmp_path / "shards"), shard_bytes=20)
    urls["goodput-shards"] = str(tmp_path / "shards")
    extra = {"tokens": ["--seq-len", str(SEQ_LEN), "--dtype", "uint16"], "parquet": ["--split", "train"]}
    for name, url in urls.items():
        code, summary = _inspect(capsys, url, "--json", *extra.get(name, []))
        assert code == 0 and isinstance(summary, dict), summary
        assert summary["format"] == name
        assert summary["samples"] == (5 if name == "goodput-shards" else N)
        assert summary["first_sample_seconds"] >= summary["open_seconds"] > 0
    code, summary = _inspect(capsys, urls["parquet"], "--json", "--columns", "id")
    assert isinstance(summary, dict) and summary["columns"] == {"id": "int64"} and summary["shards"] == 4
    code, summary = _inspect(capsys, urls["tokens"], "--json", "--seq-len", "3", "--dtype", "uint16")
    assert isinstance(summary, dict) and summary["dtype"] == "uint16"


def test_inspect_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = BUILDERS[2].write(str(tmp_path), N)
    code, err = _inspect(capsys, url)
    assert code == 2 and "pass the window length (--seq-len" in str(err)
    code, err = _inspect(capsys, BUILDERS[0].write(str(tmp_path), N), "--seq-len", "3")
    assert code == 2 and "is parquet, which takes no seq_len" in str(err)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    code, err = _inspect(capsys, str(bad))
    assert code == 2 and "is not a Parquet file" in str(err) and len(str(err).strip().splitlines()) == 1


def test_the_formats_stay_optional() -> None:
    """``import goodput`` (and touching the format classes) imports no pyarrow/datasets; the base install
    depends on neither, the extras name them and the dev install pins them."""
    import subprocess
    import sys
    import tomllib

    code = (
        "import sys, goodput, goodput.data\n"
        "goodput.ParquetDataset, goodput.ArrowDataset, goodput.TokenDataset, goodput.WebDataset\n"
        "goodput.MDSDataset\n"
        "mods = ('pyarrow', 'datasets', 'torchdata', 'pandas', 'zstandard', 'webdataset')\n"
        "print(sorted(m for m in mods if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
    root = ROOT
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("pyarrow", "datasets")) for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["parquet"]] == ["pyarrow"]
    assert {"pyarrow", "datasets"} <= {d.split(">")[0] for d in extras["hf-datasets"]}
    pins = {
        line.split("==")[0] for line in (root / "constraints.txt").read_text().splitlines() if "==" in line
    }
    assert {"pyarrow", "datasets", "torchdata", "zstandard"} <= pins
    assert {"pyarrow", "datasets", "torchdata", "zstandard"} <= {d.split(">")[0] for d in extras["dev"]}
    assert [d.split(">")[0] for d in extras["mds"]] == ["zstandard"]
