"""PyTorch 1.13 reference for training across RPC workers: distributed autograd + DistributedOptimizer.

A two-stage model, each stage an nn.Module on its own RPC worker ("stage1", "stage2"), driven by a
trainer (rank 0) that holds the data and the loss, as PyTorch's model-parallel RPC tutorial does:
    x -> stage1 (Linear(w, w) + ReLU) -> stage2 (Linear(w, w)) -> loss = mean((y - target)^2)
One training step: forward through both stages by rpc_sync on their RRefs, inside a
dist_autograd context, dist_autograd.backward, then DistributedOptimizer (SGD, lr 0.01) over both
stages' parameters. Two sizes:
    small  batch 16, width 64          (latency-bound: a step is mostly RPC round trips)
    16mib  batch 65536, width 64       (each activation and its gradient is 16 MiB)
Prints one JSON line per size: {"impl": "torch", "model": ..., "ms_step": ...} (the median of
--reps timed blocks of --steps steps, after --warmup steps).

Run with Debian's interpreter (the first python3 on PATH may lack torch):
    /usr/bin/python3 bench/dist_autograd_torch.py [--steps 20] [--reps 3] [--models small,16mib]
"""
import argparse
import json
import os
import statistics
import time

import torch_env  # noqa: F401  (sets OPENBLAS_CORETYPE before torch loads)
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

SIZES = {"small": (16, 64), "16mib": (65536, 64)}


class Stage(torch.nn.Module):
    def __init__(self, width, relu, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(width, width)
        self.relu = relu

    def forward(self, x):
        y = self.linear(x)
        return torch.relu(y) if self.relu else y

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


def step(stage1, stage2, opt, x, target):
    with dist_autograd.context() as ctx:
        h = stage1.rpc_sync().forward(x)
        y = stage2.rpc_sync().forward(h)
        loss = ((y - target) ** 2).mean()
        dist_autograd.backward(ctx, [loss])
        opt.step(ctx)
    return loss.item()


def trainer(args):
    for name in args.models.split(","):
        batch, width = SIZES[name]
        stage1 = rpc.remote("stage1", Stage, args=(width, True, 1))
        stage2 = rpc.remote("stage2", Stage, args=(width, False, 2))
        params = stage1.rpc_sync().parameter_rrefs() + stage2.rpc_sync().parameter_rrefs()
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.01)
        torch.manual_seed(0)
        x = torch.randn(batch, width)
        target = torch.randn(batch, width)
        for _ in range(args.warmup):
            step(stage1, stage2, opt, x, target)
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(stage1, stage2, opt, x, target)
            times.append((time.perf_counter() - t0) / args.steps * 1e3)
        print(json.dumps({"impl": "torch", "model": name, "batch": batch, "width": width,
                          "ms_step": round(statistics.median(times), 3)}), flush=True)


def run(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=300)
    name = ["trainer", "stage1", "stage2"][rank]
    rpc.init_rpc(name, rank=rank, world_size=3, rpc_backend_options=opts)
    if rank == 0:
        trainer(args)
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="small,16mib")
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    for name in args.models.split(","):
        if name not in SIZES:
            ap.error(f"unknown model '{name}' (known: {', '.join(SIZES)})")
    mp.spawn(run, args=(args,), nprocs=3, join=True)


if __name__ == "__main__":
    main()
