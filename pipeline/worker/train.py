"""The harness's training loop: one fresh-process run described by a WorkerSpec."""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from . import checkpoint, determinism, envinfo, loader, rng
from .checkpoint import LoopPosition, Resume
from .contract import ContractError, ModelContext, TrainSetup, load_factory, validate
from .controls import ControlWatch
from .fingerprint import BATCH_CHECKSUM, StepFingerprints, batch_checksum, dump_state, final_hash, initial_row
from .spec import FAULTS, PROFILE_STEPS, WorkerSpec, resolve

RECORD_VERSION = 1
OPS_KEPT = 80  # per-op rows kept in a record, most expensive first


class AttestationError(Exception):
    """A determinism control did not take effect in this process."""


class DeviceUnavailable(Exception):
    """The device the spec asks for does not exist in this process (an infrastructure fault)."""


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


def _batches(setup: TrainSetup, pos: LoopPosition, resume: Resume | None, spec: WorkerSpec) -> Iterator[Any]:
    """Yield batches forever, across epochs, tracking the position for checkpoints.

    Each epoch starts with a snapshot (``loader.EpochStart``) and ``set_epoch``. A resumed
    run puts the interrupted epoch's snapshot back, replays that epoch to the checkpoint's
    batch (``loader.replay_epoch``), and only then restores the RNG and extra state saved
    at the checkpoint: state that the replay advanced is put back to its checkpointed value,
    and state the replay never touches (a dataset's own RNG, under index-level skipping) is
    not advanced twice. A checkpoint at an epoch's last batch resumes into the next epoch.
    """
    resuming = resume is not None
    while True:
        if resuming:
            assert resume is not None
            if pos.epoch_start is not None:
                loader.restore(setup, pos.epoch_start)
            skip = 0 if spec.fault == "resume-skip-loader-position" else pos.batch_in_epoch
            it, how = loader.replay_epoch(setup, pos.epoch, skip)
            pos.replayed = how
            rng.set_states(resume.rng, torch_rng=spec.fault != "resume-drop-rng")
            if setup.set_extra_state is not None and resume.extra is not None:
                setup.set_extra_state(resume.extra)
            if spec.fault == "resume-skip-loader-position":
                pos.batch_in_epoch = 0
        else:
            pos.epoch_start = loader.snapshot(setup)
            it = loader.begin_epoch(setup, pos.epoch)
        produced = False
        for batch in it:
            produced = True
            pos.batch_in_epoch += 1
            yield batch
        if not produced and not resuming:
            raise ContractError(f"{spec.model_ref}: the loader yielded no batch in epoch {pos.epoch}")
        resuming = False
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


def _peak_memory(device: torch.device) -> tuple[int | None, str | None]:
    """Peak memory so far: allocator peak on a GPU, the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda.max_memory_allocated"
    try:
        import resource
    except ImportError:  # not a Unix
        return None, None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "ru_maxrss"


def _steady_allocator() -> bool:
    """Fix glibc malloc's thresholds for a timed run; True if they were set.

    By default glibc adapts its mmap and trim thresholds as a process frees memory, so
    whether each step's large CPU buffers are recycled or handed back to the kernel and
    faulted in again depends on the process's history: two identical processes measured
    side by side differed by up to 50 % in step time on a 2-core VM (conv, quick profile),
    and by about 1.5 % with fixed thresholds. Timed runs of every mode get the same settings.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    ok = mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's upper limit on 64-bit; fixed, no longer adaptive
    ok &= mallopt(m_trim_threshold, 2**30)  # keep freed heap memory instead of returning it each step
    ok &= mallopt(m_top_pad, 64 * 2**20)
    return bool(ok)


def _prime_profiler(device: torch.device) -> None:
    """The profiler's first session pays a one-time start-up (about 1 s on a CPU): pay it
    before warm-up, beside a paired run's own set-up, not inside a turn."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities):
        torch.zeros(1, device=device).add_(1)


def _start_profiler(device: torch.device, steps: int) -> Any:
    """A profiler over ``steps`` steps: one warm-up step, then every step recorded and marked."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps - 1, repeat=1))
    prof.start()
    return prof


