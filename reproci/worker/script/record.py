"""The record of a script model's run (``run_record.RunRecord``, the factory runs' document): the
steps ``hooks.ScriptTrace`` kept, the attestations, the environment; what only a factory's loop
knows (its loader, epochs, execution, census) is left empty."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Protocol

import torch

from .. import determinism
from ..controls import ControlWatch
from ..data.batchlog import BatchLog
from ..data.batchsum import BATCH_CHECKSUM, BATCH_CONTENTS
from ..process import envinfo
from ..process.spec import WorkerSpec
from ..run_record import RunRecord, ScriptFacts, Timings
from ..state.fingerprint import FINGERPRINT_SCHEME, StepFingerprints

if TYPE_CHECKING:
    from ..sections import InitialFingerprint


class ScriptSteps(Protocol):
    """What ``hooks.ScriptTrace`` kept of a run, as the record reads it."""

    spec: WorkerSpec
    attestation: determinism.Attestation
    watch: ControlWatch
    start: int  # the step before the process's first
    taken: int  # steps recorded
    beyond: int  # steps after N, not recorded
    model: torch.nn.Module | None
    optimizer_names: list[str]
    fps: StepFingerprints | None
    initial: InitialFingerprint | None
    batches: BatchLog
    opaque: list[str]
    losses: list[torch.Tensor]
    final: tuple[str, dict[str, str]] | None
    step_times: list[float]
    t0: float
    t_first: float | None
    t_last: float | None
    copied: bool


def build(trace: ScriptSteps) -> RunRecord:
    """The record of a script run that reached step N (or a probe's step), as a factory run's
    ``record.build`` makes it: what the hooks kept, and what they could not know left empty."""
    spec = trace.spec
    assert trace.final is not None
    strict = spec.mode == "strict"
    n = trace.taken
    sums, contents = trace.batches.values()
    values = torch.stack(trace.losses).cpu().tolist() if trace.losses else []
    train_s = (trace.t_last or trace.t0) - (trace.t_first or trace.t0)
    steps_per_s = 1.0 / statistics.median(trace.step_times[1:]) if len(trace.step_times) > 1 and \
        statistics.median(trace.step_times[1:]) > 0 else None
    assert spec.script is not None
    return RunRecord(
        model=spec.model_name, model_ref=spec.model_ref, role=spec.role, mode=spec.mode, seed=spec.seed,
        start_step=trace.start, end_step=trace.start + n, steps=spec.steps, fault=None, fault_detail=None,
        attestation=trace.attestation,
        attestations={"start": trace.attestation,
                      "end": determinism.attest(seed=spec.seed, threads=spec.threads, strict=strict,
                                                hash_seed=spec.hash_seed, cpu_isa=spec.cpu_isa)},
        controls={"events": trace.watch.events, "switched_off": trace.watch.switched_off()} if strict else None,
        replayed=None, loader=None,
        environment=envinfo.environment(seed=spec.seed, device=spec.device, project_commit=spec.project_commit),
        packages=envinfo.packages() if spec.role in ("A", "golden") else None,
        config=dict(spec.script.config), batch_size=None, accumulate=1, initial_fingerprint=trace.initial,
        batch_checksum=BATCH_CHECKSUM, fingerprint_scheme=FINGERPRINT_SCHEME,
        tensor_names=list(trace.fps.names or []) if trace.fps is not None else [],
        fingerprints=trace.fps.to_lists() if trace.fps is not None else [],
        batch_fingerprints=sums, batch_contents_scheme=BATCH_CONTENTS, batch_contents=contents,
        batch_opaque=trace.opaque, batch_epochs=[],  # epochs are the script's own: not known here
        losses=[v if v == v and abs(v) != float("inf") else repr(v) for v in values],
        final_sha256=trace.final[0], tensor_sha256=trace.final[1],
        timings=Timings(setup_s=(trace.t_first or trace.t0) - trace.t0, train_s=train_s, timed_steps=n, timed_s=train_s),
        step_times_s=trace.step_times, data_times_s=[], steps_per_s=steps_per_s, samples_per_s=None,
        peak_memory_bytes=None, peak_memory_kind=None, profiled_steps=0, cpus=None, steady_allocator=False,
        ops=None, execution=None, compile_cache=None, compile_attestation=None, scaler_state=None, perturbed=None,
        checkpoint_at=spec.checkpoint_at, census=None, extra_state_sha256=None, distributed=None,
        script=ScriptFacts(model=type(trace.model).__name__, optimizers=trace.optimizer_names,
                           steps_taken=trace.taken + trace.beyond, copied_out=trace.copied),
    )
