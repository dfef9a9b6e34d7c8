#!/usr/bin/python3
"""PyTorch 1.13 side of bench/ddp.cc: torch.nn.parallel.DistributedDataParallel on gloo, the same
workload — MLP 784-1024-1024-10, batch 64 per rank, SGD (lr 0.01), cross-entropy, synthetic data
generated once per rank, one thread per rank, `--warmup` steps then `--steps` timed steps (wall
clock, rank 0) — and the same JSON columns, one line per bucket size.

  /usr/bin/python3 bench/torch_ddp.py --bucket-cap-mb 1,4,25     # 2 forked ranks, gloo on 127.0.0.1
  /usr/bin/python3 bench/torch_ddp.py --world 1                  # one process, no DDP
  /usr/bin/python3 bench/torch_ddp.py --no-comm                  # 2 ranks, DDP under no_sync()

Columns as bench/ddp.cc, except the exposed communication: PyTorch does not say how long the end of
backward waited for its buckets, so after the timed steps every rank runs the same number of steps
under no_sync() and exposed_est_ms = median backward with DDP − median backward under no_sync (both
columns are printed; bench/ddp.cc prints the same estimate beside its measured exposed_ms).
bare_ms: one dist.all_reduce of all gradients as one flat float32 tensor, same group.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time


import torch_env  # noqa: E402,F401  (sets OPENBLAS_CORETYPE; must precede loading torch)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as tnn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

BATCH, IN, HIDDEN, CLASSES = 64, 784, 1024, 10


def make_model():
    torch.manual_seed(0)
    return tnn.Sequential(tnn.Linear(IN, HIDDEN), tnn.ReLU(), tnn.Linear(HIDDEN, HIDDEN), tnn.ReLU(),
                          tnn.Linear(HIDDEN, CLASSES))


def run_steps(model, opt, x, y, warmup, steps, barrier=None):
    """warmup + timed steps; per-step wall seconds of the step and its phases, and CPU seconds."""
    rec = {"step": [], "fwd": [], "bwd": [], "opt": [], "cpu": []}

    def step(record):
        c0, t0 = time.process_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3, c1 = time.perf_counter(), time.process_time()
        if record:
            for k, v in (("step", t3 - t0), ("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2), ("cpu", c1 - c0)):
                rec[k].append(v)

    for _ in range(warmup):
        step(False)
    if barrier is not None:
        barrier()
    for _ in range(steps):
        step(True)
    return rec


def med_ms(v):
    return round(statistics.median(v) * 1e3, 3)


def bare_allreduce(numel, iters):
    t = torch.randn(numel)
    for _ in range(3):
        dist.all_reduce(t)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(world, mode, cap, buckets, rec):
    step_s = statistics.median(rec["step"])
    return {"impl": "torch", "backend": "gloo" if world > 1 else "none", "world": world, "mode": mode,
            "bucket_mb": cap, "buckets": buckets, "ms_step": round(step_s * 1e3, 3),
            "samples_s": round(world * BATCH / step_s, 1), "fwd_ms": med_ms(rec["fwd"]), "bwd_ms": med_ms(rec["bwd"]),
            "opt_ms": med_ms(rec["opt"]), "cpu_ms": med_ms(rec["cpu"])}


def data(rank):
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(BATCH, IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def single(a):
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = data(0)
    print(json.dumps(row(1, "single", None, 0, run_steps(model, opt, x, y, a.warmup, a.steps))), flush=True)


def num_buckets(ddp):
    # After the first iteration (PyTorch 1.13 runs that one with a single bucket, then rebuilds
    # in gradient-ready order). A private API: the count is informative only.
    try:
        return len(ddp.reducer._get_zeros_like_grad_buckets())
    except Exception:
        return None


def rank_main(rank, world, a):
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=300))
    x, y = data(rank)
    for cap in a.bucket_cap_mb:
        model = make_model()
        ddp = DDP(model, bucket_cap_mb=cap)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        if a.no_comm:
            with ddp.no_sync():
                rec = run_steps(ddp, opt, x, y, a.warmup, a.steps, dist.barrier)
            r = row(world, "no_comm", cap, num_buckets(ddp), rec)
        else:
            rec = run_steps(ddp, opt, x, y, a.warmup, a.steps, dist.barrier)
            with ddp.no_sync():
                nocomm = run_steps(ddp, opt, x, y, max(2, a.warmup // 2), a.steps, dist.barrier)
            r = row(world, "ddp", cap, num_buckets(ddp), rec)
            r["bwd_nocomm_ms"] = med_ms(nocomm["bwd"])
            r["ms_step_nocomm"] = med_ms(nocomm["step"])
        numel = sum(p.numel() for p in model.parameters())
        bare = bare_allreduce(numel, a.bare_iters)
        r["bare_ms"] = round(bare * 1e3, 3)
        if not a.no_comm:
            exposed = r["bwd_ms"] - r["bwd_nocomm_ms"]
            r["exposed_est_ms"] = round(exposed, 3)
            r["overlap_est"] = round(min(1.0, max(0.0, 1.0 - exposed / r["bare_ms"])), 3)
        if rank == 0:
            print(json.dumps(r), flush=True)
        del ddp, opt, model  # while the group is alive: see below
        if a.no_comm:
            break
    dist.barrier()
    dist.destroy_process_group()
    # Leave without tearing down the interpreter: in torch 1.13 a DDP reducer that outlives
    # destroy_process_group() joins gloo's worker thread while holding the GIL, and that thread may
    # need the GIL to free a tensor (a deadlock seen here at exit).
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--bucket-cap-mb", type=lambda s: [float(v) for v in s.split(",")], default=[25.0])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--bare-iters", type=int, default=20)
    ap.add_argument("--no-comm", action="store_true")
    a = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun / cohortrun
        world = int(os.environ["WORLD_SIZE"])
        if world == 1:
            single(a)
        else:
            rank_main(int(os.environ["RANK"]), world, a)
        return
    if a.world == 1:
        single(a)
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    # fork: nothing has started a thread yet, and it spares each rank a second import of torch.
    ctx = mp.start_processes(rank_main, args=(a.world, a), nprocs=a.world, join=False, start_method="fork")
    deadline = time.monotonic() + 600
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            sys.exit("torch_ddp: ranks still running after 600 s; killed")


if __name__ == "__main__":
    main()
