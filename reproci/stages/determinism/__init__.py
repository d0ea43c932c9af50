"""The strict-determinism stage (this package holds its helpers: the golden's per-op hashes and
the re-run that confirms a drift's cause, the comparisons beyond the tensors, the evidence).

Per model, three fresh processes: A, N steps from scratch, writing a full checkpoint as it passes
step k; B, N steps from scratch; C, A's checkpoint at k loaded, on to N (a script model's runs
are its own commands': ``scripts``). A != B is NONDETERMINISTIC, A == B != C is RESUME_BROKEN,
else PASS. On a mismatch, two probe runs replay the disagreeing runs up to the first differing
step and dump every tensor there, so the evidence carries the first differing tensor's max-abs
and ULP distance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from ... import verdicts
from ...entry_sections import RunSummary
from ...errors import WorkerFailed
from ...golden.divergence import Divergence, first_divergence
from ...results import Coverage, Image, ModelEntry
from ...runner import RunContext, background, run_worker, settle
from ...settings.models import ModelRef
from ...settings.options import RunOptions
from ...worker.process.spec import WorkerSpec
from ...worker.run_record import RunRecord
from .. import model_entry
from ..base import StageRun
from ..runs import base_spec, compiled, measure
from . import beyond_tensors, causes, census, coverage, epochs, replicas, scripts
from .explain import comparison_evidence, controls_sentence, controls_switched_off, describe


def identity_config(config: Any) -> Any:
    """``config`` without the keys a library stamps into it (any ``*_version``, ``_commit_hash``,
    ``__version__``), at any depth: an upgrade is the package versions' to tell, not a model change."""
    if isinstance(config, dict):
        return {k: identity_config(v) for k, v in config.items() if not _stamped(str(k))}
    if isinstance(config, (list, tuple)):
        return [identity_config(v) for v in config]
    return config


def _stamped(key: str) -> bool:
    return key.endswith("_version") or key in ("_commit_hash", "__version__")


def config_sha256(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity_config(config), sort_keys=True, default=str).encode()).hexdigest()


def plan(options: RunOptions, model: ModelRef, *, project_commit: str | None, image: Image) -> dict[str, WorkerSpec]:
    k = options.resume_at
    base = base_spec(options, model, "A", project_commit=project_commit, image=image)
    if model.script is not None:
        return scripts.plan(base, model, k)
    fault = options.fault
    # Every run is evaluated at its end (eval_fn, when the plugin has one): held-out metrics
    # are compared like the state (stages/beyond_tensors.py); A's are also the variance stage's first seed.
    base = dataclasses.replace(base, evaluate=True)
    # A may move k past the loader's first epoch (resume_at_auto): its checkpoint is then named by
    # the run, not by a k it may not keep, so no line names ckpt-15.pt for a checkpoint at step 24
    checkpoint = "ckpt-A.pt" if options.resume_at_auto else f"ckpt-{k}.pt"
    a = dataclasses.replace(base, checkpoint_at=k, checkpoint_path=checkpoint, final_dump_path="final-A.pt",
                            checkpoint_after_epoch=options.resume_at_auto,
                            fault=fault if fault == "clock-seed" else None)
    b = dataclasses.replace(base, role="B", output="record-B.json",
                            fault=fault if fault in ("clock-seed", "buffer-drift") else None)
    # C, when compiled, reuses A's caches: W proves warm = cold first (``_decide``), and C compiles in seconds
    c = dataclasses.replace(base, role="C", output="record-C.json", resume_from=checkpoint,
                            compile_cache="inductor-cache-A",
                            fault=fault if fault in ("clock-seed", "resume-skip-loader-position", "resume-drop-rng") else None)
    return {"A": a, "B": b, "C": c}


def warm_spec(specs: dict[str, WorkerSpec]) -> WorkerSpec:
    """Run W: run A again with A's inductor caches, now warm; it must equal A (cold) bit for bit."""
    return dataclasses.replace(specs["A"], role="W", output="record-W.json", checkpoint_at=None, checkpoint_path=None,
                               checkpoint_after_epoch=False, final_dump_path=None, compile_cache="inductor-cache-A",
                               fault=None)


