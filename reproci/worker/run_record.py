"""A run's record as a typed document (schema ``reproci.run``): what one training process
writes, the only thing the orchestrator reads back from it.

``RunRecord`` is a run that finished its steps, made once by ``record.build``; ``FailedRun`` is
a run that could not, made by the worker's entry point from the exception. Both write the JSON
the record files have always held (``to_json``); ``from_json`` reads either back, and refuses
a record of another schema version in one line that names both versions.

Standard library only: the entry point writes a ``FailedRun`` even where torch cannot be imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    fault_detail: Any
    attestation: dict[str, Any]  # the determinism controls, proven in effect before set-up
    attestations: dict[str, Any]  # the same at the checkpoint and at the end
    controls: dict[str, Any] | None  # strict runs: every determinism control set during the run, and those switched off
    replayed: Any  # batches replayed to reach a resume point
    loader: Any  # how the plugin's loader was set up (worker.data.loader.describe_setup)
    environment: dict[str, Any]  # what may change results: versions, CPU, GPU, threads, kernel-selecting variables
    packages: dict[str, Any] | None  # installed distributions (runs A and golden only)
    config: Any  # the plugin's config
    batch_size: int | None
    accumulate: int
    initial_fingerprint: dict[str, Any] | None  # the state before the first step, with fingerprints
    batch_checksum: str  # the scheme of ``batch_fingerprints``
    fingerprint_scheme: str  # what a row holds for a tensor absent at a step
    tensor_names: list[str]  # the columns of ``fingerprints``
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
    cpus: Any  # the CPUs a lockstep run was pinned to
    steady_allocator: bool
    ops: Any  # per-op self times of the profiled steps (throughput runs)
    execution: dict[str, Any] | None  # compiled, autocast: part of the run's identity
    compile_cache: dict[str, Any] | None
    compile_attestation: dict[str, Any] | None
    scaler_state: Any
    perturbed: dict[str, Any] | None  # what a portability probe changed
    checkpoint_at: int | None
    census: Any  # the state outside the checkpoint, at the checkpoint and the resume (worker.state.census)
    extra_state_sha256: dict[str, str | None] | None  # what get_extra_state returns, hashed
    distributed: dict[str, Any] | None  # ranks and how the model was wrapped
    eval: dict[str, Any] | None = field(default=None)  # the plugin's held-out evaluation, when asked for

    def to_json(self) -> dict[str, Any]:
        """The record file's JSON object (``eval`` only when the run evaluated)."""
        out: dict[str, Any] = {"schema": SCHEMA, "version": RECORD_VERSION, "status": "ok"}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "eval" and value is None:
                continue
            out[f.name] = dataclasses.asdict(value) if isinstance(value, Timings) else value
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
    values["timings"] = Timings(**values["timings"])
    return RunRecord(**values)
