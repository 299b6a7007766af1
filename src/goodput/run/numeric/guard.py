"""The numeric guard: find NaN/Inf, loss spikes and corrupted replicas, roll back in place, skip the bad data.

    run = gp.Run(numeric=gp.NumericConfig(spike_k=6.0, check_every=50))   # the defaults; numeric=True is the same

A hook of :class:`~goodput.run.run.Run` (off by default), attached by ``run.restore``, called by ``step_done``:

* **Detect.** Before every ``grads_every``-th optimizer step the gradients' sum is checked (with DDP, the
  reduced buckets', the same on every rank); a NaN/Inf one is dropped, so it never reaches the parameters. One
  on another step does, and is found by the loss it makes non-finite or by the next replica check, which also
  sums the parameters; a rollback passes over every checkpoint holding it. ``step_done`` checks the loss,
  applies the spike rule to the ranks' mean loss (recent level + k x noise of a recent window, after a warm-up)
  and, every ``check_every`` steps, fingerprints the parameters (:func:`~goodput.run.numeric.rules.fingerprint`)
  and sums them. Every rank's word reaches every rank while the next step
  computes and every rank draws the same verdict from it, one step late: with DDP it rides the next step's
  first gradient bucket (:mod:`~goodput.run.numeric.carry`: no collective of its own), otherwise it is
  all-gathered on the guard's own group (:mod:`~goodput.run.numeric.exchange`). 3+ replicas name a differing
  fingerprint by majority; with 2 both roll back and the redo of the check step names the rank whose own
  fingerprint changed (needs deterministic training).
* **Respond**, a bounded ladder, every rung in the ledger: roll back in place to the newest checkpoint before
  the anomaly (for a corrupted replica: at or before the last check where every fingerprint agreed), memory tier
  first, and let ``run.batches`` continue from the restored position; when the same NaN or spike comes back
  while the window is being redone, roll back again and skip that window's samples (the skip list goes into the
  loader's position, so into every checkpoint, and into ``RUN_DIR/numeric/skips.json``); stop with
  :class:`~goodput.errors.NumericFault` (exit ``EXIT_NUMERIC``) when a fault survives the skip, when
  ``max_rollbacks`` rollbacks fall within ``rollback_window`` steps, or when a rank is named corrupt twice
  (under ``--restart warm`` that rank goes to a hot spare instead).

A rollback opens a new ledger attempt in the same processes (like a warm restart): the redone steps count as
``lost_work`` and the restore as ``rollback``.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any

from goodput.errors import NumericFault
from goodput.ledger.live import reserved_world
from goodput.run._warm import WarmHook
from goodput.run.hooks import RunHook, find_hook
from goodput.run.numeric.carry import Carried
from goodput.run.numeric.config import NumericConfig
from goodput.run.numeric.exchange import Exchange, new_group, shared_window, start_gather
from goodput.run.numeric.grads import BucketCheck
from goodput.run.numeric.ops import (
    Episode,
    announce,
    apply_skips,
    gradient_sum,
    inject_faults,
    json_number,
    local_tensor,
    parameter_sum,
    poison,
    read_skips,
    refuse_unseen_bitflip,
    replicated,
    restore_finite,
    skip_window,
)
from goodput.run.numeric.rules import (
    FLAG_FINGERPRINT,
    FLAG_GRAD_BAD,
    FLAG_LOSS,
    FLAG_LOSS_BAD,
    FLAG_PARAMS_BAD,
    FLAG_SELF_DIFFERS,
    Verdict,
    encode_row,
    fingerprint,
    verdict,
)
from goodput.run.numeric.spikes import SpikeWatch

if TYPE_CHECKING:
    from goodput.checkpoint.state import TrainingState
    from goodput.run.run import Run

__all__ = ["NumericConfig", "NumericGuard"]


class NumericGuard(RunHook):
    """The guard of one ``Run`` (see the module docstring): a hook that attaches at each restore, injects a
    drill's faults into the loss, checks each step and rolls back in place."""

    def __init__(self, config: NumericConfig, *, flips: bool = False) -> None:
        self.config = config
        self._flips = flips  # the fault plan flips a bit on some rank (the same on every rank)
        self._run: Run | None = None
        self._state: TrainingState | None = None
        self._group: Any = None
        self._hook: Any = None
        self._buckets: BucketCheck | None = None  # DDP's per-bucket sums, when its comm hook is ours
        self._bad_grad: tuple[int, float] | None = None  # (step, norm) refused by the pre-step hook
        self._losses: list[tuple[int, float]] = []  # (step, mean loss) of good steps
        self._prints: dict[int, int] = {}  # this rank's fingerprint at each check step
        self._agreed = 0  # the newest check step where every replica agreed
        self._episodes: list[Episode] = []
        self._named: dict[int, int] = {}  # rank -> times named corrupt
        self._unnamed: set[int] = set()  # check steps whose differing replica no majority could name
        self._tier = "durable"
        self._comparable = True
        self._alone = False  # a shrunk generation of one rank: no replica to compare a flipped bit against
        self._inflight: list[Exchange | Carried] = []  # steps whose words are being exchanged, oldest first
        self._closing = False  # the loop ended before close() judged its last step: a fault stops the run
        self._handover: int | None = None  # a rank named corrupt under warm restarts, to leave for a spare
        self._watch = SpikeWatch(config)

    # ---- lifetime ---------------------------------------------------------------------------------------------
    def on_restore(self, run: Run, state: TrainingState, restored: int | None) -> None:
        """Watch ``state`` (after ``run.restore`` loaded it): the optimizer hook, the group, the known skips."""
        import torch.distributed as dist
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.on_close(run, "restore")
        # Every rank judges from the same memory, and a new attempt's hot spare starts with none: the survivors of
        # a warm restart hand it their spike window (below), and forget the rest (the rollbacks counted, the ranks
        # named), or one rank's verdict on a step could differ from another's.
        window = [(s, x) for s, x in self._losses if restored is not None and s <= restored]
        self._losses, self._episodes, self._named, self._unnamed, self._prints = [], [], {}, set(), {}
        self._run, self._state = run, state
        world = run.info.world_size
        self._comparable = replicated(state.model)
        # A job that had replicas and shrank to one rank has nothing to compare for now: its bitflip faults are
        # not injected (see adjust_loss) rather than refused; a job launched without replicas is refused.
        self._alone = world == 1 and reserved_world(world) > 1
        refuse_unseen_bitflip(self._flips and not self._alone, self._comparable)  # on every rank alike
        self._watch.restored(run.ledger)
        self._group = new_group() if world > 1 and dist.is_initialized() else None
        self._losses = shared_window(window, self._group)
        self._agree(restored or 0)
        if self.config.grads and state.optimizer is not None:
            self._hook = register_optimizer_step_pre_hook(self._before_optimizer_step)
            self._buckets = BucketCheck.install(state.model, self._group)
            if self._buckets is not None:
                self._buckets.arm(run.faults, self._agreed + 1)
        run.manager.add_listener(self._on_checkpoint_event)
        apply_skips(state.loader, read_skips(run.run_dir))

    def on_close(self, run: Run, status: str) -> None:
        """Remove the optimizer hook, drop the exchanges in flight and release the group."""
        self._inflight = []  # judged by on_loop_end on a clean close; else a failed generation's: not waited for
        if self._buckets is not None and self._buckets.carrier is not None:
            self._buckets.carrier.clear()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._group is not None:
            import torch.distributed as dist

            group, self._group = self._group, None
            with contextlib.suppress(Exception):  # a warm restart's dead generation may have taken it already
                if dist.is_initialized():
                    dist.destroy_process_group(group)

    def _on_checkpoint_event(self, name: str, **fields: Any) -> None:
        if name == "checkpoint_restored":
            self._tier = str(fields.get("tier", "durable"))

    # ---- detection --------------------------------------------------------------------------------------------
    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The pre-step hook, on every ``grads_every``-th step: a NaN/Inf gradient makes this optimizer step a
        no-op here. With DDP the reduced buckets are summed, the same on every rank; otherwise this rank's
        gradients. On the other steps only a drill's fault for the gradients goes in."""
        mine = self._state.optimizer if self._state is not None else None
        if self._run is None or mine is None or optimizer is not mine:
            return
        step = self._run.step + 1
        checked = step % self.config.grads_every == 0
        buckets = self._buckets
        if buckets is not None and not checked and buckets.drop():
            buckets.arm(self._run.faults, step + 1)
            return  # DDP's hook put this step's drill fault in already
        params = [p for group in mine.param_groups for p in group["params"] if p.grad is not None]
        total = buckets.take() if buckets is not None else None
        if buckets is not None:
            buckets.arm(self._run.faults, step + 1)
        if total is None:
            grads = [
                g for g in (local_tensor(p.grad) for p in params) if g.numel() > 0
            ]  # FSDP2: may be empty
            if not grads:
                return
            fault = self._run.faults.take("nan", step, into="grad")
            if fault is not None:
                poison(grads[0], fault)
            if not checked:
                return
            total = gradient_sum(grads)
        if not math.isfinite(total):
            self._bad_grad = (step, total)
            for p in params:
                p.grad = None  # the optimizer skips a parameter without a gradient: nothing changes

    def on_step(self, run: Run, step: int, loss: float | None) -> bool:
        """Send this step's word (``loss`` as ``adjust_loss`` returned it) and judge the words of the step
        before, whose exchange ran while this step computed: True when the run rolled back; raises NumericFault
        to stop. Without peers the step is judged at once."""
        assert self._run is run and self._state is not None, "NumericGuard.on_step before on_restore"
        word, carrier = self._word(step, loss), self._buckets.carrier if self._buckets else None
        self._inflight.append(carrier.board(step, word) if carrier else start_gather(step, word, self._group))
        rolled_back = self._judge_ready(keep=0 if self._group is None else 1)
        self._hand_over(run)
        return rolled_back

    def on_loop_end(self, run: Run, closing: bool) -> bool:
        """Judge every step still in flight (the loop's last one): True when the run rolled back; while
        ``closing`` a fault stops the run instead (the loop that would redo the steps is gone)."""
        self._closing = closing
        rolled_back = self._run is run and self._judge_ready(keep=0)
        self._hand_over(run)
        return rolled_back

    def _hand_over(self, run: Run) -> None:
        """Under ``--restart warm``, the rank named corrupt leaves (after every rank rolled back) so the warm
        agent gives its place to a hot spare; the others meet its absence at their next collective, as after any
        failure, and hand their rolled-back state to the spare."""
        rank, self._handover = self._handover, None
        if rank is not None and rank == run.info.rank:
            from goodput.run._warm import exit_failed

            why = f"numeric guard: rank {rank} corrupted its replica; it leaves for a hot spare"
            exit_failed(run, RuntimeError(why), planned=True)

    def _word(self, step: int, loss: float | None) -> list[int]:
        """This rank's row for ``step``: its loss, a refused gradient, its fingerprint on a check step."""
        flags, fp, grad_value = 0, 0, 0.0
        if loss is not None:
            flags |= FLAG_LOSS | (0 if math.isfinite(loss) else FLAG_LOSS_BAD)
        if self._bad_grad is not None and self._bad_grad[0] == step:
            flags, grad_value = flags | FLAG_GRAD_BAD, self._bad_grad[1]
        self._bad_grad = None
        every = self.config.check_every
        model = self._state.model if self._state is not None else None
        if every is not None and step % every == 0 and model is not None:
            fp, total = fingerprint(model.parameters()), parameter_sum(model)
            if not math.isfinite(total):  # a gradient that no check saw reached them
                flags, grad_value = flags | FLAG_PARAMS_BAD, total
            before = self._prints.get(step)
            flags |= FLAG_FINGERPRINT | (FLAG_SELF_DIFFERS if before is not None and before != fp else 0)
            self._prints[step] = fp
        return encode_row(flags, loss if loss is not None else 0.0, fp, grad_value)

    def _judge_ready(self, *, keep: int) -> bool:
        """Judge the oldest exchanges until ``keep`` remain in flight; after a rollback, wait out the rest (their
        steps are undone) so every rank's collectives stay paired."""
        while len(self._inflight) > keep:
            exchange = self._inflight.pop(0)
            if self._judge(exchange.step, exchange.rows()):
                for later in self._inflight:
                    later.rows()
                self._inflight.clear()
                return True
        return False

    def _judge(self, step: int, rows: list[list[int]]) -> bool:
        """Every rank's verdict on ``step`` from every rank's row; act on it. True when the run rolled back."""
        config = self.config
        history = [x for _, x in self._losses[-config.spike_window :]]
        found = verdict(
            rows,
            history=history,
            warmup=config.spike_warmup,
            k=config.spike_k or 0.0,
            min_rise=config.spike_min_rise,
            spikes=config.spike_k is not None,
            comparable=self._comparable,
        )
        if found.agreed:
            self._agree(step)
        if found.named is not None and found.kind is None and step in self._unnamed:
            self._unnamed.discard(step)
            why = "its redo of this step fingerprinted differently from its first run"
            self._name(found.named, step, why)
            announce(self._run, f"numeric fault: rank {found.named} named corrupt at step {step}: {why}")
        self._watch.judged(self._run, step, history, found.kind == "spike", found.mean_loss)
        if found.kind is None:
            if found.mean_loss is not None:
                self._losses.append((step, found.mean_loss))
                del self._losses[: -config.spike_window]
            return False
        self._respond(found, step)
        return True

    def _agree(self, step: int) -> None:
        """``step`` is the newest where every replica agreed: a corrupted replica's rollback target, which the
        checkpoint tiers' retention keeps (pinned) while newer saves come and go."""
        self._agreed = step
        if self._comparable and self._run is not None:
            self._run.manager.pin(step)

    def adjust_loss(self, run: Run, step: int, loss: float | None) -> float | None:
        """Apply a drill's numeric faults due at ``step``: the loss they make, a flipped bit."""
        if self._run is None or self._state is None:
            return loss
        loss, factor = inject_faults(run, self._state.model, step, loss, alone=self._alone)
        self._watch.injected(step, factor)
        return loss

    # ---- response ---------------------------------------------------------------------------------------------
    def _respond(self, found: Verdict, step: int) -> None:
        """Take the next rung for ``found`` at ``step``: roll back, roll back and skip, or stop."""
        run = self._run
        assert run is not None and found.kind is not None
        who = "no rank named" if found.rank is None else f"rank {found.rank}"
        seen = f"{found.kind} ({found.detail}) at step {step} on {who}, value {found.value!r}"
        where = (f" on rank {found.rank}" if found.rank is not None else "") + (
            f", value {found.value!r}" if found.kind != "sdc" else ""  # an sdc's value is a fingerprint
        )  # for the terminal's one line per event; the ledger holds the rest
        run.ledger.event(
            "numeric_fault", kind=found.kind, step=step, on_rank=found.rank, value=json_number(found.value),
            detail=found.detail, detected_at=run.step,
        )  # fmt: skip
        if self._closing:
            self._stop(seen, "the loop had ended: let run.batches() run to its end before run.close()")
        if found.kind == "sdc" and found.rank is not None:
            self._name(found.rank, step, found.detail)
        elif found.kind == "sdc":
            self._unnamed.add(step)  # the redo of this check step names the rank whose fingerprint changed
        window = self.config.rollback_window
        recent = [e for e in self._episodes if step - e.step < window]
        if len(recent) >= self.config.max_rollbacks:
            self._stop(seen, f"{len(recent)} rollbacks within {window} steps")
        previous = self._episodes[-1] if self._episodes else None
        again = (
            found.kind != "sdc"
            and previous is not None
            and previous.kind != "sdc"
            and previous.restored < step <= previous.step
        )
        if again and previous is not None and previous.skipped:
            self._stop(seen, "it survived skipping the data window")
        ceiling = self._agreed if found.kind == "sdc" else step - 1
        restored = self._roll_back(found, step, ceiling)
        episode = Episode(step, found.kind, restored)
        self._episodes.append(episode)
        done = f"rolled back to step {restored} ({self._tier} tier)"
        if again:
            steps = self.config.skip_steps or (step - restored)
            samples = skip_window(run, self._state.loader if self._state else None, restored, steps)
            episode.skipped = samples is not None
            if samples is None:
                self._stop(seen, "it came back after a rollback and this loader cannot skip data")
            done += f" and skipped the data of steps {restored + 1}-{restored + steps} ({samples} samples)"
        announce(run, f"numeric fault: {found.kind} ({found.detail}) at step {step}{where}: {done}")
        # Written through, as restore_end is: a kill within the ledger's next flush period (the next steps take
        # milliseconds) must not lose the rollback and the skipped window, which the report names.
        run.ledger.flush()

    def _roll_back(self, found: Verdict, step: int, ceiling: int) -> int:
        """Restore the newest checkpoint at or before ``ceiling`` in place, as a new ledger attempt."""
        run = self._run
        assert run is not None and found.kind is not None
        began = time.monotonic()  # the rollback: from the verdict to training again
        run.end_attempt(f"numeric fault: {found.kind} at step {step}")
        run.begin_attempt("rollback", began=time.time())
        run.ledger.restore_start()
        started = time.monotonic()
        with run.phase("restore"):
            assert self._state is not None
            restored = restore_finite(run, self._state.model, self._group, ceiling, self._agreed)
        seconds = time.monotonic() - started
        run.ledger.restore_end(restored)
        if restored is None:
            self._stop(
                f"{found.kind} ({found.detail}) at step {step}, value {found.value!r}",
                f"no checkpoint at or before step {ceiling} to roll back to",
            )
        assert restored is not None
        apply_skips(self._state.loader if self._state else None, read_skips(run.run_dir))
        run.ledger.event(
            "rollback", kind=found.kind, tier=self._tier, from_step=step, to_step=restored, seconds=seconds,
            seconds_total=time.monotonic() - began,
        )  # fmt: skip
        run.ledger.init_done()
        self._losses = [(s, x) for s, x in self._losses if s <= restored]
        self._agree(min(self._agreed, restored))
        run.rewind(restored)
        if self._buckets is not None:
            self._buckets.arm(run.faults, restored + 1)
        return restored

    def _name(self, rank: int, step: int, why: str) -> None:
        run = self._run
        assert run is not None
        self._named[rank] = self._named.get(rank, 0) + 1
        run.ledger.event("sdc_named", named_rank=rank, step=step, times=self._named[rank], why=why)
        if (
            find_hook(run.hooks, WarmHook) is not None
        ):  # --restart warm: a hot spare takes the rank, with a clean record
            del self._named[rank]
            self._handover = rank
            run.ledger.event("sdc_handover", named_rank=rank, step=step, why=f"{why}: handed to a hot spare")
            return
        if self._named[rank] >= 2:
            self._stop(
                f"sdc at step {step} on rank {rank} ({why})",
                f"rank {rank} corrupted its replica {self._named[rank]} times: replace its accelerator",
            )

    def _stop(self, seen: str, why: str) -> None:
        from goodput.job.codes import EXIT_NUMERIC

        run = self._run
        assert run is not None
        tried = "; ".join(
            f"rolled back from step {e.step} to {e.restored}" + (" and skipped its data" if e.skipped else "")
            for e in self._episodes
        )
        line = (
            f"numeric fault: {seen}; tried: {tried or 'nothing'}; stopping: {why} "
            f"(exit {EXIT_NUMERIC}: fix the data or the model, or replace the hardware, then relaunch)"
        )
        run.ledger.event("numeric_stop", reason=why, line=line)
        run.ledger.flush()
        raise NumericFault(line)
