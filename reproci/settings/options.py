"""RunOptions: built once from the command line, reproci.yaml and the environment.

Everything downstream receives this frozen object; nothing else reads argv,
os.environ or the config file.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, TypedDict, TypeVar, cast

from .. import cpu_flags, images
from ..backends.docker_spec import DEFAULT_MEMORY, DEFAULT_PIDS, GIB
from ..errors import ConfigError, InfrastructureError, UsageError
from ..golden.folder import golden_file_name, golden_path, require_folder
from ..reference_models import REGISTRY
from ..results import RecordedOptions
from ..worker.process.spec import FAULTS, CompileSpec
from . import declared
from .config_file import CONFIG_FILE, Settings, load_config  # noqa: F401 (re-exported)
from .declared import PROFILES, Catalog  # noqa: F401 (PROFILES re-exported)
from .models import ModelRef, resolve_all, resolve_script

MAX_STEPS = 1_000_000  # a bound on N: a typo of many digits is refused, not trained for hours
MAX_THREADS = 1024  # a bound on --threads: more than any host's cores; a typo is refused before a pool is made
SEED_RANGE = 2**32  # the seed feeds PYTHONHASHSEED, whose range is 0 .. 2**32 - 1


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    models: tuple[ModelRef, ...]
    stages: tuple[str, ...] = ()  # build() sets them: --stage, else the catalog's first stage
    image: str | None = None  # --image as given (a manifest NAME or a reference); None: the local backend
    image_reference: str | None = None  # what the engine runs: the manifest tag of a NAME, else --image itself
    image_entry: images.ImageEntry | None = None  # the manifest's entry for --image (by name or tag), if it has one
    image_name: str = "local"  # the golden file name for this image
    profile: str = "quick"
    steps: int = PROFILES["quick"]
    steps_given: bool = False  # --steps (or steps:) set: it also caps a throughput repetition's timed steps
    resume_at: int = PROFILES["quick"] // 2
    resume_at_auto: bool = True  # k not given: run A moves it past the loader's first epoch (recorded)
    seed: int = 0
    threads: int = 1  # CPU intra-op threads: part of a run's identity (changes conv/transformer hashes)
    device: str = "cpu"
    cpu_isa: str | None = None  # --cpu-isa: cap the CPU kernels at this level (launch.CPU_ISA_ENV); None: native
    world_size: int = 1  # determinism stage: ranks under DDP (torchrun); part of a run's identity, like threads
    gpus: str | None = None  # docker: "all", a count, or comma-separated ids
    memory: int = DEFAULT_MEMORY  # docker: a container's memory limit in bytes, swap included
    pids_limit: int = DEFAULT_PIDS  # docker: a container's processes and threads
    timeout: float = 600.0  # seconds per worker run
    jobs: int = 1  # worker runs at once (build() defaults it to default_jobs)
    results_dir: Path = Path("results")
    goldens_dir: Path = Path("goldens")
    update_golden: bool = False
    ci: bool = False
    webhook: str | None = None
    keep_checkpoints: bool = False
    fork_server: bool | None = None  # fork runs from preloaded servers; None: on locally, off for Docker
    fork_servers: Path | None = None  # $REPROCI_FORK_SERVERS: local servers stand there, shared across invocations
    compiled: tuple[str, ...] = ()  # the models run under torch.compile (--compile: all; config: a list)
    compile_mode: str | None = None  # torch.compile's mode; None: its default
    amp: str | None = None  # "bf16" or "fp16": the step under torch.autocast
    fault: str | None = None  # test-only fault injection into run B (or C for resume faults)
    # each stage's own options (its frozen dataclass, ``stages.base.Stage.options``), by the stage's name
    staged: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    catalog: Catalog = field(default_factory=Catalog, repr=False, compare=False)  # the options with these stages
    github_actions: bool = False  # print ::error/::warning annotations
    step_summary: Path | None = None  # $GITHUB_STEP_SUMMARY, appended to when set
    project_root: Path = field(default_factory=lambda: Path.cwd())
    config_file: Path | None = None

    @property
    def backend(self) -> str:
        return "local" if self.image is None else "docker"

    def of(self, kind: type[OptionsT]) -> OptionsT:
        """A stage's options (``kind``: its frozen options dataclass), as built; its defaults where
        the stage is not among this run's catalog (options made by hand)."""
        found = next((v for v in self.staged.values() if type(v) is kind), None)
        return found if found is not None else kind()

    def recorded(self) -> RecordedOptions:
        """The options a run's results record (``options`` of results.json): every declaration marked
        ``record``, in the order results have always had, then any recorded later (a registered stage's
        knob among them, which ``RecordedOptions`` does not name: the keys come from the declarations)."""
        names = [o.name for o in self.catalog.options() if o.record]
        order = [n for n in declared.RECORDED_ORDER if n in names] + [n for n in names if n not in declared.RECORDED_ORDER]
        return cast(RecordedOptions, {name: self._recorded(name) for name in order})

    def _recorded(self, name: str) -> Any:
        if name == "fork_server":  # as the run took it: on by default locally, off for Docker
            return self.fork_server if self.fork_server is not None else self.backend == "local"
        value = (getattr(self, "compiled" if name == "compile" else name) if name in _FIELDS
                 else getattr(self.staged[self.catalog.owners[name]], name))
        return list(value) if isinstance(value, tuple) else value

    def compile_spec(self, model: str) -> CompileSpec | None:
        """How a model's runs are compiled (``WorkerSpec.compile``), or None: eager."""
        if model not in self.compiled:
            return None
        return {"backend": "inductor", "mode": self.compile_mode, "dynamic": None, "fullgraph": False}


