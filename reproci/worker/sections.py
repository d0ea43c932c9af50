"""The sections of a run record that results.json and the goldens copy: the run's environment
(``process.envinfo``), its attestation of the determinism controls (``determinism.attest``), its
execution identity (``execution``) and the state before its first step (``record``). Declared here,
beside no code that needs torch, so that the host reads them as types at run time
(``results.ModelEntry``) without importing torch; the modules named above write them.

Standard library only.
"""

from __future__ import annotations

from typing import Any, TypedDict


class CpuId(TypedDict):
    """The CPU as /proc/cpuinfo names it (x86 fields, else their ARM counterparts)."""

    vendor: str | None
    family: str | None
    model: str | None
    stepping: str | None
    isa: list[str]  # the ``ISA_FLAGS`` it has


class TorchBuild(TypedDict, total=False):
    """The libraries torch was built with (none of the keys where torch has no ``__config__``)."""

    onednn: str | None
    mkl: str | None
    blas: str | None
    lapack: str | None
    parallel: str | None  # ATen's parallel backend


class Gpu(TypedDict):
    """The GPUs this process sees."""

    count: int
    names: list[str]
    capability: list[str]  # MAJOR.MINOR of each
    driver: str | None  # the NVIDIA driver's version


class Threads(TypedDict):
    intra_op: int
    inter_op: int


class Environment(TypedDict):
    """A run's environment (``environment``): what may change its results."""

    torch: str
    torch_git: str | None
    cuda: str | None
    cudnn: int | None
    nccl: str | None
    hip: str | None
    gpu: Gpu
    device: str
    cpu: str  # the CPU's model name
    cpu_id: CpuId
    cpu_capability: str | None  # the CPU capability ATen dispatches to
    torch_build: TorchBuild
    kernel_env: dict[str, str]  # the kernel-selecting variables that are set (``kernel_env``)
    machine: str
    cpu_count: int | None
    threads: Threads
    python: str
    numpy: str
    env: dict[str, str | None]  # the ``DETERMINISM_VARS``, None where unset
    seed: int
    world_size: int
    project_commit: str | None


class Check(TypedDict):
    """One control as ``attest`` read it back."""

    expected: Any  # the value the control must hold (a description where several are right)
    actual: Any  # the value read in this process
    ok: bool


class Attestation(TypedDict):
    """The determinism controls read back inside a run's process (``attest``): a record's
    ``attestation``, and each of its ``attestations``."""

    strict: bool
    ok: bool  # every check holds
    checks: dict[str, Check]  # by control: PYTHONHASHSEED, intra_op_threads, cudnn_deterministic, ...


class CompileIdentity(TypedDict):
    """What identifies a run's compilation (``Execution.compile``)."""

    source: str  # "harness" (--compile) or "plugin" (the plugin's own compiled model)
    backend: str  # "plugin" where the plugin compiled it
    mode: str | None
    dynamic: bool | None
    fullgraph: bool | None
    inductor: dict[str, bool | None]  # the ``NUMERIC_OPTIONS`` as the run had them


class Execution(TypedDict):
    """A run's execution identity (``execution``): compiled and autocast. None for eager fp32."""

    compile: CompileIdentity | None
    amp: str | None  # "bf16" or "fp16"


class CacheDir(TypedDict):
    """Where a compiled run's caches went (``_set_caches``)."""

    dir: str  # the cache directory's name, in the run's directory
    warm: bool  # it held files before the run
    precompiled_headers: bool  # inductor's precompiled headers were moved into it


class CompileCache(CacheDir):
    """A compiled run's cache facts (``compile_cache``): recorded beside the identity, not in it."""

    options: dict[str, bool | None]  # the ``CACHE_OPTIONS`` as the run had them


class _InductorSwitch(TypedDict):
    deterministic: bool | None  # None: the running torch has no such switch
    ok: bool


class CompileAttestation(_InductorSwitch, total=False):
    """Whether inductor's deterministic switch held to a strict compiled run's end (``compile_attestation``)."""

    note: str  # why it could not be read


class InitialFingerprint(TypedDict):
    """The state before a run's first step (``initial_fingerprint``): step 0, or the resume point."""

    step: int
    names: list[str]  # the tensors, in the row's order
    row: list[int]  # each tensor's checksum
    transient: list[str]  # the non-persistent buffers (``state.transient_buffers``): no checkpoint holds them
