"""A run's record: what one training process reports (schema ``reproci.run``).

Per step a run keeps its loss and, with fingerprints, the checksums of its batch and of
its state (``Trace``), on the device until the run ends. ``build`` then gathers these,
the final hash, the attestations, the timings and the environment into one JSON-ready
dict, the only thing the orchestrator reads back from the process.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from .process import envinfo
from .data import loader
from .data import batchtree
from .data.batchlog import BatchLog
from .data.batchsum import BATCH_CHECKSUM, BATCH_CONTENTS
from .state.checkpoint import LoopPosition
from .contract import TrainSetup
from .controls import ControlWatch
from .evaluate import evaluate
from .faults import Faults
from .state.fingerprint import FINGERPRINT_SCHEME, StepFingerprints, initial_row
from .state.state import transient_buffers
from .process.spec import WorkerSpec
from .timing import StepClock
from .turns import Turns

RECORD_VERSION = 1


@dataclass(frozen=True)
class Start:
    """What a run knows before its model exists."""

    t: float  # time.perf_counter() when the run began
    attestation: dict[str, Any]  # the determinism controls, proven in effect before set-up
    steady_allocator: bool


class Trace:
    """What each step leaves in the record, from the step this run starts at (0, or the
    resume point) to its last."""

    def __init__(self, setup: TrainSetup, *, fingerprints: bool, start_step: int) -> None:
        self.start_step = start_step
        self.initial: dict[str, Any] | None = None
        if fingerprints:  # the state before this run's first step: step 0, or the resume point
            names, row = initial_row(setup.model, setup.optimizer, setup.state_modules)
            self.initial = {"step": start_step, "names": names, "row": row.tolist(),
                            "transient": transient_buffers(setup.model)}
        self.fps = StepFingerprints(setup.model, setup.optimizer, setup.state_modules) if fingerprints else None
        self.losses: list[torch.Tensor] = []
        self.batches = BatchLog()  # each step's batch checksums
        self.opaque: list[str] = []  # batch leaves the checksums cannot see into, named once
        self.epochs: list[int] = []  # the epoch of each step's batch
        self.last_batch: Any = None  # where an fp16 overflow is looked for (finite.check_finite)

    def batch(self, batch: Any, epoch: int) -> None:
        """The batch this step trains on, from epoch ``epoch``."""
        self.epochs.append(epoch)
        self.last_batch = batch
        if self.fps is not None:
            self.batches.add(batch)
            if len(self.batches) == 1:
                self.opaque = batchtree.opaque(batch)

    def step(self, loss: torch.Tensor) -> None:
        """The step's loss and the state it left."""
        self.losses.append(loss.float().reshape(()))
        if self.fps is not None:
            self.fps.record()


def build(spec: WorkerSpec, setup: TrainSetup, pos: LoopPosition, *, start: Start, trace: Trace, faults: Faults,
          attestations: dict[str, Any], watch: ControlWatch, clock: StepClock, turns: Turns | None,
          final: tuple[str, dict[str, str]]) -> dict[str, Any]:
    """The record of a run that finished its steps."""
    strict = spec.mode == "strict"
    loss_values = torch.stack(trace.losses).cpu().tolist() if trace.losses else []
    batch_sums, batch_contents = trace.batches.values()
    return {
        "schema": "reproci.run",
        "version": RECORD_VERSION,
        "status": "ok",
        "model": spec.model_name,
        "model_ref": spec.model_ref,
        "role": spec.role,
        "mode": spec.mode,
        "seed": spec.seed,
        "start_step": trace.start_step,
        "end_step": pos.step,
        "steps": spec.steps,
        "fault": spec.fault,
        "fault_detail": faults.detail(),
        "attestation": start.attestation,
        "attestations": attestations,
        "controls": {"events": watch.events, "switched_off": watch.switched_off()} if strict else None,
        "replayed": pos.replayed,
        "loader": loader.describe_setup(setup),
        "environment": envinfo.environment(seed=spec.seed, device=spec.device, project_commit=spec.project_commit),
        "packages": envinfo.packages() if spec.role in ("A", "golden") else None,
        "config": setup.config,
        "batch_size": setup.batch_size,
        "accumulate": setup.accumulate,
        "initial_fingerprint": trace.initial,
        "batch_checksum": BATCH_CHECKSUM,
        "fingerprint_scheme": FINGERPRINT_SCHEME,  # what a row holds for a tensor absent at a step
        "tensor_names": trace.fps.names if trace.fps is not None else [],
        "fingerprints": trace.fps.to_lists() if trace.fps is not None else [],
        "batch_fingerprints": batch_sums,
        "batch_contents_scheme": BATCH_CONTENTS,
        "batch_contents": batch_contents,
        "batch_opaque": trace.opaque,
        "batch_epochs": trace.epochs,
        "losses": [v if math.isfinite(v) else repr(v) for v in loss_values],
        "final_sha256": final[0],
        "tensor_sha256": final[1],
        **_timing_fields(clock, start, pos.step - trace.start_step, setup.batch_size, lockstep=turns is not None),
        "cpus": turns.cpus if turns is not None else None,
        "steady_allocator": start.steady_allocator,
        "ops": clock.ops,
    }


def _timing_fields(clock: StepClock, start: Start, steps_taken: int, batch_size: int | None, *,
                   lockstep: bool) -> dict[str, Any]:
    """Set-up and training time; on throughput runs, each timed step and the rates they give."""
    train_s = clock.ended - clock.since
    timed_s = ((clock.timed_end or clock.ended) - clock.timed_from) if clock.timed_from is not None else train_s
    if lockstep:
        timed_s = sum(clock.step_times)  # the time it held the turn, not the time it waited for it
    steps_per_s = 1.0 / statistics.median(clock.step_times) if clock.step_times else None
    peak = clock.peak or (None, None)
    return {
        "timings": {
            "setup_s": clock.since - start.t,
            "train_s": train_s,
            "timed_steps": clock.timed_steps if clock.timed_from is not None else steps_taken,
            "timed_s": timed_s,
        },
        "step_times_s": clock.step_times,
        "data_times_s": clock.data_times,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * batch_size if steps_per_s and batch_size else None,
        "peak_memory_bytes": peak[0],
        "peak_memory_kind": peak[1],
        "profiled_steps": max(clock.profile_steps - 1, 0),
    }


def evaluated(out: dict[str, Any], spec: WorkerSpec, setup: TrainSetup, clock: StepClock, build_s: float) -> None:
    """The held-out evaluation the spec asks for, after the final hash (it never touches it),
    and the timings of a run's time outside its steps: the plugin's factory (``build_s``, of
    set-up), the checkpoints (``checkpoint_s``, of training), the checks, final hash and
    record after the last step (``finish_s``) and the plugin's eval_fn (``eval_s``)."""
    t_eval = time.perf_counter()
    if spec.evaluate:
        out["eval"] = evaluate(setup, spec.model_ref)
    eval_s = time.perf_counter() - t_eval
    out["timings"].update(build_s=build_s, checkpoint_s=clock.checkpoint_s, eval_s=eval_s,
                          finish_s=t_eval - clock.ended)