OptionsT = TypeVar("OptionsT")


class _RunShape(TypedDict):
    """The RunOptions fields of what the runs do (``_run_shape``)."""

    profile: str
    steps: int
    steps_given: bool
    resume_at: int
    resume_at_auto: bool
    stages: tuple[str, ...]
    fault: str | None


class _Execution(TypedDict):
    """The RunOptions fields of compile and autocast (``_execution``)."""

    compiled: tuple[str, ...]
    compile_mode: str | None
    amp: str | None


class _Resources(TypedDict):
    """The RunOptions fields of what the runs get (``_resources``)."""

    threads: int
    jobs: int
    timeout: float
    device: str
    world_size: int


class _Limits(TypedDict):
    """The RunOptions fields of a container's limits (``_limits``)."""

    memory: int
    pids_limit: int


class _Image(TypedDict):
    """The RunOptions fields that name the image (``_image``)."""

    image: str | None
    image_reference: str | None
    image_entry: images.ImageEntry | None
    image_name: str
    cpu_isa: str | None

_FIELDS = {f.name for f in fields(RunOptions)} | {"compile"}  # declared options RunOptions holds (compile: compiled)


def default_jobs(threads: int) -> int:
    """Worker runs at once by default: as many as the usable CPUs hold at ``threads`` each, at
    most 3 (A, B and another model's run). Concurrency never changes a result (threads are pinned)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(3, usable // max(threads, 1)))


def build(cli: Mapping[str, Any], catalog: Catalog, env: Mapping[str, str] | None = None,
          settings: Settings | None = None) -> RunOptions:
    """Merge CLI values (None = not given) over the config file over defaults, and check them
    (``catalog``: the options with the stages the command line composed; ``settings``: the config
    file as a command already read it, with these CLI values)."""
    env = os.environ if env is None else env
    pick = Settings.read(cli, catalog) if settings is None else Settings(cli, settings.config, settings.path, catalog)
    config, config_path = pick.config, pick.path
    shape = _run_shape(pick, config)
    resources = _resources(pick)
    image = _image(pick, env)
    for stage in catalog.stages:
        if stage.name in shape["stages"] and stage.needs_image and image["image"] is None:
            raise UsageError(f"{_asked(pick, stage.name)} {stage.needs_image}")
    script = _script(pick, shape)
    model_texts = pick("models", () if script is not None else tuple(REGISTRY))
    model_texts = (model_texts,) if isinstance(model_texts, str) else tuple(model_texts)
    models = resolve_all(model_texts if pick.given("models") else tuple(map(pick.beside, model_texts)),
                         () if script is None else (script,))
    for o in catalog.options():
        if o.needs_stage is not None and pick(o.name, None) and o.needs_stage[0] not in shape["stages"]:
            raise UsageError(f"{pick.said(o.name)} {o.needs_stage[1]}: add --stage {o.needs_stage[0]}")
    goldens_dir = _goldens_dir(pick)
    _require_golden(pick, shape["stages"], goldens_dir, image["image_name"])
    ci_env = str(env.get("CI", "")).lower() in ("1", "true", "yes")
    return RunOptions(
        models=models,
        **_execution(pick, models),
        **shape,
        **resources,
        **image,
        seed=_seed(pick),
        gpus=None if pick("gpus", None) is None else str(pick("gpus", None)),
        **_limits(pick, image["image"]),
        results_dir=pick.folder("results_dir", "results"),
        goldens_dir=goldens_dir,
        update_golden=bool(pick("update_golden", False)),
        ci=bool(cli.get("ci")) if cli.get("ci") is not None else ci_env,
        webhook=pick("webhook", None) or env.get("REPROCI_WEBHOOK") or None,
        keep_checkpoints=bool(pick("keep_checkpoints", False)),
        fork_server=pick("fork_server", None),
        fork_servers=Path(env["REPROCI_FORK_SERVERS"]).absolute() if env.get("REPROCI_FORK_SERVERS") else None,
        staged=MappingProxyType(_staged(pick)),
        catalog=catalog,
        config_file=config_path,
        github_actions=str(env.get("GITHUB_ACTIONS", "")).lower() == "true",
        step_summary=Path(env["GITHUB_STEP_SUMMARY"]) if env.get("GITHUB_STEP_SUMMARY") else None,
    )


def _require_golden(pick: Settings, stages: tuple[str, ...], goldens_dir: Path, image_name: str) -> None:
    """A stage that compares with the image's golden (``needs_golden``), asked for where there is
    none: refused before any run, not found once the runs are done."""
    for stage in pick.catalog.stages:
        if stage.name in stages and stage.needs_golden and not (path := golden_path(goldens_dir, image_name)).is_file():
            raise UsageError(f"{_asked(pick, stage.name)} {stage.needs_golden}, and there is no golden for {image_name} "
                             f"({path}); record one in the old image first: reproci golden update --image OLD "
                             f"--image-name {image_name}")


def _asked(pick: Settings, stage: str) -> str:
    """How the user asked for ``stage``: the switch that adds it (--blame), else --stage NAME."""
    switch = next((o for o in pick.catalog.options() if o.adds_stage == stage and pick(o.name, False)), None)
    return pick.said(switch.name) if switch is not None else f"{pick.said('stages')} {stage}"


def _staged(pick: Settings) -> dict[str, Any]:
    """Each stage's options dataclass, made of its options each given or its default, made its
    type and checked by its declaration (a switch that adds its stage is folded into ``stages``)."""
    out = {}
    for stage in pick.catalog.stages:
        if stage.options is None:
            continue
        values = {}
        for o in declared.declared_by(stage.name, stage.options):
            value = pick(o.name, o.default) if o.adds_stage is None else bool(pick(o.name, False))
            if value is not None and o.convert is not None:
                value = o.convert(value)
            why = o.refuse(value) if o.refuse is not None and value is not None else None
            if why:
                raise UsageError(f"{pick.said(o.name)} {why}")
            values[o.name] = value
        out[stage.name] = stage.options(**values)
    return out


def _run_shape(pick: Settings, config: Mapping[str, Any]) -> _RunShape:
    """Profile, steps, resume point, stages and the test-only fault: what the runs do."""
    said = pick.said
    profile = pick("profile", "quick")
    if profile not in PROFILES:
        raise UsageError(f"{pick.from_file('profile')}unknown profile {profile!r}; use one of {', '.join(PROFILES)}")
    steps = int(pick("steps", PROFILES[profile]))
    if steps > MAX_STEPS:
        raise UsageError(f"{said('steps')} {steps} is more than {MAX_STEPS:,} steps a run; the profiles take "
                         f"{PROFILES['quick']} (quick) and {PROFILES['full']} (full): choose a smaller N")
    resume_at_auto = pick("resume_at", None) is None
    resume_at = int(pick("resume_at", steps // 2))
    if steps < 2:
        raise UsageError(f"{said('steps')} must be at least 2 (got {steps})")
    if not 1 <= resume_at < steps:
        raise UsageError(f"{said('resume_at')} must be between 1 and steps-1 = {steps - 1} (got {resume_at}); "
                         "N must exceed k")
    names = pick.catalog.names
    stages = tuple(pick("stages", names[:1]))  # the first stage by default
    if isinstance(config.get("stages"), str) and not pick.given("stages"):
        stages = (config["stages"],)
    for s in stages:
        if s not in names:
            raise UsageError(f"{pick.from_file('stages')}unknown stage {s!r}; use one of {', '.join(names)}")
    for o in pick.catalog.options():  # a switch that adds its stage (--bisect)
        if o.adds_stage is not None and pick(o.name, False) and o.adds_stage not in stages:
            stages = (*stages, o.adds_stage)
    for stage in pick.catalog.stages:  # the stages a stage starts from, before it (bisect: determinism)
        if stage.name in stages:
            stages = (*(n for n in stage.needs if n not in stages), *stages)
    fault = pick("fault", None)
    if fault is not None and fault not in FAULTS:
        raise UsageError(f"unknown fault {fault!r}; known (test-only): {', '.join(FAULTS)}")
    return {"profile": profile, "steps": steps, "steps_given": pick("steps", None) is not None,
            "resume_at": resume_at, "resume_at_auto": resume_at_auto,
            "stages": stages, "fault": fault}


def _script(pick: Settings, shape: _RunShape) -> ModelRef | None:
    """The model of ``--script`` (or reproci.yaml's ``script:``), checked; None when there is none.
    A script's runs are its own processes: the determinism stage runs them; compile, autocast
    and ranks are the script's to choose, not reproci's."""
    command = pick("script", None)
    for name in ("resume_script", "script_name"):
        if command is None and pick(name, None) is not None:
            raise UsageError(f"{pick.said(name)} goes with --script (or script: in reproci.yaml): give the command "
                             "that trains")
    if command is None:
        return None
    checker = pick.catalog.checker  # the stage of runs A, B and C
    other = [s for s in shape["stages"] if s != checker]
    if other:
        raise UsageError(f"{pick.said('script')}: the {other[0]} stage does not run a script model; a script's "
                         f"runs are checked by the {checker} stage (drop --stage {other[0]})")
    for name, what in (("compile", "compiles"), ("amp", "runs under autocast"), ("world_size", "runs ranks")):
        value = pick(name, None)
        if value is True or (value not in (None, False, 1, ()) and not isinstance(value, bool)):
            raise UsageError(f"{pick.said(name)} with {pick.said('script')}: your script decides whether it {what}; "
                             f"drop {pick.said(name)}")
    from_file = not pick.given("script") and pick.root is not None
    cwd = pick.root.resolve() if from_file and pick.root is not None else Path.cwd()
    return resolve_script(command, pick("resume_script", None), pick("script_name", None), cwd,
                          said=pick.said("script"), said_resume=pick.said("resume_script"))


def check_script_cells(options: RunOptions, backend: str) -> None:
    """A script model as a cell of --backend ray or slurm: its commands run from a copy of the
    folder reproci is started in, on the node's own Python. Refused in one line where they could
    not: in --image, or from reproci.yaml's folder above the working directory."""
    script = next((m.script for m in options.models if m.script is not None), None)
    if script is None:
        return
    if options.image is not None:
        raise UsageError(f"--script with --backend {backend} runs each cell's script on its node's own Python, not in "
                         "--image: drop --image, or run the script in the image on one machine (--backend docker)")
    if script.cwd.resolve() != Path.cwd().resolve():
        raise UsageError(f"--script with --backend {backend}: its commands run from {script.cwd}, where reproci.yaml "
                         f"is, and a cell runs them from a copy of the folder reproci is started in: run reproci from "
                         f"{script.cwd}")


def _execution(pick: Settings, models: tuple[ModelRef, ...]) -> _Execution:
    """Compile and autocast: which models are compiled (``--compile``: all; the config may list
    some), in which mode, and the AMP dtype."""
    chosen = pick("compile", False)
    names = [m.name for m in models]
    if isinstance(chosen, (str, list)):
        listed = [chosen] if isinstance(chosen, str) else chosen
        unknown = [n for n in listed if n not in names]
        if unknown:
            raise ConfigError(f"{pick.said('compile')}: {', '.join(n or repr(n) for n in unknown)} is not among the models run "
                              f"({', '.join(names)}); list model names, or write compile: true for all")
        compiled = tuple(n for n in names if n in listed)
    else:
        compiled = tuple(names) if chosen else ()
    mode = pick("compile_mode", None)
    if mode not in (None, "default") and not compiled:  # the default is what an uncompiled run says too
        add = "--compile" if pick.given("compile_mode") else "compile: true (or --compile)"
        raise UsageError(f"{pick.said('compile_mode')} sets how torch.compile compiles: add {add}")
    return {"compiled": compiled, "compile_mode": None if mode == "default" else mode, "amp": pick("amp", None)}


def _goldens_dir(pick: Settings) -> Path:
    goldens_dir = pick.folder("goldens_dir", "goldens")
    require_folder(goldens_dir, pick.said("goldens_dir"))
    return goldens_dir


def _seed(pick: Settings) -> int:
    seed = int(pick("seed", 0))
    if not 0 <= seed < SEED_RANGE:
        raise UsageError(f"{pick.said('seed')} {seed} is out of range: use 0 .. {SEED_RANGE - 1} (it also sets "
                         "PYTHONHASHSEED, which takes that range)")
    return seed


def _resources(pick: Settings) -> _Resources:
    """Threads, parallel runs, the per-run timeout and the device: what the runs get."""
    threads = int(pick("threads", 1))
    if threads < 1:
        raise UsageError(f"{pick.said('threads')} must be at least 1")
    if threads > MAX_THREADS:
        raise UsageError(f"{pick.said('threads')} {threads} is more than {MAX_THREADS} intra-op threads a run; "
                         "give the number of cores a run should use (1 for goldens that hold on every host)")
    world_size = _world_size(pick)
    jobs = pick("jobs", None)
    jobs = default_jobs(threads * world_size) if jobs is None else int(jobs)
    if jobs < 1:
        raise UsageError(f"{pick.said('jobs')} must be at least 1")
    timeout = float(pick("timeout", 600.0))
    if not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"{pick.said('timeout')} must be positive (seconds; got {timeout})")
    device = pick("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"{pick.from_file('device')}unknown device {device!r}; use cpu or cuda")
    return {"threads": threads, "jobs": jobs, "timeout": timeout, "device": device, "world_size": world_size}


def _world_size(pick: Settings) -> int:
    """Ranks per run (DDP under torchrun), checked against the GPUs asked of Docker: one per rank on CUDA."""
    said = pick.said
    world_size = int(pick("world_size", 1))
    if world_size < 1:
        raise UsageError(f"{said('world_size')} must be at least 1 (got {world_size}); use 1 for one process, "
                         "N for N ranks")
    gpus = pick("gpus", None)
    if gpus is not None and not _gpus_ok(str(gpus)):
        raise UsageError(f"{said('gpus')} {gpus!r}: use all, a count (2), device ids (0,1 or device=0) or GPU UUIDs (GPU-…)")
    if pick("device", "cpu") != "cuda" or gpus is None or world_size == 1:
        return world_size
    text = str(gpus)
    given = int(text) if text.isdigit() else None if text == "all" else len([g for g in text.split(",") if g.strip()])
    if given is not None and given < world_size:
        raise UsageError(f"{said('world_size')} {world_size} on CUDA needs one GPU per rank but {said('gpus')} {text} "
                         f"gives {given}: lower {said('world_size')} or pass {said('gpus')} all (or {world_size} GPUs)")
    return world_size


MIN_MEMORY = 64 * 1024**2  # below this not even python3 and torch start: a typo (64 for 64g), refused
MIN_PIDS = 16  # the worker alone has a handful of threads
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
          "g": GIB, "gb": GIB, "gib": GIB, "t": 1024 * GIB, "tb": 1024 * GIB, "tib": 1024 * GIB}


