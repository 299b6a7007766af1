"""The cheap sharded state dict gives DCP's get_state_dict answer, follows changes, and leaves FSDP to DCP."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from goodput.checkpoint._state_cache import StateDictCache


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: two keys, one tensor
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.arange(6).reshape(2, 3)).sum().backward()
    opt.step()
    opt.zero_grad()


def _assert_same(got: Any, want: Any) -> None:
    """Same keys in the same order, tensors with equal values, equal plain values."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_same(a, b)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want) and got.dtype == want.dtype
    else:
        assert got == want


def test_matches_dcp_before_and_after_steps_and_after_a_new_param_group() -> None:
    torch.manual_seed(0)
    model = Tied()
    opt = torch.optim.AdamW(model.body.parameters(), lr=0.1)
    cache = StateDictCache()
    for round_ in range(4):
        got = cache.get(model, opt)  # round 0: before any step (DCP creates the optimizer's state)
        _assert_same(got, get_state_dict(model, opt, options=StateDictOptions()))
        _train(model, opt)
        got = cache.get(model, opt)
        _assert_same(got, get_state_dict(model, opt, options=StateDictOptions()))
        if round_ == 1:
            opt.add_param_group({"params": list(model.embed.parameters()), "lr": 0.01})
    # the values are the live tensors: a later step shows in the next answer, no copy is made
    model_sd, optim_sd = cache.get(model, opt)
    assert cache._plan is not None, "the cheap form was never used: every answer came from DCP"
    assert model_sd["body.0.weight"].data_ptr() == model.body[0].weight.data_ptr()
    assert optim_sd["param_groups"][0]["lr"] == 0.1 and optim_sd["param_groups"][1]["lr"] == 0.01


def test_the_answer_is_a_new_dict_each_time() -> None:
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cache = StateDictCache()
    _train_linear = lambda: (model(torch.ones(2, 3)).sum().backward(), opt.step())  # noqa: E731
    _train_linear()
    first = cache.get(model, opt)
    first[0]["extra"] = torch.zeros(1)
    first[1]["param_groups"][0]["lr"] = 99.0
    second = cache.get(model, opt)
    assert "extra" not in second[0] and second[1]["param_groups"][0]["lr"] == 0.1
    _assert_same(second, get_state_dict(model, opt, options=StateDictOptions()))
