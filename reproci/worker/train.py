"""The harness's training loop: one fresh-process run described by a WorkerSpec.

``run`` switches the determinism controls on and proves them, sets the plugin's model up
(or restores it from a checkpoint), takes the steps and returns the run's record. What
each step leaves behind is kept by ``record.Trace``, its timing by ``timing.StepClock``,
turns with paired runs by ``turns.Turns`` and test-only faults by ``faults.Faults``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from . import determinism, distributed, execution, perturb, record
from .contract import ModelContext, TrainSetup, load_factory, loss_of, validate
from .controls import ControlWatch
from .data.batches import Accumulated, EpochEnds, epoch_batches, next_batch
from .data.loader import resume_point
from .faults import Faults
from .finite import check_finite
from .overflow import first_overflow
from .process.progress import StepLine
from .process.spec import WorkerSpec, resolve
from .run_record import RunRecord
from .sections import Attestation
from .state import census, checkpoint
from .state.checkpoint import LoopPosition, Resume, extra_sha256
from .state.state import dump_state, final_hash
from .timing import StepClock, steady_allocator, sync
from .turns import Turns


class AttestationError(Exception):
    """A determinism control did not take effect in this process."""


class DeviceUnavailable(Exception):
    """The device the spec asks for does not exist in this process (an infrastructure fault)."""


def run(spec: WorkerSpec, spec_file: Path) -> RunRecord:
    """Run one training process as the spec says; return its record."""
    faults = Faults(spec.fault, spec.steps)
    t_start = time.perf_counter()
    steady = steady_allocator() if spec.warmup_steps > 0 else False
    determinism.make_deterministic(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict",
                                   bookkeeping=spec.mode == "bookkeeping", warn_only=spec.audit_path is not None)
    attestation = _attest(spec)
    if not attestation["ok"]:
        bad = [f"{k} (expected {v['expected']!r}, got {v['actual']!r})" for k, v in attestation["checks"].items() if not v["ok"]]
        raise AttestationError("determinism controls did not take effect: " + "; ".join(bad))
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"--device cuda: torch {torch.__version__} in this process sees no GPU (torch.cuda.is_available() is "
            "False); run where a GPU and a CUDA build of torch are, or use --device cpu")
    missing = distributed.missing_gpus(spec.world_size, device)
    if missing:
        raise DeviceUnavailable(missing)
    rank = distributed.join(spec.world_size, device)
    pos = LoopPosition()
    watch = ControlWatch(step=lambda: pos.step)
    with watch if spec.mode == "strict" else contextlib.nullcontext():
        out = _train(spec, spec_file, distributed.device_of(rank, device), pos, watch, faults,
                     record.Start(t_start, attestation, steady), rank)
    distributed.leave(rank)
    return out


def _train(spec: WorkerSpec, spec_file: Path, device: torch.device, pos: LoopPosition, watch: ControlWatch,
           faults: Faults, start: record.Start, rank: distributed.Rank) -> RunRecord:
    """Set the model up (or restore it), take the steps, then hash and record the result."""
    listings = perturb.reverse_listings() if spec.reverse_listing else None
    setup, own, build_s = _set_up(spec, spec_file, device, rank)
    spec = dataclasses.replace(spec, checkpoint_at=resume_point(spec, setup))
    perturbed = _perturb(spec, spec_file, setup, device, listings)
    net, ddp, compiled, cache = _step_module(spec, spec_file, setup, own, rank)
    autocast = execution.autocast(spec.amp, device)
    faults.after_setup()
    resume = _resume(spec, spec_file, setup, device, pos)
    trace = record.Trace(setup, fingerprints=spec.fingerprints, start_step=pos.step)
    attestations: dict[str, Attestation] = {"start": start.attestation}
    extra_hashes: dict[str, str | None] = {}  # what get_extra_state returns, hashed at the checkpoint and the end
    turns, stop, clock = _pacing(spec, spec_file, device, pos.step)
    batches = epoch_batches(setup, pos, resume, spec, faults)
    epochs = EpochEnds(setup, pos.epoch)  # epoch-stepped schedulers, from the epoch the run starts in
    watch.step = lambda: pos.step + 1  # from here on, a control set is set in the step being taken
    step_line = StepLine(stop) if rank.rank == 0 else (lambda step: None)
    points = census.Points(pos.step if resume is not None else spec.checkpoint_at)  # A's checkpoint, C's resume
    sync(device)
    while pos.step < stop:
        in_turn = turns is not None and clock.past_warmup(pos.step)
        if in_turn:
            stop = _wait_turn(turns, clock, pos.step, stop)  # type: ignore[arg-type]
            if pos.step >= stop:
                break
        clock.before_step(pos.step)
        t_fetch = time.perf_counter()
        batch = next_batch(batches, setup.accumulate, device)
        fetch_s = time.perf_counter() - t_fetch
        points.before_step(setup, pos.step)
        trace.batch(batch, pos.epoch)
        epochs.reached(pos.epoch)
        loss = _recorded_step(spec, spec_file, setup, net, batch, pos.step + 1, autocast)
        pos.step += 1
        faults.after_step(setup.model, pos.step)
        points.after_step(setup, pos.step)
        trace.step(loss)
        clock.step_taken(pos.step, fetch_s)
        _save_checkpoints(spec, spec_file, setup, pos, attestations, extra_hashes, clock)
        clock.step_ended()
        step_line(pos.step)
        if in_turn:
            turns.done(clock.last_time, last=pos.step >= stop)  # type: ignore[union-attr]
    if turns is not None:
        turns.wait()  # released once every paired run has finished its steps
        turns.close()
    clock.stop()
    check_finite(setup, trace.losses, trace.start_step, spec.amp, lambda: first_overflow(setup, trace.last_batch, device))

    _dump_states(spec, spec_file, setup, pos)
    final = final_hash(setup.model, setup.optimizer, setup.state_modules)
    extra_hashes["end"] = extra_sha256(setup)
    attestations["end"] = _attest(spec)
    finish = record.Finish(final=final, attestations=attestations,
                           execution=_execution_facts(spec, setup, compiled, cache), perturbed=perturbed,
                           census=points.to_record(),
                           extra_state_sha256=extra_hashes if setup.get_extra_state is not None else None,
                           distributed=distributed.describe(rank, ddp), build_s=build_s)
    return record.build(spec, setup, pos, start=start, trace=trace, faults=faults, watch=watch, clock=clock,
                        turns=turns, finish=finish)


def _wait_turn(turns: Turns, clock: StepClock, taken: int, stop: int) -> int:
    """Wait for the next step's turn; returns the step the run stops at. When the
    orchestrator has timed enough, only the profiled steps follow (none: the run ends here,
    and this turn is answered as its last)."""
    if not turns.wait():
        stop = clock.end_timing(taken)
        if taken >= stop:
            turns.done(None, last=True)
            return stop
    clock.turn_started()
    return stop


def _pacing(spec: WorkerSpec, spec_file: Path, device: torch.device,
            start_step: int) -> tuple[Turns | None, int, StepClock]:
    """Turns with paired runs (lockstep), the step the run stops at (a dump at ``dump_at`` ends
    it), and the step clock, started now that the set-up is done."""
    t_setup = time.perf_counter()
    turns = Turns(spec, spec_file, device) if spec.lockstep else None
    stop = spec.steps if spec.dump_at is None else min(spec.steps, spec.dump_at)
    clock = StepClock(device, since=t_setup, start_step=start_step, stop=stop, warmup_steps=spec.warmup_steps,
                      profile_ops=spec.profile_ops)
    return turns, stop, clock


def _step_module(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, own: torch.nn.Module | None,
                 rank: distributed.Rank
                 ) -> tuple[torch.nn.Module, dict[str, Any], execution.CompileIdentity | None, execution.CompileCache | None]:
    """The module each step calls: DDP-wrapped above one rank, then compiled where asked (or as
    the plugin compiled it); ``setup.model`` stays the plain module: hashed, checkpointed."""
    net, ddp = distributed.wrap(setup, rank)
    cache_dir = resolve(spec_file, spec.compile_cache or f"inductor-cache-{spec.role}")
    net, compiled, cache = execution.prepare(spec.compile, cache_dir, spec.mode == "strict", setup, net, own,
                                             eager=spec.eager)
    return net, ddp, compiled, cache


def _execution_facts(spec: WorkerSpec, setup: TrainSetup, compiled: execution.CompileIdentity | None,
                     cache: execution.CompileCache | None) -> execution.Facts:
    """The record's facts of compile and autocast; a strict compiled run whose inductor
    deterministic switch was turned off is refused, like any control that did not hold."""
    attested = execution.attest(compiled, spec.mode == "strict")
    if attested is not None and not attested["ok"]:
        raise AttestationError("inductor's deterministic switch (torch._inductor.config.deterministic) was found off "
                               "at the end of a strict compiled run: the model or a library set it; leave it on")
    return {"execution": execution.describe(compiled, spec.amp),  # part of the run's identity
            "compile_cache": cache, "compile_attestation": attested, "scaler_state": execution.scaler_state(setup)}


def _perturb(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, device: torch.device,
             listings: dict[str, int] | None) -> perturb.Perturbed | None:
    """A portability probe's change to the set-up (``perturb``), or its inspection
    (``inspection``); what it changed goes in the record."""
    out: perturb.Perturbed = {}
    if listings is not None:
        out["listings"] = listings  # the live count: read when the record is built
    if spec.num_workers is not None:
        out["workers"] = perturb.with_workers(setup, spec.num_workers)
    if spec.inspect_path is not None:
        from .inspection import inspect

        inspect(setup, device, str(resolve(spec_file, spec.inspect_path)))
    return out or None


def _attest(spec: WorkerSpec) -> Attestation:
    return determinism.attest(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict",
                              bookkeeping=spec.mode == "bookkeeping", warn_only=spec.audit_path is not None,
                              hash_seed=spec.hash_seed, cpu_isa=spec.cpu_isa)


def _set_up(spec: WorkerSpec, spec_file: Path, device: torch.device,
            rank: distributed.Rank) -> tuple[TrainSetup, torch.nn.Module | None, float]:
    """The plugin's TrainSetup, checked against the contract, its model on the device and training,
    with a GradScaler under fp16; the plugin's own compiled model, if any; the factory's seconds."""
    ctx = ModelContext(profile=spec.profile, device=device, seed=spec.seed, rank=rank.rank, world_size=rank.world_size,
                       steps=spec.steps)
    plugin_paths = [str(resolve(spec_file, p)) for p in spec.plugin_paths]
    factory = load_factory(spec.model_ref, plugin_paths)
    t_build = time.perf_counter()
    setup = validate(factory(ctx), spec.model_ref)
    build_s = time.perf_counter() - t_build  # the plugin's own set-up: its model, data and optimizer
    own = execution.unwrap(setup)
    setup.model.to(device)
    setup.model.train()
    for module in setup.state_modules.values():
        module.to(device)
    execution.ensure_scaler(spec.amp, setup, device)
    return setup, own, build_s


def _resume(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, device: torch.device,
            pos: LoopPosition) -> Resume | None:
    """Restore the checkpoint the spec resumes from, if any, and move ``pos`` to it."""
    if spec.resume_from is None:
        return None
    loaded, resume = checkpoint.load(str(resolve(spec_file, spec.resume_from)), setup, device)
    pos.__dict__.update(loaded.__dict__)
    return resume


def _recorded_step(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, net: torch.nn.Module, batch: Any,
                   step: int, autocast: Any = contextlib.nullcontext) -> torch.Tensor:
    """One training step; every op recorded where the spec asks: the audit's first step
    (``audit``), a probed step (``oprecord``)."""
    if spec.audit_path is not None and step == 1:
        from .audit.audit import audited_step

        return audited_step(setup.model, setup.optimizer, lambda: train_step(setup, net, batch, step, autocast),
                            str(resolve(spec_file, spec.audit_path)))
    several = step in spec.ops_steps
    if spec.ops_path is None or not (several or (step == spec.dump_at and not spec.ops_steps)):
        return train_step(setup, net, batch, step, autocast)
    from .audit.oprecord import OpRecorder

    with OpRecorder(setup.model, setup.optimizer, digests=True, keep=not several) as recorder:
        loss = train_step(setup, net, batch, step, autocast)
        recorder.mark_loss(loss)
    recorder.save(str(resolve(spec_file, spec.ops_path.format(step=step) if several else spec.ops_path)))
    return loss


def train_step(setup: TrainSetup, net: torch.nn.Module, batch: Any, step: int = 0,
               autocast: Any = contextlib.nullcontext) -> torch.Tensor:
    """One optimizer step (number ``step``, 1-based) over one batch or the micro-batches of an
    ``Accumulated``; ``net`` is the model as the step calls it (DDP-wrapped above one rank,
    compiled under ``--compile``); each forward and loss runs in ``autocast()`` (``--amp``)."""
    parts = list(batch) if isinstance(batch, Accumulated) else [batch]
    setup.optimizer.zero_grad(set_to_none=True)
    items = setup.step_items(parts) if setup.step_items is not None else None  # each loss then sums to the step's
    losses = []
    for part in parts:
        with autocast():
            loss = loss_of(setup.loss_fn(net, part) if items is None else setup.loss_fn(net, part, items))
        scaled = loss / len(parts) if len(parts) > 1 and items is None else loss
        (setup.scaler.scale(scaled) if setup.scaler is not None else scaled).backward()
        if setup.after_backward is not None:
            setup.after_backward()
        losses.append(loss)
    if setup.scaler is not None:
        if setup.grad_clip is not None:
            setup.scaler.unscale_(setup.optimizer)
            torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip)
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    else:
        if setup.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip)
        setup.optimizer.step()
    # detached after the optimizer's step, where the recorded ops of a step have always had it
    total = losses[0].detach()
    for more in losses[1:]:
        total = total + more.detach()
    loss = total / len(parts) if len(parts) > 1 and items is None else total
    if setup.scheduler is not None:
        setup.scheduler.stepped(step, loss)
    if setup.after_step is not None:
        setup.after_step(step)
    return loss


def _save_checkpoints(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, pos: LoopPosition,
                      attestations: dict[str, Attestation], extra_hashes: dict[str, str | None], clock: StepClock) -> None:
    """The checkpoints the spec asks for at this step, timed on ``clock``. The resume check's
    checkpoint (``checkpoint_at``) also re-attests the controls: the record shows they still
    held where the resumed run picks up."""
    t0 = time.perf_counter()
    if spec.checkpoint_at is not None and pos.step == spec.checkpoint_at:
        checkpoint.save(str(resolve(spec_file, spec.checkpoint_path)), setup, pos)
        attestations["checkpoint"] = _attest(spec)
        extra_hashes["checkpoint"] = extra_sha256(setup)
    if pos.step in spec.checkpoint_steps:
        checkpoint.save(str(resolve(spec_file, spec.checkpoint_pattern.format(step=pos.step))), setup, pos)
    clock.checkpoint_s += time.perf_counter() - t0


def _dump_states(spec: WorkerSpec, spec_file: Path, setup: TrainSetup, pos: LoopPosition) -> None:
    """Every state tensor at ``dump_at`` and at the end, where the spec asks for them."""
    if spec.dump_at is not None and spec.dump_path is not None:
        dump_state(setup.model, setup.optimizer, str(resolve(spec_file, spec.dump_path)), setup.state_modules)
    if spec.final_dump_path is not None and (spec.dump_at is None or pos.step == spec.steps):
        dump_state(setup.model, setup.optimizer, str(resolve(spec_file, spec.final_dump_path)), setup.state_modules)
