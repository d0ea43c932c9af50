"""Every option of ``reproci run``, declared once: its command-line flag and help, its
``reproci.yaml`` key and the check of its value there, its default, the check of its value,
its group (what it is about) and whether the results record it.

This module holds the core options (``OPTIONS``: the image, the run's shape, its resources and
output). A stage declares its own as the fields of its frozen options dataclass (``setting``;
``stages.base.Stage.options``) and reads them by attribute. ``Catalog`` is the whole table for
an ordered tuple of stages, which the command line composes (``reproci.plugins``) and hands
down: ``commands/run.py`` makes the click options from it, ``settings.config_file`` the keys
``reproci.yaml`` accepts, ``settings.options.build`` the frozen ``RunOptions`` (each stage's
options dataclass built) and ``recorded`` the ``options`` of results.json. Nothing here imports
a stage; this module imports nothing of reproci, so that a stage's module can declare its
options with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Protocol, TypeVar

PROFILES = {"quick": 30, "full": 300}  # profile -> default steps
AMP = ("bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CPU_ISAS = ("avx2", "avx512", "native")

# the groups, by concern
CLUSTER = "cluster"  # where cells run beyond this machine: --backend ray or slurm (the driver's own)
IMAGE = "image"  # what the runs run in
SHAPE = "run shape"  # which models, stages, steps: what the runs do
RESOURCES = "resources"  # what each run gets
OUTPUT = "output"  # where results, goldens and alerts go
EXECUTION = "execution"  # compile and autocast: part of a run's identity
# a stage's knobs: the group is the stage's name


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


def _is_names(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


Check = Callable[[Any], bool]
INTEGER: tuple[str, Check] = ("an integer", _is_int)
BOOLEAN: tuple[str, Check] = ("true or false", _is_bool)
SECONDS: tuple[str, Check] = ("a number of seconds", _is_number)
NUMBER: tuple[str, Check] = ("a number", _is_number)
NAMES = "a model name or a list of them"


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of ``reproci run``."""

    name: str  # the reproci.yaml key, the field of RunOptions (or the knob's name), the key in results.json
    group: str  # what it is about (the constants above)
    help: str  # its command-line help
    flags: tuple[str, ...] = ()  # its command-line spellings; () for --NAME (underscores as dashes)
    param: str | None = None  # the click parameter's name where it is not ``name``
    type: Any = None  # click's value type: int, float, Path (a path), None (text)
    choices: tuple[str, ...] = ()  # the only values the command line takes
    minimum: int | None = None  # the command line refuses integers below it
    flag: bool = False  # a switch (--x, or --x/--no-x when ``negatable``)
    negatable: bool = False
    multiple: bool = False  # repeatable; the values come as a tuple
    hidden: bool = False  # test-only: left out of --help
    metavar: str | None = None
    yaml: tuple[str, Check] | None = None  # what reproci.yaml takes (as its error says it) and the check; None: flag only
    aliases: tuple[str, ...] = ()  # reproci.yaml keys read as this one
    # A knob (an option without a RunOptions field of its own, built by the one generic path):
    default: Any = None  # its value when neither the command line nor reproci.yaml gives one
    convert: Callable[[Any], Any] | None = None  # the given value, made its type (int, float, bool)
    refuse: Callable[[Any], str | None] | None = None  # why a value is refused (after the flag's name), else None
    record: bool = False  # recorded in the options of results.json
    cell: bool = True  # a cell of --backend ray or slurm receives it (False: the driver's own, or the cell sets it)
    # What it has to do with a stage (checked by ``settings.options.build``; no other code names a stage there):
    adds_stage: str | None = None  # a switch that adds this stage to the run (--bisect)
    # (a stage, what the option does): refused unless that stage runs; the stage may be CHECKER, and
    # what it does may say {stage}: the catalog names the stage that checks reproducibility there
    needs_stage: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        """The click parameter's name: what the command line's values are keyed by."""
        return self.param or self.name

    @property
    def shown(self) -> str:
        """The flag as messages name it: --stage, --compile-mode, --time."""
        long = next((f for f in self.flags if f.startswith("--")), None)
        return long.split("/")[0] if long else "--" + self.name.replace("_", "-")


