"""dropout_warm_train.py's job under warm restarts, then an uncaught error on one rank after training: once,
in the first process to end training holding ``--fail-rank`` (a hot spare, when that rank was killed).

The error reaches the interpreter's excepthook, which goodput's ``Run`` installed when the process started,
before a spare is handed its rank: the error file must name the rank the process holds when it fails.
"""

import argparse
import os

from dropout_warm_train import make_run, train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fail-rank", type=int, default=1)
    args = p.parse_args()
    run = make_run(args.steps)
    run.warm(lambda r: train(r, args.steps))
    if run.info.rank != args.fail_rank:
        return
    try:  # once per job: the process that takes the rank next ends well
        os.close(os.open(os.path.join(run.run_dir, "late-error-raised"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    raise RuntimeError(f"late error after training, holding rank {run.info.rank} (pid {os.getpid()})")


if __name__ == "__main__":
    main()
