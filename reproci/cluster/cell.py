"""One cell on its node: ``reproci run`` for one model, in a directory of its own, with the
image's golden shipped by the driver; its run directory and any golden it recorded go back.

A cell is the unit that cannot be split: runs A, B and C, the replays and the golden's per-op
runs share files and must run on one host and one kind of device. The driver never lets a
node write the project's goldens: the cell records into its own copy, and the driver writes
the combined file (``combine.write_golden``).

This module runs inside a Ray task, on the node's own reproci (the driver checks the
versions first); it imports no Ray itself, so the task body is plain and testable.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STDERR_TAIL = 40  # lines of the cell's stderr that come back with its result
CANCEL_GRACE_S = 60.0  # how long a cancelled cell's run has to stop its workers and containers
PR_SET_PDEATHSIG = 1
ORPHAN_POLL_S = 0.5
PROGRESS = re.compile(r"\[\s*[\d.]+ s\] |error: ")  # a run's progress lines (reports/progress.py) and errors
OPTIONS_FILE = ".reproci-cell-options.json"  # in the cell directory: the run's options, read by `reproci run`


@dataclass(frozen=True)
class CellSpec:
    """What the driver sends: the cell's name, its model, the options of its ``reproci run`` (every
    option the user gave that a cell receives, as JSON: ``settings.declared.for_cell``), and the
    golden files to compare with."""

    name: str
    model: str
    options: dict[str, Any]
    goldens_dir: str  # relative to the cell directory: what the driver's own run calls it
    golden_files: dict[str, bytes] = field(default_factory=dict)
    update_golden: bool = False
    keep_checkpoints: bool = False


@dataclass
class CellResult:
    """What comes back: the run's exit code, its run directory as a tar (None when the run
    wrote none), the golden files it recorded, where it ran and the end of its stderr."""

    name: str
    exit_code: int
    run_tar: bytes | None
    golden_files: dict[str, bytes]
    host: str
    node_ip: str
    seconds: float
    stderr_tail: list[str]


def _die_with_parent() -> None:
    """In the child: SIGTERM when the task's process dies (its node lost), so the run stops its
    containers and removes its files like a cancelled CI job; then a session of its own, so a
    signal to the task's process group does not kill it before it can."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # a Ray worker's thread blocks signals, and exec keeps the mask
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    os.setsid()


def options(spec: CellSpec, results_dir: str) -> dict[str, Any]:
    """The cell's run's options: the user's, its one model (or its script's commands:
    ``cells.script_options``), its own results and goldens."""
    model = {} if "script" in spec.options else {"models": [spec.model]}
    return {**spec.options, **model, "results_dir": results_dir, "goldens_dir": spec.goldens_dir,
            **({"update_golden": True} if spec.update_golden else {}),
            **({"keep_checkpoints": True} if spec.keep_checkpoints else {})}


def command() -> list[str]:
    """The cell's ``reproci run``, run from the cell directory: its options from ``OPTIONS_FILE``."""
    return [sys.executable, "-m", "reproci.cli", "run", "--cell-options", OPTIONS_FILE]


def prepare(spec: CellSpec, project: Path, where: Path) -> None:
    """The cell directory: the project's files (links, read as they are), its own goldens
    directory holding the shipped golden, and no results of the project's."""
    goldens = Path(spec.goldens_dir)
    skip = {goldens.parts[0]} if goldens.parts else set()
    skip |= {"results", ".git"}
    for entry in project.iterdir() if project.is_dir() else []:
        if entry.name not in skip:
            (where / entry.name).symlink_to(entry)
    (where / goldens).mkdir(parents=True, exist_ok=True)
    for name, data in spec.golden_files.items():
        (where / goldens / name).write_bytes(data)


def run(spec: CellSpec, project: Path | None = None) -> CellResult:
    """Run the cell from a fresh directory under the node's temp dir; return its results.

    A KeyboardInterrupt (Ray's cancel) stops the run with SIGINT, as Ctrl-C would, waits for it
    to clean up, removes the cell directory and propagates."""
    project = Path.cwd() if project is None else project
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"reproci-cell-{spec.name}-") as tmp:
        where = Path(tmp)
        prepare(spec, project, where)
        (where / OPTIONS_FILE).write_text(json.dumps(options(spec, "results")))
        proc = subprocess.Popen(command(), cwd=where, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
        tail: list[str] = []
        watchdog = threading.Thread(target=_stop_when_orphaned, args=(proc, os.getppid()), daemon=True)
        watchdog.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if PROGRESS.match(line):  # Ray forwards it to the driver, after the task's name (the cell's)
                    print(line.rstrip(), file=sys.stderr, flush=True)
                tail = (tail + [line.rstrip()])[-STDERR_TAIL:]
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
        return CellResult(name=spec.name, exit_code=code, run_tar=_pack(where / "results"),
                          golden_files=_goldens(spec, where) if spec.update_golden else {},
                          host=socket.gethostname(), node_ip=_node_ip(), seconds=round(time.monotonic() - started, 3),
                          stderr_tail=tail)


def _stop_when_orphaned(proc: subprocess.Popen, parent: int) -> None:
    """Stop the run if the process that started this one goes (a Ray worker's parent is its
    node's raylet: the node is lost, and no one will read this cell's result)."""
    while proc.poll() is None:
        if os.getppid() != parent:
            _stop(proc)
            return
        time.sleep(ORPHAN_POLL_S)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT the run (its own clean-up: workers, containers, files), then SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=CANCEL_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _pack(results: Path) -> bytes | None:
    """The run's directory (the one with results.json) as a tar, paths relative to it."""
    runs = [d for d in results.iterdir() if (d / "results.json").is_file()] if results.is_dir() else []
    if not runs:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(runs[0], arcname=".")
    return buf.getvalue()


def _goldens(spec: CellSpec, where: Path) -> dict[str, bytes]:
    """The golden files the cell's run recorded (YAML and sidecars), by name."""
    d = where / spec.goldens_dir
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".")}


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # outside Ray (tests of this module): the host's name is what there is
        return socket.gethostname()


def unpack(data: bytes, into: Path) -> None:
    """A cell's run directory, unpacked on the driver (only plain files and folders under ``into``)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(into, filter="data")


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
