"""What an environment is made of, and how two differ: the keys of the environment
fingerprint that name a toolchain or a host, and the package versions inside an image.
Both the golden store (may models recorded apart share one file?) and the drift verdict
(why did the hashes move?) decide with these."""

from __future__ import annotations

from typing import Any, Mapping

# Toolchain fields of the environment fingerprint: a difference is an upgrade.
TOOLCHAIN_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "hip", "python", "numpy")
# Host fields: a difference with the same toolchain is an environment change.
HOST_KEYS = ("gpu.names", "gpu.count", "gpu.driver", "gpu.capability", "threads.intra_op", "threads.inter_op",
             "world_size", "env.NCCL_ALGO", "env.NCCL_PROTO", "cpu", "machine", "device")
# How a host field reads in a sentence, where its key does not ("world size 4 → 2").
HOST_LABELS = {"world_size": "world size", "env.NCCL_ALGO": "NCCL_ALGO", "env.NCCL_PROTO": "NCCL_PROTO"}


def _get(d: Mapping[str, Any] | None, dotted: str) -> Any:
    cur: Any = d or {}
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def diff_keys(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, list[Any]]:
    return {k: [_get(old, k), _get(new, k)] for k in keys if _get(old, k) != _get(new, k)}


def package_diff(old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> dict[str, list[Any]]:
    old, new = old or {}, new or {}
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


# Distributions whose version can change training results: torch and its CUDA libraries,
# the numerics underneath, the compilers. Others (pytest, linters, reproci itself) are
# listed apart, so a package diff leads with what matters.
_RESULT_PREFIXES = ("torch", "pytorch-", "nvidia-", "cuda-", "triton", "numpy", "scipy", "mkl", "intel-",
                    "onednn", "tbb", "jax", "flash-attn", "xformers", "apex", "transformer-engine", "deepspeed",
                    "accelerate", "transformers", "timm", "opt-einsum")


def affects_results(package: str) -> bool:
    return package.lower().startswith(_RESULT_PREFIXES)


def split_packages(diff: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A package diff as (packages that can change results, the others)."""
    relevant = {k: v for k, v in diff.items() if affects_results(k)}
    return relevant, {k: v for k, v in diff.items() if k not in relevant}
