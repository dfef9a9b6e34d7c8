#!/usr/bin/python3
"""PyTorch side of the GradScaler tests (tests/core/amp/grad_scaler_test.cc).

Usage: grad_scaler_reference.py <dir>. Reads <dir>/config.json and writes <dir>/torch_out.json.

The scaler is PyTorch 1.13's own torch.cuda.amp.GradScaler class: its unscale_, step, update,
state and per-optimizer bookkeeping run unchanged. That class needs CUDA for four things, which
this script supplies on the CPU:
  - the CUDA check in its constructor (torch.cuda.amp.grad_scaler.amp_definitely_not_available),
    which would disable it, is answered "available";
  - _MultiDeviceReplicator, which asserts CUDA tensors, is replaced by PyTorch's own CPU-capable
    subclass from torch.distributed.fsdp.sharded_grad_scaler when that imports, else by the same
    class without the assertion;
  - the two CUDA-only kernels are written here in Python from their documented semantics:
      torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale): every grad is
        multiplied by inv_scale in place (in float32, float64 for float64 grads, stored in the
        grad's dtype) and found_inf becomes 1 if any grad held an inf or NaN;
      torch._amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
        growth_interval): if found_inf, scale *= backoff_factor and the tracker is reset to 0;
        else the tracker counts up, and when it reaches growth_interval the scale is multiplied by
        growth_factor (kept only if finite) and the tracker is reset to 0; products are taken in
        double and stored in the float32 scale tensor;
  - GradScaler refuses float16 gradients; like ShardedGradScaler, this script lets it unscale them;
  - GradScaler.scale asserts a CUDA tensor, so the loss is scaled here as the class does it
    (loss * the float32 scale tensor), cast back to the loss's dtype as ShardedGradScaler does.

Cases in config["cases"]:
  {"kind": "train", ...}: a parameter vector p (dtype "float32" or "float16"), loss = sum(p * x_k)
    on step k, SGD, and inf/NaN written into gradient element 0 after backward at listed steps.
    Reports per step: whether the optimizer stepped, the scale and growth tracker after update(),
    and p.
  {"kind": "clip", ...}: gradients given already scaled; unscale_ then clip_grad_norm_. Reports
    the gradients and the total norm.
"""
import json
import math
import sys

import torch
import torch.cuda.amp.grad_scaler as gs

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _check_and_unscale(grads, found_inf, inv_scale):
    inv = inv_scale.item()
    for g in grads:
        compute = torch.float64 if g.dtype == torch.float64 else torch.float32
        v = g.to(compute)
        if not bool(torch.isfinite(v).all()):
            found_inf.fill_(1.0)
        g.copy_(v * torch.tensor(inv, dtype=compute))


def _update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    if found_inf.item() > 0:
        scale.fill_(scale.item() * backoff_factor)
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker.item()) + 1
        if successful == growth_interval:
            grown = torch.tensor(scale.item() * growth_factor, dtype=torch.float32)
            if bool(torch.isfinite(grown)):
                scale.copy_(grown)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


def _install_cpu_support():
    gs.amp_definitely_not_available = lambda: False
    try:
        from torch.distributed.fsdp.sharded_grad_scaler import _GeneralMultiDeviceReplicator as replicator
    except Exception:  # a build without torch.distributed
        class replicator(gs._MultiDeviceReplicator):
            def __init__(self, master_tensor):
                self.master = master_tensor
                self._per_device_tensors = {}
    gs._MultiDeviceReplicator = replicator
    torch._amp_foreach_non_finite_check_and_unscale_ = _check_and_unscale
    torch._amp_update_scale_ = _update_scale


def make_scaler(case):
    scaler = gs.GradScaler(init_scale=case["init_scale"], growth_factor=case["growth_factor"],
                           backoff_factor=case["backoff_factor"], growth_interval=case["growth_interval"])
    assert scaler.is_enabled()
    # GradScaler refuses float16 gradients (it expects float32 master gradients); cohort's scaler
    # unscales them in float32, as PyTorch's ShardedGradScaler does by passing allow_fp16=True.
    unscale_grads = scaler._unscale_grads_
    scaler._unscale_grads_ = lambda opt, inv_scale, found_inf, allow_fp16: unscale_grads(opt, inv_scale, found_inf, True)
    return scaler


def scale_loss(scaler, loss):
    if scaler._scale is None:
        scaler._lazy_init_scale_growth_tracker(loss.device)
    return (loss * scaler._scale).type(loss.dtype)


def run_train(case):
    dt = DTYPES[case["dtype"]]
    p = torch.tensor(case["init"], dtype=dt).requires_grad_()
    opt = torch.optim.SGD([p], lr=case["lr"], momentum=case["momentum"])
    scaler = make_scaler(case)
    forced = {int(k): v for k, v in case["forced"].items()}
    out = {"stepped": [], "scales": [], "trackers": [], "params": []}
    for k, x in enumerate(case["xs"]):
        opt.zero_grad(set_to_none=True)
        loss = (p * torch.tensor(x, dtype=dt)).sum()
        scale_loss(scaler, loss).backward()
        if k in forced:
            with torch.no_grad():
                p.grad[0] = math.inf if forced[k] == "inf" else math.nan
        scaler.step(opt)
        found = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
        scaler.update()
        out["stepped"].append(found == 0)
        out["scales"].append(scaler.get_scale())
        out["trackers"].append(scaler._get_growth_tracker())
        out["params"].append(p.detach().double().tolist())
    out["state_dict"] = scaler.state_dict()
    return out


def run_clip(case):
    params, grads = [], []
    for values, has_grad in zip(case["grads"], case["has_grad"]):
        p = torch.zeros(len(values), requires_grad=True)
        if has_grad:
            p.grad = torch.tensor(values, dtype=torch.float32)
        params.append(p)
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = make_scaler(case)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.unscale_(opt)
    total = torch.nn.utils.clip_grad_norm_(params, case["max_norm"], norm_type=case["norm_type"])
    for p in params:
        grads.append(p.grad.double().tolist() if p.grad is not None else None)
    return {"grads": grads, "total_norm": float(total)}


def main():
    d = sys.argv[1]
    with open(f"{d}/config.json") as f:
        config = json.load(f)
    _install_cpu_support()
    torch.manual_seed(0)
    results = []
    for case in config["cases"]:
        if case["kind"] == "train":
            results.append(run_train(case))
        elif case["kind"] == "clip":
            results.append(run_clip(case))
        else:
            raise ValueError(f"unknown case kind {case['kind']}")
    with open(f"{d}/torch_out.json", "w") as f:
        json.dump({"torch_version": torch.__version__, "results": results}, f)


if __name__ == "__main__":
    main()
