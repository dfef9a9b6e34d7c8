#!/usr/bin/python3
"""PyTorch 1.13 side of bench/pipeline: GPipe training with torch.distributed.pipeline.sync.Pipe.

The model and data are bench/pipeline.cc's: a nanoGPT-layout GPT (vocab 65, --block 64,
--layers 4, 4 heads, --embd 192, dropout 0, pre-LN blocks, exact-GELU MLP 4x, causal attention,
lm_head tied to the token embedding), batches of --batch 32 random token ids and targets drawn
from a generator seeded 1000 + step, cross-entropy loss, AdamW (lr 1e-4, torch's default weight
decay 0.01, as cohort's AdamW). Pipe splits each batch into --microbatches 8 chunks over two
partitions: [embeddings + first half of the blocks] and [second half + ln_f + lm_head]. The tie
holds across the partitions: Pipe accepts one parameter in two partitions when both are on the
same device, as here (CPU), so lm_head and wte are one tensor, as in cohort's split.

One timed step is zero_grad, forward through Pipe, the loss, backward and the AdamW step. Every
thread computes on one core (torch.set_num_threads(1), one OpenBLAS thread), as each of cohort's
two pipeline ranks does. single_samples_s is the same model trained without Pipe on this thread,
measured first, in this run.

What Pipe does on CPU, and the configurations printed (--workers):
  per_device     Pipe as shipped. It starts one worker thread per *device*, and both partitions
                 are on the CPU, so both partitions' forwards run on one thread, one after the
                 other: there is no overlap.
  per_partition  Pipe with one worker thread per partition (its create_workers replaced while
                 the Pipe is built), so the forward of micro-batch i on partition 1 overlaps the
                 forward of micro-batch i + 1 on partition 0, GPipe's fill-drain schedule.
In both, the backward runs on the thread that calls loss.backward(): PyTorch's autograd engine
runs all CPU work of a backward pass on the calling thread, so the two partitions' backwards do
not overlap (on GPUs the engine has a thread per device). Pipe recomputes activations in backward
by default (checkpoint="except_last"); cohort's GPipe keeps them, so this runs
checkpoint="never" unless --checkpoint says otherwise. Pipe needs an RPC agent even in one process
(its forward returns an RRef): a one-worker TensorPipe agent restricted to the uv transport, since
the default shm transport busy-polls a core for as long as the agent lives.

Prints one JSON line per configuration:
  {"impl": "torch_pipe", "schedule": "gpipe", "workers": ..., "samples_s": ..., "single_samples_s": ...,
   "speedup": ..., "step_ms": ..., "optimizer_ms": ..., "microbatches": 8, "partitions": 2, ...}
samples_s is --batch over the mean of --steps timed steps, after --warmup steps.

  /usr/bin/python3 bench/pipeline_torch.py [--steps 5] [--warmup 2] [--microbatches 8] [--layers 4]
      [--embd 192] [--heads 4] [--block 64] [--batch 32] [--workers per_device,per_partition]
      [--checkpoint never|except_last|always]
"""
import argparse
import contextlib
import json
import math
import os
import queue
import tempfile
import threading
import time

import torch_env  # noqa: F401  (sets OPENBLAS_CORETYPE; must precede loading torch)

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.pipeline.sync import Pipe  # noqa: E402
from torch.distributed.pipeline.sync import pipeline as pipe_pipeline  # noqa: E402
from torch.distributed.pipeline.sync import worker as pipe_worker  # noqa: E402

VOCAB = 65