# In an option's ``needs_stage``: the stage whose verdicts say that the runs reproduce (the
# composed stage with ``checks_reproducibility``), named by ``Catalog`` once it knows the stages.
CHECKER = "<the stage that checks reproducibility>"

_SLURM = "--backend slurm: "
OPTIONS: list[Option] = [
    # where cells run beyond this machine: the driver's own, never a cell's (commands/run.py reads them)
    Option(name="image", group=IMAGE, yaml=("an image name (a string)", _is_str),
           help="Container image to run in (manifest name or any reference). Omit for the local backend."),
    Option(name="backend", group=CLUSTER, choices=("local", "docker", "ray", "slurm"),
           help="Where the runs execute: local (no --image), docker (--image), or ray: each model a cell on a "
                "Ray cluster, run there by the local or Docker backend, merged here (needs reproci[ray]); "
                "slurm: each model a task of one Slurm job array (a filesystem shared with the nodes)."),
    Option(name="address", group=CLUSTER,
           help="--backend ray: the cluster, HOST:PORT (default: $RAY_ADDRESS, else a local cluster)."),
    Option(name="node_labels", flags=("--node-label",), group=CLUSTER, multiple=True,
           help="--backend ray: only nodes with this label, KEY=VALUE (repeatable), e.g. ray.io/accelerator-type=H100."),
    Option(name="across_nodes", group=CLUSTER, flag=True,
           help="--backend ray or slurm: run each model's cell on two nodes and compare their runs A step by step, "
                "so that results are proven to agree across machines of one image (twice the cells; on Slurm "
                "each task asks for two nodes, --nodes=2 --ntasks-per-node=1)."),
    Option(name="partition", group=CLUSTER, help=_SLURM + "the partition (sbatch --partition)."),
    Option(name="account", group=CLUSTER, help=_SLURM + "the account charged (sbatch --account)."),
    Option(name="qos", group=CLUSTER, help=_SLURM + "the quality of service (sbatch --qos)."),
    Option(name="slurm_time", flags=("--time",), group=CLUSTER,
           help=_SLURM + "each cell's time limit, MINUTES or [D-]HH:MM:SS (sbatch --time)."),
    Option(name="gres", group=CLUSTER,
           help=_SLURM + "generic resources per cell, e.g. gpu:1 or gpu:a100:2 (sbatch --gres)."),
    Option(name="gpus_per_task", group=CLUSTER, help=_SLURM + "GPUs per cell, [TYPE:]COUNT (sbatch --gpus-per-task)."),
    Option(name="sbatch_args", flags=("--sbatch-arg",), group=CLUSTER, multiple=True,
           help=_SLURM + "one more sbatch option, passed as it is (repeatable), e.g. --sbatch-arg=--exclusive."),
    Option(name="launcher", group=CLUSTER, choices=("node", "pyxis"),
           help=_SLURM + "node (default): each node's reproci runs the cell, by its Docker with --image; "
                "pyxis: srun --container-image runs the cell inside --image (reproci installed in it)."),
    Option(name="slurm_spool", group=CLUSTER, type=Path,
           help=_SLURM + "the directory shared with the nodes for the cells' specs and results "
                "(default: RESULTS_DIR/.slurm)."),
    # the image and the runs
    Option(name="image_name", group=IMAGE, yaml=("a golden name (a string)", _is_str),
           help="Name under which goldens for this image are kept (default: from --image, or 'local')."),
    Option(name="models", cell=False, flags=("--model", "-m"), group=SHAPE, multiple=True, yaml=(NAMES, _is_names), aliases=("model",),
           help="Model to run: conv, transformer, embedding, FILE.py:factory or module:factory. Repeatable. "
                "Default: all reference models."),
    Option(name="script", cell=False, group=SHAPE, yaml=("a command (a string)", _is_str), metavar="COMMAND",
           help="Your own training script as a model, unchanged: the command that trains from scratch, with "
                "{steps} (N), {resume_at} (k) and {out} (the run's own output folder), e.g. \"python train.py "
                "--max_iters {steps} --out_dir {out}\". Runs from this directory; a leading python is reproci's."),
    Option(name="resume_script", cell=False, group=SHAPE, yaml=("a command (a string)", _is_str), metavar="COMMAND",
           help="With --script: the command that resumes from the checkpoint in {out} (run C's {out} is a copy of "
                "run A's as its step k+1 began), e.g. \"python train.py --out_dir {out} --init_from resume\"."),
    Option(name="script_name", flags=("--name",), cell=False, group=SHAPE, yaml=("a model name (a string)", _is_str),
           metavar="NAME", help="With --script: the model's name in results and goldens (default: the script's file name)."),
    Option(name="stages", flags=("--stage", "-s"), group=SHAPE, multiple=True, record=True,
           yaml=("a stage name or a list of them", _is_names),  # every stage of the catalog
           help="Stage: {stages}. Repeatable."),  # the stages, as options() lists them
    Option(name="profile", group=SHAPE, choices=tuple(PROFILES), record=True, yaml=("quick or full", _is_str),
           help="quick: CPU-sized (default); full: GPU-sized."),
    Option(name="steps", group=SHAPE, type=int, yaml=INTEGER, record=True,
           help="Training steps N per run (default: 30 quick, 300 full)."),
    Option(name="resume_at", group=SHAPE, type=int, yaml=INTEGER, record=True,
           help="Step k where run C resumes from run A's checkpoint (default N/2)."),
    Option(name="seed", group=SHAPE, type=int, yaml=INTEGER, record=True, help="Run seed (default 0)."),
    Option(name="threads", group=RESOURCES, type=int, yaml=INTEGER, record=True,
           help="CPU intra-op threads, pinned and recorded (default 1)."),
    Option(name="device", group=RESOURCES, choices=("cpu", "cuda"), yaml=("cpu or cuda", _is_str), record=True,
           help="Device for training (default cpu)."),
    Option(name="cpu_isa", group=IMAGE, choices=CPU_ISAS, yaml=("one of avx2, avx512, native", lambda v: v in CPU_ISAS),
           record=True,
           help="Cap the CPU kernels at this level (ATen, oneDNN and MKL), so goldens hold on every host that "
                "has it (default: the image's manifest cpu_isa, else native: what the host offers)."),
    Option(name="world_size", group=RESOURCES, type=int, yaml=INTEGER, record=True,
           help="Ranks per run under DDP, launched by torchrun (default 1); audit and probes run one process."),
    Option(name="gpus", group=RESOURCES,
           yaml=("all, a count or comma-separated GPU ids", lambda v: isinstance(v, str) or _is_int(v)),
           help="Docker backend: GPUs to request: all, a count, or ids like 0,1."),
    Option(name="memory", group=RESOURCES, yaml=("a size, e.g. 8g or 512m", lambda v: isinstance(v, str) or _is_int(v)),
           help="Docker backend: a container's memory limit, swap included, e.g. 8g or 512m "
                "(default 8g); a run that reaches it is an ERROR that says so."),
    Option(name="pids_limit", group=RESOURCES, type=int, yaml=INTEGER,
           help="Docker backend: a container's processes and threads (default 1024); "
                "a run that reaches it is an ERROR that says so."),
    Option(name="timeout", group=RESOURCES, type=float, yaml=SECONDS, help="Seconds allowed per worker run (default 600)."),
    Option(name="jobs", flags=("--jobs", "-j"), group=RESOURCES, type=int, yaml=INTEGER,
           help="Worker runs at once (default: usable CPUs / --threads, at most 3)."),
    Option(name="results_dir", cell=False, group=OUTPUT, type=Path, yaml=("a directory (a string)", _is_str),
           help="Where results go (default: results in this directory, or beside a reproci.yaml found above it)."),
    Option(name="goldens_dir", cell=False, group=OUTPUT, type=Path, yaml=("a directory (a string)", _is_str),
           help="Where golden files live (default: goldens in this directory, or beside a reproci.yaml found above "
                "it)."),
    Option(name="update_golden", cell=False, group=OUTPUT, flag=True,
           needs_stage=(CHECKER, "records the {stage} stage's hashes (the variance stage rides along)"),
           help="Record goldens from this run if it passed its own checks."),
    Option(name="webhook", cell=False, group=OUTPUT, yaml=("a URL (a string)", _is_str),
           help="Slack-compatible webhook URL for alerts (or REPROCI_WEBHOOK)."),
    Option(name="keep_checkpoints", cell=False, group=OUTPUT, flag=True, yaml=BOOLEAN, help="Keep run A's checkpoint files."),
    Option(name="fork_server", group=RESOURCES, flag=True, negatable=True, yaml=BOOLEAN, record=True,
           help="Fork each run from a preloaded server (default on the local backend; with --image, "
                "a server container per model) or start a fresh interpreter (container) per run."),
    Option(name="compile", param="compile_", group=EXECUTION, flag=True, record=True,
           yaml=("true, false or a list of the models to compile", lambda v: isinstance(v, bool) or _is_names(v)),
           help="Run every run compiled with torch.compile (inductor), each with a cold cache of its own; "
                "compared only with compiled goldens."),
    Option(name="compile_mode", group=EXECUTION, choices=COMPILE_MODES, record=True,
           yaml=(f"one of {', '.join(COMPILE_MODES)}", lambda v: v in COMPILE_MODES),
           help="With --compile: torch.compile's mode (default: default)."),
    Option(name="amp", group=EXECUTION, choices=AMP, yaml=("bf16 or fp16", lambda v: v in AMP), record=True,
           help="Each forward and loss under torch.autocast to this dtype (fp16 with a GradScaler); part of the identity."),
    Option(name="config", group=OUTPUT, type=Path,
           help="Config file (default: reproci.yaml in this directory or the nearest folder above it, up to "
                "the git work tree's top)."),
    Option(name="ci", cell=False, group=OUTPUT, flag=True, negatable=True, record=True,
           help="CI mode: a golden that is missing or cannot be compared fails (default: from $CI)."),
    Option(name="fault", group=SHAPE, hidden=True, record=True, help="TEST ONLY: inject a fault to prove a verdict fires."),
    Option(name="cell_options", group=CLUSTER, type=Path, hidden=True,
           help="A cell of --backend ray or slurm: the run's options, as the driver sends them (JSON)."),
]

