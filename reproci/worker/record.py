"""A run's record: what one training process reports (``run_record.RunRecord``).

Per step a run keeps its loss and, with fingerprints, the checksums of its batch and of
its state (``Trace``), on the device until the run ends. ``build`` then gathers these,
the final hash, the attestations, the timings, the environment and the facts of the run's
set-up (``Finish``) into the one ``RunRecord``, the only thing the orchestrator reads back
from the process.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from .contract import TrainSetup
from .controls import ControlWatch
from .data import batchtree, loader
from .data.batchlog import BatchLog
from .data.batchsum import BATCH_CHECKSUM, BATCH_CONTENTS
from .distributed import Distributed
from .evaluate import evaluate
from .execution import Facts
from .faults import Faults
from .perturb import Perturbed
from .process import envinfo
from .process.spec import WorkerSpec
from .run_record import RunRecord, Timings
from .sections import Attestation, InitialFingerprint
from .state.census import CensusRecord
from .state.checkpoint import LoopPosition
from .state.fingerprint import FINGERPRINT_SCHEME, StepFingerprints, initial_row
from .state.state import transient_buffers
from .timing import StepClock
from .turns import Turns


class Rates(TypedDict):
    """Each timed step, and the rates and peak memory they give (``_rates``)."""

    step_times_s: list[float]
    data_times_s: list[float]
    steps_per_s: float | None
    samples_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None
    profiled_steps: int


@dataclass(frozen=True)
class Start:
    """What a run knows before its model exists."""

    t: float  # time.perf_counter() when the run began
    attestation: Attestation  # the determinism controls, proven in effect before set-up
    steady_allocator: bool


@dataclass(frozen=True)
class Finish:
    """What the training loop knows of a run once its steps are taken, beside its ``Trace``."""

    final: tuple[str, dict[str, str]]  # the final hash of the whole state, and per tensor
    attestations: dict[str, Attestation]  # the determinism controls at the start, the checkpoint and the end
    execution: Facts  # compile and autocast facts (train._execution_facts)
    perturbed: Perturbed | None  # what a portability probe changed
    census: CensusRecord | None  # the state outside the checkpoint (census.Points.to_record)
    extra_state_sha256: dict[str, str | None] | None  # get_extra_state, hashed at the checkpoint and the end
    distributed: Distributed | None  # ranks and wrapping (distributed.describe)
    build_s: float  # the plugin's factory, of set-up


class Trace:
    """What each step leaves in the record, from the step this run starts at (0, or the
    resume point) to its last."""

    def __init__(self, setup: TrainSetup, *, fingerprints: bool, start_step: int) -> None:
        self.start_step = start_step
        self.initial: InitialFingerprint | None = None
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
          watch: ControlWatch, clock: StepClock, turns: Turns | None, finish: Finish) -> RunRecord:
    """The record of a run that finished its steps, made here once. The held-out evaluation runs last (it never
    touches the final hash); after the last step, ``finish_s`` is the checks, hash and record, ``eval_s`` the rest."""
    batch_sums, batch_contents = trace.batches.values()
    # what the record holds, taken before the held-out evaluation (in this order)
    fault_detail = faults.detail()
    controls = watch.record() if spec.mode == "strict" else None
    described = loader.describe_setup(setup)
    environment = envinfo.environment(seed=spec.seed, device=spec.device, project_commit=spec.project_commit)
    packages = envinfo.packages() if spec.role in ("A", "golden") else None
    tensor_names, fingerprints = (trace.fps.names, trace.fps.to_lists()) if trace.fps is not None else ([], [])
    losses = [v if math.isfinite(v) else repr(v) for v in (torch.stack(trace.losses).cpu().tolist() if trace.losses else [])]
    rates = _rates(clock, setup.batch_size)
    t_eval = time.perf_counter()
    evaluation = evaluate(setup, spec.model_ref) if spec.evaluate else None
    timings = _timings(clock, start, pos.step - trace.start_step, lockstep=turns is not None, build_s=finish.build_s,
                       eval_s=time.perf_counter() - t_eval, finish_s=t_eval - clock.ended)
    return RunRecord(
        model=spec.model_name,
        model_ref=spec.model_ref,
        role=spec.role,
        mode=spec.mode,
        seed=spec.seed,
        start_step=trace.start_step,
        end_step=pos.step,
        steps=spec.steps,
        fault=spec.fault,
        fault_detail=fault_detail,
        attestation=start.attestation,
        attestations=finish.attestations,
        controls=controls,
        replayed=pos.replayed,
        loader=described,
        environment=environment,
        packages=packages,
        config=setup.config,
        batch_size=setup.batch_size,
        accumulate=setup.accumulate,
        initial_fingerprint=trace.initial,
        batch_checksum=BATCH_CHECKSUM,
        fingerprint_scheme=FINGERPRINT_SCHEME,  # what a row holds for a tensor absent at a step
        tensor_names=tensor_names,
        fingerprints=fingerprints,
        batch_fingerprints=batch_sums,
        batch_contents_scheme=BATCH_CONTENTS,
        batch_contents=batch_contents,
        batch_opaque=trace.opaque,
        batch_epochs=trace.epochs,
        losses=losses,
        final_sha256=finish.final[0],
        tensor_sha256=finish.final[1],
        cpus=turns.cpus if turns is not None else None,
        steady_allocator=start.steady_allocator,
        ops=clock.ops,
        **finish.execution,  # execution, compile_cache, compile_attestation, scaler_state
        perturbed=finish.perturbed,
        checkpoint_at=spec.checkpoint_at,
        census=finish.census,
        extra_state_sha256=finish.extra_state_sha256,
        distributed=finish.distributed,
        timings=timings,
        **rates,
        eval=evaluation,
    )


def _timings(clock: StepClock, start: Start, steps_taken: int, *, lockstep: bool, build_s: float, eval_s: float,
             finish_s: float) -> Timings:
    """Set-up and training time (on throughput runs, of the timed steps), and the time outside the steps."""
    train_s = clock.ended - clock.since
    timed_s = ((clock.timed_end or clock.ended) - clock.timed_from) if clock.timed_from is not None else train_s
    if lockstep:
        timed_s = sum(clock.step_times)  # the time it held the turn, not the time it waited for it
    return Timings(setup_s=clock.since - start.t, train_s=train_s,
                   timed_steps=clock.timed_steps if clock.timed_from is not None else steps_taken, timed_s=timed_s,
                   build_s=build_s, checkpoint_s=clock.checkpoint_s, eval_s=eval_s, finish_s=finish_s)


def _rates(clock: StepClock, batch_size: int | None) -> Rates:
    """Each timed step, and the rates and peak memory they give."""
    steps_per_s = 1.0 / statistics.median(clock.step_times) if clock.step_times else None
    peak = clock.peak or (None, None)
    return {
        "step_times_s": clock.step_times,
        "data_times_s": clock.data_times,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * batch_size if steps_per_s and batch_size else None,
        "peak_memory_bytes": peak[0],
        "peak_memory_kind": peak[1],
        "profiled_steps": max(clock.profile_steps - 1, 0),
    }