class CausalSelfAttention(nn.Module):
    def __init__(self, embd, heads, block):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(embd, 3 * embd)
        self.c_proj = nn.Linear(embd, embd)
        mask = torch.full((block, block), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads)) + self.mask[:T, :T]
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, embd):
        super().__init__()
        self.c_fc = nn.Linear(embd, 4 * embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * embd, embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, embd, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(embd)
        self.attn = CausalSelfAttention(embd, heads, block)
        self.ln_2 = nn.LayerNorm(embd)
        self.mlp = MLP(embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Head(nn.Module):
    """Partition 0: token + position embeddings, then the first blocks."""

    def __init__(self, wte, wpe, blocks):
        super().__init__()
        self.wte, self.wpe, self.h = wte, wpe, nn.ModuleList(blocks)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return x


class Tail(nn.Module):
    """Partition 1: the remaining blocks, ln_f and lm_head (tied to the token embedding)."""

    def __init__(self, blocks, ln_f, lm_head):
        super().__init__()
        self.h, self.ln_f, self.lm_head = nn.ModuleList(blocks), ln_f, lm_head

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(args):
    """The GPT as nn.Sequential(Head, Tail), initialised as nanoGPT (and cohort's nn::GPT)."""
    torch.manual_seed(0)
    lm_head = nn.Linear(args.embd, VOCAB, bias=False)
    wte = nn.Embedding(VOCAB, args.embd)
    wte.weight = lm_head.weight
    wpe = nn.Embedding(args.block, args.embd)
    blocks = [Block(args.embd, args.heads, args.block) for _ in range(args.layers)]
    half = args.layers // 2
    model = nn.Sequential(Head(wte, wpe, blocks[:half]), Tail(blocks[half:], nn.LayerNorm(args.embd), lm_head))
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * max(args.layers, 1)))
    return model


def batch_for(args, step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, VOCAB, (args.batch, args.block), generator=g)
    y = torch.randint(0, VOCAB, (args.batch, args.block), generator=g)
    return x, y


def train(args, forward, params):
    """Mean seconds per step and per AdamW step over --steps steps after --warmup."""
    opt = torch.optim.AdamW(params, lr=1e-4)
    step_total = opt_total = 0.0
    for s in range(args.warmup + args.steps):
        x, y = batch_for(args, s)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = forward(x)
        F.cross_entropy(logits.view(-1, VOCAB), y.view(-1)).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if s >= args.warmup:
            step_total += t2 - t0
            opt_total += t2 - t1
    return step_total / args.steps, opt_total / args.steps


def workers_per_partition(devices):
    """Pipe's create_workers, but one thread per partition rather than one per device."""
    in_queues, out_queues = [], []
    for device in devices:
        in_q, out_q = queue.Queue(), queue.Queue()
        threading.Thread(target=pipe_worker.worker, args=(in_q, out_q, device), daemon=True).start()
        in_queues.append(in_q)
        out_queues.append(out_q)
    return in_queues, out_queues


@contextlib.contextmanager
def pipe_workers(kind):
    if kind == "per_device":
        yield
        return
    stock = pipe_pipeline.create_workers
    pipe_pipeline.create_workers = workers_per_partition
    try:
        yield
    finally:
        pipe_pipeline.create_workers = stock


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=192)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", default="per_device,per_partition")
    ap.add_argument("--checkpoint", default="never", choices=["never", "except_last", "always"])
    args = ap.parse_args()
    workers = args.workers.split(",")
    for w in workers:
        if w not in ("per_device", "per_partition"):
            ap.error(f"--workers: unknown {w!r} (per_device, per_partition)")
    torch.set_num_threads(1)

    single = gpt(args)
    single_step, _ = train(args, single, single.parameters())
    single_samples = args.batch / single_step

    with tempfile.TemporaryDirectory() as tmp:
        # One worker, no peers; uv (TCP) alone, as shm's busy-polling would take a core from the partitions.
        options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp}/rpc_init", num_worker_threads=2,
                                                  _transports=["uv"])
        rpc.init_rpc("worker", rank=0, world_size=1, rpc_backend_options=options)
        try:
            for w in workers:
                model = gpt(args)
                with pipe_workers(w):
                    pipe = Pipe(model, chunks=args.microbatches, checkpoint=args.checkpoint)
                step, opt = train(args, lambda x: pipe(x).local_value(), pipe.parameters())
                print(json.dumps({
                    "impl": "torch_pipe", "schedule": "gpipe", "workers": w,
                    "samples_s": round(args.batch / step, 2), "single_samples_s": round(single_samples, 2),
                    "speedup": round(single_step / step, 3), "step_ms": round(step * 1e3, 2),
                    "optimizer_ms": round(opt * 1e3, 2), "single_step_ms": round(single_step * 1e3, 2),
                    "microbatches": args.microbatches, "partitions": len(pipe.partitions),
                    "checkpoint": args.checkpoint, "torch": torch.__version__}), flush=True)
        finally:
            rpc.shutdown()


if __name__ == "__main__":
    main()