# The order results.json has always recorded its options in; an option recorded later follows them.
RECORDED_ORDER = ("stages", "profile", "steps", "resume_at", "seed", "threads", "world_size", "device", "cpu_isa",
                  "fault", "ci", "slowdown_fails", "probes_fail", "fork_server", "compile", "compile_mode", "amp")


OPTION = "reproci.option"  # the metadata key of a stage's option, a field of its options dataclass (``setting``)
T = TypeVar("T")


def setting(default: T, *, help: str, **how: Any) -> T:
    """A stage's option, as a field of the stage's frozen options dataclass (``Stage.options``): its
    default, its command-line help, and the rest of its declaration (``Option``'s fields: ``type``,
    ``yaml``, ``flag``, ``convert``, ``refuse``, ``record``, ...). The field's name is the option's:
    its reproci.yaml key, ``--NAME`` on the command line, its key in results.json; a stage reads
    its value by attribute (``run.options.of(ThroughputOptions).repetitions``)."""
    unknown = sorted(set(how) - {f.name for f in fields(Option)})
    if unknown:
        raise TypeError(f"setting() takes Option's fields; not {', '.join(unknown)}")
    return field(default=default, metadata={OPTION: {"help": help, **how}})


def declared_by(stage: str, kind: type[Any] | None) -> tuple[Option, ...]:
    """The options a stage's options dataclass declares (its fields made by ``setting``), in
    field order, each in the stage's group."""
    if kind is None:
        return ()
    if not is_dataclass(kind):
        raise TypeError(f"stage {stage!r}: its options must be a frozen dataclass, not {kind!r}")
    out = []
    for f in fields(kind):
        if OPTION not in f.metadata:
            raise TypeError(f"stage {stage!r}: option {f.name} is not declared with settings.declared.setting()")
        out.append(Option(name=f.name, group=stage, default=f.default, **f.metadata[OPTION]))
    return tuple(out)


