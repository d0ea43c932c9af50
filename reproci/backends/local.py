"""The local backend: fresh processes of the current Python interpreter, forked by default
from a preloaded server per launch environment (``forking``), else started with
``subprocess``."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from ..errors import InfrastructureError
from ..results import Image
from ..worker.process.launch import CPU_ISA_VARS, launch_environment, overridden, run_temp_dir, worker_command
from ..worker.process.spec import WorkerSpec
from .base import CODE_ROOT, Backend, BackendOptions, Launch, LaunchResult, OnStart, OnStep, take_line
from .forking import ForkedRun, ServerFailed, fresh_reason, kill_process_group
from .forkpool import ForkServers

# Names of the variables the launcher owns; inherited values are dropped first.
_OWNED = ("REPROCI_PARENT_PID", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
          "OPENBLAS_NUM_THREADS", "PYTHONUNBUFFERED",
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets these per rank


def given_pythonpath() -> list[str]:
    """This process's ``PYTHONPATH`` as its own interpreter read it: each entry made absolute
    against the working directory (an empty one is that directory), so that a worker, which
    starts in a folder of its own, finds the modules ``PYTHONPATH=.`` found here."""
    given = os.environ.get("PYTHONPATH")
    return [os.path.abspath(p or os.curdir) for p in given.split(os.pathsep)] if given else []


class LocalBackend(Backend):
    name = "local"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self._procs: dict[subprocess.Popen[bytes] | ForkedRun, bool] = {}  # each running worker: under torchrun?
        self._lock = threading.Lock()
        self._temps: set[Path] = set()  # the temporary folders of the runs under way (``run_temp_dir``)
        self.servers = ForkServers(options.fork_servers) if options.fork_server is not False else None

    def image_info(self) -> Image:
        return {"name": self.options.image_name, "reference": None, "digest": None, "backend": "local"}

    def environment(self, spec: WorkerSpec) -> dict[str, str]:
        owned = _OWNED + (CPU_ISA_VARS if spec.cpu_isa is not None else ())  # a cap replaces inherited ones
        env = {k: v for k, v in os.environ.items() if k not in owned}
        env.update(launch_environment(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict",
                                      hash_seed=spec.hash_seed, world_size=spec.world_size, cpu_isa=spec.cpu_isa))
        # This interpreter's reproci: an install's site-packages, or a checkout's root, which holds reproci/.
        # A plugin's folder goes before it in the worker (contract.load_factory): a user's own
        # `pipeline` package wins.
        env["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT), *given_pythonpath()])
        env["REPROCI_PARENT_PID"] = str(os.getpid())  # the worker dies with this process (worker.__main__)
        return overridden(env, spec.env)

    def launch(self, spec: WorkerSpec, spec_file: Path, *, timeout: float,
               on_step: OnStep | None = None, on_start: OnStart | None = None) -> LaunchResult:
        self.refuse_if_closed(spec)
        t0 = time.monotonic()
        env = self.environment(spec)
        temp = Path(run_temp_dir(spec_file, env.get("TMPDIR") or tempfile.gettempdir()))  # the worker makes it
        with self._lock:
            self._temps.add(temp)
        try:
            proc, launch = self._start(spec, spec_file, env)
            return self._wait(proc, launch, spec, t0, timeout=timeout, on_step=on_step, on_start=on_start)
        finally:  # however the run ended: its loader workers' pymp-* folders too, where it was killed
            shutil.rmtree(temp, ignore_errors=True)
            with self._lock:
                self._temps.discard(temp)

    def _wait(self, proc: subprocess.Popen[bytes] | ForkedRun, launch: Launch, spec: WorkerSpec, t0: float, *,
              timeout: float, on_step: OnStep | None, on_start: OnStart | None) -> LaunchResult:
        if on_start is not None:
            on_start(getattr(proc, "started", None))  # a forked run's own clock: this thread may have waited
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
        returncode = -signal.SIGKILL if proc.returncode is None else proc.returncode  # as forking.follow has it
        return LaunchResult(returncode=returncode, seconds=time.monotonic() - t0, timed_out=timed_out,
                            log_tail="\n".join(tail), launch=launch)

    def _start(self, spec: WorkerSpec, spec_file: Path,
               env: dict[str, str]) -> tuple[subprocess.Popen[bytes] | ForkedRun, Launch]:
        """The run's process, forked where a server can give it what a fresh interpreter would,
        and how it started ({"mode": "forked"} or {"mode": "fresh", "why": ...})."""
        why = ("a script model's command starts its own interpreter" if spec.script is not None
               else "--no-fork-server" if self.servers is None else fresh_reason(env, world_size=spec.world_size))
        if why is None and self.servers is not None:
            try:
                key, make = self.servers.local(sys.executable, env, CODE_ROOT)
                return self.servers.start(key, make, spec_file, spec_file.parent), {"mode": "forked"}
            except ServerFailed as e:
                self.refuse_if_closed(spec)  # the servers went with the backend (Ctrl-C): no warning, no fresh run
                why = f"the fork server failed: {e}"
                if why not in self.servers.warned:
                    self.servers.warned.add(why)
                    print(f"warning: {why}; runs with this environment start as fresh processes", file=sys.stderr)
        proc = subprocess.Popen(
            worker_command(sys.executable, str(spec_file), world_size=spec.world_size, script=spec.script is not None),
            env=env,
            cwd=str(spec_file.parent),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: a timeout kills loader workers too
        )
        return proc, {"mode": "fresh", "why": why}

    def close(self) -> None:
        with self._lock:
            procs = list(self._procs.items())
        for p, torchrun in procs:
            _kill_group(p, torchrun=torchrun)
        with self._lock:
            temps = list(self._temps)
        for temp in temps:  # now, not by the launching threads: this process may end first (Ctrl-C)
            shutil.rmtree(temp, ignore_errors=True)
        if self.servers is not None:
            self.servers.close()


def require_device(device: str) -> None:
    """Refuse, before any run, a device torch here does not have: every run would fail on it."""
    if device == "cuda" and (missing := cuda_missing()) is not None:
        raise InfrastructureError(f"--device cuda: {missing}; use --device cpu, or run where torch sees a GPU "
                                  "(a CUDA build of torch and an NVIDIA driver), or name a CUDA image with --image")


def cuda_missing() -> str | None:
    """Why torch here (this interpreter: the local backend's runs use it) has no GPU, or None
    where it has one. A CPU build is named from ``torch/version.py``'s text, at once; a CUDA
    build is asked (``torch.cuda.is_available()``, once torch is imported)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None  # no torch here: each run says so in its own words
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        tree = ast.Module(body=[], type_ignores=[])
    built: dict[str, object] = {t.id: n.value.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
             if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    if {"cuda", "hip"} <= built.keys() and built["cuda"] is None and built["hip"] is None:
        return f"torch {built.get('__version__', '(of an unknown version)')} here is a CPU build, which sees no GPU"
    import torch

    if torch.cuda.is_available():
        return None
    return f"torch {torch.__version__} here sees no GPU (torch.cuda.is_available() is False)"


def _drain(proc: subprocess.Popen[bytes] | ForkedRun, tail: deque[str], on_step: OnStep | None) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        take_line(raw.decode("utf-8", "replace").rstrip(), tail, on_step)


def _kill_group(proc: subprocess.Popen[bytes] | ForkedRun, *, torchrun: bool = False) -> None:
    """Stop a worker and its process group (loader workers too) with SIGKILL. Under torchrun,
    SIGTERM first: torchrun passes it on to its ranks, each of which runs in a session of its
    own, out of the group's reach."""
    if isinstance(proc, ForkedRun):
        proc.kill_group()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return
    kill_process_group(proc, (signal.SIGTERM, signal.SIGKILL) if torchrun else (signal.SIGKILL,))
