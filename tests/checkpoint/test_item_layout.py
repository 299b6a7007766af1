"""The restore's view of one saved tensor item (``_direct_read._view_item``): the same values torch's own loader
gives, read from the item's bytes in place; anything but a plain tensor record is left to torch's path (None)
without running any of its pickle."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.durable._direct_read import _view_item
from tests.helpers.planted import Planted


def _saved(value: object) -> memoryview:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return memoryview(buffer.getvalue())


CASES = {
    "float32 matrix": torch.randn(64, 32),
    "transposed": torch.randn(16, 8).t(),
    "view into a larger storage": torch.randn(6, 4, dtype=torch.float16)[1:, 1:],
    "int64": torch.arange(10, dtype=torch.int64) * 7,
    "bfloat16": torch.randn(3, 4, dtype=torch.bfloat16),
    "0-d": torch.tensor(3.5, dtype=torch.float64),
    "empty": torch.zeros(0, 4),
    "complex64": torch.randn(5, dtype=torch.complex64),
    "bool": torch.tensor([True, False, True]),
    "uint8": torch.arange(256, dtype=torch.uint8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_plain_tensor_item_is_viewed_with_torchs_values_and_layout(name: str) -> None:
    tensor = CASES[name]
    item = _saved(tensor)
    viewed = _view_item(item)
    loaded = torch.load(io.BytesIO(bytes(item)), weights_only=True)
    assert viewed is not None
    assert (
        viewed.dtype == loaded.dtype and viewed.shape == loaded.shape and viewed.stride() == loaded.stride()
    )
    assert torch.equal(viewed, loaded)


def test_a_viewed_item_reads_the_items_own_bytes() -> None:
    item = bytearray(_saved(torch.zeros(8, dtype=torch.int32)))
    viewed = _view_item(memoryview(item))
    assert viewed is not None and int(viewed.sum()) == 0
    at = bytes(item).find(bytes(32))  # the storage record: 8 zero int32s
    item[at] = 5
    assert int(viewed[0]) == 5  # a view of the bytes, not a copy made while parsing


def test_anything_but_a_plain_tensor_is_left_to_torch_and_nothing_in_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with_attribute = torch.randn(3)
    with_attribute.note = "x"  # type: ignore[attr-defined]
    items = {
        "planted callable": _saved(Planted(str(marker))),
        "a dict": _saved({"a": torch.ones(2)}),
        "a parameter": _saved(torch.nn.Parameter(torch.ones(2))),
        "a tensor with attributes": _saved(with_attribute),
        "not an archive": memoryview(b"\x00" * 64),
    }
    assert {name: _view_item(item) for name, item in items.items()} == dict.fromkeys(items)
    assert not marker.exists()
