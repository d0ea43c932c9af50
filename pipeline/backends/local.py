"""The local backend: fresh subprocesses of the current Python interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..worker.launch import CPU_ISA_VARS, launch_environment, overridden, worker_command
from ..worker.spec import WorkerSpec
from .base import CODE_ROOT, Backend, BackendOptions, LaunchResult, OnStep, take_line

# Names of the variables the launcher owns; inherited values are dropped first.
_OWNED = ("REPROCI_PARENT_PID", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
          "OPENBLAS_NUM_THREADS", "PYTHONUNBUFFERED",
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets these per rank


class LocalBackend(Backend):
    name = "local"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self._procs: dict[subprocess.Popen[bytes], bool] = {}  # each running worker: under torchrun?
        self._lock = threading.Lock()

    def image_info(self) -> dict[str, Any]:
        return {"name": self.options.image_name, "reference": None, "digest": None, "backend": "local"}

    def environment(self, spec: WorkerSpec) -> dict[str, str]:
        owned = _OWNED + (CPU_ISA_VARS if spec.cpu_isa is not None else ())  # a cap replaces inherited ones
        env = {k: v for k, v in os.environ.items() if k not in owned}
        env.update(launch_environment(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict",
                                      hash_seed=spec.hash_seed, world_size=spec.world_size, cpu_isa=spec.cpu_isa))
        env["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        env["REPROCI_PARENT_PID"] = str(os.getpid())  # the worker dies with this process (worker.__main__)
        return overridden(env, spec.env)

    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float,
               on_step: OnStep | None = None) -> LaunchResult:
        self.refuse_if_closed(spec)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            worker_command(sys.executable, str(spec_file), world_size=spec.world_size),
            env=self.environment(spec),
            cwd=str(spec_file.parent),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: a timeout kills loader workers too
        )
        with self._lock:
            refused = self.closed  # left while this run started: close() will not see it, so stop it here
            if not refused:
                self._procs[proc] = spec.world_size > 1
        if refused:
            _kill_group(proc, torchrun=spec.world_size > 1)
            self.refuse_if_closed(spec)
        tail: deque[str] = deque(maxlen=40)
        reader = threading.Thread(target=_drain, args=(proc, tail, on_step), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc, torchrun=spec.world_size > 1)
        except BaseException:  # Ctrl-C or SIGTERM while waiting: the run must not outlive this process
            _kill_group(proc, torchrun=spec.world_size > 1)
            raise
        finally:
            reader.join(timeout=5)
            with self._lock:
                self._procs.pop(proc, None)
        return LaunchResult(returncode=proc.returncode, seconds=time.monotonic() - t0, timed_out=timed_out,
                            log_tail="\n".join(tail))

    def close(self) -> None:
        with self._lock:
            procs = list(self._procs.items())
        for p, torchrun in procs:
            _kill_group(p, torchrun=torchrun)


def _drain(proc: subprocess.Popen[bytes], tail: deque[str], on_step: OnStep | None) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        take_line(raw.decode("utf-8", "replace").rstrip(), tail, on_step)


def _kill_group(proc: subprocess.Popen[bytes], *, torchrun: bool = False) -> None:
    """Stop a worker and its process group (loader workers too) with SIGKILL. Under torchrun,
    SIGTERM first: torchrun passes it on to its ranks, each of which runs in a session of its
    own, out of the group's reach."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if torchrun else (signal.SIGKILL,):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
