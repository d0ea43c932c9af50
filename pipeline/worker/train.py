"""The harness's training loop: one fresh-process run described by a WorkerSpec."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from . import checkpoint, determinism, envinfo
from .checkpoint import LoopPosition
from .contract import ContractError, ModelContext, TrainSetup, load_factory, validate
from .fingerprint import StepFingerprints, batch_checksum, dump_state, final_hash
from .spec import FAULTS, WorkerSpec, resolve

RECORD_VERSION = 1


class AttestationError(Exception):
    """A determinism control did not take effect in this process."""


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=False)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_step(setup: TrainSetup, batch: Any) -> torch.Tensor:
    setup.optimizer.zero_grad(set_to_none=True)
    loss = setup.loss_fn(setup.model, batch)
    if setup.scaler is not None:
        setup.scaler.scale(loss).backward()
        if setup.grad_clip is not None:
            setup.scaler.unscale_(setup.optimizer)
            torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip)
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    else:
        loss.backward()
        if setup.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip)
        setup.optimizer.step()
    if setup.scheduler is not None:
        setup.scheduler.step()
    return loss.detach()


def _batches(setup: TrainSetup, pos: LoopPosition, resume_rng: dict[str, Any] | None, spec: WorkerSpec) -> Iterator[Any]:
    """Yield batches forever, across epochs, tracking the position for checkpoints.

    On resume the loader generator is put back to its state before the interrupted
    epoch's ``iter()`` and the consumed batches are fast-forwarded, so sampler order
    and worker seeds are those of the original run; then the RNG states saved at the
    checkpoint are restored.
    """
    gen = setup.generator()
    skip = pos.batch_in_epoch
    if spec.fault == "resume-skip-loader-position":
        skip = 0
    first = True
    while True:
        if first and resume_rng is not None:
            if gen is not None and pos.epoch_generator_state is not None:
                gen.set_state(pos.epoch_generator_state)
        else:
            pos.epoch_generator_state = gen.get_state() if gen is not None else None
        it = iter(setup.loader)
        if first and resume_rng is not None:
            for _ in range(skip):
                next(it)
            checkpoint.set_rng_states(resume_rng, torch_rng=spec.fault != "resume-drop-rng")
            if spec.fault == "resume-skip-loader-position":
                pos.batch_in_epoch = 0
        first = False
        produced = False
        for batch in it:
            produced = True
            pos.batch_in_epoch += 1
            yield batch
        if not produced:
            raise ContractError(f"{spec.model_ref}: the loader yielded no batch in an epoch")
        pos.epoch += 1
        pos.batch_in_epoch = 0


def _buffer_drift(model: torch.nn.Module) -> str:
    """Test fault: move one floating buffer by one ULP."""
    for name, b in model.named_buffers():
        if b.is_floating_point() and b.numel():
            with torch.no_grad():
                flat = b.view(-1)
                flat[0] = torch.nextafter(flat[0], flat[0] + 1)
            return name
    raise ContractError("fault buffer-drift needs a model with a floating-point buffer")


def run(spec: WorkerSpec, spec_file: Path) -> dict[str, Any]:
    """Run one training process as the spec says; return its record (also written)."""
    if spec.fault is not None and spec.fault not in FAULTS:
        raise ContractError(f"unknown fault {spec.fault!r}; known: {', '.join(FAULTS)}")
    strict = spec.mode == "strict"
    t_start = time.perf_counter()
    determinism.make_deterministic(seed=spec.seed, threads=spec.threads, strict=strict)
    attestation = determinism.attest(seed=spec.seed, threads=spec.threads, strict=strict)
    if not attestation["ok"]:
        bad = [f"{k} (expected {v['expected']!r}, got {v['actual']!r})" for k, v in attestation["checks"].items() if not v["ok"]]
        raise AttestationError("determinism controls did not take effect: " + "; ".join(bad))

    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ContractError("device cuda was asked for but torch sees no GPU in this process")
    ctx = ModelContext(profile=spec.profile, device=device, seed=spec.seed)
    plugin_paths = [str(resolve(spec_file, p)) for p in spec.plugin_paths]
    factory = load_factory(spec.model_ref, plugin_paths)
    setup = validate(factory(ctx), spec.model_ref)
    setup.model.to(device)
    setup.model.train()
    if spec.fault == "clock-seed":
        torch.manual_seed(time.time_ns() % 2**62)

    pos = LoopPosition()
    resume_rng = None
    if spec.resume_from is not None:
        pos, resume_rng = checkpoint.load(str(resolve(spec_file, spec.resume_from)), setup, device)
    start_step = pos.step
    t_setup = time.perf_counter()

    fps = StepFingerprints(setup.model, setup.optimizer) if spec.fingerprints else None
    losses: list[torch.Tensor] = []
    batch_sums: list[torch.Tensor] = []
    stop = spec.steps if spec.dump_at is None else min(spec.steps, spec.dump_at)
    drift_step = spec.steps // 2 if spec.fault == "buffer-drift" else None
    drifted: str | None = None
    timed_from: float | None = None
    timed_steps = 0
    batches = _batches(setup, pos, resume_rng, spec)
    _sync(device)
    while pos.step < stop:
        batch = to_device(next(batches), device)
        if fps is not None:
            bs = batch_checksum(batch)
            batch_sums.append(bs if bs is not None else torch.zeros((), dtype=torch.int64))
        loss = _train_step(setup, batch)
        pos.step += 1
        if drift_step is not None and pos.step == drift_step:
            drifted = _buffer_drift(setup.model)
        losses.append(loss.float().reshape(()))
        if fps is not None:
            fps.record()
        if pos.step - start_step == spec.warmup_steps:
            _sync(device)
            timed_from = time.perf_counter()
        elif timed_from is not None:
            timed_steps += 1
        if spec.checkpoint_at is not None and pos.step == spec.checkpoint_at:
            checkpoint.save(str(resolve(spec_file, spec.checkpoint_path)), setup, pos)
    _sync(device)
    t_end = time.perf_counter()
    if spec.dump_at is not None and spec.dump_path is not None:
        dump_state(setup.model, setup.optimizer, str(resolve(spec_file, spec.dump_path)))
    digest, per_tensor = final_hash(setup.model, setup.optimizer)
    loss_values = torch.stack(losses).cpu().tolist() if losses else []
    train_s = t_end - t_setup
    timed_s = (t_end - timed_from) if timed_from is not None else train_s
    return {
        "schema": "reproci.run",
        "version": RECORD_VERSION,
        "status": "ok",
        "model": spec.model_name,
        "model_ref": spec.model_ref,
        "role": spec.role,
        "mode": spec.mode,
        "seed": spec.seed,
        "start_step": start_step,
        "end_step": pos.step,
        "steps": spec.steps,
        "fault": spec.fault,
        "fault_detail": {"buffer": drifted} if drifted else None,
        "attestation": attestation,
        "environment": envinfo.environment(seed=spec.seed, device=spec.device, project_commit=spec.project_commit),
        "packages": envinfo.packages() if spec.role in ("A", "golden") else None,
        "config": setup.config,
        "batch_size": setup.batch_size,
        "tensor_names": fps.names if fps is not None else [],
        "fingerprints": fps.to_lists() if fps is not None else [],
        "batch_fingerprints": torch.stack(batch_sums).cpu().tolist() if batch_sums else [],
        "losses": [v if math.isfinite(v) else repr(v) for v in loss_values],
        "final_sha256": digest,
        "tensor_sha256": per_tensor,
        "timings": {
            "setup_s": t_setup - t_start,
            "train_s": train_s,
            "timed_steps": timed_steps if timed_from is not None else pos.step - start_step,
            "timed_s": timed_s,
        },
    }
