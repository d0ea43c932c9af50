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
    SPOOL/cell-I/result.json     its exit code, host and time; written last: the rest is complete

On its node an array task runs ``python -m reproci.cluster.slurm_job SPOOL I`` from the
project directory: ``cell.run`` (the Ray cell, unchanged), its result left in the spool.
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
from typing import Iterable

from ..errors import UsageError
from ..golden.advice import shown
from ..options import RunOptions
from . import cell as cell_mod
from .ray_driver import cell_goldens_dir, cell_name, golden_files

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


def slurm_options(partition: str | None = None, account: str | None = None, qos: str | None = None,
                  time: str | None = None, gres: str | None = None, gpus_per_task: str | None = None,
                  sbatch_args: Iterable[str] = (), launcher: str | None = None, spool: Path | None = None
                  ) -> SlurmOptions:
    if gres is not None and not all(_GRES.match(part) for part in gres.split(",")):
        raise UsageError(f"--gres {gres!r} is not NAME[:TYPE][:COUNT][,...]; write e.g. --gres gpu:1 or --gres gpu:a100:2")
    if time is not None and not _TIME.match(time.strip()):
        raise UsageError(f"--time {time!r} is not a Slurm time limit; write MINUTES, HH:MM:SS or D-HH:MM:SS (e.g. 30, 2:00:00)")
    if gpus_per_task is not None and not _GPUS.match(gpus_per_task):
        raise UsageError(f"--gpus-per-task {gpus_per_task!r} is not [TYPE:]COUNT; write e.g. --gpus-per-task 1 or a100:1")
    return SlurmOptions(partition=partition, account=account, qos=qos, time=None if time is None else time.strip(),
                        gres=gres, gpus_per_task=gpus_per_task, sbatch_args=tuple(sbatch_args),
                        launcher=launcher or "node", spool=spool)


def write(options: RunOptions, spool: Path, args: tuple[str, ...]) -> list[cell_mod.CellSpec]:
    """The spool of a run: the golden shipped to the cells, and each cell's spec (in the order of its array index)."""
    (spool / "goldens").mkdir()
    for name, data in golden_files(options).items():
        (spool / "goldens" / name).write_bytes(data)
    specs = []
    for i, model in enumerate(options.models):
        spec = cell_mod.CellSpec(name=cell_name(options, model.name), model=shown(model, options.project_root),
                                 args=args, goldens_dir=cell_goldens_dir(options), update_golden=options.update_golden,
                                 keep_checkpoints=options.keep_checkpoints)
        (spool / f"cell-{i}").mkdir()
        (spool / f"cell-{i}" / "spec.json").write_text(json.dumps(asdict(spec)))
        specs.append(spec)
    return specs



def script(options: RunOptions, slurm: SlurmOptions, spool: Path, count: int, cpus: int) -> str:
    """The array job's batch script: one task per cell, each running its cell from the spool."""
    head = [f"--job-name=reproci-{options.image_name}", f"--array=0-{count - 1}",
            f"--output={spool}/cell-%a/slurm.log", "--ntasks=1", f"--cpus-per-task={cpus}"]
    head += [f"--{flag}={value}" for flag, value in (("partition", slurm.partition), ("account", slurm.account),
                                                      ("qos", slurm.qos), ("time", slurm.time), ("gres", slurm.gres),
                                                      ("gpus-per-task", slurm.gpus_per_task)) if value]
    if options.device == "cuda" and not (slurm.gres or slurm.gpus_per_task):
        head.append(f"--gres=gpu:{options.world_size}")  # a CUDA cell's ranks, as a Ray cell asks num_gpus
    project, cell = shlex.quote(str(options.project_root)), f'{shlex.quote(str(spool))} "$SLURM_ARRAY_TASK_ID"'
    if slurm.launcher == "pyxis":
        mounts = ",".join(dict.fromkeys(f"{p}:{p}" for p in (options.project_root, spool)))
        run = (f"srun --ntasks=1 --container-image={shlex.quote(options.image_reference or '')} "
               f"--container-mounts={shlex.quote(mounts)} --container-workdir={project} "
               f"python3 -m reproci.cluster.slurm_job {cell}")
    else:
        run = f"{shlex.quote(sys.executable)} -m reproci.cluster.slurm_job {cell}"
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {h}" for h in head), f"cd {project}", f"exec {run}", ""])


def pyxis_args(args: tuple[str, ...], image_name: str) -> tuple[str, ...]:
    """A cell's arguments inside its pyxis container: the image is where it runs, not one it
    starts (the local backend, its goldens still named after the image); no container limits."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("--image", "--gpus", "--memory", "--pids-limit"):
            skip = True
        else:
            out.append(a)
    return tuple(out) + (() if "--image-name" in args else ("--image-name", image_name))


@dataclass
class _Sent:
    """A cell's result as it lies in the spool (the run directory's tar and goldens beside it)."""

    name: str
    exit_code: int
    host: str
    node_ip: str
    seconds: float
    stderr_tail: list[str] = field(default_factory=list)


def run_task(spool: Path, index: int) -> int:
    """Run cell ``index`` from the spool in the current directory (the project) and leave its
    result there; the run's own exit code is in the result (this task exits 0 once it is written)."""
    where = spool / f"cell-{index}"
    for stale in ("result.json", "run.tar.gz"):  # a requeued task starts again
        (where / stale).unlink(missing_ok=True)
    spec = cell_mod.CellSpec(**json.loads((where / "spec.json").read_text()))
    spec = cell_mod.CellSpec(**{**asdict(spec), "args": tuple(spec.args), "golden_files": {
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
    sys.exit(run_task(Path(sys.argv[1]), int(sys.argv[2])))
