"""What an environment is made of, and how two differ: the keys of the environment
fingerprint that name a toolchain or a host, and the package versions inside an image.
Both the golden store (may models recorded apart share one file?) and the drift verdict
(why did the hashes move?) decide with these."""

from __future__ import annotations

from typing import Any, Mapping

# Toolchain fields of the environment fingerprint: a difference is an upgrade.
TOOLCHAIN_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "hip", "python", "numpy",
                  "torch_build.onednn", "torch_build.mkl", "torch_build.blas", "torch_build.parallel")
# Host fields: a difference with the same toolchain is an environment change. The variables
# that select kernels (``kernel_env``, only those set) are host fields too, key by key.
HOST_KEYS = ("gpu.names", "gpu.count", "gpu.driver", "gpu.capability", "threads.intra_op", "threads.inter_op",
             "world_size", "env.NCCL_ALGO", "env.NCCL_PROTO", "cpu_capability", "cpu_id.isa", "cpu_id.vendor",
             "cpu_id.family", "cpu_id.model", "cpu_id.stepping", "cpu", "machine", "device")
# How a host field reads in a sentence, where its key does not ("world size 4 → 2").
HOST_LABELS = {"world_size": "world size", "env.NCCL_ALGO": "NCCL_ALGO", "env.NCCL_PROTO": "NCCL_PROTO",
               "cpu_capability": "CPU capability (ATen)", "cpu_id.isa": "CPU instruction set",
               "cpu_id.vendor": "CPU vendor", "cpu_id.family": "CPU family", "cpu_id.model": "CPU model number",
               "cpu_id.stepping": "CPU stepping", "cpu": "CPU", "threads.intra_op": "threads",
               "threads.inter_op": "inter-op threads", "gpu.names": "GPU", "gpu.driver": "driver",
               "gpu.capability": "GPU compute capability", "gpu.count": "GPU count"}
# Which host factors are the likely cause first, per device: what picks the kernels, then the
# hardware that offers them. (Within a rank, a key not listed keeps its HOST_KEYS place.)
_LIKELY = {"cpu": ("cpu_capability", "kernel_env", "cpu_id.isa", "threads.intra_op", "threads.inter_op",
                   "world_size", "env.", "cpu_id", "cpu", "machine"),
           "cuda": ("gpu.names", "gpu.capability", "kernel_env", "gpu.driver", "world_size", "env.", "gpu.count",
                    "threads.intra_op", "cpu_capability", "cpu_id.isa")}


def host_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, device: str | None) -> dict[str, list[Any]]:
    """Every host factor that differs, the likely causes first: the fixed host fields and
    each kernel-selecting variable set on either side (``kernel_env.NAME``)."""
    out = diff_keys(old, new, HOST_KEYS)
    ko, kn = _get(old, "kernel_env") or {}, _get(new, "kernel_env") or {}
    for k in sorted(set(ko) | set(kn)):
        if ko.get(k) != kn.get(k):
            out[f"kernel_env.{k}"] = [ko.get(k), kn.get(k)]
    order = _LIKELY["cuda" if str(device or "").startswith("cuda") else "cpu"]

    def rank(key: str) -> tuple[int, int]:
        hit = next((i for i, p in enumerate(order) if key == p or key.startswith(p + ".") or
                    (p.endswith(".") and key.startswith(p))), len(order))
        return hit, HOST_KEYS.index(key) if key in HOST_KEYS else 0

    return dict(sorted(out.items(), key=lambda kv: rank(kv[0])))


def host_text(key: str, old: Any, new: Any) -> str:
    """One host factor for a sentence: 'CPU capability (ATen) AVX2 → AVX512',
    'CPU instruction set +avx512f +avx512bw', 'ATEN_CPU_CAPABILITY avx2 → (unset)'."""
    if key == "cpu_id.isa" and isinstance(old, list) and isinstance(new, list):
        added, lost = [f for f in new if f not in old], [f for f in old if f not in new]
        return "CPU instruction set " + " ".join([*(f"+{f}" for f in added[:4]), *(f"-{f}" for f in lost[:4])]) + (
            " …" if len(added) > 4 or len(lost) > 4 else "")
    label = key.removeprefix("kernel_env.") if key.startswith("kernel_env.") else HOST_LABELS.get(key, key)

    def show(v: Any) -> str:
        return "(not recorded)" if v is None and not key.startswith("kernel_env.") else "(unset)" if v is None else str(v)
    return f"{label} {show(old)} → {show(new)}"


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


def split_packages(diff: Mapping[str, list[Any]]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """A package diff as (packages that can change results, the others)."""
    relevant = {k: v for k, v in diff.items() if affects_results(k)}
    return relevant, {k: v for k, v in diff.items() if k not in relevant}
