"""``reproci run --backend slurm``: the run's cells as the tasks of one Slurm job array.

Each cell (one model of the run: one image, one device kind, the Ray backend's unit) is one
task of a single ``sbatch --array`` job. The submitting machine and the nodes share a
filesystem (the Slurm norm): a spool directory per run (under the results directory, or
``--slurm-spool DIR``) holds each cell's spec, the image's golden shipped to the cells, and
what each cell sends back (its run directory as a tar, the golden it recorded, its Slurm log).
On its node a task runs ``python -m reproci.cluster.slurm_job SPOOL INDEX``, which is
``cell.run`` (the same cell as on Ray: reproci's own ``run`` for one model in a directory of
its own, by the node's Docker with ``--image``, else the local backend), either with the
node's own reproci (``--launcher node``, the default: reproci installed at the same path on
every node) or inside the image through pyxis (``--launcher pyxis``: ``srun
--container-image``, reproci installed in the image). The driver combines what came back
as the Ray driver does (``combine.finish``): one results file, verdict, exit code and golden.

It drives Slurm with its own commands (``sbatch``, ``scontrol``, ``sacct``, ``squeue``,
``scancel``), not submitit (which installs from the package index): submitit pickles a Python
function and runs it under its own job layout, where a cell is a command line, pyxis wants
its ``srun`` options in the script, and the state, reason and exit code of a task that Slurm
killed come from ``scontrol`` (``sacct`` once the controller has forgotten the job; it needs
accounting, which small clusters often lack). Four commands and one script read plainly.

``--across-nodes`` makes each array task a pair: the cell on one node and its twin on another
of the task's two-node allocation, compared as on Ray (``across``); ``slurm_job`` says why a
node count and not ``--nodelist``, ``--exclude`` or ``--spread-job``. A partition with fewer
than two nodes that can take jobs is a usage error before anything is submitted.

Ctrl-C or SIGTERM cancels the array (``scancel``) and waits until none of its tasks is left.
A task that Slurm ends (time limit, node failure, preemption, someone's ``scancel``) is that
cell's infrastructure error (exit 5) naming Slurm's state, reason and exit code; the other
cells' results are kept. A requeued task is the same cell: counted once, by its array index.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import errors
from ..errors import InfrastructureError, UsageError
from ..results import ResultsDocument
from ..settings.options import RunOptions
from . import across, combine
from . import cell as cell_mod
from . import slurm_job as job_mod
from .placement import Node, cell_cpus
from .slurm_job import SlurmOptions

POLL_S = 1.0
CANCEL_WAIT_S = cell_mod.CANCEL_GRACE_S + 30  # a cancelled task's run stops its workers; Slurm's KillWait after that
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}
RAN = {"COMPLETED", "FAILED"}  # the task's own script ended: the cell's result file says how
UNUSABLE = ("down", "drain", "drng", "fail", "maint", "inval", "futr", "unk", "npc", "resv")  # sinfo %t: takes no job now


def _slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """One Slurm command; a missing command or an unreachable controller is an infrastructure error."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    except FileNotFoundError as e:
        raise InfrastructureError(f"`{argv[0]}` is not on this machine's PATH: install Slurm's client commands "
                                  "(Debian: slurm-client) and point SLURM_CONF at the cluster's slurm.conf") from e
    except subprocess.TimeoutExpired as e:
        raise InfrastructureError(f"`{argv[0]}` did not answer within 120 s: the Slurm controller is overloaded or down") from e
    said = next((line.strip() for line in (out.stderr + out.stdout).splitlines() if line.strip()), f"exit {out.returncode}")
    if out.returncode != 0 and re.search(r"unable to contact slurm controller|could not establish a configuration"
                                         r"|connection refused|resolve_ctls_from_dns_srv", said, re.I):
        raise InfrastructureError(f"cannot reach the Slurm controller ({said.removeprefix('sbatch: error: ')}); "
                                  "check that slurmctld runs and SLURM_CONF names its slurm.conf")
    if out.returncode != 0 and check:
        raise InfrastructureError(f"`{' '.join(argv[:2])}` failed: {said}")
    return out


