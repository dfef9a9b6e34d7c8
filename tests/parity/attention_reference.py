#!/usr/bin/python3
"""PyTorch side of cohort's attention module tests (tests/core/nn/attention_modules_test.cc).

Reads <dir>/cases.json (a list of cases) and <dir>/inputs.safetensors, where case <name> has its
module's state dict under "<name>/param/<key>", its inputs under "<name>/<input>" and the weights
of the scalar loss under "<name>/grad_out" (and "<name>/grad_weights" when attention weights are
returned). Builds the same torch.nn module (float64, training mode, dropout 0), runs it, and
backpropagates loss = sum(out * grad_out) + sum(weights * grad_weights). Writes
<dir>/outputs.safetensors ("<name>/out", "<name>/weights", "<name>/grad/<input>",
"<name>/grad/param/<key>") and <dir>/outputs.json ({"<name>": {"parameters": [names in order]}}).
Runs on Debian's python3-torch (1.13) with /usr/bin/python3.
"""
import json
import sys

import torch
import torch.nn as tnn

from torch_reference import load_safetensors, save_safetensors


def mha(c):
    return tnn.MultiheadAttention(c["embed_dim"], c["num_heads"], dropout=0.0, bias=c["bias"],
                                  add_bias_kv=c["add_bias_kv"], add_zero_attn=c["add_zero_attn"],
                                  kdim=c.get("kdim"), vdim=c.get("vdim"), batch_first=c["batch_first"])


def encoder_layer(c):
    return tnn.TransformerEncoderLayer(c["d_model"], c["nhead"], dim_feedforward=c["dim_feedforward"], dropout=0.0,
                                       activation=c["activation"], layer_norm_eps=c["layer_norm_eps"],
                                       batch_first=c["batch_first"], norm_first=c["norm_first"])


def build(c):
    if c["kind"] == "mha":
        return mha(c)
    if c["kind"] == "layer":
        return encoder_layer(c)
    norm = tnn.LayerNorm(c["d_model"], eps=c["layer_norm_eps"]) if c["final_norm"] else None
    return tnn.TransformerEncoder(encoder_layer(c), c["num_layers"], norm=norm, enable_nested_tensor=False)


def run_case(c, data, out, info):
    name = c["name"]
    model = build(c).double()
    prefix = f"{name}/param/"
    state = {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}
    model.load_state_dict(state, strict=True)
    model.train()
    info[name] = {"parameters": [n for n, _ in model.named_parameters()]}

    def get(key):
        t = data.get(f"{name}/{key}")
        return t.clone().requires_grad_() if t is not None and t.is_floating_point() else t

    grads = {}
    weights = None
    if c["kind"] == "mha":
        q = get("query")
        k, v = (q, q) if c["self"] else (get("key"), get("value"))
        grads = {"query": q} if c["self"] else {"query": q, "key": k, "value": v}
        result, weights = model(q, k, v, key_padding_mask=get("key_padding_mask"), need_weights=c["need_weights"],
                                attn_mask=get("attn_mask"), average_attn_weights=c["average_attn_weights"])
    else:
        src = get("src")
        grads = {"src": src}
        if c["kind"] == "layer":
            result = model(src, src_mask=get("mask"), src_key_padding_mask=get("key_padding_mask"))
        else:
            result = model(src, mask=get("mask"), src_key_padding_mask=get("key_padding_mask"))
    loss = (result * data[f"{name}/grad_out"]).sum()
    out[f"{name}/out"] = result.detach()
    if weights is not None:
        out[f"{name}/weights"] = weights.detach()
        loss = loss + (weights * data[f"{name}/grad_weights"]).sum()
    loss.backward()
    for key, t in grads.items():
        out[f"{name}/grad/{key}"] = t.grad
    for n, p in model.named_parameters():
        out[f"{name}/grad/param/{n}"] = p.grad


def main(d):
    torch.set_num_threads(1)
    with open(f"{d}/cases.json") as f:
        cases = json.load(f)
    data = load_safetensors(f"{d}/inputs.safetensors")
    out, info = {}, {}
    for c in cases:
        run_case(c, data, out, info)
    save_safetensors(f"{d}/outputs.safetensors", out)
    with open(f"{d}/outputs.json", "w") as f:
        json.dump(info, f)


if __name__ == "__main__":
    main(sys.argv[1])
