"""A training process for crash tests: ``python -m tests.helpers.ckpt_child ROOT STRATEGY WIDTH LAST_STEP KEEP_LAST KEEP_EVERY``.

It restores the newest checkpoint, then trains and saves every step up to LAST_STEP, printing one line per
checkpoint event (flushed) so that the parent can SIGKILL it at a chosen moment.
"""

from __future__ import annotations

import sys
import threading

import torch

from goodput.checkpoint import CheckpointConfig, CheckpointManager, TrainingState


def weight_sum(model: torch.nn.Module) -> str:
    return repr(float(sum(p.detach().double().sum() for p in model.parameters())))


def main(argv: list[str]) -> None:
    root, strategy, width, last, keep_last, keep_every = argv
    torch.manual_seed(0)
    model = torch.nn.Linear(int(width), int(width))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = TrainingState(model=model, optimizer=opt)

    printing = threading.Lock()  # a background save reports from its own thread: one whole line at a time

    def on_event(name: str, **fields: object) -> None:
        line = f"{name} {fields.get('phase', '-')} {fields['step']} {weight_sum(model)}\n"
        with printing:
            sys.stdout.write(line)
            sys.stdout.flush()

    config = CheckpointConfig(
        root=root, strategy=strategy, every=1, keep_last=int(keep_last), keep_every=int(keep_every) or None
    )
    manager = CheckpointManager(config, state, on_event=on_event)
    restored = manager.restore_latest()
    with printing:
        print("restored", restored, weight_sum(model), flush=True)
    for step in range((restored or 0) + 1, int(last) + 1):
        model(torch.randn(8, int(width))).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if manager.should_save(step):
            manager.save(step)
    manager.close()
    with printing:
        print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
