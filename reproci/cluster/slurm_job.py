"""The array job of ``--backend slurm``: what each task asks of Slurm (``SlurmOptions``, checked
once), its batch script, and the spool that carries each cell to its task and its result back.

The spool is a directory shared by the submitting machine and the nodes (the Slurm norm), one
per run:

    SPOOL/job.sh                 the array job's batch script (``script``)
    SPOOL/goldens/               the image's golden, shipped to every cell
    SPOOL/cell-I/spec.json       cell I's CellSpec (I: its array index)
    SPOOL/cell-I/slurm.log       its task's output (sbatch --output)
    SPOOL/cell-I/run.tar.gz      its run directory (cell._pack)
    SPOOL/cell-I/goldens/        the golden it recorded (--update-golden)
    SPOOL/cell-I/result.json     its exit code, host, node and time; written last: the rest is complete
    SPOOL/cell-I/twin/           --across-nodes: the cell's twin, the same files (its log is the task's)

On its node an array task runs ``python -m reproci.cluster.slurm_job SPOOL I`` from the
project directory: ``cell.run`` (the Ray cell, unchanged), its result left in the spool.

``--across-nodes``: each array task is a pair, the cell and its twin (``across``), and asks
for two nodes with one task on each (``--nodes=2 --ntasks-per-node=1``); its script starts
both with one ``srun``, and each reads its half from ``SLURM_PROCID`` (0: the cell, 1: the
twin). Distinct nodes are then what the allocation is, not a wish: every Slurm scheduler
honours a node count, as it must for MPI. The other ways were weighed and set aside:
``--spread-job`` and ``--distribution`` only order tasks over the nodes a job already has
(one node may get both); ``--nodelist``/``--exclude`` pin node names, which an array cannot
vary per task (one job per twin), which needs the first cell's node known before the twin
is submitted (one queue wait after another), and which leave a job pending for good when a
named node drains; a heterogeneous job's components may share a node. The cost: a pair
starts when two nodes are free at once, and holds the faster half's node until the slower
half ends (the same model and arguments: about the same time). One job id holds both
halves, so one ``scancel`` ends both.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import UsageError
from ..settings.options import RunOptions
from . import across, cells
from . import cell as cell_mod

LAUNCHERS = ("node", "pyxis")
_GRES = re.compile(r"^[A-Za-z][\w.-]*(:[A-Za-z_][\w.-]*)?(:\d+[KMG]?)?$")  # gpu, gpu:2, gpu:a100:2 (one of a list)
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
                   r"|UNLIMITED|INFINITE)$")
_GPUS = re.compile(r"^([A-Za-z_][\w.-]*:)?\d+$")  # 2, a100:2


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm backend's own options, checked once: what each task asks of Slurm, how the
    image starts on the node, and where the spool lives."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # sbatch --time: MINUTES, [D-]HH:MM:SS, ...
    gres: str | None = None
    gpus_per_task: str | None = None
    sbatch_args: tuple[str, ...] = ()  # appended to sbatch's command line: they win over reproci's own
    launcher: str = "node"
    spool: Path | None = None
    across_nodes: bool = False  # each cell and its twin on two nodes of one task's allocation (cluster/across.py)


def slurm_options(partition: str | None = None, account: str | None = None, qos: str | None = None,
                  time: str | None = None, gres: str | None = None, gpus_per_task: str | None = None,
                  sbatch_args: Iterable[str] = (), launcher: str | None = None, spool: Path | None = None,
                  across_nodes: bool = False) -> SlurmOptions:
    if gres is not None and not all(_GRES.match(part) for part in gres.split(",")):
        raise UsageError(f"--gres {gres!r} is not NAME[:TYPE][:COUNT][,...]; write e.g. --gres gpu:1 or --gres gpu:a100:2")
    if time is not None and not _TIME.match(time.strip()):
        raise UsageError(f"--time {time!r} is not a Slurm time limit; write MINUTES, HH:MM:SS or D-HH:MM:SS (e.g. 30, 2:00:00)")
    if gpus_per_task is not None and not _GPUS.match(gpus_per_task):
        raise UsageError(f"--gpus-per-task {gpus_per_task!r} is not [TYPE:]COUNT; write e.g. --gpus-per-task 1 or a100:1")
    return SlurmOptions(partition=partition, account=account, qos=qos, time=None if time is None else time.strip(),
                        gres=gres, gpus_per_task=gpus_per_task, sbatch_args=tuple(sbatch_args),
                        launcher=launcher or "node", spool=spool, across_nodes=across_nodes)


TWIN_DIR = "twin"  # under a cell's spool directory: its twin's (--across-nodes)


def write(options: RunOptions, spool: Path, cell_options: dict[str, Any], across_nodes: bool = False
          ) -> list[list[cell_mod.CellSpec]]:
    """The spool of a run: the golden shipped to the cells, and each array task's specs (in the
    order of its index): its cell, and with ``across_nodes`` the cell's twin (``across.placements``
    over the task's two srun ranks: the same run, recording no golden, both keeping run A's end)."""
    (spool / "goldens").mkdir()
    for name, data in cells.golden_files(options).items():
        (spool / "goldens" / name).write_bytes(data)
    tasks = []
    for i, model in enumerate(options.models):
        cell = cells.model_cell(options, model, cell_options)
        specs = [spec for _, spec in across.placements((0, 1), 0, cell, across_nodes)]
        for rank, spec in enumerate(specs):
            where = task_dir(spool, i, rank)
            where.mkdir(parents=True)
            (where / "spec.json").write_text(json.dumps(asdict(spec)))
        tasks.append(specs)
    return tasks


def task_dir(spool: Path, index: int, rank: int = 0) -> Path:
    """Where array task ``index``'s cell (rank 0) or its twin (rank 1) is spooled."""
    return spool / f"cell-{index}" / (TWIN_DIR if rank else "")


