"""``reproci run`` (and ``reproci golden update``, which takes the same options): the click
code; ``orchestrate.run_all`` does the work."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click

from .. import console, options as options_mod, orchestrate
from ..reports.progress import RunProgress
from ..stages import registry

_OPTIONS = [
    click.option("--image", help="Container image to run in (manifest name or any reference). Omit for the local backend."),
    click.option("--backend", type=click.Choice(["local", "docker", "ray", "slurm"]), default=None,
                 help="Where the runs execute: local (no --image), docker (--image), or ray: each model a cell on a "
                      "Ray cluster, run there by the local or Docker backend, merged here (needs reproci[ray]); "
                      "slurm: each model a task of one Slurm job array (a filesystem shared with the nodes).",
                 ),
    click.option("--address", help="--backend ray: the cluster, HOST:PORT (default: $RAY_ADDRESS, else a local cluster)."),
    click.option("--node-label", "node_labels", multiple=True,
                 help="--backend ray: only nodes with this label, KEY=VALUE (repeatable), e.g. ray.io/accelerator-type=H100."),
    click.option("--across-nodes", is_flag=True, default=None,
                 help="--backend ray or slurm: run each model's cell on two nodes and compare their runs A step by step, "
                      "so that results are proven to agree across machines of one image (twice the cells; on Slurm "
                      "each task asks for two nodes, --nodes=2 --ntasks-per-node=1)."),
    click.option("--partition", help="--backend slurm: the partition (sbatch --partition)."),
    click.option("--account", help="--backend slurm: the account charged (sbatch --account)."),
    click.option("--qos", help="--backend slurm: the quality of service (sbatch --qos)."),
    click.option("--time", "slurm_time", help="--backend slurm: each cell's time limit, MINUTES or [D-]HH:MM:SS (sbatch --time)."),
    click.option("--gres", help="--backend slurm: generic resources per cell, e.g. gpu:1 or gpu:a100:2 (sbatch --gres)."),
    click.option("--gpus-per-task", help="--backend slurm: GPUs per cell, [TYPE:]COUNT (sbatch --gpus-per-task)."),
    click.option("--sbatch-arg", "sbatch_args", multiple=True,
                 help="--backend slurm: one more sbatch option, passed as it is (repeatable), e.g. --sbatch-arg=--exclusive."),
    click.option("--launcher", type=click.Choice(["node", "pyxis"]), default=None,
                 help="--backend slurm: node (default): each node's reproci runs the cell, by its Docker with --image; "
                      "pyxis: srun --container-image runs the cell inside --image (reproci installed in it)."),
    click.option("--slurm-spool", type=click.Path(path_type=Path),
                 help="--backend slurm: the directory shared with the nodes for the cells' specs and results "
                      "(default: RESULTS_DIR/.slurm)."),
    click.option("--image-name", help="Name under which goldens for this image are kept (default: from --image, or 'local')."),
    click.option("--model", "-m", "models", multiple=True,
                  help="Model to run: conv, transformer, embedding, FILE.py:factory or module:factory. Repeatable. "
                       "Default: all reference models."),
    click.option("--stage", "-s", "stages", multiple=True,  # every stage of the registry (options.STAGES is its names)
                 help=f"Stage: {options_mod.STAGES[0]} (default), {', '.join(options_mod.STAGES[1:-1])} or "
                      f"{options_mod.STAGES[-1]}. Repeatable."),
    click.option("--profile", type=click.Choice(["quick", "full"]), default=None, help="quick: CPU-sized (default); full: GPU-sized."),
    click.option("--steps", type=int, help="Training steps N per run (default: 30 quick, 300 full)."),
    click.option("--resume-at", type=int, help="Step k where run C resumes from run A's checkpoint (default N/2)."),
    click.option("--seed", type=int, help="Run seed (default 0)."),
    click.option("--threads", type=int, help="CPU intra-op threads, pinned and recorded (default 1)."),
    click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Device for training (default cpu)."),
    click.option("--cpu-isa", type=click.Choice(["avx2", "avx512", "native"]), default=None,
                 help="Cap the CPU kernels at this level (ATen, oneDNN and MKL), so goldens hold on every host that "
                      "has it (default: the image's manifest cpu_isa, else native: what the host offers)."),
    click.option("--world-size", type=int,
                 help="Ranks per run under DDP, launched by torchrun (default 1); audit and probes run one process."),
    click.option("--gpus", help="Docker backend: GPUs to request: all, a count, or ids like 0,1."),
    click.option("--memory", help="Docker backend: a container's memory limit, swap included, e.g. 8g or 512m "
                                  "(default 8g); a run that reaches it is an ERROR that says so."),
    click.option("--pids-limit", type=int, help="Docker backend: a container's processes and threads (default 1024); "
                                                "a run that reaches it is an ERROR that says so."),
    click.option("--timeout", type=float, help="Seconds allowed per worker run (default 600)."),
    click.option("--jobs", "-j", type=int, help="Worker runs at once (default: usable CPUs / --threads, at most 3)."),
    click.option("--results-dir", type=click.Path(path_type=Path), help="Where results go (default ./results)."),
    click.option("--goldens-dir", type=click.Path(path_type=Path), help="Where golden files live (default ./goldens)."),
    click.option("--update-golden", is_flag=True, default=None, help="Record goldens from this run if it passed its own checks."),
    click.option("--webhook", help="Slack-compatible webhook URL for alerts (or REPROCI_WEBHOOK)."),
    click.option("--keep-checkpoints", is_flag=True, default=None, help="Keep run A's checkpoint files."),
    click.option("--fork-server/--no-fork-server", default=None,
                 help="Fork each run from a preloaded server (default on the local backend; with --image, "
                      "a server container per model) or start a fresh interpreter (container) per run."),
    click.option("--compile", "compile_", is_flag=True, default=None,
                 help="Run every run compiled with torch.compile (inductor), each with a cold cache of its own; "
                      "compared only with compiled goldens."),
    click.option("--compile-mode", type=click.Choice(["default", "reduce-overhead", "max-autotune",
                                                      "max-autotune-no-cudagraphs"]), default=None,
                 help="With --compile: torch.compile's mode (default: default)."),
    click.option("--amp", type=click.Choice(["bf16", "fp16"]), default=None,
                 help="Each forward and loss under torch.autocast to this dtype (fp16 with a GradScaler); part of the identity."),
    click.option("--bisect", is_flag=True, default=None,
                 help="For each model that fails its check, re-run it with compile, AMP, loader workers, ranks and "
                      "threads turned off one at a time, and name the first change that restores equality."),
    click.option("--blame", is_flag=True, default=None,
                 help="For each UPGRADE_CHANGED model (--image), run it in the golden's image with one changed package "
                      "(group) of the new image at a time, and name the one that alone reproduces the change."),
    click.option("--config", type=click.Path(path_type=Path), help="Config file (default ./reproci.yaml if present)."),
    click.option("--ci/--no-ci", default=None,
                 help="CI mode: a golden that is missing or cannot be compared fails (default: from $CI)."),
    click.option("--repetitions", type=click.IntRange(min=1),
                 help="Throughput stage: interleaved repetitions per mode (at most; default 5)."),
    click.option("--time-budget", type=float, metavar="SECONDS",
                 help="Throughput stage: seconds a model's measurement may take; it stops when the slowdown's interval "
                      f"reaches its target or this is spent, and says which (default {options_mod.DEFAULT_TIME_BUDGET:g})."),
    click.option("--seeds", type=int, help="Variance stage: strict runs per model, seeds --seed .. --seed + K - 1 (default 5)."),
    click.option("--slowdown-factor", type=float, help="Throughput regression threshold against the golden (default 1.25)."),
    click.option("--slowdown-fails", is_flag=True, default=None, help="A throughput regression fails the run (exit 3) instead of warning."),
    click.option("--probes-fail", is_flag=True, default=None,
                 help="A dependency found by --stage probes fails the run (exit 1) instead of being reported."),
    click.option("--fault", hidden=True, help="TEST ONLY: inject a fault to prove a verdict fires."),
]


def run_options(fn: Callable[..., Any] | None = None, *, without: tuple[str, ...] = (),
                helps: dict[str, str] | None = None) -> Any:
    """Every option of ``reproci run``, for the commands that run the matrix: ``@run_options``,
    or ``@run_options(without=(names...), helps={name: help})`` for a command that has no use
    for some of them or says one differently (bisect's -m is required)."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(_OPTIONS):
            fn = option(fn)
        params = fn.__click_params__  # type: ignore[attr-defined]
        params[:] = [p for p in params if p.name not in without]
        for p in params:
            if p.name in (helps or {}):
                p.help = (helps or {})[p.name]
        return fn
    return decorate(fn) if fn is not None else decorate


# what a cell of --backend ray is not given: the driver's own (cluster/cell.py sets the rest)
SLURM_ONLY = ("partition", "account", "qos", "slurm_time", "gres", "gpus_per_task", "sbatch_args", "launcher",
              "slurm_spool")
DRIVER_ONLY = {"backend", "address", "node_labels", "across_nodes", "models", "results_dir", "goldens_dir",
               "update_golden", "keep_checkpoints", "webhook", "ci", *SLURM_ONLY}


def _backend(kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """--backend checked against --image; the Ray or Slurm backend's options (None for the others)."""
    backend, address, labels = kwargs.pop("backend", None), kwargs.pop("address", None), kwargs.pop("node_labels", ())
    across = bool(kwargs.pop("across_nodes", None))
    if across and backend not in ("ray", "slurm"):
        raise options_mod.UsageError("--across-nodes runs each model's cell on two nodes of a cluster: add --backend ray "
                                     "or --backend slurm")
    slurm = {k: kwargs.pop(k, None) for k in SLURM_ONLY}
    given = next((k for k, v in slurm.items() if v not in (None, ())), None)
    if given and backend != "slurm":
        flag = {"slurm_time": "time", "sbatch_args": "sbatch-arg"}.get(given, given.replace("_", "-"))
        raise options_mod.UsageError(f"--{flag} asks Slurm for the cells: add --backend slurm")
    if backend == "local" and kwargs.get("image") not in (None, "local"):
        raise options_mod.UsageError("--backend local runs without a container: leave out --image, or use --backend docker")
    if backend == "docker" and kwargs.get("image") in (None, "local"):
        raise options_mod.UsageError("--backend docker runs in a container: name it with --image")
    if backend != "ray":
        if address or labels:
            raise options_mod.UsageError(f"{'--address' if address else '--node-label'} places cells on a Ray cluster: "
                                         "add --backend ray")
        return backend, None if backend != "slurm" else replace(_slurm(slurm), across_nodes=across)
    from ..cluster import ray_driver

    return backend, replace(ray_driver.cluster_options(address, labels), across_nodes=across)


def _slurm(given: dict[str, Any]) -> Any:
    from ..cluster import slurm_job

    return slurm_job.slurm_options(given["partition"], given["account"], given["qos"], given["slurm_time"],
                                   given["gres"], given["gpus_per_task"], given["sbatch_args"] or (),
                                   given["launcher"], given["slurm_spool"])


def run_and_report(kwargs: dict[str, Any], params: list[click.Parameter] | None = None) -> None:
    """Build the options once, run every stage, print the tables, exit with the verdict's code."""
    given = dict(kwargs)
    params = click.get_current_context().command.params if params is None else params
    backend, cluster = _backend(kwargs)
    opts = options_mod.build(kwargs)
    out, err = console.stdout(), console.stderr()
    if given.get("config") is None and opts.config_file is not None and opts.config_file.parent != Path("."):
        err.print(f"using {opts.config_file}, found above the working directory: its folder holds the results "
                  "and goldens", highlight=False, markup=False)
    lost: list[str] = []
    with RunProgress(err, log=console.is_log(sys.stderr)) as progress:
        if cluster is not None:
            from ..cluster import ray_driver, slurm_driver

            args = ray_driver.argv_of(params, given, DRIVER_ONLY) + (("--ci",) if opts.ci else ("--no-ci",))
            engine = slurm_driver if backend == "slurm" else ray_driver
            document, path, lost = engine.run_cells(opts, cluster, args, progress)
        else:
            document, path = orchestrate.run_all(opts, progress=progress, on_step=progress.step)
    registry.print_run(document, opts.stages, out, err, path)
    g = document.get("golden") or {}
    if g.get("updated"):
        out.print(f"golden recorded: {g['file']} (review and commit it)")
    elif g.get("refused"):
        err.print(f"[bold red]error:[/] {g['refused']}")
    for line in lost:
        err.print(f"[bold red]error:[/] {line}", highlight=False)
    code = document["summary"]["exit_code"]
    if code:
        raise SystemExit(code)


@click.command("run")
@run_options
def run_cmd(**kwargs: Any) -> None:
    """Run the reference matrix through the strict-determinism stage (and any other --stage)."""
    run_and_report(kwargs)
