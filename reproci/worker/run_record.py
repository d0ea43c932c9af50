"""A run's record as a typed document (schema ``reproci.run``): what one training process
writes, the only thing the orchestrator reads back from it.

``RunRecord`` is a run that finished its steps, made once by ``record.build``; ``FailedRun`` is
a run that could not, made by the worker's entry point from the exception. Both write the JSON
the record files have always held (``to_json``); ``from_json`` reads either back, and refuses
a record of another schema version in one line that names both versions.

The orchestrator reads every record through ``from_json`` (``runner.run_worker``) and adds what
only it knows of the run's process (``Launched``), which is never written to the record file.

Standard library only: the entry point writes a ``FailedRun`` even where torch cannot be imported.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Union

if TYPE_CHECKING:  # the sections' writers import torch: read here as types only
    from .controls import Controls
    from .distributed import Distributed
    from .perturb import Perturbed
    from .state.census import CensusRecord

from .sections import (  # the sections results.json copies: standard library, read at run time too
    Attestation,
    CompileAttestation,
    CompileCache,
    Environment,
    Execution,
    InitialFingerprint,
)

SCHEMA = "reproci.run"
RECORD_VERSION = 1


class RecordVersionError(ValueError):
    """A record written by another version of reproci's worker."""


@dataclass
class Timings:
    """Where a run's time went, in seconds."""

    setup_s: float  # from the process's start to the first step (controls, imports, the plugin's factory)
    train_s: float  # the steps, checkpoints included
    timed_steps: int  # the steps ``timed_s`` covers (a throughput run times the steps past its warm-up)
    timed_s: float
    build_s: float = 0.0  # of set-up: the plugin's factory
    checkpoint_s: float = 0.0  # of training: writing checkpoints
    eval_s: float = 0.0  # the plugin's eval_fn, after the final hash
    finish_s: float = 0.0  # the checks, final hash and record after the last step


@dataclass
class ScriptFacts:
    """What a script model's run found and took (``worker.script``)."""

    model: str  # the class of the module tree that names the tensors
    optimizers: list[str]  # the classes of the optimizers stepped
    steps_taken: int  # the optimizer steps the process took, those past N included
    copied_out: bool  # run A: its {out} copied as its step k + 1 began


@dataclass(frozen=True)
class Launched:
    """What the orchestrator saw of a run's process (``runner.run_worker``): not in the record file."""

    wall_s: float  # the run's own process, from its start to its end
    start_wait_s: float  # a fork server's or container's start, paid before it
    how: Any  # forked from a server, fresh (and why), or a container (the backend's ``LaunchResult.launch``)
    at: float  # time.monotonic() as the process started (after any wait for a slot)


@dataclass
class RunRecord:
    """A run that finished its steps. The fields are the record file's keys, in its order."""

    model: str
    model_ref: str
    role: str  # A, B, C, golden, a probe's or a stage's name
    mode: str  # strict, default, bookkeeping
    seed: int
    start_step: int  # 0, or the resume point
    end_step: int
    steps: int
    fault: str | None  # a test-only fault injected into the run
    fault_detail: dict[str, str] | None  # what the fault did (``faults.Faults.detail``)
    attestation: Attestation  # the determinism controls, proven in effect before set-up
    attestations: dict[str, Attestation]  # the same at the checkpoint ("checkpoint") and at the end ("end")
    controls: Controls | None  # strict runs: every determinism control set during the run, and those switched off
    replayed: str | None  # how a resumed run reached its batch: "index", "fetch" or "loader"
    loader: Any  # how the plugin's loader was set up (worker.data.loader.describe_setup)
    environment: Environment  # what may change results: versions, CPU, GPU, threads, kernel-selecting variables
    packages: dict[str, str] | None  # installed distributions, name -> version (runs A and golden only)
    config: Any  # the plugin's config
    batch_size: int | None
    accumulate: int
    initial_fingerprint: InitialFingerprint | None  # the state before the first step, with fingerprints
    batch_checksum: str  # the scheme of ``batch_fingerprints``
    fingerprint_scheme: str  # what a row holds for a tensor absent at a step
    tensor_names: list[str] | None  # the columns of ``fingerprints``; None where no step was fingerprinted
    fingerprints: list[Any]  # per step, a row of per-tensor checksums
    batch_fingerprints: list[Any]  # per step, the batch's checksum
    batch_contents_scheme: str
    batch_contents: list[Any]  # per step, the batch's order-free checksum
    batch_opaque: list[str]  # batch leaves the checksums cannot see into
    batch_epochs: list[int]  # the epoch of each step's batch
    losses: list[Any]  # per step; a non-finite loss as its repr
    final_sha256: str  # of the whole trained state
    tensor_sha256: dict[str, str]  # per tensor
    timings: Timings
    step_times_s: list[float]
    data_times_s: list[float]
    steps_per_s: float | None
    samples_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None
    profiled_steps: int
    cpus: list[int] | None  # the CPUs a lockstep run was pinned to
    steady_allocator: bool
    ops: Any  # per-op self times of the profiled steps (throughput runs)
    execution: Execution | None  # compiled, autocast: part of the run's identity
    compile_cache: CompileCache | None
    compile_attestation: CompileAttestation | None
    scaler_state: dict[str, float] | None  # the GradScaler's scale and growth tracker
    perturbed: Perturbed | None  # what a portability probe changed
    checkpoint_at: int | None
    census: CensusRecord | None  # the state outside the checkpoint, at the checkpoint and the resume (worker.state.census)
    extra_state_sha256: dict[str, str | None] | None  # what get_extra_state returns, hashed
    distributed: Distributed | None  # ranks and how the model was wrapped
    eval: dict[str, float] | None = field(default=None)  # the plugin's held-out evaluation, metric -> value
    script: ScriptFacts | None = field(default=None)  # a script model's run: what was found and taken
    launched: Launched | None = field(default=None, compare=False)  # set by the orchestrator, never written

    def launched_at(self) -> float:
        """time.monotonic() as the run's process started (0.0 where the orchestrator did not launch it)."""
        return self.launched.at if self.launched is not None else 0.0

    def to_json(self) -> dict[str, Any]:
        """The record file's JSON object (``eval`` only when the run evaluated)."""
        out: dict[str, Any] = {"schema": SCHEMA, "version": RECORD_VERSION, "status": "ok"}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "launched" or (f.name in ("eval", "script") and value is None):
                continue
            out[f.name] = dataclasses.asdict(value) if isinstance(value, (Timings, ScriptFacts)) else value
        return out


