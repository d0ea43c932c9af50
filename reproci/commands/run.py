"""``reproci run`` (and ``reproci golden update``, which takes the same options): the click
code; ``orchestrate.run_all`` does the work."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click

from .. import console, orchestrate, plugins
from ..cluster.engines import ENGINES, engine
from ..reports.progress import RunProgress
from ..reports.terminal import print_run
from ..settings import options as options_mod
from ..settings.declared import Option


def _click_args(o: Option) -> tuple[list[str], dict[str, Any]]:
    """The parameter declarations and settings of a declaration's click option."""
    flags = o.flags or ("--" + o.name.replace("_", "-"),)
    if o.negatable:
        flags = (f"{flags[0]}/--no-{flags[0].removeprefix('--')}",)
    kind: Any = o.type
    if o.choices:
        kind = click.Choice(list(o.choices))
    elif o.type is Path:
        kind = click.Path(path_type=Path)
    elif o.minimum is not None:
        kind = click.IntRange(min=o.minimum)
    more: dict[str, Any] = {"is_flag": True} if o.flag and not o.negatable else {}
    if o.multiple:
        more["multiple"] = True
    if o.hidden:
        more["hidden"] = True
    if o.metavar:
        more["metavar"] = o.metavar
    return [*flags, o.key], {"type": kind, "default": None, "help": o.help, **more}


def click_option(o: Option) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of a declaration (``settings.declared``)."""
    decls, attrs = _click_args(o)
    return click.option(*decls, **attrs)


def run_options(fn: Callable[..., Any] | None = None, *, without: tuple[str, ...] = (),
                helps: dict[str, str] | None = None) -> Any:
    """Every option of ``reproci run``, for the commands that run the matrix: ``@run_options``,
    or ``@run_options(without=(names...), helps={name: help})`` for a command that has no use
    for some of them or says one differently (bisect's -m is required)."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        table = plugins.catalog().options()
        for option in reversed(table):
            fn = click_option(option)(fn)
        params = fn.__click_params__  # type: ignore[attr-defined]
        params[:] = [p for p in params if p.name not in without]
        for p in params:
            if p.name in (helps or {}):
                p.help = (helps or {})[p.name]
        return fn
    return decorate(fn) if fn is not None else decorate


SLURM_ONLY = ("partition", "account", "qos", "slurm_time", "gres", "gpus_per_task", "sbatch_args", "launcher",
              "slurm_spool")  # what --backend slurm asks Slurm for


def _backend(kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """--backend checked against --image; the Ray or Slurm backend's options (None for the others)."""
    backend, address, labels = kwargs.pop("backend", None), kwargs.pop("address", None), kwargs.pop("node_labels", ())
    across = bool(kwargs.pop("across_nodes", None))
    if across and backend not in ENGINES:
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


def run_and_report(kwargs: dict[str, Any], settings: options_mod.Settings | None = None) -> None:
    """Build the options once, run every stage, print the tables, exit with the verdict's code
    (``settings``: reproci.yaml as the command already read it)."""
    if kwargs.get("cell_options") is not None:  # a cell of --backend ray or slurm: the driver's options for it
        kwargs = plugins.catalog().from_cell(json.loads(Path(kwargs["cell_options"]).read_text()))
    kwargs.pop("cell_options", None)
    given = dict(kwargs)
    backend, cluster = _backend(kwargs)
    opts = plugins.build_options(kwargs, settings=settings)
    if cluster is not None and backend is not None:
        options_mod.check_script_cells(opts, backend)
    out, err = console.stdout(), console.stderr()
    if given.get("config") is None and opts.config_file is not None and opts.config_file.parent != Path("."):
        err.print(f"using {opts.config_file}, found above the working directory: its folder holds the results "
                  "and goldens", highlight=False, markup=False)
    lost: list[str] = []
    with RunProgress(err, log=console.is_log(sys.stderr)) as progress:
        if cluster is not None:
            sent = {**plugins.catalog().for_cell(given), "ci": opts.ci}  # each cell's run: the options, not a command line
            assert backend is not None
            document, path, lost = engine(backend).run_cells(opts, cluster, sent, progress, orchestrate.publish)
        else:
            document, path = orchestrate.run_all(opts, progress=progress, on_step=progress.step)
    print_run(document, plugins.stages(), out, err, path)
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
