"""The numeric guard's pure parts and the skip list, in one process: fault plans, the fingerprint, the spike rule
and the verdict every rank draws, and a sampler that steps over skipped data exactly."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from goodput.data.sampler import ResumableSampler
from goodput.errors import ConfigError
from goodput.faults import FaultPlan, parse_faults
from goodput.run.numeric import NumericConfig, rules
from goodput.run.numeric.rules import encode_row, fingerprint, spike_threshold, verdict
from tests.helpers.numeric import replay_alarms


def _verdict(rows: list[list[int]], history: list[float] | None = None, comparable: bool = True):  # type: ignore[no-untyped-def]
    return verdict(
        rows, history=history or [], warmup=4, k=6.0, min_rise=0.1, spikes=True, comparable=comparable
    )


def test_numeric_faults_parse_and_fire_once_each(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan_text = "nan@step=3,rank=1,into=grad,value=inf; spike@step=4,factor=20; bitflip@step=5,rank=0,bit=30"
    nan, spike, flip = parse_faults(plan_text)
    assert (nan.action, nan.into, nan.value, nan.rank) == ("nan", "grad", "inf", 1)
    assert spike.factor == 20.0 and flip.bit == 30
    plan = FaultPlan([nan, nan], rank=1, marker_dir=str(tmp_path))
    assert plan.take("nan", 3, into="loss") is None
    assert plan.take("nan", 3, into="grad") is not None  # the first of the two
    assert plan.take("nan", 3, into="grad") is not None  # the repeat: fires on the step's redo
    assert plan.take("nan", 3, into="grad") is None
    plan.check(phase="step", step=3)  # a numeric fault is never fired as a process action
    for bad in ("bitflip@step=3", "nan@mtbf=10s", "nan@step=2,into=weights", "spike@step=2,factor=-1"):
        with pytest.raises(ConfigError):
            parse_faults(bad)


def test_a_replica_check_that_finds_a_non_finite_parameter_rolls_back_and_agrees_on_nothing() -> None:
    """A NaN that reached both replicas (a gradient no check saw) leaves their fingerprints equal: the check's
    sum of the parameters is what finds it, and the check is no state to roll back to."""
    checked = rules.FLAG_LOSS | rules.FLAG_FINGERPRINT
    good = encode_row(checked, 2.0, 7, 0.0)
    bad = [encode_row(checked | rules.FLAG_PARAMS_BAD, 2.0, 7, math.nan) for _ in range(2)]
    found = _verdict(bad)
    assert (found.kind, found.rank, found.detail, found.agreed) == ("nonfinite", 0, "the parameters", False)
    assert found.value is not None and math.isnan(found.value)
    assert _verdict([good, bad[1]]).rank == 1 and _verdict([good, good]).agreed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fingerprint_catches_every_single_flipped_bit(dtype: torch.dtype) -> None:
    params = [torch.randn(7, 5, dtype=dtype), torch.randn(3, dtype=dtype)]
    clean = fingerprint(params)
    width = torch.finfo(dtype).bits
    ints = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    for bit in range(width):
        copy = [p.clone() for p in params]
        view = copy[1].view(ints)
        view[2] ^= (1 << bit) if bit < width - 1 else -(1 << bit)
        assert fingerprint(copy) != clean, f"bit {bit} of a {dtype} went unseen"
    assert fingerprint([p.clone() for p in params]) == clean


def test_spike_rule_flags_a_spike_and_no_false_alarm_over_a_noisy_falling_loss() -> None:
    rng = random.Random(0)
    losses = [3.0 * math.exp(-i / 300) + rng.gauss(0, 0.05) for i in range(2000)]
    alarms = [i for i in range(20, len(losses)) if losses[i] > spike_threshold(losses[i - 100 : i] if i >= 100 else losses[:i], k=6.0, min_rise=0.1)]  # fmt: skip
    assert alarms == []
    window = losses[1000:1100]  # 0.1 +- 0.05 there: a 4x step rises 8 sigmas of the rises, a 2x one 3
    assert losses[1100] * 4 > spike_threshold(window, k=6.0, min_rise=0.1)
    assert losses[1100] * 2 < spike_threshold(window, k=6.0, min_rise=0.1)


def test_verdict_agrees_names_by_majority_and_by_self_check() -> None:
    ok = [encode_row(rules.FLAG_LOSS | rules.FLAG_FINGERPRINT, 1.0, 42, 0.0) for _ in range(3)]
    assert _verdict(ok).kind is None and _verdict(ok).agreed
    odd = [*ok[:2], encode_row(rules.FLAG_LOSS | rules.FLAG_FINGERPRINT, 1.0, 43, 0.0)]
    found = _verdict(odd)
    assert (found.kind, found.rank) == ("sdc", 2)
    two = [ok[0], odd[2]]
    found = _verdict(two)
    assert (found.kind, found.rank) == ("sdc", None)  # two replicas: no majority
    redo = [
        ok[0],
        encode_row(rules.FLAG_LOSS | rules.FLAG_FINGERPRINT | rules.FLAG_SELF_DIFFERS, 1.0, 42, 0.0),
    ]
    found = _verdict(redo)
    assert (found.kind, found.named, found.agreed) == (None, 1, True)
    assert _verdict(odd, comparable=False).kind is None  # FSDP2 shards: fingerprints do not compare


def test_verdict_on_nonfinite_values_and_spikes() -> None:
    good = encode_row(rules.FLAG_LOSS, 1.0, 0, 0.0)
    grad = encode_row(rules.FLAG_LOSS | rules.FLAG_GRAD_BAD, 1.0, 0, math.inf)
    found = _verdict([good, grad])
    assert (found.kind, found.rank, found.value, found.detail) == ("nonfinite", 1, math.inf, "a gradient")
    nan = encode_row(rules.FLAG_LOSS | rules.FLAG_LOSS_BAD, math.nan, 0, 0.0)
    assert _verdict([nan, good]).kind == "nonfinite" and _verdict([nan, good]).rank == 0
    history = [1.0, 1.01, 0.99, 1.0, 1.02]
    assert _verdict([good, encode_row(rules.FLAG_LOSS, 9.0, 0, 0.0)], history).kind == "spike"
    assert _verdict([good, encode_row(rules.FLAG_LOSS, 1.05, 0, 0.0)], history).kind is None
    assert _verdict([good, encode_row(rules.FLAG_LOSS, 9.0, 0, 0.0)], history[:3]).kind is None  # warming up


def test_numeric_config_is_validated() -> None:
    for bad in ({"check_every": 0}, {"spike_k": -1.0}, {"spike_warmup": 200, "spike_window": 100}):
        with pytest.raises(ConfigError, match="NumericConfig"):
            NumericConfig(**bad)  # type: ignore[arg-type]


def _epoch(sampler: ResumableSampler) -> list[list[int]]:
    return [list(keys) for keys in sampler]


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_skipped_range_is_never_trained_and_every_other_sample_once(drop_last: bool) -> None:
    world, batch, size = 2, 3, 50
    samplers = [
        ResumableSampler(size, batch_size=batch, seed=1, rank=r, world_size=world, drop_last=drop_last)
        for r in range(world)
    ]
    full = sorted(i for s in samplers for keys in _epoch(s) for i in keys)
    skipped = samplers[0].order(0).at(np.arange(12, 24)).tolist()
    for s in samplers:
        s.skip(0, 12, 24)
    plans = [s.begin() for s in samplers]
    assert plans[0].count == plans[1].count  # the ranks step in lockstep
    seen = []
    for step in range(plans[0].count):
        for s, plan in zip(samplers, plans, strict=True):
            seen += plan.indices(step).tolist()
            s.delivered(plan, step)
            if step == 2:  # a checkpoint mid-epoch, restored into a fresh sampler: still skips
                state = json.loads(json.dumps(s.state_dict()))
                assert state["format"] == 2 and state["skips"] == [[0, 12, 24]]
    assert sorted(seen + skipped) == full and not set(seen) & set(skipped)
    fresh = ResumableSampler(size, batch_size=batch, seed=1, rank=0, world_size=world, drop_last=drop_last)
    fresh.load_state_dict(json.loads(json.dumps(samplers[0].state_dict())))
    assert fresh.skips == [(0, 12, 24)]


def test_a_position_inside_a_skipped_range_moves_past_it() -> None:
    sampler = ResumableSampler(40, batch_size=2, seed=0, rank=0, world_size=2, drop_last=True)
    sampler.load_state_dict({**sampler.state_dict(), "consumed": 8, "skips": [[0, 8, 16]], "format": 2})
    plan = sampler.begin()
    assert sampler.consumed == 16 and plan.count == 6
    assert plan.indices(0).tolist() == sampler.order(0).at(np.arange(16, 18)).tolist()


def test_a_numeric_fault_with_the_guard_off_is_refused(tmp_path: Path) -> None:
    """A drill's nan/spike/bitflip needs the guard to take it: with the guard off (numeric=False) the plan could
    never fire, so Run refuses it in one line instead of training on as if it had been drilled."""
    import goodput as gp

    run = gp.Run(
        str(tmp_path / "on"),
        total_steps=4,
        progress=False,
        hang_timeout=None,
        faults="nan@step=2",
        numeric=True,
    )
    run.close()  # with the guard on the same plan is accepted
    with pytest.raises(ConfigError, match=r"numeric guard is off: pass numeric=True to drill it"):
        gp.Run(str(tmp_path), total_steps=4, progress=False, hang_timeout=None, faults="nan@step=2")


def test_a_bitflip_on_a_model_without_replicas_is_refused_at_restore(tmp_path: Path) -> None:
    """Only the replica check finds a flipped bit: on a model whose ranks hold no replicas (FSDP2 shards, a plain
    module) it would corrupt the run unseen, so Run refuses the fault in one line at run.restore (the drill then
    reports ``bitflip`` as not applying) instead of training on."""
    import torch.distributed as dist

    import goodput as gp

    flip = "bitflip@step=2,rank=0"
    run = gp.Run(
        str(tmp_path / "ddp"), total_steps=4, progress=False, hang_timeout=None, faults=flip, numeric=True
    )
    assert dist.is_initialized()  # Run formed a one-rank group: a DDP model holds replicas
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    run.restore(model=ddp, optimizer=torch.optim.SGD(ddp.parameters(), lr=0.1))  # accepted
    run.close()
    run = gp.Run(
        str(tmp_path / "plain"), total_steps=4, progress=False, hang_timeout=None, faults=flip, numeric=True
    )
    plain = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match=r"flips a bit but the model has no replicas to compare"):
        run.restore(model=plain, optimizer=torch.optim.SGD(plain.parameters(), lr=0.1))
    run.close()


def test_a_job_shrunk_to_one_rank_holds_its_bitflip_instead_of_refusing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job launched with replicas that shrank in place to one rank has nothing to compare a flipped bit
    against for now: its restore is accepted (a refusal would stop a job the launch accepted), the flip is not
    injected, and the ledger says so."""
    import goodput as gp
    from goodput.ledger.ledger import read_events

    monkeypatch.setenv("GOODPUT_RESERVED_WORLD", "2")  # as goodput launch sets it for a job of 2 ranks
    run = gp.Run(
        str(tmp_path), total_steps=3, progress=False, hang_timeout=None, faults="bitflip@step=2,rank=0",
        numeric=True,
    )  # fmt: skip
    plain = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(plain.parameters(), lr=0.0)  # the weights change only by a flip
    run.restore(model=plain, optimizer=opt)
    before = [p.detach().clone() for p in plain.parameters()]
    while run.step < 3:
        loss = plain(torch.ones(1, 2)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.step_done(loss=loss.item())
    run.close()
    assert all(torch.equal(a, b) for a, b in zip(before, plain.parameters(), strict=True))
    (held,) = [e for e in read_events(str(tmp_path), rank=0) if e["event"] == "fault_not_injected"]
    assert held["step"] == 2 and "bitflip" in held["fault"]


def _restart_train_losses(steps: int) -> list[float]:
    """The mean loss of 2 ranks of ``bench/_restart_train.py`` (its data, model, optimizer and schedule; batches of
    8 per rank, one process): a small-batch squared error, skewed to the right (a few samples dominate)."""
    from goodput.bench._restart_train import Samples

    data = Samples().x
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.01 * s))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    losses, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # as under torchrun: several threads on a few shared cores are slower here
    try:
        for step in range(steps):
            first = 16 * step % len(data)
            x = data[order[first : first + 16]]
            ranks = [
                (model(x[r : r + 8]) - x[r : r + 8].sum(dim=1, keepdim=True)).pow(2).mean() for r in (0, 8)
            ]
            loss = (ranks[0] + ranks[1]) / 2
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def test_no_false_spike_on_a_small_batch_squared_error_from_any_relaunch_step() -> None:
    """The warm preemption test's loss (500 of the 600 steps of _restart_train.py): its steps reach 4-5x the median of their
    window, ten MADs on the loss's own scale (the rule measured there called them spikes, from relaunches near
    steps 390 and 455). In factors (the logarithm) they are ordinary; a 50x jump of a late step is a spike (its
    threshold is near 28x the window's median: a loss this noisy hides a smaller one)."""
    losses = _restart_train_losses(500)
    config = NumericConfig()
    alarms = {start: replay_alarms(losses, start, config) for start in range(0, 480, 2)}
    assert {s: a for s, a in alarms.items() if a} == {}
    assert 50 * losses[499] > spike_threshold(losses[399:499], k=6.0, min_rise=0.1)


