"""PyTorch RPC (TensorPipe) side of bench/rpc: the same four figures between two processes.

Run with Debian's interpreter (the first python3 on PATH may lack torch):
    /usr/bin/python3 bench/rpc_torch.py [--iters 1000] [--concurrent 10000] [--reps 3] [--json]
scripts/bench_rpc.sh runs it beside build/bench/rpc and prints both measured columns in one table.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def noop(x):
    return x


def nbytes(t):
    return t.numel() * t.element_size()


def echo(t):
    return t


def run(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    name = "client" if rank == 0 else "server"
    rpc.init_rpc(name, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        big = torch.ones(4 * 1024 * 1024)
        for i in range(200):
            rpc.rpc_sync("server", noop, args=(i,))
        tiny, send16, echo16, conc, per_call = [], [], [], [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for i in range(args.iters):
                c0 = time.perf_counter()
                rpc.rpc_sync("server", noop, args=(i,))
                per_call.append(time.perf_counter() - c0)
            tiny.append((time.perf_counter() - t0) / args.iters)
            t0 = time.perf_counter()
            for _ in range(20):
                rpc.rpc_sync("server", nbytes, args=(big,))
            send16.append((time.perf_counter() - t0) / 20)
            t0 = time.perf_counter()
            for _ in range(20):
                rpc.rpc_sync("server", echo, args=(big,))
            echo16.append((time.perf_counter() - t0) / 20)
            t0 = time.perf_counter()
            futs = [rpc.rpc_async("server", noop, args=(i,)) for i in range(args.concurrent)]
            assert [f.wait() for f in futs] == list(range(args.concurrent))
            conc.append(args.concurrent / (time.perf_counter() - t0))
        med = statistics.median
        per_call.sort()

        def pct(q):
            return per_call[min(len(per_call) - 1, int(q * len(per_call)))] * 1e6

        if args.json:
            print(json.dumps({"impl": "torch", "label": f"PyTorch {torch.__version__} (TensorPipe)", "reps": args.reps,
                              "tiny_us": med(tiny) * 1e6, "tiny_p50_us": pct(0.5), "tiny_p90_us": pct(0.9),
                              "tiny_p99_us": pct(0.99), "send16_ms": med(send16) * 1e3,
                              "send16_gbs": 16 * 1024 * 1024 / med(send16) / 1e9, "echo16_ms": med(echo16) * 1e3,
                              "concurrent_calls_s": med(conc), "concurrent": args.concurrent, "wrong": 0}), flush=True)
            rpc.shutdown()
            return
        print(f"PyTorch {torch.__version__} RPC, 2 processes, medians of {args.reps} repetitions")
        print(f"rpc_sync of a tiny function (round trip)      {med(tiny) * 1e6:9.1f} us")
        print(f"  its p50 / p90 / p99 over all calls          {pct(0.5):9.1f} us / {pct(0.9):.1f} us / "
              f"{pct(0.99):.1f} us")
        print(f"16 MiB tensor sent, callee returns its size   {med(send16) * 1e3:9.2f} ms "
              f"({16 * 1024 * 1024 / med(send16) / 1e9:.2f} GB/s)")
        print(f"16 MiB tensor echoed back                     {med(echo16) * 1e3:9.2f} ms")
        print(f"concurrent rpc_async in flight                {med(conc):9.0f} calls/s")
    rpc.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--concurrent", type=int, default=10000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--json", action="store_true", help="print one JSON line (as build/bench/rpc --json does)")
    args = p.parse_args()
    torch.set_num_threads(1)
    mp.spawn(run, args=(args,), nprocs=2)