def _limits(pick: Settings, image: str | None) -> _Limits:
    """A container's memory (``--memory 8g``, binary units as Docker reads them) and process limits."""
    for key in ("memory", "pids_limit"):
        if image is None and pick(key, None) is not None:
            raise UsageError(f"{pick.said(key)} limits a container (--image); the local backend runs in this "
                             "machine's own limits: leave it out, or add --image")
    memory = pick("memory", None)
    if memory is None:
        size = DEFAULT_MEMORY
    else:
        text = str(memory).strip().lower().replace(" ", "")
        number = text.rstrip("bgikmt")
        unit = text[len(number):]
        try:
            size = int(float(number) * _UNITS[unit])
        except (ValueError, KeyError, OverflowError):
            raise UsageError(f"{pick.said('memory')} {memory!r} is not a size: write e.g. 8g, 512m or 16GiB") from None
        if size < MIN_MEMORY:
            raise UsageError(f"{pick.said('memory')} {memory!r} is under {MIN_MEMORY // 1024**2} MiB, too little for "
                             "python3 and torch: give a unit, e.g. 8g")
    pids = int(pick("pids_limit", DEFAULT_PIDS))
    if pids < MIN_PIDS:
        raise UsageError(f"{pick.said('pids_limit')} {pids} is under {MIN_PIDS}: a worker alone starts a handful of "
                         "threads; give e.g. 1024")
    return {"memory": size, "pids_limit": pids}


