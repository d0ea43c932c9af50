"""The worker spec: what one fresh-process run must do (stdlib only).

The orchestrator writes a spec as JSON next to the run's outputs; the worker reads
it. Relative paths in a spec are relative to the directory of the spec file, so the
same spec works on the host and inside a container where that directory is mounted
elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypedDict

SPEC_VERSION = 1

# Faults that tests inject to prove each verdict fires (never use them otherwise).
FAULTS = {
    "clock-seed": "reseed torch from the clock after set-up (NONDETERMINISTIC)",
    "buffer-drift": "move one floating buffer by one ULP at the middle step; the loss is unaffected",
    "resume-skip-loader-position": "on resume, restart the epoch instead of restoring the loader position",
    "resume-drop-rng": "on resume, do not restore the torch RNG state",
}

# strict: every determinism control; default: benchmark mode allowed, deterministic algorithms off,
# the image's default precision; bookkeeping: seeds and environment variables only.
MODES = ("strict", "default", "bookkeeping")
# profile_ops: the last PROFILE_STEPS + 1 of a run's steps go to torch.profiler (one warm-up
# step, then PROFILE_STEPS recorded), after and outside the timed steps.
PROFILE_STEPS = 4

# The bytes of a paired throughput run's turns over the FIFOs ``lockstep`` names
# (reproci.worker.turns on the worker's side, reproci.stages.throughput.lockstep on the orchestrator's).
# A turn's answer: b"d", the step's clocked seconds (-1: not a timed step), and 1 when it was
# the run's last step. Written in one call (well under PIPE_BUF), so it arrives whole.
DONE = struct.Struct("<cdB")
GO, END_TIMING = b"g", b"e"  # a turn: take a step; or stop timing (the profiled steps follow)


class CompileSpec(TypedDict):
    """How the harness compiles a run's step (``WorkerSpec.compile``): ``torch.compile``'s arguments."""

    backend: str
    mode: str | None
    dynamic: bool | None
    fullgraph: bool


@dataclass(frozen=True, kw_only=True)
class ScriptCommand:
    """A script model's run (``reproci.worker.script``): the team's own command, not a factory."""

    command: str  # the command this run executes, its placeholders unfilled (run C's: the resume command)
    cwd: str  # where it runs: the directory reproci was started in (in a container, where that is mounted)
    resume_at: int  # k: what {resume_at} says, and the step run C resumes at
    config: dict[str, str] = field(default_factory=dict)  # the model's identity: both commands, as given


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    model_ref: str  # "conv", "path/to/file.py:factory" or "package.module:factory"
    model_name: str
    role: str  # "A", "B", "C", "probe-A", "throughput-strict-1", ...
    steps: int
    seed: int = 0
    profile: str = "quick"
    device: str = "cpu"
    threads: int = 1
    mode: str = "strict"
    output: str = "record.json"
    checkpoint_at: int | None = None
    checkpoint_path: str | None = None
    # Move checkpoint_at past the loader's first epoch when the run is long enough to hold one
    # (and it is not there already): the resume then starts inside a later epoch.
    checkpoint_after_epoch: bool = False
    resume_from: str | None = None
    # More checkpoints, one per listed step, at checkpoint_pattern.format(step=...) (resume sweeps)
    checkpoint_steps: tuple[int, ...] = ()
    checkpoint_pattern: str = "ckpt-{step}.pt"
    dump_at: int | None = None
    dump_path: str | None = None
    final_dump_path: str | None = None  # every state tensor at the end (goldens, magnitudes)
    ops_path: str | None = None  # with dump_at: every aten op of step dump_at, with output digests
    # With ops_path: these steps instead (ops_path.format(step=...)), digests only (goldens' per-op hashes)
    ops_steps: tuple[int, ...] = ()
    audit_path: str | None = None  # the op audit of the first step (worker.audit); strict mode warns, not raises
    # Portability probes (stages/probes/): a perturbed copy of a run, one factor changed
    hash_seed: int | None = None  # PYTHONHASHSEED, when not the seed
    reverse_listing: bool = False  # os.listdir, os.scandir, glob and Path.iterdir give reversed orders
    num_workers: int | None = None  # rebuild a DataLoader with this many worker processes
    inspect_path: str | None = None  # before training: epoch order and batch invariance (worker.inspection)
    fingerprints: bool = True
    evaluate: bool = False  # after the last step, call the plugin's eval_fn and record its metrics (variance stage)
    warmup_steps: int = 0
    profile_ops: bool = False
    lockstep: str | None = None  # FIFO path prefix (.go/.done): after warm-up, take turns step by step
    fault: str | None = None
    plugin_paths: tuple[str, ...] = ()  # extra sys.path entries for plugin files
    project_commit: str | None = None
    image: Mapping[str, Any] = field(default_factory=dict)  # the results' image (reproci.results.Image), as given
    world_size: int = 1  # ranks under DistributedDataParallel, launched by torchrun when above 1
    cpu_isa: str | None = None  # cap the CPU kernels at this level (launch.CPU_ISA_ENV), attested
    env: dict[str, str | None] = field(default_factory=dict)  # variables set (None: removed) after the launcher's
    # torch.compile of the step's module: {"backend", "mode", "dynamic", "fullgraph"} (worker.execution); None: eager
    compile: CompileSpec | None = None
    compile_cache: str | None = None  # inductor's and Triton's cache directory for this run (cold unless shared)
    eager: bool = False  # run a plugin's own compiled model uncompiled (the bisection's compile factor)
    amp: str | None = None  # "bf16" or "fp16": each forward and loss under torch.autocast (fp16 with a GradScaler)
    # A script model: the command runs instead of a factory; A's checkpoint_path is then the folder
    # that keeps a copy of {out} as step k + 1 begins, C's resume_from that copy
    script: ScriptCommand | None = None
    version: int = SPEC_VERSION

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["plugin_paths"] = list(self.plugin_paths)
        data["checkpoint_steps"] = list(self.checkpoint_steps)
        data["ops_steps"] = list(self.ops_steps)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        data = json.loads(text)
        if data.get("version") != SPEC_VERSION:
            raise ValueError(
                f"worker spec version {data.get('version')!r} is not {SPEC_VERSION}: "
                "the orchestrator and the worker code come from different reproci versions"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown worker spec fields: {sorted(unknown)}")
        data["plugin_paths"] = tuple(data.get("plugin_paths", ()))
        data["checkpoint_steps"] = tuple(data.get("checkpoint_steps", ()))
        data["ops_steps"] = tuple(data.get("ops_steps", ()))
        if isinstance(data.get("script"), dict):
            data["script"] = ScriptCommand(**data["script"])
        return cls(**data)

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)


def resolve(spec_file: Path, rel: str | None) -> Path | None:
    """A spec path made absolute against the spec file's directory."""
    if rel is None:
        return None
    p = Path(rel)
    return p if p.is_absolute() else spec_file.parent / p