def _op_times(prof: Any, device: torch.device) -> list[dict[str, Any]]:
    """Per op, the median over profiled steps of its self time (microseconds), most expensive first.

    Events are assigned to the ``ProfilerStep`` range they start in; a step's own self
    time (Python between ops) is reported as "(outside ops)". Medians keep one slow step
    (a page fault, a neighbour on a shared machine) from inflating an op.
    """
    events = [e for e in prof.events() if str(getattr(e, "device_type", "CPU")).endswith("CPU")]
    marks = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep"))
    starts = [m[0] for m in marks]
    per_step: list[dict[str, list[float]]] = [{} for _ in marks]
    for e in events:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > marks[i][1]:
            continue
        name = "(outside ops)" if e.name.startswith("ProfilerStep") else e.name
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:  # older torch
            dev = getattr(e, "self_cuda_time_total", 0.0)
        row = per_step[i].setdefault(name, [0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += e.self_cpu_time_total
        row[2] += float(dev)
    names = set().union(*per_step) if per_step else set()
    rows = []
    for name in names:
        cols = [statistics.median(step.get(name, [0.0, 0.0, 0.0])[k] for step in per_step) for k in range(3)]
        rows.append({"name": name, "calls": cols[0], "self_cpu_us": cols[1], "self_device_us": cols[2]})
    key = "self_device_us" if device.type == "cuda" else "self_cpu_us"
    rows = [r for r in rows if r[key] > 0]
    rows.sort(key=lambda r: -r[key])
    return rows[:OPS_KEPT]


class _Turns:
    """Taking turns with paired runs (spec.lockstep): one step per turn, handed out by the
    orchestrator through two FIFOs, so the modes of a throughput pair meet the same
    neighbours on a shared machine. The orchestrator holds its ends open before launch.

    On a CPU, the first turn moves this process to the first ``threads`` CPUs it may use:
    paired workers start with the same CPU set, so they take their turns on the same CPUs.
    Processes it forks later (loader workers) get the full set back, so data loading still
    runs beside training as it would unpinned.
    """

    def __init__(self, spec: WorkerSpec, spec_file: Path, device: torch.device) -> None:
        base = str(resolve(spec_file, spec.lockstep))
        try:
            self.go = os.open(base + ".go", os.O_RDONLY)
            self.finished = os.open(base + ".done", os.O_WRONLY)
        except FileNotFoundError:  # the orchestrator ended the pair (its partner failed) before this run got here
            raise RuntimeError("lockstep: the orchestrator stopped handing out turns") from None
        self.pin = spec.threads if device.type == "cpu" and hasattr(os, "sched_setaffinity") else 0
        self.cpus: list[int] | None = None
        self.allowed: set[int] | None = None

    def wait(self) -> None:
        if self.pin and self.cpus is None:
            allowed = self.allowed = os.sched_getaffinity(0)
            self.cpus = sorted(allowed)[:self.pin]
            os.register_at_fork(after_in_child=lambda: os.sched_setaffinity(0, allowed))
            os.sched_setaffinity(0, self.cpus)
        if os.read(self.go, 1) != b"g":
            raise RuntimeError("lockstep: the orchestrator stopped handing out turns")

    def done(self) -> None:
        os.write(self.finished, b"d")

    def close(self) -> None:
        """After the last turn: the pair finishes (hashes, record, exit) side by side again."""
        os.close(self.go)
        os.close(self.finished)
        if self.allowed is not None:
            os.sched_setaffinity(0, self.allowed)


def run(spec: WorkerSpec, spec_file: Path) -> dict[str, Any]:
    """Run one training process as the spec says; return its record (also written)."""
    if spec.fault is not None and spec.fault not in FAULTS:
        raise ContractError(f"unknown fault {spec.fault!r}; known: {', '.join(FAULTS)}")
    strict = spec.mode == "strict"
    bookkeeping = spec.mode == "bookkeeping"
    t_start = time.perf_counter()
    steady_allocator = _steady_allocator() if spec.warmup_steps > 0 else False
    determinism.make_deterministic(seed=spec.seed, threads=spec.threads, strict=strict, bookkeeping=bookkeeping)
    attestation = determinism.attest(seed=spec.seed, threads=spec.threads, strict=strict, bookkeeping=bookkeeping)
    if not attestation["ok"]:
        bad = [f"{k} (expected {v['expected']!r}, got {v['actual']!r})" for k, v in attestation["checks"].items() if not v["ok"]]
        raise AttestationError("determinism controls did not take effect: " + "; ".join(bad))

    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"--device cuda: torch {torch.__version__} in this process sees no GPU (torch.cuda.is_available() is "
            "False); run where a GPU and a CUDA build of torch are, or use --device cpu")
    ctx = ModelContext(profile=spec.profile, device=device, seed=spec.seed)
    plugin_paths = [str(resolve(spec_file, p)) for p in spec.plugin_paths]
    pos = LoopPosition()
    watch = ControlWatch(step=lambda: pos.step)
    with watch if strict else contextlib.nullcontext():
        return _train(spec, spec_file, device, ctx, plugin_paths, pos, watch, attestation, t_start, steady_allocator)


def _reattest(spec: WorkerSpec, strict: bool, bookkeeping: bool) -> dict[str, Any]:
    return determinism.attest(seed=spec.seed, threads=spec.threads, strict=strict, bookkeeping=bookkeeping)


def _train(spec: WorkerSpec, spec_file: Path, device: torch.device, ctx: ModelContext, plugin_paths: list[str],
           pos: LoopPosition, watch: ControlWatch, attestation: dict[str, Any], t_start: float,
           steady_allocator: bool) -> dict[str, Any]:
    strict = spec.mode == "strict"
    bookkeeping = spec.mode == "bookkeeping"
    factory = load_factory(spec.model_ref, plugin_paths)
    setup = validate(factory(ctx), spec.model_ref)
    setup.model.to(device)
    setup.model.train()
    if spec.fault == "clock-seed":
        torch.manual_seed(time.time_ns() % 2**62)

    resume = None
    if spec.resume_from is not None:
        loaded, resume = checkpoint.load(str(resolve(spec_file, spec.resume_from)), setup, device)
        pos.__dict__.update(loaded.__dict__)
    start_step = pos.step
    initial: dict[str, Any] | None = None
    if spec.fingerprints:  # the state before this run's first step: step 0, or the resume point
        names0, row0 = initial_row(setup.model, setup.optimizer)
        initial = {"step": start_step, "names": names0, "row": row0.tolist()}
    attestations = {"start": attestation}
    t_setup = time.perf_counter()

    fps = StepFingerprints(setup.model, setup.optimizer) if spec.fingerprints else None
    batch_workspace: dict[Any, torch.Tensor] = {}  # reused buffers for the batch checksum
    losses: list[torch.Tensor] = []
    batch_sums: list[torch.Tensor] = []
    stop = spec.steps if spec.dump_at is None else min(spec.steps, spec.dump_at)
    drift_step = spec.steps // 2 if spec.fault == "buffer-drift" else None
    drifted: str | None = None
    timed_from: float | None = None
    timed_steps = 0
    # Throughput runs (warmup_steps > 0): each timed step is clocked after a device sync;
    # with profile_ops the last PROFILE_STEPS + 1 steps run under torch.profiler, untimed.
    step_times: list[float] = []
    data_times: list[float] = []  # the part of each timed step spent waiting for its batch
    turns = _Turns(spec, spec_file, device) if spec.lockstep else None
    profile_steps = min(PROFILE_STEPS + 1, stop - start_step - spec.warmup_steps - 2) if spec.profile_ops else 0
    profile_steps = profile_steps if profile_steps >= 2 else 0
    timed_stop = stop - profile_steps
    t_timed_end: float | None = None
    profiler: Any = None
    peak: tuple[int | None, str | None] | None = None
    if profile_steps:
        _prime_profiler(device)
    batches = _batches(setup, pos, resume, spec)
    watch.step = lambda: pos.step + 1  # from here on, a control set is set in the step being taken
    _sync(device)
    while pos.step < stop:
        in_turn = turns is not None and pos.step - start_step >= spec.warmup_steps
        if in_turn:
            turns.wait()  # type: ignore[union-attr]
            last_clock = time.perf_counter()
        if profile_steps and pos.step == timed_stop:
            peak = _peak_memory(device)
            profiler = _start_profiler(device, profile_steps)
        t_fetch = time.perf_counter()
        batch = to_device(next(batches), device)
        fetch_s = time.perf_counter() - t_fetch
        if fps is not None:
            bs = batch_checksum(batch, batch_workspace)
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
            timed_from = last_clock = time.perf_counter()
        elif timed_from is not None and pos.step <= timed_stop:
            timed_steps += 1
            _sync(device)
            now = time.perf_counter()
            step_times.append(now - last_clock)
            data_times.append(fetch_s)
            last_clock = t_timed_end = now
        if spec.checkpoint_at is not None and pos.step == spec.checkpoint_at:
            checkpoint.save(str(resolve(spec_file, spec.checkpoint_path)), setup, pos)
            attestations["checkpoint"] = _reattest(spec, strict, bookkeeping)
        if pos.step in spec.checkpoint_steps:
            checkpoint.save(str(resolve(spec_file, spec.checkpoint_pattern.format(step=pos.step))), setup, pos)
        if profiler is not None:
            _sync(device)
            profiler.step()
        if in_turn:
            _sync(device)
            turns.done()  # type: ignore[union-attr]
    if turns is not None:
        turns.wait()  # released once every paired run has finished its steps
        turns.close()
    _sync(device)
    t_end = time.perf_counter()
    ops = None
    if profiler is not None:
        profiler.stop()
        ops = _op_times(profiler, device)
    if peak is None:
        peak = _peak_memory(device)
    steps_per_s = 1.0 / statistics.median(step_times) if step_times else None
    if spec.dump_at is not None and spec.dump_path is not None:
        dump_state(setup.model, setup.optimizer, str(resolve(spec_file, spec.dump_path)))
    if spec.final_dump_path is not None and (spec.dump_at is None or pos.step == spec.steps):
        dump_state(setup.model, setup.optimizer, str(resolve(spec_file, spec.final_dump_path)))
    digest, per_tensor = final_hash(setup.model, setup.optimizer)
    attestations["end"] = _reattest(spec, strict, bookkeeping)
    loss_values = torch.stack(losses).cpu().tolist() if losses else []
    train_s = t_end - t_setup
    timed_s = ((t_timed_end or t_end) - timed_from) if timed_from is not None else train_s
    if turns is not None:
        timed_s = sum(step_times)  # the time it held the turn, not the time it waited for it
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
        "attestations": attestations,
        "controls": {"events": watch.events, "switched_off": watch.switched_off()} if strict else None,
        "replayed": pos.replayed,
        "loader": loader.describe(setup.loader),
        "environment": envinfo.environment(seed=spec.seed, device=spec.device, project_commit=spec.project_commit),
        "packages": envinfo.packages() if spec.role in ("A", "golden") else None,
        "config": setup.config,
        "batch_size": setup.batch_size,
        "initial_fingerprint": initial,
        "batch_checksum": BATCH_CHECKSUM,
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
        "step_times_s": step_times,
        "data_times_s": data_times,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * setup.batch_size if steps_per_s and setup.batch_size else None,
        "peak_memory_bytes": peak[0],
        "peak_memory_kind": peak[1],
        "profiled_steps": max(profile_steps - 1, 0),
        "cpus": turns.cpus if turns is not None else None,
        "steady_allocator": steady_allocator,
        "ops": ops,
    }
