"""Determinism controls: one function that sets them, one that attests them.

``make_deterministic`` must run before any CUDA work. The launcher has already set
``PYTHONHASHSEED``, ``CUBLAS_WORKSPACE_CONFIG`` and the thread-count variables in the
process environment before the interpreter started (they are read at start-up).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from .process.launch import CPU_ISA_CAPABILITY, CUBLAS_WORKSPACE, CUBLAS_WORKSPACES, launch_environment  # noqa: F401
from .sections import Attestation, Check

# torch's fp32_precision tree (torch >= 2.9), each node above the nodes under it: setting a node
# sets those under it (and "cudnn" sets "cuda.matmul" too), so a full restore goes in this order.
_PRECISION_NODES = ("", "cudnn", "cuda.matmul", "cudnn.conv", "cudnn.rnn",
                    "mkldnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _precision_node(path: str) -> Any:
    node: Any = torch.backends
    for part in filter(None, path.split(".")):
        node = getattr(node, part, None)
    return node if hasattr(node, "fp32_precision") else None


def _tf32_off() -> None:
    """TF32 off everywhere, through both of torch's APIs, so that both read back "off".

    The legacy flags go first: ``set_float32_matmul_precision("highest")`` for the matmuls of
    cuBLAS and oneDNN both (``cuda.matmul.allow_tf32 = False`` leaves oneDNN's as it was: a process
    that had asked for "high" kept TF32 in oneDNN's matmul, and ``torch.get_float32_matmul_precision()``,
    which Lightning reads, raised "mix of the legacy and new APIs"), then ``cudnn.allow_tf32``.
    Then every node of the new ``fp32_precision`` API: a node left as it was beside one set would
    make torch refuse the legacy getters (``torch._C._get_cudnn_allow_tf32()`` raises "cuDNN conv
    and cuDNN RNN have different TF32 flags"), and with it ``torch.backends.cudnn.flags(...)``,
    which library code uses (the CTC loss of transformers).
    """
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    for path in _PRECISION_NODES:
        node = _precision_node(path)
        if node is not None:  # torch >= 2.9
            node.fp32_precision = "ieee"


@dataclass(frozen=True)
class PrecisionFlags:
    """Every TF32 flag, as both APIs read it; a legacy one that torch refuses to read (the process
    set the two APIs to disagree) is None."""

    float32_matmul_precision: str | None  # torch.get_float32_matmul_precision()
    cudnn_allow_tf32: bool | None  # torch.backends.cudnn.allow_tf32
    nodes: dict[str, str]  # fp32_precision of each node of the new API (torch >= 2.9), by path


def _precision_flags() -> PrecisionFlags:
    """Every TF32 flag as it reads now (``PrecisionFlags``)."""
    try:
        matmul: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:
        matmul = None
    try:
        cudnn: bool | None = torch.backends.cudnn.allow_tf32
    except RuntimeError:
        cudnn = None
    nodes: dict[str, str] = {}
    for path in _PRECISION_NODES:
        node = _precision_node(path)
        if node is not None:
            nodes[path] = node.fp32_precision
    return PrecisionFlags(matmul, cudnn, nodes)


def _restore_precision(flags: PrecisionFlags) -> None:
    """Set back what ``_precision_flags`` read: the legacy flags first, then the new API's nodes
    from the root down, so that every node ends as it was and both APIs read as before."""
    if flags.float32_matmul_precision is not None:
        torch.set_float32_matmul_precision(flags.float32_matmul_precision)
    if flags.cudnn_allow_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = flags.cudnn_allow_tf32
    for path in _PRECISION_NODES:
        node = _precision_node(path)
        if node is not None and path in flags.nodes:
            node.fp32_precision = flags.nodes[path]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device


def make_deterministic(*, seed: int, threads: int, strict: bool = True, bookkeeping: bool = False,
                       warn_only: bool = False) -> None:
    """Seed every RNG and switch on every determinism control (or leave defaults).

    ``bookkeeping`` (with ``strict=False``): only the cheap fixes, seeds and environment
    variables; no deterministic kernels, no benchmark mode, the image's default precision.
    ``warn_only`` (the op audit): strict, but an op without a deterministic kernel warns.
    The cuBLAS workspace variable is read when the first cuBLAS handle is made, so setting
    it here, before any CUDA work, still takes effect.
    """
    seed_everything(seed)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # fails once inter-op work has started
        torch.set_num_interop_threads(1)
    if strict:
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        _tf32_off()
        if hasattr(torch.utils, "deterministic"):
            torch.utils.deterministic.fill_uninitialized_memory = True
    elif bookkeeping:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = False
        torch.use_deterministic_algorithms(False)
    else:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = False
        torch.use_deterministic_algorithms(False)


def _fp32_precision() -> str:
    if hasattr(torch.backends, "fp32_precision"):
        return str(torch.backends.cuda.matmul.fp32_precision)
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _cudnn_tf32() -> str:
    if hasattr(torch.backends, "fp32_precision"):
        p = torch.backends.cudnn.conv.fp32_precision
        return "ieee" if p == "ieee" else str(p)
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


def _legacy_cudnn_tf32() -> bool | str:
    """The legacy getter that ``torch.backends.cudnn.flags`` reads: it must keep working."""
    try:
        return bool(torch._C._get_cudnn_allow_tf32())
    except RuntimeError as e:
        return f"unreadable: {str(e).split(',')[0]}"




def attest(*, seed: int, threads: int, strict: bool, bookkeeping: bool = False, warn_only: bool = False,
           hash_seed: int | None = None, cpu_isa: str | None = None) -> Attestation:
    """Read back, inside this process, whether the controls took effect."""
    checks: dict[str, Check] = {}

    def check(name: str, expected: Any, actual: Any) -> None:
        checks[name] = {"expected": expected, "actual": actual, "ok": expected == actual}

    def check_cublas() -> None:
        actual = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        checks["CUBLAS_WORKSPACE_CONFIG"] = {"expected": " or ".join(CUBLAS_WORKSPACES) + " (both are deterministic)",
                                             "actual": actual, "ok": actual in CUBLAS_WORKSPACES}

    hashes = str(seed if hash_seed is None else hash_seed)
    check("PYTHONHASHSEED", hashes, os.environ.get("PYTHONHASHSEED"))
    check("hash_randomization_off", True, sys.flags.hash_randomization == 0 or os.environ.get("PYTHONHASHSEED") == hashes)
    check("intra_op_threads", threads, torch.get_num_threads())
    if cpu_isa is not None:  # --cpu-isa: ATen dispatches to that level (a CPU without it cannot)
        check("cpu_capability", CPU_ISA_CAPABILITY[cpu_isa], str(torch.backends.cpu.get_cpu_capability()))
    if strict:
        check_cublas()
        check("deterministic_algorithms", True, torch.are_deterministic_algorithms_enabled())
        check("deterministic_algorithms_warn_only", warn_only, torch.is_deterministic_algorithms_warn_only_enabled())
        check("cudnn_deterministic", True, bool(torch.backends.cudnn.deterministic))
        check("cudnn_benchmark", False, bool(torch.backends.cudnn.benchmark))
        check("matmul_fp32_precision", "ieee", _fp32_precision())
        check("cudnn_fp32_precision", "ieee", _cudnn_tf32())
        check("cudnn_legacy_allow_tf32", False, _legacy_cudnn_tf32())
        if hasattr(torch.utils, "deterministic"):
            check("fill_uninitialized_memory", True, bool(torch.utils.deterministic.fill_uninitialized_memory))
    elif bookkeeping:
        check_cublas()
        check("deterministic_algorithms", False, torch.are_deterministic_algorithms_enabled())
        check("cudnn_benchmark", False, bool(torch.backends.cudnn.benchmark))
    return {"strict": strict, "ok": all(c["ok"] for c in checks.values()), "checks": checks}


@contextlib.contextmanager
def deterministic_mode(*, seed: int = 0, threads: int = 1, strict: bool = True) -> Iterator[None]:
    """make_deterministic for the duration of a block, restoring what was there (tests)."""
    saved = {
        "threads": torch.get_num_threads(),
        "det": torch.are_deterministic_algorithms_enabled(),
        "warn": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_det": torch.backends.cudnn.deterministic,
        "cudnn_bench": torch.backends.cudnn.benchmark,
        "precision": _precision_flags(),
        "fill": getattr(getattr(torch.utils, "deterministic", None), "fill_uninitialized_memory", None),
        "rng": torch.get_rng_state(),
    }
    try:
        make_deterministic(seed=seed, threads=threads, strict=strict)
        yield
    finally:
        torch.set_num_threads(saved["threads"])
        torch.use_deterministic_algorithms(saved["det"], warn_only=saved["warn"])
        torch.backends.cudnn.deterministic = saved["cudnn_det"]
        torch.backends.cudnn.benchmark = saved["cudnn_bench"]
        _restore_precision(saved["precision"])
        if saved["fill"] is not None:
            torch.utils.deterministic.fill_uninitialized_memory = saved["fill"]
        torch.set_rng_state(saved["rng"])
