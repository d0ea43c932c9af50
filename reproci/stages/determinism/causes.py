"""Causes the harness can name from what the runs recorded, beyond where they differ: a
loader's persistent workers, an RNG of the data pipeline the checkpoint does not hold, DDP's
bucket rebuild at three ranks or more."""

from __future__ import annotations

from ... import verdicts
from ...golden.divergence import Divergence
from ...worker.run_record import RunRecord


def known_cause(verdict: str, ev: Divergence | None, record_a: RunRecord) -> str | None:
    """A cause the harness can name from what the run recorded, beyond where it differs."""
    loader = record_a.loader or {}
    if verdict == verdicts.NONDETERMINISTIC and record_a.script is not None:
        return ("run B drew its seeds from --seed + 1, run A from --seed (the hash seed the same): what the script "
                "draws from an RNG it has not seeded itself differs between them, as it does between two launches "
                "without reproci; seed it in the script")
    if verdict == verdicts.RESUME_BROKEN and ev is not None and ev.cause == "compute":
        return ddp_rebuild(ev, record_a)
    if verdict != verdicts.RESUME_BROKEN or ev is None or ev.cause != "data":
        return None
    if loader.get("persistent_workers") and loader.get("num_workers", 0) > 0:
        return ("the DataLoader keeps persistent worker processes, whose RNG carries across epochs and cannot be "
                "checkpointed: set persistent_workers=False")
    unsaved = [f"{path} ({info['type']})" for path, info in (loader.get("rngs") or {}).items()
               if not info.get("snapshotted")]
    if unsaved:
        held = "unless get_extra_state holds it" if record_a.extra_state_sha256 else "which the checkpoint does not hold"
        return (f"the data pipeline draws from {', '.join(unsaved)}, {held} (a checkpoint holds the loader's "
                "generator and a torch sampler's generator=, not an RNG of the plugin's own sampler, dataset or "
                "collate function): return its state "
                "from get_extra_state and put it back in set_extra_state")
    return None


def ddp_rebuild(ev: Divergence, record_a: RunRecord) -> str | None:
    """The resumed run's first step differs in an all-reduce, at 3 ranks or more, under a DDP
    that rebuilds its buckets: torch's DDP, not the model (``worker.distributed.wrap``)."""
    dist = record_a.distributed
    op = (ev.op or {}).get("op") or ""
    if dist is None or dist["world_size"] < 3 or "allreduce" not in op or dist["ddp"].get("find_unused_parameters"):
        return None
    return ("the first resumed step differs in an all-reduce: a fresh DDP reduces its first step with one bucket "
            "in registration order, where run A, past its first step, used buckets rebuilt in backward order, and "
            f"at {dist['world_size']} ranks a ring all-reduce sums each element in an order set by its place in the "
            "bucket; this is torch's DDP, not the model: with find_unused_parameters=True (TrainSetup.ddp_options) "
            "DDP keeps one bucket layout, as the harness's own DDP does from 3 ranks on")
