"""The environment fingerprint recorded with every run (hostname-free)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

import numpy as np
import torch

DETERMINISM_VARS = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO",
    "NCCL_PROTO",
)


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


def _gpus() -> dict[str, Any]:
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


def packages() -> dict[str, str]:
    """Installed distributions, name -> version, as the golden's package section."""
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            out[name.lower().replace("_", "-")] = dist.version
    return dict(sorted(out.items()))


def environment(*, seed: int, device: str, project_commit: str | None) -> dict[str, Any]:
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
