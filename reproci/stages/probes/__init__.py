"""The portability probes (``--stage probes``): what a run depends on that one machine
never shows. A baseline run and a perturbed copy per factor (hash seed, directory listing
order, DataLoader worker count, intra-op threads), each compared step by step with the
baseline; a differing pair is replayed to its first differing step with op recording, as
in the determinism stage. One more run inspects the loader and model before training:
whether consecutive epochs visit the samples in the same order, and whether a sample's
output depends on the batch around it.

Each probe says "depends on X" or "does not depend on X" and is a row of its own in every
report; a dependency fails the run only with ``--probes-fail``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ... import typed, verdicts
from ...document import Document
from ...errors import WorkerFailed
from ...golden.divergence import first_divergence
from ...results import Image, ResultsDocument
from ...runner import RunContext, run_many
from ...settings.models import ModelRef
from ...settings.options import RunOptions
from ...worker.process.spec import WorkerSpec, other_worker_count
from ...worker.run_record import RunRecord
from ..base import StageRun
from ..runs import base_spec, measure, repeated

if TYPE_CHECKING:  # what the worker's inspection run writes (inspect.json); that module imports torch
    from ...worker.inspection import BatchInvariance, EpochOrder, Inspection
from .result import ProbeRow, ProbesResult, of

DEPENDS, INDEPENDENT, NOT_APPLICABLE, FAILED = "depends", "independent", "not applicable", "error"
# probe -> (the factor, how a spec is perturbed)
PERTURBED: dict[str, tuple[str, Callable[[WorkerSpec], WorkerSpec]]] = {
    "hash-seed": ("PYTHONHASHSEED", lambda s: dataclasses.replace(s, hash_seed=s.seed + 1)),
    "listing-order": ("directory listing order", lambda s: dataclasses.replace(s, reverse_listing=True)),
    "num-workers": ("DataLoader num_workers", lambda s: dataclasses.replace(s, num_workers=-1)),
    "threads": ("intra-op threads", lambda s: dataclasses.replace(s, threads=s.threads + 1)),
}
INSPECTED = {"epoch-order": "a new sample order each epoch", "batch-size": "the batch size at inference"}
PROBES = (*PERTURBED, *INSPECTED)


@dataclass(frozen=True, kw_only=True)
class Workers:
    """The loader rebuilt with another worker count (``worker.perturb.with_workers``)."""

    applicable: bool = False
    why: str = "the loader cannot be rebuilt"  # where it does not apply
    num_workers: list[int] | None = None  # before, after


@dataclass(frozen=True, kw_only=True)
class Listings:
    listings: int | None = None  # directory listings the run made, each reversed


@dataclass(frozen=True, kw_only=True)
class Perturbed:
    """What a probe's run changed (its record's ``perturbed``)."""

    listings: Listings | None = None
    workers: Workers | None = None

    @classmethod
    def of(cls, record: RunRecord) -> Perturbed:
        return typed.load(cls, record.perturbed or {}, lenient=True)



def plan(options: RunOptions, model: ModelRef, *, project_commit: str | None, image: Image) -> dict[str, WorkerSpec]:
    base = dataclasses.replace(base_spec(options, model, "P-base", project_commit=project_commit, image=image),
                               output="record-P-base.json", world_size=1)  # one process: one factor at a time
    specs = {"base": base}
    for name, (_, change) in PERTURBED.items():
        specs[name] = dataclasses.replace(change(base), role=f"P-{name}", output=f"record-P-{name}.json")
    specs["inspect"] = dataclasses.replace(base, role="P-inspect", output="record-P-inspect.json", steps=1,
                                           fingerprints=False, inspect_path="inspect.json")
    return specs


def run_model(run: StageRun, model: ModelRef) -> ProbesResult:
    """Every probe of one model: a row per probe, and how many found a dependency."""
    options, ctx = run.options, run.ctx
    t0 = time.monotonic()
    specs = plan(options, model, project_commit=run.project_commit, image=run.image)
    records, errors = _run_all(options, ctx, specs)
    rows = [_perturbed_row(ctx, name, specs, records, errors) for name in PERTURBED]
    rows += _inspected_rows(ctx, model, errors.get("inspect"))
    return ProbesResult(rows=rows, depends=[r.probe for r in rows if r.status == DEPENDS],
                        seconds=round(time.monotonic() - t0, 3))


def _run_all(options: RunOptions, ctx: RunContext,
             specs: dict[str, WorkerSpec]) -> tuple[dict[str, RunRecord], dict[str, str]]:
    """Every run of the plan (at most ``--jobs`` at once): records by role, and the error of each failed run."""
    records: dict[str, RunRecord] = {}
    errors: dict[str, str] = {}
    for role, outcome in zip(specs, run_many(ctx, list(specs.values()), options.jobs)):
        if isinstance(outcome, WorkerFailed):
            errors[role] = str(outcome)
        else:
            records[role] = outcome
    return records, errors


def _change(name: str, base: RunRecord, base_spec: WorkerSpec, spec: WorkerSpec) -> str:
    if name == "hash-seed":
        return f"{base_spec.seed} → {spec.hash_seed}"
    if name == "threads":
        return f"{base_spec.threads} → {spec.threads}"
    if name == "num-workers":
        before = (base.loader or {}).get("num_workers", 0)
        return f"{before} → {other_worker_count(before)}"
    return "filesystem order → reversed"


def _perturbed_row(ctx: RunContext, name: str, specs: dict[str, WorkerSpec], records: dict[str, RunRecord],
                   errors: dict[str, str]) -> ProbeRow:
    factor = PERTURBED[name][0]
    failed = errors.get("base") or errors.get(name)
    if failed:
        return ProbeRow(probe=name, factor=factor, status=FAILED, message=f"could not run: {failed}")
    base, probe = records["base"], records[name]
    change = _change(name, base, specs["base"], specs[name])
    perturbed = Perturbed.of(probe)
    workers = perturbed.workers or Workers()
    if name == "num-workers" and not workers.applicable:
        why = workers.why
        return ProbeRow(probe=name, factor=factor, status=NOT_APPLICABLE, message=f"not applicable: {why}")
    div = first_divergence(base, probe)
    if div is None:
        listed = perturbed.listings.listings if perturbed.listings else None
        note = ("" if name != "listing-order" or listed is None else
                " (the run lists no directory)" if listed == 0 else f" ({listed} directory listings, reversed)")
        return ProbeRow(probe=name, factor=factor, change=change, status=INDEPENDENT,
                        message=f"does not depend on {factor}{note}")
    if div.cause == "compute":  # on other batches every op differs: only a same-batch difference has a first op
        measure(ctx, div, {"base": specs["base"], name: specs[name]}, "base", name, {"base": base, name: probe})
    d = div.to_dict()
    mag = verdicts.magnitude_text(d)
    cause = verdicts.cause_text(d)
    op = f"; first differing op: {verdicts.op_text(div.op)}" if div.op else ""
    detail = ", ".join(p for p in (mag, cause) if p)
    return ProbeRow(probe=name, factor=factor, change=change, evidence=d, status=DEPENDS,
                    message=f"depends on {factor} ({change}): {verdicts.where_text(d)}{', ' + detail if detail else ''}{op}")


def _inspected_rows(ctx: RunContext, model: ModelRef, failed: str | None) -> list[ProbeRow]:
    """The epoch-order and batch-size rows, from the inspection run's inspect.json."""
    if failed:
        return [_inspected(name, FAILED, f"could not run: {failed}") for name in INSPECTED]
    data: Inspection = json.loads((ctx.run_dir / model.name / "inspect.json").read_text())
    order, batch = data["epoch_order"], data["batch"]
    if order["same"] and order["sequential"]:
        epoch = _inspected("epoch-order", NOT_APPLICABLE, "the loader does not shuffle: every epoch is in index order")
    elif order["same"]:
        epoch = _inspected("epoch-order", DEPENDS, repeated(1, f"first {order['batches']} batches of sample indices compared"),
                           evidence=order)
    else:
        epoch = _inspected("epoch-order", INDEPENDENT, "each epoch visits the samples in a new order")
    if not batch["applicable"]:
        sized = _inspected("batch-size", NOT_APPLICABLE, f"not applicable: {batch['why']}")
    elif batch["differs_at"]:
        sizes = ", ".join(str(n) for n in batch["differs_at"])
        sized = _inspected("batch-size", DEPENDS, (
            f"depends on the batch size: sample 0's output alone differs from the same sample in a batch of "
            f"{sizes} (max |Δ| {batch['max_abs']:.3g}); batch-invariant kernels are needed for per-sample equality"),
            evidence=batch)
    else:
        sized = _inspected("batch-size", INDEPENDENT, f"sample 0's output is the same alone and in batches of "
                                                      f"{', '.join(str(n) for n in batch['sizes'][1:])}")
    return [epoch, sized]


def _inspected(name: str, status: str, message: str, evidence: EpochOrder | BatchInvariance | None = None) -> ProbeRow:
    return ProbeRow(probe=name, factor=INSPECTED[name], evidence=evidence, status=status, message=message)


def probed(document: ResultsDocument) -> list[tuple[str, ProbesResult]]:
    """Each probed model's name and probes, in the document's order."""
    return [(m["model"], probes) for m in document.get("models") or [] if (probes := of(m)) is not None]


def rows(document: ResultsDocument) -> list[tuple[str, ProbeRow]]:
    """Every probe row of every model, with its model's name, for the reports."""
    return [(model, r) for model, probes in probed(document) for r in probes.rows]


def probes_fail(document: ResultsDocument) -> bool:
    """Whether the run was asked to fail on a dependency (--probes-fail, as the document records it)."""
    return Document.of(document).options.probes_fail


def fails(document: ResultsDocument) -> bool:
    """Whether the probes fail the run: a dependency found, with --probes-fail."""
    return probes_fail(document) and any(p.depends for _, p in probed(document))
