"""Plugins that report how their process was started (test-only), for the fork server's tests.

- ``facts``: writes to ``facts.json`` in its working directory (the run's) what a run's process sees before its first step:
  hash seed and hashes, threads, environment, argv, path, working directory, signal
  handlers, session, open descriptors, ``__main__``, a first Python and numpy random draw;
  then trains a tiny linear model.
  At its end it leaves ``exit.txt``: what a non-daemon thread it started and an ``atexit``
  handler wrote as the process ended, and a line it printed unflushed (the run's log).
- ``hangs``: starts a grandchild (``sleep 600``), writes both pids to ``facts.json``
  and never returns, as a stuck model does.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup

ENV = ("PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
       "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "PYTHONUNBUFFERED", "REPROCI_TEST_VAR")


def _write(facts: dict) -> None:
    path = "facts.json"
    with open(path + ".tmp", "w") as f:
        json.dump(facts, f)
    os.replace(path + ".tmp", path)


def _numpy_blas_threads() -> int | None:
    """The thread count numpy's OpenBLAS runs with (read from the library itself)."""
    from reproci.worker.process import openblas_threads

    functions = openblas_threads._library_functions()
    return int(functions[1]()) if functions else None


def _handler(sig: int) -> str:
    h = signal.getsignal(sig)
    return getattr(h, "__name__", str(h))


def _setup(ctx: ModelContext) -> TrainSetup:
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(16, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    model = nn.Linear(4, 1).to(ctx.device)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      loader=torch.utils.data.DataLoader(data, batch_size=4),
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batch_size=4)


def _on_exit(lines: list[str]) -> None:
    lines.append("atexit")
    with open("exit.txt", "w") as f:
        f.write(" ".join(lines))
    print("unflushed line at exit", end="")  # the stream is flushed as the interpreter ends


def _exit_witnesses() -> None:
    """A non-daemon thread still working as the run returns, and an atexit handler after it:
    an interpreter's exit joins the thread first, then runs the handler."""
    lines: list[str] = []

    def late() -> None:
        time.sleep(0.3)
        lines.append("thread")
    threading.Thread(target=late).start()
    atexit.register(_on_exit, lines)


def facts(ctx: ModelContext) -> TrainSetup:
    main = sys.modules["__main__"]
    _write({
        "hash_randomization": sys.flags.hash_randomization,
        "hashes": [hash("x"), hash(("reproci", 1)), hash(b"bytes")],
        "flags": repr(sys.flags),
        "torch_threads": torch.get_num_threads(),
        "numpy_blas_threads": _numpy_blas_threads(),
        "threads_before_first_op": len(os.listdir("/proc/self/task")),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "env": {k: os.environ.get(k) for k in ENV},
        "parent_is_launcher": os.getppid() == int(os.environ["REPROCI_PARENT_PID"]),
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "main": [main.__name__, getattr(main.__spec__, "name", None), os.path.basename(main.__file__)],
        "main_imported": "reproci.worker.__main__" in sys.modules,
        "signals": {name: _handler(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE")},
        "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3],
        "stdin": os.path.realpath("/proc/self/fd/0"),
        "random": random.random(),
        "numpy_random": float(np.random.random()),
        "pid": os.getpid(),
    })
    _exit_witnesses()
    return _setup(ctx)


def hangs(ctx: ModelContext) -> TrainSetup:
    child = subprocess.Popen(["sleep", "600"])
    _write({"pid": os.getpid(), "child": child.pid})
    while True:
        time.sleep(1)