def _gpus_ok(text: str) -> bool:
    """``all``, a count, or comma-separated ids: ``0``, ``device=0``, ``GPU-<uuid>``, ``MIG-<uuid>``."""
    if text == "all" or text.isdigit():
        return True
    tokens = [t.strip().removeprefix("device=") for t in text.split(",")]
    return all(t.isdigit() or t.startswith(("GPU-", "MIG-")) for t in tokens) and all(tokens)


def _image(pick: Settings, env: Mapping[str, str]) -> _Image:
    """The RunOptions fields that name the image: ``--image`` looked up in the manifest, once."""
    image = pick("image", None)
    if image is not None and not str(image).strip():
        raise UsageError(f"{pick.said('image')} is empty: name a manifest image (see `reproci images list`) or a "
                         "reference, or leave --image out for the local backend")
    if image == "local":  # the name results and goldens give the local backend: accept it back
        image = None
    if image is None and pick("gpus", None) is not None:
        raise UsageError(f"{pick.said('gpus')} chooses GPUs for a container (--image); the local backend uses the GPUs "
                         "torch sees: set CUDA_VISIBLE_DEVICES instead")
    reference, entry = images.resolve(image) if image else (None, None)
    cpu_isa = _cpu_isa(pick, entry, env)
    return {"image": image, "image_reference": reference, "image_entry": entry,
            "image_name": golden_file_name(pick("image_name", None), pick.said("image_name"))
            or (golden_name(image, entry) if image else "local"),
            "cpu_isa": None if cpu_isa == "native" else cpu_isa}


