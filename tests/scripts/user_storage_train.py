"""A user's script from the README alone, with its checkpoints and/or its data on object storage.

goodput launch --nproc 2 --run-dir runs/s3 -- tests/scripts/user_storage_train.py --ckpt s3://bucket/run1
goodput launch --run-dir runs/s3 -- tests/scripts/user_storage_train.py --data s3://bucket/datasets/train

Credentials and the endpoint come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL), as the README says: the script passes no storage_options.
"""

import argparse
import os

import torch
from _readme_loop import fit

import goodput as gp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default=None, help="checkpoint root (default: RUN_DIR/checkpoints)")
    p.add_argument("--data", default=None, help="goodput shards at a URL (default: 64 random points)")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    run_dir = os.environ["GOODPUT_RUN_DIR"]
    checkpoint = gp.CheckpointConfig(root=args.ckpt, every=4) if args.ckpt else None
    run = gp.Run(checkpoint=checkpoint, total_steps=args.steps, backend="gloo", progress=False)
    if args.data:
        cache = gp.CacheConfig(folder=os.path.join(run_dir, "cache"), budget_bytes=gp.parse_bytes("64MiB"))
        dataset = gp.ShardedDataset(
            args.data, cache=cache, decode=lambda b: torch.frombuffer(bytearray(b), dtype=torch.float32)
        )
    else:
        dataset = list(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)))
    model = torch.nn.Linear(4, 1)
    if run.info.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = gp.ResumableLoader(dataset, batch_size=4, seed=0, drop_last=True)
    run.restore(model=model, optimizer=opt, loader=loader)
    fit(run, loader, lambda batch: model(batch).pow(2).mean(), opt)


if __name__ == "__main__":
    main()
