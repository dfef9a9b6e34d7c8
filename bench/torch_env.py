"""Environment for the PyTorch side of cohort's benches: import this before torch.

OpenBLAS reads OPENBLAS_CORETYPE when it is loaded, so it must be set before `import torch`.
cohort's BLAS loader (core/blas/blas.cc) picks the same kernels, so both sides run the same GEMM.
"""
import os


def openblas_core_type():
    """The OpenBLAS kernel family cohort's loader picks on this CPU ("" when none applies)."""
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line
                break
    if " avx512f" in flags and " avx512bw" in flags:
        return "CooperLake" if " avx512_bf16" in flags else "SkylakeX"
    return "Haswell" if " avx2" in flags else ""


if "OPENBLAS_CORETYPE" not in os.environ and openblas_core_type():
    os.environ["OPENBLAS_CORETYPE"] = openblas_core_type()