def _run_summary(record: RunRecord) -> RunSummary:
    t, launched = record.timings, record.launched
    return {
        "final_sha256": record.final_sha256,
        "start_step": record.start_step,
        "end_step": record.end_step,
        "wall_s": round(launched.wall_s if launched else 0.0, 3),  # the run's process, start to end
        "start_wait_s": round(launched.start_wait_s if launched else 0.0, 3),  # its server's or container's start
        "setup_s": round(t.setup_s, 3),
        "train_s": round(t.train_s, 3),
        "attested": bool(record.attestation.get("ok")),
        "launch": launched.how if launched else None,  # forked from a server, fresh (and why), or a container
        "losses_last": record.losses[-1] if record.losses else None,
    }


def run_model(run: StageRun, model: ModelRef) -> ModelEntry:
    """Run A, B and C for one model and decide its verdict."""
    options, ctx = run.options, run.ctx
    t0 = time.monotonic()
    specs = plan(options, model, project_commit=run.project_commit, image=run.image)
    records: dict[str, RunRecord] = {}
    result = model_entry.new(options, model)
    try:
        _run_all(options, ctx, specs, records)
        ranks = replicas.load(ctx.run_dir / model.name, tuple(records), options.world_size)
        scripts.check_resumed(model, records, options.resume_at)
    except WorkerFailed as e:
        result.update({"verdict": verdicts.ERROR, "message": str(e), "error": {"kind": e.kind, "message": str(e)},
                       "runs": {r: _run_summary(rec) for r, rec in records.items()}, "seconds": time.monotonic() - t0,
                       "final_sha256": records["A"].final_sha256 if "A" in records else None, "evidence": None,
                       "records": {r: f"{model.name}/record-{r}.json" for r in records}})
        return result

    verdict, pair, evidence = _decide(records)
    rank = None
    if verdict == verdicts.PASS and ranks:
        verdict, pair, evidence, rank = replicas.decide(records, ranks, _decide)
    private = census.differences(records["A"], records["C"])
    verdict, pair, evidence = census.decide(verdict, pair, evidence, private)
    if evidence is not None and pair is not None and evidence.cause not in ("restore", "census") and rank is None:
        measure(ctx, evidence, specs, pair[0], pair[1], records)
    hint = census.hint(verdict, pair, evidence, private) or causes.known_cause(verdict, evidence, records["A"])
    order = epochs.repeated_order(records["A"])
    shared = replicas.shared_batches(records["A"], ranks)
    covered = coverage.of(records["A"], options)
    private_notice = census.notice(private) if verdict == verdicts.PASS else None
    metric_warning = census.metrics(private) if verdict == verdicts.PASS else None
    warnings = [w for w in (order, shared, metric_warning) if w]
    switched = controls_switched_off(records)
    if switched and verdict == verdicts.PASS:  # agreed, but not under strict determinism: no guarantee elsewhere
        verdict = verdicts.NONDETERMINISTIC
    a = records["A"]
    result.update({
        "verdict": verdict,
        "message": (replicas.describe(verdict, evidence, pair, rank, ranks[rank][pair[0]]) if rank is not None and pair
                    else census.describe(private) + (f"; {controls_sentence(switched)}" if switched else "")
                    if evidence is not None and evidence.cause == "census"
                    else describe(verdict, evidence, pair, switched))
                   + _notes(hint, warnings, covered, records, pair, private_notice),
        "state_census": census.summary(records, private, private_notice, metric_warning),
        "epoch_order": order,
        "shared_batches": shared,
        "coverage": covered,
        "resume_at": covered.get("resume_at", options.resume_at),
        "final_sha256": a.final_sha256,
        "config": a.config,
        "config_sha256": config_sha256(a.config),
        "execution": a.execution,  # compiled, autocast: part of the identity a golden is compared by
        "batch_size": a.batch_size,
        "attestation": a.attestation,
        "runs": {r: _run_summary(rec) for r, rec in records.items()},
        "evidence": comparison_evidence(evidence, pair, switched, hint, rank),
        "error": None,
        "records": {r: f"{model.name}/record-{r}.json" for r in records},
        "seconds": round(time.monotonic() - own_start(records, t0), 3),
    })
    _clean(options, ctx.run_dir / model.name)
    return result


def _clean(options: RunOptions, work: Path) -> None:
    """The checkpoints (unless kept) and the compiled code of a model's runs, rebuilt by any re-run."""
    if not options.keep_checkpoints:
        for p in work.glob("ckpt-*.pt"):
            p.unlink(missing_ok=True)
        scripts.remove_outputs(work)
    for cache in work.glob("inductor-cache-*"):
        shutil.rmtree(cache, ignore_errors=True)


