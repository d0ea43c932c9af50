"""What the stages' runs start from, shared by every stage that runs a model: its strict run as
the options shape it (``base_spec``), whether a run was compiled, a divergence's magnitude
measured by probe re-runs up to its step (``measure``), and the sentence for a loader whose
epochs repeat their order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import verdicts
from ..errors import WorkerFailed
from ..golden import ops
from ..golden.divergence import Divergence, step_rows, tensor_magnitude
from ..results import Image
from ..runner import RunContext, run_worker
from ..settings.models import ModelRef
from ..settings.options import RunOptions
from ..worker.process.spec import WorkerSpec
from ..worker.run_record import RunRecord


def base_spec(options: RunOptions, model: ModelRef, role: str, *, project_commit: str | None,
              image: Image) -> WorkerSpec:
    """A model's strict run as the options shape it: N steps from scratch, as the role ``role``."""
    return WorkerSpec(
        model_ref=model.ref, model_name=model.name, role=role, steps=options.steps, seed=options.seed,
        profile=options.profile, device=options.device, threads=options.threads, mode="strict",
        output=f"record-{role}.json", project_commit=project_commit, image=image, world_size=options.world_size,
        cpu_isa=options.cpu_isa, compile=options.compile_spec(model.name), amp=options.amp,
    )


def compiled(record: RunRecord) -> bool:
    """Whether a run was compiled (by ``--compile`` or by the plugin)."""
    return bool(record.execution and record.execution["compile"])


def probe(ctx: RunContext, spec: WorkerSpec, step: int) -> tuple[Path, Path, RunRecord]:
    """Re-run up to ``step``, recording that step's ops and dumping the state after it."""
    probe = dataclasses.replace(spec, role=f"probe-{spec.role}", output=f"record-probe-{spec.role}.json",
                                checkpoint_at=None, checkpoint_path=None, final_dump_path=None, dump_at=step,
                                dump_path=f"dump-{spec.role}-{step}.pt", ops_path=f"ops-{spec.role}-{step}.pt")
    record = run_worker(ctx, probe)
    work = ctx.run_dir / spec.model_name
    return work / f"dump-{spec.role}-{step}.pt", work / f"ops-{spec.role}-{step}.pt", record


def measure(ctx: RunContext, div: Divergence, specs: dict[str, WorkerSpec], x: str, y: str,
            records: dict[str, RunRecord]) -> None:
    """Fill in the divergence's magnitude from probe re-runs of X and Y up to its step."""
    if div.step is None or div.tensor is None:
        return
    import torch

    try:
        dump_x, ops_x, rec_x = probe(ctx, specs[x], div.step)
        dump_y, ops_y, rec_y = probe(ctx, specs[y], div.step)
    except WorkerFailed as e:
        div.magnitude_source = f"unavailable: {e}"
        return
    tx = torch.load(dump_x, map_location="cpu", weights_only=True)
    ty = torch.load(dump_y, map_location="cpu", weights_only=True)
    name = div.tensor
    faithful = (step_rows(rec_x).get(div.step) == step_rows(records[x]).get(div.step)
                and step_rows(rec_y).get(div.step) == step_rows(records[y]).get(div.step))
    m = tensor_magnitude(tx[name], ty[name]) if name in tx and name in ty else None
    if m is not None and (faithful or m["max_abs"]):  # never a zero from replays that did not differ there
        div.max_abs, div.max_ulp, div.elements_differing = m["max_abs"], m["max_ulp"], m["elements_differing"]
    div.magnitude_source = "probe" if faithful else verdicts.UNREPRODUCED + (
        " (compiled kernels vary from run to run)" if compiled(records[x]) else " (the runs vary from one to the next)")
    if ops_x.is_file() and ops_y.is_file():
        div.op = ops.first_op_difference(ops.load(ops_x), ops.load(ops_y))
        if div.op is not None and compiled(records[x]):
            div.op["compiled"] = True  # the recorder sees aten ops, not the code inductor generated
    for p in (dump_x, dump_y, ops_x, ops_y):
        p.unlink(missing_ok=True)


def repeated(epoch: int, compared: str) -> str:
    """The one sentence for a shuffling loader whose epoch ``epoch + 1`` repeats epoch ``epoch``'s
    order, said by the determinism stage (batch checksums) and the epoch-order probe (indices)."""
    return (f"epoch {epoch + 1} visits the samples in the same order as epoch {epoch} ({compared}): the shuffle is "
            "re-seeded each epoch, or the sampler's set_epoch is not called (the harness calls it on the loader, "
            "its sampler, batch sampler and dataset; a custom batch sampler must pass set_epoch on to the sampler "
            "it wraps)")