# The files a rank writes: rank 0 keeps the spec's names (its record is the run's record),
# rank r > 0 writes ``record-A.rank{r}.json``, ``ckpt-3.rank{r}.pt``, ...; the final state
# and probe dumps are rank 0's alone (its replicas are compared step by step instead).
RANK_FILES = ("output", "checkpoint_path", "resume_from", "checkpoint_pattern")
RANK_0_ONLY = ("dump_path", "final_dump_path", "ops_path")


def rank_path(path: str, rank: int) -> str:
    """``path`` for rank ``rank``: unchanged for rank 0, else ``.rank{r}`` before its suffix."""
    if rank == 0:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def for_rank(spec: WorkerSpec, rank: int) -> WorkerSpec:
    """The spec as rank ``rank`` of a distributed run carries it out."""
    if rank == 0:
        return spec
    files = {k: rank_path(getattr(spec, k), rank) for k in RANK_FILES if getattr(spec, k) is not None}
    cleared: dict[str, Any] = {**files, **{k: None for k in RANK_0_ONLY}}
    return dataclasses.replace(spec, **cleared)


def other_worker_count(n: int) -> int:
    """The worker count the num-workers probe changes to: none where there were some, else two
    (here, beside the spec, so that the orchestrator can say it without importing torch)."""
    return 0 if n > 0 else 2