def test_goodput_numeric_turns_the_guard_on_where_the_script_leaves_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify-rollback drills a user's script that never passed numeric=: GOODPUT_NUMERIC=1 turns the guard on."""
    import goodput as gp

    monkeypatch.setenv("GOODPUT_NUMERIC", "1")
    run = gp.Run(str(tmp_path), total_steps=4, progress=False, hang_timeout=None, faults="nan@step=2")
    try:
        assert any(type(hook).__name__ == "NumericGuard" for hook in run.hooks)
    finally:
        run.close()


def test_a_spike_k_too_large_for_any_float_trains_and_writes_its_figures(tmp_path: Path) -> None:
    """``spike_k=1e9`` puts the threshold above every float (a spike rule made blind, as a recording of a clean
    loss wants): the run trains and its ledger says the rule catches no finite rise, instead of stopping on an
    infinity the ledger's JSON cannot hold (exit 78)."""
    import goodput as gp
    from goodput.ledger.ledger import read_events

    run = gp.Run(
        str(tmp_path),
        total_steps=30,
        progress=False,
        hang_timeout=None,
        numeric=gp.NumericConfig(spike_k=1e9),
    )
    model = torch.nn.Linear(2, 1)
    run.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    while run.step < 30:
        run.step_done(loss=1.0 + 0.1 * (run.step % 3))
    run.close()
    figures = [e for e in read_events(str(tmp_path), rank=0) if e["event"] == "spike_rule"]
    assert figures and all(e["rise"] is None and e["threshold"] is None for e in figures), figures
