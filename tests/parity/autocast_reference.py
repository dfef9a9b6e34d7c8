#!/usr/bin/python3
"""PyTorch side of cohort's autocast test (tests/core/amp/autocast_test.cc).

Usage: autocast_reference.py <dir>
Reads <dir>/inputs.safetensors (float32, int64 and bool tensors written by cohort), runs every case
below under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch 1.13's CPU autocast has no
float16), and writes <dir>/outputs.safetensors:
each case's output in the dtype autocast gave it (a case with several outputs writes name.0,
name.1, ...), plus <dir>/errors.json for cases PyTorch rejects. The case names are the test's; it
checks both lists are the same.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import load_safetensors, save_safetensors  # noqa: E402


def cases(t, h):
    """t: the float32/int/bool inputs; h: a name -> tensor in the autocast dtype."""
    x, x2, w, b, sq, y3, w3 = t["x"], t["x2"], t["w"], t["b"], t["sq"], t["y3"], t["w3"]
    tgt, idx, idx2, mask = t["tgt"], t["idx"], t["idx2"], t["mask"]
    img, kw, kb, ln_w, ln_b = t["img"], t["kw"], t["kb"], t["ln_w"], t["ln_b"]
    q, k, v = t["q"], t["k"], t["v"]
    pos = x.abs() + 0.5
    hx, hx2, hpos, himg = h(x), h(x2), h(pos), h(img)
    return {
        "mm_f32": lambda: torch.mm(x, sq),
        "mm_half": lambda: torch.mm(hx, h(sq)),
        "bmm_f32": lambda: torch.bmm(y3, w3),
        "matmul_f32": lambda: torch.matmul(y3, sq),
        "matmul_mixed": lambda: torch.matmul(hx, sq),
        "linear_f32": lambda: F.linear(x, w, b),
        "addmm_f32": lambda: torch.addmm(b, x, w.t()),
        "conv2d_f32": lambda: F.conv2d(img, kw, kb, padding=1),
        "sdpa_f32": lambda: torch.softmax(q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5), -1) @ v,
        "crossEntropy_half": lambda: F.cross_entropy(hx, tgt),
        "crossEntropy_f32": lambda: F.cross_entropy(x, tgt),
        "nllLoss_half": lambda: F.nll_loss(h(F.log_softmax(x, -1)), tgt),
        "mseLoss_half": lambda: F.mse_loss(hx, hx2),
        "softmax_half": lambda: F.softmax(hx, -1),
        "softmax_f32": lambda: F.softmax(x, -1),
        "logSoftmax_half": lambda: F.log_softmax(hx, -1),
        "layerNorm_half": lambda: F.layer_norm(hx, (8,)),
        "layerNorm_f32": lambda: F.layer_norm(x, (8,), ln_w, ln_b),
        "exp_half": lambda: hx.exp(),
        "log_half": lambda: hpos.log(),
        "pow_half": lambda: hx.pow(2),
        "rsqrt_half": lambda: hpos.rsqrt(),
        "sqrt_half": lambda: hpos.sqrt(),
        "abs_half": lambda: hx.abs(),
        "neg_half": lambda: -hx,
        "tanh_half": lambda: hx.tanh(),
        "sigmoid_half": lambda: hx.sigmoid(),
        "relu_half": lambda: F.relu(hx),
        "gelu_half": lambda: F.gelu(hx),
        "silu_half": lambda: F.silu(hx),
        "clamp_half": lambda: hx.clamp(-0.5, 0.5),
        "dropout_half": lambda: F.dropout(hx, 0.5, training=False),
        "add_mixed": lambda: hx + x2,
        "sub_mixed": lambda: hx - x2,
        "rsub_half": lambda: torch.rsub(hx, 2.0),
        "mul_mixed": lambda: hx * x2,
        "div_mixed": lambda: hx / (x2.abs() + 1),
        "add_half": lambda: hx + hx2,
        "maximum_mixed": lambda: torch.maximum(hx, x2),
        "minimum_mixed": lambda: torch.minimum(hx, x2),
        "where_mixed": lambda: torch.where(mask, hx, x2),
        "eq_mixed": lambda: hx == x2,
        "ne_mixed": lambda: hx != x2,
        "lt_mixed": lambda: hx < x2,
        "le_mixed": lambda: hx <= x2,
        "gt_mixed": lambda: hx > x2,
        "ge_mixed": lambda: hx >= x2,
        "sum_half": lambda: hx.sum(),
        "sum_dim_half": lambda: hx.sum(1),
        "mean_half": lambda: hx.mean(1),
        "norm_half": lambda: hx.norm(),
        "var_half": lambda: hx.var(1),
        "std_half": lambda: hx.std(1),
        "amax_half": lambda: hx.amax(1),
        "amin_half": lambda: hx.amin(1),
        "max_half": lambda: hx.max(1),
        "min_half": lambda: hx.min(1),
        "argmax_half": lambda: hx.argmax(1),
        "argmin_half": lambda: hx.argmin(1),
        "cat_mixed": lambda: torch.cat([hx, x2]),
        "stack_mixed": lambda: torch.stack([hx, x2]),
        "cat_half": lambda: torch.cat([hx, hx2]),
        "embedding_f32": lambda: F.embedding(tgt, sq),
        "indexSelect_half": lambda: hx.index_select(0, idx),
        "gather_half": lambda: hx.gather(1, idx2),
        "scatterAdd_half": lambda: hx.scatter_add(1, idx2, hx2[:, :3]),
        "maskedFill_half": lambda: hx.masked_fill(mask, 0.5),
        "tril_half": lambda: hx.tril(),
        "triu_half": lambda: hx.triu(),
        "oneHot": lambda: F.one_hot(tgt, 8),
        "maxPool2d_half": lambda: F.max_pool2d(himg, 2),
        "avgPool2d_half": lambda: F.avg_pool2d(himg, 2),
    }


def main():
    d, dtype = sys.argv[1], torch.bfloat16
    t = load_safetensors(os.path.join(d, "inputs.safetensors"))
    outputs, errors = {}, {}
    with torch.autocast("cpu", dtype=dtype):
        for name, fn in cases(t, lambda a: a.to(dtype)).items():
            try:
                r = fn()
            except Exception as e:  # recorded; the test expects cohort to reject it too
                errors[name] = str(e).splitlines()[0]
                continue
            if isinstance(r, tuple):
                for i, part in enumerate(r):
                    outputs[f"{name}.{i}"] = part
            else:
                outputs[name] = r
    save_safetensors(os.path.join(d, "outputs.safetensors"), outputs)
    with open(os.path.join(d, "errors.json"), "w") as f:
        json.dump(errors, f, indent=1)


if __name__ == "__main__":
    main()
