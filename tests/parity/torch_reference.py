#!/usr/bin/python3
"""PyTorch side of the cohort parity test (tests/core/parity_test.cc).

Reads <dir>/config.json, <dir>/init.safetensors (initial weights written by cohort) and
<dir>/batches.safetensors (x0, y0, x1, y1, ...), trains the same model with AdamW, gradient
clipping and the warmup+cosine schedule for config["steps"] steps, and writes
<dir>/torch_out.json ({"losses": [...], "grad_norms": [...], "lrs": [...]}) and
<dir>/torch_final.safetensors on one thread. With a second argument THREADS it trains on that
many threads and writes only <dir>/torch_out_threads<THREADS>.json (the losses). Runs on Debian's
python3-torch (1.13) with /usr/bin/python3; safetensors files are read and written by hand (the
format is an 8-byte little-endian header length, a JSON header, then raw little-endian data), so
no extra package is needed.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn as tnn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "U8": torch.uint8, "BOOL": torch.bool, "F16": torch.float16, "BF16": torch.bfloat16}
NAMES = {v: k for k, v in DTYPES.items()}


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = bytearray(blob[base + start:base + end])
        dt = DTYPES[info["dtype"]]
        t = torch.frombuffer(raw, dtype=dt) if len(raw) else torch.empty(0, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def save_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


class CausalSelfAttention(tnn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["heads"]
        self.sdpa = c.get("sdpa", False)  # PyTorch's fused attention (PyTorch 2), for GPU benchmarks
        self.attention = c.get("attention", "math")
        self.c_attn = tnn.Linear(c["embd"], 3 * c["embd"], bias=c["bias"])
        self.c_proj = tnn.Linear(c["embd"], c["embd"], bias=c["bias"])

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        # config "attention": "fused" (the cohort side runs its fused attention): under autocast,
        # compute the attention in float32, as the fused kernel does inside. Otherwise the ops
        # below take autocast's policy one by one (the bfloat16 matmuls of PyTorch 1.13), as
        # cohort's op-by-op formula (GPTConfig::fusedAttention = false) does.
        f32 = self.attention == "fused" and torch.is_autocast_cpu_enabled()
        with torch.autocast("cpu", enabled=not f32 and torch.is_autocast_cpu_enabled()):
            if f32:
                q, k, v = q.float(), k.float(), v.float()
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(tnn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = tnn.Linear(c["embd"], 4 * c["embd"], bias=c["bias"])
        self.c_proj = tnn.Linear(4 * c["embd"], c["embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


def layer_norm(c):
    ln = tnn.LayerNorm(c["embd"], elementwise_affine=True)
    if not c["bias"]:
        ln.bias = None
    return ln


class Block(tnn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = layer_norm(c)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = layer_norm(c)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(tnn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(c["vocab"], c["embd"]),
            wpe=tnn.Embedding(c["block"], c["embd"]),
            h=tnn.ModuleList([Block(c) for _ in range(c["layers"])]),
            ln_f=layer_norm(c)))
        self.lm_head = tnn.Linear(c["embd"], c["vocab"], bias=False)
        if c["tie"]:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for b in self.transformer.h:
            x = b(x)
        return self.lm_head(self.transformer.ln_f(x))


def build(cfg):
    if cfg["model"] == "mlp":
        sizes = cfg["sizes"]
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(tnn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(tnn.ReLU())
        return tnn.Sequential(*layers)
    return GPT(cfg)


def lr_at(cfg, step):
    """Linear warmup to lr over `warmup` steps, then cosine decay to min_lr at `total` steps."""
    lr, warm, total, min_lr = cfg["lr"], cfg["warmup"], cfg["total"], cfg["min_lr"]
    if step < warm:
        return lr * (step + 1) / warm
    if step >= total:
        return min_lr
    ratio = (step - warm) / max(1, total - warm)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def main(d, threads=None):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    torch.set_num_threads(threads or 1)
    model = build(cfg)
    state = load_safetensors(f"{d}/init.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.get("tie") and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    batches = load_safetensors(f"{d}/batches.safetensors")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
                            weight_decay=cfg["weight_decay"])
    losses, norms, lrs = [], [], []
    for step in range(cfg["steps"]):
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches[f"x{step}"], batches[f"y{step}"]
        # config "amp": "bf16" runs forward and loss under CPU autocast (as cohort's amp::Autocast).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.get("amp") == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
        lrs.append(lr)
    if threads is not None:  # a run to measure PyTorch's own spread: its losses only
        with open(f"{d}/torch_out_threads{threads}.json", "w") as f:
            json.dump({"losses": losses}, f)
        return
    with open(f"{d}/torch_out.json", "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "lrs": lrs}, f)
    save_safetensors(f"{d}/torch_final.safetensors", dict(model.state_dict()))


if __name__ == "__main__":
    # torch_reference.py DIR [THREADS]: with THREADS, train on that many threads and write only
    # DIR/torch_out_threads<THREADS>.json (the parity test's measure of PyTorch's own spread).
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