@dataclass
class FailedRun:
    """A run that could not finish: its kind of failure (``error_kind``) and one line saying why."""

    error_kind: str  # crash, contract, attestation, no-device, non-finite, no-deterministic-kernel, ...
    message: str
    traceback: str
    model: str
    role: str

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": RECORD_VERSION, "status": "error", "error_kind": self.error_kind,
                "message": self.message, "traceback": self.traceback, "model": self.model, "role": self.role}


@dataclass(frozen=True)
class Trajectory:
    """What comparing two runs reads of each: a run record's steps (``RunRecord``), or a golden's
    (``reproci.golden.store.ModelGolden.as_record``). Fields absent from a source read as empty."""

    tensor_names: list[str] = field(default_factory=list)  # the columns of ``fingerprints``
    fingerprints: list[Any] = field(default_factory=list)  # per step, a row of per-tensor checksums
    start_step: int = 0  # 0, or the resume point
    fingerprint_scheme: str | None = None  # what a row holds for a tensor absent at a step
    initial_fingerprint: InitialFingerprint | None = None  # the state before the first step
    losses: list[Any] = field(default_factory=list)
    batch_checksum: str | None = None  # the scheme of ``batch_fingerprints``
    batch_fingerprints: list[Any] = field(default_factory=list)
    batch_contents_scheme: str | None = None
    batch_contents: list[Any] = field(default_factory=list)  # per step, the batch's order-free checksum
    batch_epochs: list[int] = field(default_factory=list)
    batches_per_epoch: int | None = None  # the loader's, when known
    final_sha256: str | None = None
    tensor_sha256: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> Trajectory:
        """The trajectory of a run record, or of a mapping with a record's keys (a golden's, a test's)."""
        if isinstance(run, Trajectory):
            return run
        if isinstance(run, RunRecord):
            return cls(tensor_names=run.tensor_names or [], fingerprints=run.fingerprints, start_step=run.start_step,
                       fingerprint_scheme=run.fingerprint_scheme, initial_fingerprint=run.initial_fingerprint,
                       losses=run.losses, batch_checksum=run.batch_checksum, batch_fingerprints=run.batch_fingerprints,
                       batch_contents_scheme=run.batch_contents_scheme, batch_contents=run.batch_contents,
                       batch_epochs=run.batch_epochs, batches_per_epoch=(run.loader or {}).get("batches_per_epoch"),
                       final_sha256=run.final_sha256, tensor_sha256=run.tensor_sha256)
        return cls(tensor_names=list(run.get("tensor_names") or []), fingerprints=list(run.get("fingerprints") or []),
                   start_step=int(run.get("start_step", 0)), fingerprint_scheme=run.get("fingerprint_scheme"),
                   initial_fingerprint=run.get("initial_fingerprint"), losses=list(run.get("losses") or []),
                   batch_checksum=run.get("batch_checksum"), batch_fingerprints=list(run.get("batch_fingerprints") or []),
                   batch_contents_scheme=run.get("batch_contents_scheme"),
                   batch_contents=list(run.get("batch_contents") or []), batch_epochs=list(run.get("batch_epochs") or []),
                   batches_per_epoch=(run.get("loader") or {}).get("batches_per_epoch"),
                   final_sha256=run.get("final_sha256"), tensor_sha256=dict(run.get("tensor_sha256") or {}))


# A run as the comparisons take it: its record, its trajectory, or a mapping with a record's keys.
Run = Union[RunRecord, Trajectory, Mapping[str, Any]]


def from_json(data: dict[str, Any]) -> RunRecord | FailedRun:
    """A record file's object, typed; a record of another version is refused in one line."""
    if data.get("schema") != SCHEMA or data.get("version") != RECORD_VERSION:
        raise RecordVersionError(f"run record {data.get('schema')!r} version {data.get('version')!r} is not "
                                 f"{SCHEMA!r} version {RECORD_VERSION}: it was written by another version of reproci; "
                                 "run it again with this one")
    if data.get("status") != "ok":
        return FailedRun(**{f.name: data.get(f.name, "") for f in dataclasses.fields(FailedRun)})
    names = {f.name for f in dataclasses.fields(RunRecord)}
    values = {k: v for k, v in data.items() if k in names}
    values.pop("launched", None)
    values["timings"] = Timings(**values["timings"])
    if values.get("script") is not None:
        values["script"] = ScriptFacts(**values["script"])
    return RunRecord(**values)


def read(path: Path) -> RunRecord | FailedRun:
    """The record file at ``path``, typed (``from_json``)."""
    return from_json(json.loads(path.read_text()))


def read_ok(path: Path) -> RunRecord:
    """The record of a run that finished its steps, at ``path``; a failed run's record raises ValueError."""
    record = read(path)
    if not isinstance(record, RunRecord):
        raise ValueError(f"{path}: run {record.role} of {record.model} failed: {record.message}")
    return record
