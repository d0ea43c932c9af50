"""The environment a launcher sets before the worker's interpreter starts (stdlib only).

Kept apart from ``determinism`` so the orchestrator can build a child's environment
without importing torch.
"""

from __future__ import annotations

import hashlib
import os

CUBLAS_WORKSPACE = ":4096:8"  # what the launcher sets
# The values cuBLAS documents as deterministic (NVIDIA's cuBLAS docs, "Results reproducibility";
# torch's reproducibility notes): either is strict. HF's enable_full_determinism sets ":16:8".
CUBLAS_WORKSPACES = (":4096:8", ":16:8")


# --cpu-isa LEVEL: every switch that caps the CPU kernels torch runs, measured on an AVX512
# host (conv, quick profile): ATen's dispatch alone or oneDNN's alone each gives a third
# hash; both together reproduce an AVX2 host bit for bit. MKL's dispatch is capped too, so
# that no library picks wider kernels than the level.
CPU_ISA_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}
CPU_ISA_CAPABILITY = {"avx2": "AVX2", "avx512": "AVX512"}  # what torch.backends.cpu.get_cpu_capability() says then
CPU_ISA_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def run_temp_dir(spec_file: str | os.PathLike[str], base: str) -> str:
    """The temporary folder of the run of ``spec_file`` under ``base`` (its TMPDIR): the worker
    makes it and points TMPDIR there (``worker.__main__.own_temp_dir``), the launcher removes it
    once the run ends, however it ends. A run killed (Ctrl-C, a timeout) leaves nothing in the
    temporary directory: not even multiprocessing's ``pymp-*`` folder of each loader worker,
    which only a clean exit removes. Named after the spec's path, which both sides know; short,
    since a Unix socket's path inside it (multiprocessing's) has 108 bytes."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(spec_file))).hexdigest()[:16]
    return os.path.join(base, f"reproci-run-{digest}")


def launch_environment(*, seed: int, threads: int, strict: bool, hash_seed: int | None = None,
                       world_size: int = 1, cpu_isa: str | None = None) -> dict[str, str]:
    """Variables a launcher puts in the child's environment before it starts."""
    env = {
        "PYTHONHASHSEED": str(seed if hash_seed is None else hash_seed),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    if strict:
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    if world_size > 1:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one node: gloo's ranks meet on the loopback interface
    if cpu_isa is not None:
        env.update(CPU_ISA_ENV[cpu_isa])
    return env


def overridden(env: dict[str, str], overrides: dict[str, str | None]) -> dict[str, str]:
    """``env`` with a spec's own variables applied last (None removes one): a re-run with the
    golden host's settings."""
    out = dict(env)
    for k, v in overrides.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def torchrun_dir(spec_file: str) -> str:
    """torchrun's own files for a run (its ``--log-dir``: a folder per launch, and each rank's
    error file): ``torchrun/`` beside the spec, in the run directory, so they leave with it.
    Without it torchrun makes a ``torchelastic_*`` folder under the system's temporary
    directory for every launch and never removes it."""
    return os.path.join(os.path.dirname(spec_file), "torchrun")


def worker_command(python: str, spec_file: str, *, world_size: int = 1, script: bool = False) -> list[str]:
    """The command line of one worker run: ``python -m reproci.worker SPEC``, or, above one
    rank, the same module under torchrun (``torch.distributed.run``: one node, ``world_size``
    processes, a free rendezvous port, its files in ``torchrun_dir``), so it works alike on the
    host and in a container. The rendezvous is on the loopback address: a container without a
    network cannot resolve its own host name, which torchrun would otherwise advertise to the ranks."""
    if script:  # a script model: the launcher prepares {out}, then becomes the team's own command
        return [python, "-m", "reproci.worker.script", spec_file]
    worker = ["-m", "reproci.worker", spec_file]
    if world_size <= 1:
        return [python, *worker]
    return [python, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
            f"--nproc-per-node={world_size}", f"--log-dir={torchrun_dir(spec_file)}", *worker]