def _cpu_isa(pick: Settings, entry: images.ImageEntry | None, env: Mapping[str, str]) -> str | None:
    """The CPU kernel cap (``--cpu-isa``, else the image's ``cpu_isa``), refused before any run
    when this CPU lacks its instructions: every run would die of SIGILL. A remote engine's
    CPU is not this one's, so there the workers' attestation decides."""
    cpu_isa = pick("cpu_isa", None) or (entry.cpu_isa if entry is not None else None)
    remote = entry is not None and str(env.get("DOCKER_HOST", "")).startswith(("tcp://", "ssh://"))
    lacking = None if cpu_isa in (None, "native") or remote else cpu_flags.host_lacks(cpu_isa)
    if lacking is None or cpu_isa is None:
        return cpu_isa
    what, instead = lacking
    if pick("cpu_isa", None) is None and entry is not None:  # the manifest's setting: this host cannot run it
        raise InfrastructureError(f"image {entry.name} caps the CPU kernels at cpu_isa {cpu_isa} "
                                  f"({entry.source}), but {what}: run it on a host with "
                                  f"{cpu_isa.upper()}, or pass --cpu-isa {instead}")
    fix = f"write cpu_isa: {instead}" if pick.from_file("cpu_isa") else f"pass --cpu-isa {instead}"
    raise UsageError(f"{pick.said('cpu_isa')} {cpu_isa}: {what}; every run would die of an illegal instruction: {fix}")


def golden_name(image: str, entry: images.ImageEntry | None) -> str:
    """The golden name for an image: its manifest name when the manifest knows the image
    (``entry``, by name or tag), else a file-safe form of the reference (repo:tag -> repo_tag)."""
    if entry is not None:
        return entry.name
    name = image.split("@", 1)[0]
    return name.replace("/", "_").replace(":", "_")
