#!/usr/bin/python3
"""PyTorch 1.13 side of bench/train_step: ms per training step for the two reference models,
one thread, same shapes as cohort's bench/train_step.cc. Prints one JSON line per model, with the
peak memory of one step as PyTorch's profiler reports it (step_peak_mb: see step_peak_mb()).
--amp bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch 1.13's
CPU autocast has no float16). --profiler on times the steps under torch.profiler (profile_memory,
record_shapes); --profiler paired alternates steps without and with it, as bench/train_step.cc does.

  /usr/bin/python3 bench/torch_train_step.py [--steps N] [--warmup N] [--model mlp|gpt|all] [--amp none|bf16]
      [--profiler off|on|paired]
"""
import argparse
import json
import os
import statistics
import sys
import time


import torch_env  # noqa: E402,F401  (sets OPENBLAS_CORETYPE; must precede loading torch)

import torch  # noqa: E402
import torch.nn as tnn
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "parity"))
from torch_reference import GPT  # noqa: E402  (the same nanoGPT layout as cohort's)


AMP = None  # torch.bfloat16 under --amp bf16
PROFILER = "off"  # --profiler off|on|paired


def autocast():
    return torch.autocast("cpu", dtype=AMP or torch.bfloat16, enabled=AMP is not None)


def step_peak_mb(step):
    """Peak, during one step, of the bytes allocated minus freed since the step began, from the
    profiler's memory records (profile_memory=True). Blocks allocated before the step (weights,
    optimizer state, last step's gradients) are not in it; PyTorch does not record their frees
    either. cohort's "step_peak_mb" is the same quantity from its allocator."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    total, peak = 0, 0
    for ev in sorted(prof.profiler.kineto_results.events(), key=lambda x: x.start_us()):
        if ev.name() == "[memory]":
            total += ev.nbytes()
            peak = max(peak, total)
    return peak / 2**20


def timed(step):
    t0 = time.process_time()  # CPU time, as bench/train_step.cc (the machines are shared)
    step()
    return (time.process_time() - t0) * 1e3


def bench_profile():
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True)


def paired_steps(step, steps):
    """--profiler paired, as bench/train_step.cc: steps without and with a fresh profile alternating
    in this process (off, on, on, off, ...). Returns the medians off and on and the per-pair ratios
    (on / off)."""
    off, on, ratios = [], [], []
    for i in range(steps):
        for half in range(2):
            if (half == 0) == (i % 2 == 0):
                off.append(timed(step))
                continue
            with bench_profile():
                on.append(timed(step))
        ratios.append(on[-1] / off[-1])
    return statistics.median(off), statistics.median(on), ratios


def time_steps(step, steps, warmup):
    for _ in range(warmup):
        step()
    if PROFILER == "paired":
        return paired_steps(step, steps)
    times = []
    prof = None
    if PROFILER == "on":  # the timed steps under PyTorch's profiler with profile_memory
        prof = bench_profile()
        prof.__enter__()
    for _ in range(steps):
        times.append(timed(step))
    if prof is not None:
        prof.__exit__(None, None, None)
        return statistics.median(times), 0.0
    return statistics.median(times), step_peak_mb(step)


def mlp(steps, warmup):
    torch.manual_seed(0)
    model = tnn.Sequential(tnn.Linear(784, 1024), tnn.ReLU(), tnn.Linear(1024, 1024), tnn.ReLU(),
                           tnn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 784)
    y = torch.randint(0, 10, (64,))

    def step():
        with autocast():
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time_steps(step, steps, warmup)


def gpt(steps, warmup):
    torch.manual_seed(0)
    cfg = {"vocab": 65, "block": 256, "layers": 6, "heads": 6, "embd": 384, "bias": True, "tie": True}
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    x = torch.randint(0, 65, (8, 256))
    y = torch.randint(0, 65, (8, 256))

    def step():
        with autocast():
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time_steps(step, steps, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--model", default="all")
    ap.add_argument("--amp", default="none", choices=["none", "bf16"])
    ap.add_argument("--profiler", default="off", choices=["off", "on", "paired"])
    a = ap.parse_args()
    global AMP, PROFILER
    PROFILER = a.profiler
    AMP = torch.bfloat16 if a.amp == "bf16" else None
    torch.set_num_threads(1)

    def line(model, result):
        if PROFILER == "paired":
            off, on, ratios = result
            for prof, ms in (("off", off), ("on", on)):
                row = {"model": model, "amp": a.amp, "profiler": prof, "ms_per_step": ms, "paired": True,
                       "pairs": len(ratios)}
                if prof == "on":
                    row["overhead_pct"] = round(100 * (statistics.median(ratios) - 1), 2)
                    row["ratios"] = [round(r, 4) for r in ratios]
                print(json.dumps(row), flush=True)
            return
        ms, peak = result
        print(json.dumps({"model": model, "amp": a.amp, "profiler": a.profiler, "ms_per_step": ms,
                          "step_peak_mb": round(peak, 1)}),
              flush=True)
    if a.model in ("mlp", "all"):
        line("mlp", mlp(a.steps, a.warmup))
    if a.model in ("gpt", "all"):
        line("gpt", gpt(max(3, a.steps // 3), 2))


if __name__ == "__main__":
    main()
