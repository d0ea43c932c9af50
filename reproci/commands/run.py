"""``reproci run`` (and ``reproci golden update``, which takes the same options): the click
code; ``orchestrate.run_all`` does the work.

The commands that run the stages (``reproci run``, ``golden update``, a stage's own, ``reproci
bisect``) are ``RunCommand``s, made with ``@run_command(NAME)``: they take the options of the
stages the command line composed (``reproci.plugins``), which ``reproci.cli`` hands down as the
click context's object (``composed_stages``). This module never imports ``reproci.plugins``: a
stage's command module uses it, and the stages are composed of those modules."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, TypedDict, cast

import click

from .. import console, orchestrate
from ..cluster.engines import ENGINES, engine
from ..errors import UsageError
from ..golden import comparison
from ..reports.progress import RunProgress
from ..reports.terminal import print_run
from ..settings import options as options_mod
from ..settings.config_file import Settings
from ..settings.declared import Option, catalog_of
from ..stages.base import Stage, Stages


class _OptionSettings(TypedDict, total=False):
    """The settings of a declaration's click option (``click.Option``'s keywords)."""

    type: Any  # a click type, or the declaration's Python type
    default: None
    help: str
    is_flag: bool
    multiple: bool
    hidden: bool
    metavar: str


def _click_args(o: Option) -> tuple[list[str], _OptionSettings]:
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
    more: _OptionSettings = {"is_flag": True} if o.flag and not o.negatable else {}
    if o.multiple:
        more["multiple"] = True
    if o.hidden:
        more["hidden"] = True
    if o.metavar:
        more["metavar"] = o.metavar
    return [*flags, o.key], {"type": kind, "default": None, "help": o.help, **more}


def composed_stages(ctx: click.Context | None = None) -> Stages:
    """The stages of ``reproci run`` as the command line composed them: the click context's object,
    which ``reproci.cli`` sets to ``plugins.stages()`` (``ctx``: the current context by default)."""
    ctx = click.get_current_context() if ctx is None else ctx
    found = ctx.find_object(Stages)
    if found is None:
        raise RuntimeError(f"`{ctx.command_path}` runs the stages the command line composed: invoke it through the "
                           "reproci group (reproci.cli), or give its context obj=reproci.plugins.stages()")
    return found


def read_settings(kwargs: Mapping[str, Any]) -> Settings:
    """A command line's settings, reproci.yaml read once, with the options of the composed stages."""
    return Settings.read(kwargs, catalog_of(composed_stages()))


