"""The OpenBLAS kernels `rlx` itself runs on this CPU, for the Python peers of its benchmarks.

OpenBLAS picks its kernels by CPU model when it loads. Debian 12's 0.3.21 does not know some
newer CPUs (Intel family 6 model 207) and falls back to its generic Prescott kernels; `rlx`
then re-executes itself with OPENBLAS_CORETYPE set from the CPU's features
(src/core/threads.cpp, prepare_blas). A peer that compares its speed with
rlx's must run the same kernels: import this module before torch.

    import blas_kernels  # noqa: F401  (may re-execute this script once)
    import torch
"""
import ctypes, os, sys


def _core_for_this_cpu():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


if "OPENBLAS_CORETYPE" not in os.environ:
    try:
        blas = ctypes.CDLL("libopenblas.so.0")
        blas.openblas_get_corename.restype = ctypes.c_char_p
        detected = blas.openblas_get_corename().decode()
    except OSError:
        detected = ""
    core = _core_for_this_cpu() if detected == "Prescott" else None
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
        os.execv(sys.executable, [sys.executable] + sys.argv)
