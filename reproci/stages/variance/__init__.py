"""The variance stage: is a change inside seed noise?

Per model, K strict runs (``--seeds K``, default 5) on the same image with seeds
``--seed`` + 0 … K−1, each a fresh process through the same backend as every other run.
Each run records its final training loss and, when the plugin offers an ``eval_fn``, its
held-out metrics. The stage keeps per metric the per-seed values, their mean and sample
standard deviation; ``reproci compare`` and the golden comparison judge a difference of
means against that spread with Welch's interval (``reproci.stats``).
"""

from __future__ import annotations

import dataclasses
import json

from ... import stats, typed, verdicts
from ...document import Entry
from ...entry_sections import RunSummaryView
from ...errors import WorkerFailed
from ...results import Image, ModelEntry
from ...runner import RunContext, run_many
from ...settings.models import ModelRef
from ...settings.options import RunOptions
from ...typed import Error
from ...worker import run_record
from ...worker.process.spec import WorkerSpec
from ...worker.run_record import Launched, RunRecord
from ..base import StageRun
from ..model_entry import add_result
from ..runs import base_spec
from .options import VarianceOptions
from .result import AgainstGolden, Comparison, MetricSpread, VarianceResult, VarianceSummary

FINAL_LOSS = "final_loss"  # the last step's training loss


def plan(options: RunOptions, model: ModelRef, *, project_commit: str | None, image: Image) -> list[WorkerSpec]:
    """One strict run per seed, with the held-out evaluation at its end (no per-step checksums:
    this stage compares metrics, not bits)."""
    base = base_spec(options, model, "variance", project_commit=project_commit, image=image)
    return [dataclasses.replace(base, role=f"variance-seed{s}", output=f"record-variance-seed{s}.json", seed=s,
                                fingerprints=False, evaluate=True)
            for s in range(options.seed, options.seed + options.of(VarianceOptions).seeds)]


def summarize(specs: list[WorkerSpec], records: list[RunRecord]) -> dict[str, MetricSpread]:
    """Metric -> per-seed values, mean, std and direction: the final loss, then eval_fn's metrics."""
    per_metric: dict[str, list[float]] = {FINAL_LOSS: [float(r.losses[-1]) if r.losses else float("nan")
                                                       for r in records]}
    for rec in records:
        for name, value in (rec.eval or {}).items():
            per_metric.setdefault(name, []).append(float(value))
    return {name: MetricSpread(**stats.describe(values), lower_is_better=stats.lower_is_better(name))
            for name, values in per_metric.items() if len(values) == len(specs)}


def run_all(run: StageRun, entries: list[ModelEntry]) -> None:
    """The variance stage for every model, attached to its entry. With ``--jobs`` ≥ 2 the seed
    runs of every model share the slots. When the determinism stage ran, its run A (the first
    seed, with the evaluation at its end) is the first seed's run here, not trained again.
    The run's old golden gives the variance each model is judged against."""
    options, ctx, old_golden = run.options, run.ctx, run.old_golden
    plans = [plan(options, m, project_commit=run.project_commit, image=run.image) for m in options.models]
    reused = [reusable_run(options, ctx, entry) for entry in entries]
    pending = [specs[1:] if done else specs for specs, done in zip(plans, reused)]
    fresh = iter(run_many(ctx, [s for specs in pending for s in specs], options.jobs))
    for model, entry, specs, done, todo in zip(options.models, entries, plans, reused, pending):
        outcomes = ([done] if done else []) + [next(fresh) for _ in todo]
        result = _model_result(options, model, specs, outcomes)
        if done:
            result = typed.replace(result, records=[entry["records"]["A"], *result.records[1:]])
        golden = (old_golden.models.get(model.name) if old_golden is not None else None)
        if golden is not None and (kept := golden.entry.get("variance")) and result.metrics:
            result = typed.replace(result, against_golden=against(VarianceSummary.from_json(kept), result, model.name,
                                                                  run_id=golden.entry.get("run_id")))
        attach(entry, result, options.stages, options.catalog.checker)


def reusable_run(options: RunOptions, ctx: RunContext, entry: ModelEntry) -> RunRecord | None:
    """The determinism stage's run A of this model (the first seed, evaluated at its end: see
    ``determinism.plan``) when it ran without a test fault."""
    read = Entry.of(entry)
    path = read.records.get("A")
    if options.catalog.checker not in options.stages or options.fault or not path:
        return None
    try:
        record = run_record.read(ctx.run_dir / path)
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, RunRecord) or record.eval is None:
        return None
    summary = read.runs.get("A") or RunSummaryView()
    return dataclasses.replace(record, launched=Launched(wall_s=summary.wall_s or 0.0, start_wait_s=0.0,
                                                         how=summary.launch, at=0.0))


def _model_result(options: RunOptions, model: ModelRef, specs: list[WorkerSpec],
                  results: list[RunRecord | WorkerFailed]) -> VarianceResult:
    """The stage's result for one model; ``seconds`` adds up its runs' wall times (they may overlap)."""
    seconds = round(sum(r.launched.wall_s for r in results if isinstance(r, RunRecord) and r.launched), 3)
    failed = next((r for r in results if isinstance(r, WorkerFailed)), None)
    out = VarianceResult(k=len(specs), seeds=[s.seed for s in specs], steps=options.steps, seconds=seconds,
                         records=[f"{model.name}/{s.output}" for s in specs])
    if failed is not None:
        return typed.replace(out, error=Error(kind=failed.kind, message=str(failed)))
    records = [r for r in results if isinstance(r, RunRecord)]  # every one: none failed
    return typed.replace(out, metrics=summarize(specs, records), final_sha256=[r.final_sha256 for r in records])


def against(golden: VarianceSummary, current: VarianceSummary, model: str, *,
            run_id: str | None = None) -> AgainstGolden:
    """This run's variance judged against the golden's, metric by metric (B = this run)."""
    if min(golden.k, current.k) < stats.MIN_SEEDS:
        return AgainstGolden(golden_run_id=run_id, golden_k=golden.k, k=current.k,
                             skipped=(f"not compared: {golden.k} seed(s) in the golden, {current.k} in this run; "
                                      f"at least {stats.MIN_SEEDS} on each side (--seeds)"))
    then = {metric: golden.metrics[metric].values for metric in current.metrics
            if metric in golden.metrics and golden.metrics[metric].values}
    judged = [stats.judge(model, metric, values, current.metrics[metric].values) for metric, values in then.items()]
    return AgainstGolden(golden_run_id=run_id, golden_k=golden.k, k=current.k,
                         comparisons=[Comparison(**j.to_dict()) for j in judged], golden_values=then)


def attach(entry: ModelEntry, result: VarianceResult, stages: tuple[str, ...] = (), checker: str | None = None) -> None:
    """Put a variance result on a model entry; a failed seed run makes the entry an ERROR
    (``checker``: the stage that checks reproducibility, which did not run unless ``stages`` has it)."""
    if Entry.of(entry).verdict == verdicts.NOT_CHECKED and checker not in stages:
        entry["message"] = f"{checker} not checked (stages: {', '.join(stages)})"
    add_result(entry, "variance", result.to_json())