def _notes(hint: str | None, warnings: list[str], covered: Coverage, records: dict[str, RunRecord],
           pair: tuple[str, str] | None, notice: str | None = None) -> str:
    """What the verdict's sentence is followed by: a known cause, warnings (which never change the
    verdict), what the run did not cover, and that warm caches were checked (compiled runs)."""
    return ((f"; {hint}" if hint else "") + "".join(f"; warning: {w}" for w in warnings)
            + (f"; note: {covered['note']}" if covered.get("note") else "")
            + ("; compiled: W, on A's warm inductor caches, = A, compiled cold" if "W" in records
               and pair != ("A", "W") else "") + (f"; notice: {notice}" if notice else ""))


# A and B start at least this long apart (a forked A can end within a second), so a seed drawn
# from the wall clock, to the second or finer, differs between them: such a model is
# NONDETERMINISTIC whatever --jobs is, never a resume bug or a PASS by luck.
STAGGER_S = 1.5


def _run_all(options: RunOptions, ctx: RunContext, specs: dict[str, WorkerSpec],
             records: dict[str, RunRecord]) -> None:
    """Runs A, B and C into ``records``: in turn at one job; with ``--jobs`` ≥ 2, A first, B
    beside it ``STAGGER_S`` after A started, and C once A is done (a failure waits for the runs
    in flight). A compiled A is followed by W, A again on A's warm caches (``warm_spec``).

    A leads because C waits for A's checkpoint: the stagger is then spent while A trains, off
    the path to the last record (A, then C), where B's turn ahead of A would have put it."""
    if options.jobs < 2:
        records["A"] = run_worker(ctx, specs["A"])
        time.sleep(max(0.0, STAGGER_S - (time.monotonic() - records["A"].launched_at())))
        for role in ("B", "C"):
            records[role] = run_worker(ctx, specs[role])
        if compiled(records["A"]):
            specs["W"] = warm_spec(specs)
            records["W"] = run_worker(ctx, specs["W"])
        return
    launched: list[float] = []
    fa = background(run_worker, ctx, specs["A"], on_launch=lambda: launched.append(time.monotonic()))
    while not launched and not fa.done():
        time.sleep(0.05)  # A waits for a job slot (and any fork server or container it needs)
    fb = None
    try:
        if not launched:  # A ended without saying it started: its failure, or its own start time
            records["A"] = fa.result()
            launched.append(records["A"].launched_at())
        time.sleep(max(0.0, STAGGER_S - (time.monotonic() - launched[0])))
        fb = background(run_worker, ctx, specs["B"])
        records["A"] = fa.result()
    except Exception:
        settle(*[f for f in (fa, fb) if f is not None])
        raise
    fc = background(run_worker, ctx, specs["C"])
    if compiled(records["A"]):
        specs["W"] = warm_spec(specs)
    later = [fc, *([background(run_worker, ctx, specs["W"])] if "W" in specs else [])]
    try:
        records["B"] = fb.result()
    except Exception:
        settle(*later)
        raise
    for role, future in zip(("C", "W"), later):
        try:
            records[role] = future.result()
        except Exception:
            settle(*later)
            raise


def own_start(records: dict[str, RunRecord], t0: float) -> float:
    """When the model's first run started: its seconds are its own, not the wait for a job
    slot that other models' runs held (``--jobs``)."""
    return min((r.launched.at for r in records.values() if r.launched is not None), default=t0)


def _decide(records: dict[str, RunRecord]) -> tuple[str, tuple[str, str] | None, Divergence | None]:
    """A ≠ B is NONDETERMINISTIC, and so is A ≠ W (compiled: warm caches ≠ cold); A = B (= W) ≠ C
    is RESUME_BROKEN; else PASS."""
    ab = first_divergence(records["A"], records["B"]) or beyond_tensors.divergence(records["A"], records["B"])
    if ab is not None:
        return verdicts.NONDETERMINISTIC, ("A", "B"), ab
    if "W" in records:  # a compiled run on warm caches against the same run compiled cold
        aw = first_divergence(records["A"], records["W"]) or beyond_tensors.divergence(records["A"], records["W"])
        if aw is not None:
            return verdicts.NONDETERMINISTIC, ("A", "W"), aw
    ac = first_divergence(records["A"], records["C"]) or beyond_tensors.divergence(records["A"], records["C"])
    if ac is not None:
        return verdicts.RESUME_BROKEN, ("A", "C"), ac
    return verdicts.PASS, None, None