class RunCommand(click.Command):
    """A command that takes every option of ``reproci run`` (made with ``@run_command``): the core
    ones and those of the composed stages (``composed_stages``), made when click first reads the
    command's parameters with them. A stage's own command is defined before the composition it
    belongs to exists."""

    def __init__(self, *args: Any, without: tuple[str, ...] = (), helps: Mapping[str, str] | None = None,
                 takes: Callable[[Stage], bool] = lambda stage: True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.without, self.helps, self.takes = without, dict(helps or {}), takes
        self._made: dict[Stages, list[click.Parameter]] = {}

    def run_params(self, stages: Stages) -> list[click.Parameter]:
        """Its options of ``reproci run`` with ``stages``: all but those it is ``without`` and those of
        the stages it does not take, each with its help (``helps`` where the command says it otherwise)."""
        if stages not in self._made:
            catalog = catalog_of(stages)
            left_out = {stage.name for stage in stages if not self.takes(stage)}
            made: list[click.Parameter] = []
            for o in catalog.options():
                if o.key in self.without or catalog.owners.get(o.name) in left_out:
                    continue
                decls, attrs = _click_args(o)
                attrs["help"] = self.helps.get(o.key, o.help)
                made.append(click.Option(decls, **attrs))
            self._made[stages] = made
        return self._made[stages]

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return [*self.run_params(composed_stages(ctx)), *super().get_params(ctx)]


def run_command(name: str, *, without: tuple[str, ...] = (), helps: Mapping[str, str] | None = None,
                takes: Callable[[Stage], bool] = lambda stage: True) -> Callable[[Callable[..., Any]], RunCommand]:
    """``@run_command(NAME)``: the command NAME with every option of ``reproci run``, or, for a command
    that has no use for some of them or says one differently (bisect's -m is required), all but those
    ``without`` names and those of the stages ``takes`` refuses, with the help ``helps`` gives."""
    return cast(Callable[[Callable[..., Any]], RunCommand],
                click.command(name, cls=RunCommand, without=without, helps=helps, takes=takes))


SLURM_ONLY = ("partition", "account", "qos", "slurm_time", "gres", "gpus_per_task", "sbatch_args", "launcher",
              "slurm_spool")  # what --backend slurm asks Slurm for


def _backend(kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """--backend checked against --image; the Ray or Slurm backend's options (None for the others)."""
    backend, address, labels = kwargs.pop("backend", None), kwargs.pop("address", None), kwargs.pop("node_labels", ())
    across = bool(kwargs.pop("across_nodes", None))
    if across and backend not in ENGINES:
        raise UsageError("--across-nodes runs each model's cell on two nodes of a cluster: add --backend ray "
                                     "or --backend slurm")
    slurm = {k: kwargs.pop(k, None) for k in SLURM_ONLY}
    given = next((k for k, v in slurm.items() if v not in (None, ())), None)
    if given and backend != "slurm":
        flag = {"slurm_time": "time", "sbatch_args": "sbatch-arg"}.get(given, given.replace("_", "-"))
        raise UsageError(f"--{flag} asks Slurm for the cells: add --backend slurm")
    if backend == "local" and kwargs.get("image") not in (None, "local"):
        raise UsageError("--backend local runs without a container: leave out --image, or use --backend docker")
    if backend == "docker" and kwargs.get("image") in (None, "local"):
        raise UsageError("--backend docker runs in a container: name it with --image")
    if backend != "ray":
        if address or labels:
            raise UsageError(f"{'--address' if address else '--node-label'} places cells on a Ray cluster: "
                                         "add --backend ray")
        return backend, None if backend != "slurm" else replace(_slurm(slurm), across_nodes=across)
    from ..cluster import ray_driver

    return backend, replace(ray_driver.cluster_options(address, labels), across_nodes=across)


def _slurm(given: dict[str, Any]) -> Any:
    from ..cluster import slurm_job

    return slurm_job.slurm_options(given["partition"], given["account"], given["qos"], given["slurm_time"],
                                   given["gres"], given["gpus_per_task"], given["sbatch_args"] or (),
                                   given["launcher"], given["slurm_spool"])


def run_and_report(kwargs: dict[str, Any], settings: Settings | None = None) -> None:
    """Build the options once, run every stage, print the tables, exit with the verdict's code
    (``settings``: reproci.yaml as the command already read it)."""
    stages = composed_stages()
    catalog = catalog_of(stages)
    if kwargs.get("cell_options") is not None:  # a cell of --backend ray or slurm: the driver's options for it
        kwargs = catalog.from_cell(json.loads(Path(kwargs["cell_options"]).read_text()))
    kwargs.pop("cell_options", None)
    given = dict(kwargs)
    backend, cluster = _backend(kwargs)
    opts = options_mod.build(kwargs, catalog, settings=settings)
    if cluster is not None and backend is not None:
        options_mod.check_script_cells(opts, backend)
    out, err = console.stdout(), console.stderr()
    if given.get("config") is None and opts.config_file is not None and opts.config_file.parent != Path("."):
        err.print(f"using {opts.config_file}, found above the working directory: its folder holds the results "
                  "and goldens", highlight=False, markup=False)
    lost: list[str] = []
    with RunProgress(err, log=console.is_log(sys.stderr)) as progress:
        if cluster is not None:
            sent = {**catalog.for_cell(given), "ci": opts.ci}  # each cell's run: the options, not a command line
            assert backend is not None
            document, path, lost = engine(backend).run_cells(opts, cluster, sent, progress, orchestrate.publish)
        else:
            document, path = orchestrate.run_all(opts, progress=progress, on_step=progress.step)
    print_run(document, stages, out, err, path)
    g = comparison.outcome_of(document)
    if g is not None and g.updated:
        out.print(f"golden recorded: {g.file} (review and commit it)")
    elif g is not None and g.refused:
        err.print(f"[bold red]error:[/] {g.refused}")
    for line in lost:
        err.print(f"[bold red]error:[/] {line}", highlight=False)
    code = document["summary"]["exit_code"]
    if code:
        raise SystemExit(code)


def run_with(stage: str, kwargs: dict[str, Any], settings: Settings | None = None) -> None:
    """``run_and_report`` with ``stage`` added to the stages asked for (the stages it needs run before
    it: ``Stage.needs``): a stage's own command (``reproci bisect``)."""
    kwargs["stages"] = tuple(dict.fromkeys((*(kwargs.get("stages") or ()), stage)))
    run_and_report(kwargs, settings=settings)


@run_command("run")
def run_cmd(**kwargs: Any) -> None:
    """Run the reference matrix through the strict-determinism stage (and any other --stage)."""
    run_and_report(kwargs)
