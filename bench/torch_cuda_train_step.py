#!/usr/bin/env python3
"""PyTorch side of bench/cuda_train_step.cc: the same GPT (tests/parity/torch_reference.py, the nanoGPT
layout cohort's nn::GPT has), shapes and AdamW, one training step on one GPU with forward and loss
under torch.autocast("cuda", dtype=torch.bfloat16), timed and counted as the C++ side does (wall
clock over --steps steps, the device synchronised at both ends; FLOPs per token 6 N + 12 L T d).
Needs PyTorch 2 with CUDA (on the GPU machines, not the PyTorch 1.13 of the development machines).

--attn manual runs the attention as matmul, mask, softmax, matmul (what cohort does on a GPU);
--attn sdpa runs F.scaled_dot_product_attention (PyTorch's fused flash attention). Prints one JSON
line per --attn value.

  python3 bench/torch_cuda_train_step.py [--layers 12] [--heads 12] [--embd 768] [--block 1024]
      [--vocab 50304] [--batch 8] [--steps 20] [--warmup 3] [--amp bf16|none] [--attn manual,sdpa]
      [--peak-tflops 989] [--phases]

--phases also times forward, backward and optimizer apart, and the attention alone, as the C++ side.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "parity"))
from torch_reference import GPT  # noqa: E402


def run(a, attn):
    torch.manual_seed(0)
    cfg = {"vocab": a.vocab, "block": a.block, "layers": a.layers, "heads": a.heads, "embd": a.embd,
           "bias": True, "tie": True, "sdpa": attn == "sdpa"}
    dev = torch.device("cuda")
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    x = torch.randint(0, a.vocab, (a.batch, a.block), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.block), device=dev)
    amp = a.amp == "bf16"
    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def backward(loss):
        opt.zero_grad(set_to_none=True)
        loss.backward()

    loss = None

    def step():
        nonlocal loss
        loss = forward()
        backward(loss)
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / a.steps
    tokens = a.batch * a.block
    flop_per_token = 6 * n + 12 * a.layers * a.block * a.embd
    tflops = flop_per_token * tokens / sec / 1e12
    print(json.dumps({"bench": "cuda_train_step", "impl": f"torch {torch.__version__} attn={attn}", "amp": a.amp,
                      "layers": a.layers, "embd": a.embd, "block": a.block, "batch": a.batch,
                      "params_m": round(n / 1e6, 1), "ms_per_step": round(sec * 1e3, 2),
                      "tokens_per_s": round(tokens / sec), "model_tflops": round(tflops, 1),
                      "fraction_of_peak": round(tflops / a.peak_tflops, 3),
                      "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "last_loss": round(loss.item(), 4)}), flush=True)
    if a.phases:
        phases(a, attn, forward, backward, opt)


def median(v):
    return sorted(v)[len(v) // 2]


def phases(a, attn, forward, backward, opt):
    """--phases, as the C++ side: forward+loss, backward and optimizer timed apart (device
    synchronised between them), then the attention alone (bf16, causal) forward and backward."""
    sync = torch.cuda.synchronize
    f, bw, o = [], [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = forward()
        sync()
        t1 = time.perf_counter()
        backward(loss)
        sync()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        f.append((t1 - t0) * 1e3)
        bw.append((t2 - t1) * 1e3)
        o.append((t3 - t2) * 1e3)
    print(json.dumps({"bench": "cuda_train_step_phases", "impl": f"torch attn={attn}",
                      "forward_ms": round(median(f), 2), "backward_ms": round(median(bw), 2),
                      "optimizer_ms": round(median(o), 2)}), flush=True)
    if attn != "sdpa":
        return
    e = a.embd // a.heads
    shape = (a.batch, a.heads, a.block, e)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)
    tf, tb = [], []
    for _ in range(10):
        sync()
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        sync()
        t1 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)
        sync()
        t2 = time.perf_counter()
        tf.append((t1 - t0) * 1e3)
        tb.append((t2 - t1) * 1e3)
    print(json.dumps({"bench": "cuda_attention", "impl": f"torch {torch.__version__} sdpa", "shape": list(shape),
                      "forward_ms": round(median(tf), 3), "forward_backward_ms": round(median(tb), 3)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--amp", default="bf16", choices=["bf16", "none"])
    ap.add_argument("--attn", default="manual,sdpa")
    ap.add_argument("--peak-tflops", type=float, default=989)
    ap.add_argument("--phases", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "cuda_train_step", "skipped": "no CUDA device"}))
        return
    for attn in a.attn.split(","):
        run(a, attn)
        torch.cuda.empty_cache()  # the next model starts from what run() freed


if __name__ == "__main__":
    main()
