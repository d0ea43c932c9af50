"""The environment a launcher sets before the worker's interpreter starts (stdlib only).

Kept apart from ``determinism`` so the orchestrator can build a child's environment
without importing torch.
"""

from __future__ import annotations

CUBLAS_WORKSPACE = ":4096:8"  # what the launcher sets
# The values cuBLAS documents as deterministic (NVIDIA's cuBLAS docs, "Results reproducibility";
# torch's reproducibility notes): either is strict. HF's enable_full_determinism sets ":16:8".
CUBLAS_WORKSPACES = (":4096:8", ":16:8")


def launch_environment(*, seed: int, threads: int, strict: bool, hash_seed: int | None = None,
                       world_size: int = 1) -> dict[str, str]:
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
    return env


def worker_command(python: str, spec_file: str, *, world_size: int = 1) -> list[str]:
    """The command line of one worker run: ``python -m pipeline.worker SPEC``, or, above one
    rank, the same module under torchrun (``torch.distributed.run``: one node, ``world_size``
    processes, a free rendezvous port), so it works alike on the host and in a container. The
    rendezvous is on the loopback address: a container without a network cannot resolve its
    own host name, which torchrun would otherwise advertise to the ranks."""
    worker = ["-m", "pipeline.worker", spec_file]
    if world_size <= 1:
        return [python, *worker]
    return [python, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
            f"--nproc-per-node={world_size}", *worker]