def script(options: RunOptions, slurm: SlurmOptions, spool: Path, count: int, cpus: int) -> str:
    """The array job's batch script: one task per cell, each running its cell from the spool."""
    pair = slurm.across_nodes
    head = [f"--job-name=reproci-{options.image_name}", f"--array=0-{count - 1}", f"--output={spool}/cell-%a/slurm.log",
            *(("--nodes=2", "--ntasks=2", "--ntasks-per-node=1") if pair else ("--ntasks=1",)), f"--cpus-per-task={cpus}"]
    head += [f"--{flag}={value}" for flag, value in (("partition", slurm.partition), ("account", slurm.account),
                                                      ("qos", slurm.qos), ("time", slurm.time), ("gres", slurm.gres),
                                                      ("gpus-per-task", slurm.gpus_per_task)) if value]
    if options.device == "cuda" and not (slurm.gres or slurm.gpus_per_task):
        head.append(f"--gres=gpu:{options.world_size}")  # a CUDA cell's ranks, as a Ray cell asks num_gpus
    project, cell = shlex.quote(str(options.project_root)), f'{shlex.quote(str(spool))} "$SLURM_ARRAY_TASK_ID"'
    # a pair: one srun, a task on each of the allocation's two nodes (rank 0 the cell, rank 1 its twin)
    srun = f"srun --ntasks=2 --ntasks-per-node=1 --cpus-per-task={cpus} --label" if pair else "srun --ntasks=1"
    if slurm.launcher == "pyxis":
        mounts = ",".join(dict.fromkeys(f"{p}:{p}" for p in (options.project_root, spool)))
        run = (f"{srun} --container-image={shlex.quote(options.image_reference or '')} "
               f"--container-mounts={shlex.quote(mounts)} --container-workdir={project} "
               f"python3 -m reproci.cluster.slurm_job {cell}")
    else:
        run = f"{srun + ' ' if pair else ''}{shlex.quote(sys.executable)} -m reproci.cluster.slurm_job {cell}"
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {h}" for h in head), f"cd {project}", f"exec {run}", ""])


def pyxis_options(cell_options: dict[str, Any], image_name: str) -> dict[str, Any]:
    """A cell's options inside its pyxis container: the image is where it runs, not one it
    starts (the local backend, its goldens still named after the image); no container limits."""
    inside = {k: v for k, v in cell_options.items() if k not in ("image", "gpus", "memory", "pids_limit")}
    return {**inside, "image_name": cell_options.get("image_name", image_name)}


@dataclass
class _Sent:
    """A cell's result as it lies in the spool (the run directory's tar and goldens beside it)."""

    name: str
    exit_code: int
    host: str
    node_ip: str  # the Slurm node it ran on (SLURMD_NODENAME)
    seconds: float
    stderr_tail: list[str] = field(default_factory=list)


def run_task(spool: Path, index: int, rank: int = 0) -> int:
    """Run cell ``index`` (rank 1: its twin) from the spool in the current directory (the project)
    and leave its result there; the run's own exit code is in the result (this task exits 0 once
    it is written)."""
    where = task_dir(spool, index, rank)
    for stale in ("result.json", "run.tar.gz"):  # a requeued task starts again
        (where / stale).unlink(missing_ok=True)
    spec = cell_mod.CellSpec(**json.loads((where / "spec.json").read_text()))
    spec = cell_mod.CellSpec(**{**asdict(spec), "golden_files": {
        p.name: p.read_bytes() for p in sorted((spool / "goldens").iterdir()) if p.is_file()}})
    signal.signal(signal.SIGTERM, _interrupt)  # scancel, a time limit: the cell stops its run and removes its files
    r = cell_mod.run(spec, Path.cwd())
    node = os.environ.get("SLURMD_NODENAME", r.host)
    if r.run_tar is not None:
        (where / "run.tar.gz").write_bytes(r.run_tar)
    (where / "goldens").mkdir(exist_ok=True)
    for name, data in r.golden_files.items():
        (where / "goldens" / name).write_bytes(data)
    sent = _Sent(name=r.name, exit_code=r.exit_code, host=r.host, node_ip=node, seconds=r.seconds,
                 stderr_tail=r.stderr_tail)
    tmp = where / "result.json.tmp"
    tmp.write_text(json.dumps(asdict(sent)))
    tmp.replace(where / "result.json")  # last: its presence says the rest is complete
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def read_result(where: Path) -> cell_mod.CellResult | None:
    try:
        sent = _Sent(**json.loads((where / "result.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    tar = where / "run.tar.gz"
    goldens = where / "goldens"
    return cell_mod.CellResult(name=sent.name, exit_code=sent.exit_code, run_tar=tar.read_bytes() if tar.is_file() else None,
                               golden_files={p.name: p.read_bytes() for p in sorted(goldens.iterdir())}
                               if goldens.is_dir() else {},
                               host=sent.host, node_ip=sent.node_ip, seconds=sent.seconds, stderr_tail=sent.stderr_tail)


if __name__ == "__main__":
    sys.exit(run_task(Path(sys.argv[1]), int(sys.argv[2]), int(os.environ.get("SLURM_PROCID", "0"))))