def node_cpus(slurm: SlurmOptions) -> int:
    """The CPUs of the smallest node of the partition: a cell asks for no more. ``--across-nodes``:
    fewer than two nodes there that can take a job is a usage error (nothing is submitted)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %c %t"] + (["-p", slurm.partition] if slurm.partition else [])
    listed = {name: (int(cpus), state) for name, cpus, state in
              (line.split()[:3] for line in _slurm(*argv).stdout.splitlines() if len(line.split()) >= 3)
              if cpus.isdigit()}
    where = f" in partition {slurm.partition}" if slurm.partition else ""
    if not listed:
        raise InfrastructureError(f"Slurm lists no node{where}; check --partition (`sinfo` lists them)")
    if slurm.across_nodes:
        usable(listed, where)
    return min(cpus for cpus, _ in listed.values())


def usable(listed: dict[str, tuple[int, str]], where: str) -> list[str]:
    """The nodes (name -> CPUs, ``sinfo`` state) that can take a job now: neither down, drained,
    nor unresponsive (``*``); fewer than two cannot hold a cell and its twin (exit 2)."""
    up = [name for name, (_, state) in listed.items()
          if not state.startswith(UNUSABLE) and not state.endswith("*")]
    if len(up) < 2:
        nodes = f"{len(up)} node{'' if len(up) == 1 else 's'}{where}"
        raise UsageError(f"--across-nodes runs each model's cell on two nodes, and {nodes} can take "
                         f"jobs ({', '.join(f'{n} {s}' for n, (_, s) in listed.items())}); name a partition of two "
                         "or more nodes with --partition, or resume a node (`scontrol update nodename=N state=resume`)")
    return up


@dataclass
class Task:
    """One array task as the driver last saw it (its array index is the cell's)."""

    index: int
    spec: cell_mod.CellSpec
    state: str = "PENDING"
    node: str = ""
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0
    said: str = ""  # the last progress state said for it
    rank: int = 0  # --across-nodes: 0 the cell, 1 its twin (the task's second node)


def run_cells(options: RunOptions, slurm: SlurmOptions, cell_options: dict[str, Any],
              progress: Callable[[str], None], publish: combine.Publish) -> tuple[ResultsDocument, Path, list[str]]:
    """Submit every cell as one array job, follow it, and combine what came back; return the
    document, its path and one line per cell lost."""
    started = time.monotonic()
    if slurm.launcher == "pyxis" and not options.image_reference:
        raise UsageError("--launcher pyxis runs each cell inside the image: name it with --image")
    cpus, jobs = cell_cpus(options, Node(id="", ip="", labels={}, resources={"CPU": node_cpus(slurm)}),
                           "jobs" in cell_options)
    sent = cell_options if jobs is None else {**cell_options, "jobs": jobs}
    if slurm.launcher == "pyxis":
        sent = job_mod.pyxis_options(sent, options.image_name)
    root = (slurm.spool or options.results_dir / ".slurm").resolve()
    root.mkdir(parents=True, exist_ok=True)
    spool = Path(tempfile.mkdtemp(prefix=f"{options.image_name}-", dir=root))
    try:
        tasks = [Task(index=i, spec=spec, rank=rank) for i, pair in enumerate(job_mod.write(options, spool, sent,
                                                                                            slurm.across_nodes))
                 for rank, spec in enumerate(pair)]
        (spool / "job.sh").write_text(job_mod.script(options, slurm, spool, len({t.index for t in tasks}), cpus))
        out = _slurm("sbatch", "--parsable", *slurm.sbatch_args, str(spool / "job.sh"))
        job = out.stdout.strip().split(";")[0]
        for t in tasks:
            progress(f"cell {t.spec.name}: pending (job {job}_{t.index})")
        try:
            _follow(job, tasks, progress)
        except BaseException:
            cancel(job, progress)
            raise
        done, lost = _collect(job, tasks, spool, progress)
        cells, twins = across.split(done, {t.spec.name: t.node for t in tasks})
        return combine.finish(options, cells, lost, started, lambda run_dir: _write_cells(run_dir, job, tasks, done, spool),
                              publish, twins)
    finally:
        cell_mod.remove(spool)
        if root != slurm.spool and root.is_dir() and not any(root.iterdir()):
            root.rmdir()


def states(job: str) -> dict[int, dict[str, str]]:
    """Each array task's fields (JobState, Reason, ExitCode, NodeList, Restarts) by index, from
    ``scontrol``; from ``sacct`` once the controller has forgotten the job."""
    out = _slurm("scontrol", "-o", "show", "job", job, check=False)
    if out.returncode != 0:
        return _sacct(job)
    found: dict[int, dict[str, str]] = {}
    for line in out.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        for index in _indices(fields.get("ArrayTaskId", "")):
            found[index] = fields
    return found


def _indices(text: str) -> list[int]:
    """``3``, ``0-4``, ``1,3-5%2`` (pending tasks share one record): the indices named."""
    out: list[int] = []
    for part in text.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out += range(int(lo), int(hi if hi.isdigit() else lo) + 1)
    return out


def _sacct(job: str) -> dict[int, dict[str, str]]:
    out = _slurm("sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State,ExitCode,NodeList,Reason", check=False)
    found: dict[int, dict[str, str]] = {}
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        jobid, state, code, nodes, reason = (line.split("|") + [""] * 5)[:5]
        _, _, index = jobid.partition("_")
        for i in _indices(index.strip("[]")):
            found[i] = {"JobState": state.split()[0] if state else "", "ExitCode": code, "NodeList": nodes,
                        "Reason": reason}
    return found


def _follow(job: str, tasks: list[Task], progress: Callable[[str], None]) -> None:
    """Poll until every task has ended, saying each change: running on which node, requeued, ended."""
    forgotten = 0
    while any(t.state not in ENDED for t in tasks):
        time.sleep(POLL_S)
        seen = states(job)
        forgotten = 0 if seen else forgotten + 1
        for t in tasks:
            f = seen.get(t.index)
            if f is None:
                if forgotten >= 3 and t.state not in ENDED:  # neither scontrol nor sacct knows it any more
                    t.state, t.reason = "LOST", "Slurm no longer knows the job"
                continue
            restarts = int(f.get("Restarts", "0") or 0)
            t.state, t.reason, t.exit_code = f.get("JobState", ""), f.get("Reason", ""), f.get("ExitCode", "")
            t.node = f.get("NodeList", "") if f.get("NodeList") not in ("", "(null)", "None assigned") else t.node
            if restarts > t.restarts:
                progress(f"cell {t.spec.name}: requeued by Slurm (restart {restarts}); counted once")
                t.restarts, t.said = restarts, ""
            if t.state == "RUNNING" and t.said != "RUNNING":
                progress(f"cell {t.spec.name}: running on node {t.node} (job {job}_{t.index})")
                t.said = "RUNNING"
        if forgotten >= 3:
            return


def cancel(job: str, progress: Callable[[str], None] | None = None) -> None:
    """``scancel`` the whole array, then wait until none of its tasks is left (each stops its run first)."""
    subprocess.run(["scancel", job], capture_output=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    try:
        while time.monotonic() < deadline:
            left = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        return  # a second Ctrl-C: leave now
    if progress is not None:
        progress(f"job {job}: tasks still listed {CANCEL_WAIT_S:.0f} s after scancel")


def _collect(job: str, tasks: list[Task], spool: Path, progress: Callable[[str], None]
             ) -> tuple[list[cell_mod.CellResult], list[tuple[str, int]]]:
    done: list[cell_mod.CellResult] = []
    lost: list[tuple[str, int]] = []  # (line, exit code)
    for t in tasks:
        r = job_mod.read_result(job_mod.task_dir(spool, t.index, t.rank)) if t.state in RAN else None
        t.node = r.node_ip if r is not None and r.node_ip else t.node  # its own node (a pair's NodeList names both)
        where = f"{t.spec.name} (job {job}_{t.index}{', node ' + t.node if t.node else ''})"
        if t.state not in RAN:
            why = f"{t.state}" + (f" ({t.reason})" if t.reason and t.reason != "None" else "")
            lost.append((f"cell {where} was ended by Slurm: {why}, exit code {t.exit_code or '?'}; run the cell again",
                         errors.EXIT_INFRA))
            progress(f"cell {t.spec.name}: ended by Slurm ({t.state})")
            continue
        if r is None:
            tail = _last_line(spool / f"cell-{t.index}" / "slurm.log")
            lost.append((f"cell {where} ended without results (Slurm: {t.state}, exit code {t.exit_code}): {tail}",
                         errors.EXIT_INFRA))
        elif r.run_tar is None and r.exit_code in (errors.EXIT_INTERRUPTED, errors.EXIT_TERMINATED):
            lost.append((f"cell {where} was stopped on its node (its run exited {r.exit_code}); run the cell again",
                         errors.EXIT_INFRA))
        elif r.run_tar is None:
            said = next((line for line in reversed(r.stderr_tail) if line.strip()), f"exit {r.exit_code}")
            lost.append((f"cell {where}: {said.removeprefix('error: ')}", r.exit_code))
        else:
            done.append(r)
        if r is not None:
            progress(f"cell {t.spec.name}: finished on node {t.node} in {r.seconds:.1f} s (exit {r.exit_code})")
    return done, lost


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no Slurm log"
    return lines[-1].strip() if lines else "its Slurm log is empty"


def _write_cells(run_dir: Path, job: str, tasks: list[Task], done: list[cell_mod.CellResult], spool: Path) -> None:
    """``cells.json`` beside the results (as the Ray driver writes it): where each cell ran, its
    job id, array index, node, Slurm state and restarts; each cell's Slurm log under ``slurm/``."""
    from .. import atomic

    came = {r.name: r for r in done}
    rows = []
    (run_dir / "slurm").mkdir()
    for t in tasks:
        r = came.get(t.spec.name)
        rows.append({"cell": t.spec.name, "job_id": job, "array_index": t.index, "node": t.node,
                     "host": r.host if r else None, "state": t.state, "reason": t.reason,
                     "slurm_exit_code": t.exit_code, "restarts": t.restarts, "seconds": r.seconds if r else None,
                     "exit_code": r.exit_code if r else errors.EXIT_INFRA})
        log = spool / f"cell-{t.index}" / "slurm.log"
        if log.is_file():
            (run_dir / "slurm" / f"{t.spec.name}.log").write_bytes(log.read_bytes())
    atomic.write_text(run_dir / "cells.json", json.dumps({"job_id": job, "cells": rows}, indent=2) + "\n")