class StageOptions(Protocol):
    """What the options know of a stage (``stages.base.Stage`` has each of these)."""

    @property
    def name(self) -> str: ...  # what --stage says

    @property
    def options(self) -> type[Any] | None: ...  # its frozen options dataclass (fields made by ``setting``)

    @property
    def needs(self) -> tuple[str, ...]: ...  # the stages it starts from: added before it when not asked for

    @property
    def needs_image(self) -> str | None: ...  # why it needs --image (said after the flag that asked for it)

    @property
    def needs_golden(self) -> str | None: ...  # why it needs the image's golden (said after the flag)

    @property
    def checks_reproducibility(self) -> bool: ...  # its verdicts say that the runs reproduce (CHECKER)


@dataclass(frozen=True)
class Catalog:
    """The options of ``reproci run`` with a given ordered tuple of stages: the core ones, then each
    stage's own. The command line composes it from the stages it runs (``reproci.plugins``) and
    hands it down: nothing in settings imports a stage."""

    stages: tuple[StageOptions, ...] = ()
    table: tuple[Option, ...] = field(init=False, repr=False, compare=False)
    owners: Mapping[str, str] = field(init=False, repr=False, compare=False)  # a stage's option -> the stage
    # the stage that checks reproducibility (CHECKER; the determinism stage), None in a catalog without one
    checker: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two stages are named {', '.join(map(repr, twice))}")
        taken = {o.name for o in OPTIONS}
        owners: dict[str, str] = {}
        for stage in self.stages:
            declared = declared_by(stage.name, stage.options)
            clash = sorted(taken & {o.name for o in declared})
            if clash:
                raise ValueError(f"stage {stage.name!r} declares options that exist already: {', '.join(clash)}")
            taken |= {o.name for o in declared}
            owners.update((o.name, stage.name) for o in declared)
        listed = (f"{names[0]} (default), {', '.join(names[1:-1])} or {names[-1]}" if len(names) > 2
                  else " or ".join(names))
        checker = next((s.name for s in self.stages if s.checks_reproducibility), None)
        core = [replace(o, help=o.help.format(stages=listed)) if o.name == "stages" else o for o in OPTIONS]
        table = (*(o for o in core if not o.hidden), *(o for s in self.stages for o in declared_by(s.name, s.options)),
                 *(o for o in core if o.hidden))
        object.__setattr__(self, "table", tuple(_named_checker(o, checker) for o in table))
        object.__setattr__(self, "owners", MappingProxyType(owners))
        object.__setattr__(self, "checker", checker)

    @property
    def names(self) -> tuple[str, ...]:
        """The names --stage and reproci.yaml's ``stages`` accept, in the order the stages run."""
        return tuple(s.name for s in self.stages)

    def options(self) -> list[Option]:
        """Every option of ``reproci run``: the core ones, then each stage's in the order the
        stages run, then the test-only ones (hidden from --help)."""
        return list(self.table)

    def declared(self, name: str) -> Option:
        """The declaration of the option ``name`` (its reproci.yaml key)."""
        return next(o for o in self.table if o.name == name)

    def config_keys(self) -> dict[str, tuple[str, Check]]:
        """The keys reproci.yaml takes, each with what it takes and the check of its value."""
        return {key: o.yaml for o in self.table if o.yaml is not None for key in (o.name, *o.aliases)}

    def for_cell(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options a user gave (click parameter -> value) that a cell of --backend ray or slurm
        receives, as JSON: not the driver's own (``cell=False``, the cluster's), not those left unset."""
        return {o.key: _json(given[o.key]) for o in self.table
                if o.cell and o.group != CLUSTER and given.get(o.key) not in (None, ())}

    def from_cell(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A cell's options as ``settings.options.build`` takes them (``for_cell``'s JSON, read back):
        click parameter -> value, each of the type the command line gives it."""
        by_key = {o.key: o for o in self.table}
        unknown = sorted(set(values) - set(by_key))
        if unknown:  # the driver checks that the nodes run its reproci: a different one here is a bug
            raise ValueError(f"a cell's options name no option of this reproci: {', '.join(unknown)}")
        return {key: _typed(by_key[key], v) for key, v in values.items()}


@functools.cache
def catalog_of(stages: tuple[StageOptions, ...]) -> Catalog:
    """The catalog of ``stages``, made once for them (the commands read it at every command line)."""
    return Catalog(stages)


def _named_checker(o: Option, checker: str | None) -> Option:
    """An option whose ``needs_stage`` is CHECKER, with the stage that checks reproducibility named."""
    if o.needs_stage is None or o.needs_stage[0] != CHECKER or checker is None:
        return o
    return replace(o, needs_stage=(checker, o.needs_stage[1].format(stage=checker)))


def _json(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def _typed(o: Option, value: Any) -> Any:
    if o.multiple:
        return tuple(value)
    return Path(value) if o.type is Path and value is not None else value
