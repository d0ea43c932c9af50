"""The environment fingerprint recorded with every run (hostname-free).

Beside the toolchain (torch, CUDA, cuDNN, NCCL, Python, numpy) it records what selects the
kernels a run executes, since that changes results as surely as an upgrade: the CPU
capability ATen dispatches to (``torch.backends.cpu.get_cpu_capability()``), the CPU's
instruction-set features that matter (AVX2, the AVX512 families, AMX, ...), its vendor,
family, model and stepping as the OS reports them, the math libraries torch was built with
(oneDNN, MKL, BLAS, the threading library), and every environment variable known to change
kernels or numerics (``kernel_env``: only those that are set).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re

import numpy as np
import torch

from ..sections import CpuId, Environment, Gpu, TorchBuild

DETERMINISM_VARS = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO",
    "NCCL_PROTO",
)


# Environment variables that select kernels or change numerics: exact names, and prefixes.
# (Thread counts are recorded as ``threads`` and ``env``; paths, such as a cache directory,
# select no kernel and are left out.)
KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
               "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "OPENBLAS_CORETYPE", "KMP_AFFINITY",
               "GOMP_CPU_AFFINITY", "FLASH_ATTENTION_DETERMINISTIC", "TORCH_CUDNN_V8_API_DISABLED")
KERNEL_PREFIXES = ("ONEDNN_", "DNNL_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NCCL_", "TORCHINDUCTOR_", "TORCH_NCCL_")
_PATHS = ("_DIR", "_PATH", "_FILE")
# CPU features whose presence changes which kernels ATen, oneDNN and MKL pick.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512ifma", "avx512vbmi", "amx_tile", "amx_bf16",
             "amx_int8", "amx_fp16", "asimd", "sve", "sve2", "bf16", "i8mm")


def kernel_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel-selecting variables that are set, sorted by name."""
    environ = dict(os.environ) if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if (k in KERNEL_VARS or k.startswith(KERNEL_PREFIXES)) and not k.endswith(_PATHS)}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out







def cpu_identity() -> CpuId:
    """Vendor, family, model, stepping and the ISA features that matter, as the OS reports them."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {"vendor": info.get("vendor_id") or info.get("CPU implementer"),
            "family": info.get("cpu family") or info.get("CPU architecture"),
            "model": info.get("model") or info.get("CPU part"),
            "stepping": info.get("stepping") or info.get("CPU revision"),
            "isa": [f for f in ISA_FLAGS if f in flags]}


def _capability() -> str | None:
    cpu = getattr(torch.backends, "cpu", None)
    try:
        return str(cpu.get_cpu_capability()) if cpu is not None else None
    except Exception:  # an older torch
        return None


def torch_build() -> TorchBuild:
    """The math libraries and threading torch was built with (from ``torch.__config__``)."""
    try:
        text = torch.__config__.show()
        parallel = torch.__config__.parallel_info()
    except Exception:  # a torch without __config__
        return {}

    def find(pattern: str, source: str = text) -> str | None:
        m = re.search(pattern, source)
        return m.group(1).strip() if m else None

    return {"onednn": find(r"MKL-DNN v([\w.]+)"), "mkl": find(r"Math Kernel Library Version ([\w.]+)"),
            "blas": find(r"BLAS_INFO=(\w+)"), "lapack": find(r"LAPACK_INFO=(\w+)"),
            "parallel": find(r"ATen parallel backend: ([^\n]+)", parallel)}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    for token in first.split():
        if token.count(".") >= 1 and token.replace(".", "").isdigit():
            return token
    return first.strip() or None


def _gpus() -> Gpu:
    if not torch.cuda.is_available():
        return {"count": 0, "names": [], "driver": None, "capability": []}
    count = torch.cuda.device_count()
    return {
        "count": count,
        "names": [torch.cuda.get_device_name(i) for i in range(count)],
        "capability": [".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(count)],
        "driver": _nvidia_driver(),
    }


def _nccl() -> str | None:
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # NCCL missing from a CPU or ROCm build
        return None
    return None


_PACKAGES: dict[str, str] | None = None  # read once per process: a fork server's children inherit it


def packages() -> dict[str, str]:
    """Installed distributions, name -> version, as the golden's package section. Reading
    every distribution's metadata takes about a second; it is read once per process, and a
    fork server reads it before forking (it lives for one ``reproci run``, in which the
    image's packages cannot change), so its runs only copy it."""
    global _PACKAGES
    if _PACKAGES is None:
        out: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = (dist.metadata.get_all("Name") or [None])[0]
            if name:
                out[name.lower().replace("_", "-")] = dist.version
        _PACKAGES = dict(sorted(out.items()))
    return dict(_PACKAGES)


def environment(*, seed: int, device: str, project_commit: str | None) -> Environment:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": _nccl(),
        "hip": getattr(torch.version, "hip", None),
        "gpu": _gpus(),
        "device": device,
        "cpu": _cpu_model(),
        "cpu_id": cpu_identity(),
        "cpu_capability": _capability(),
        "torch_build": torch_build(),
        "kernel_env": kernel_env(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
        "python": platform.python_version(),
        "numpy": np.__version__,
        "env": {k: os.environ.get(k) for k in DETERMINISM_VARS},
        "seed": seed,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "project_commit": project_commit,
    }
