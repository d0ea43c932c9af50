"""The strict stage above one rank (``--world-size N``): every rank checked like rank 0,
and the ranks' replicas checked against each other.

Each rank r > 0 of a run writes its own record (``record-A.rank1.json``, ...; rank 0's is
the run's record, ``spec.rank_path``) and its own checkpoint. Per rank, A, B and C are
compared as rank 0's are (A ≠ B, A = B ≠ C). Then, within each run, every rank's per-step
fingerprints are compared with rank 0's: DistributedDataParallel keeps every replica's
parameters, gradients and optimizer state identical, so any difference is REPLICAS_DIVERGE,
named by run, rank, step and tensor. Buffers are compared where DDP leaves them to each rank
(``broadcast_buffers=False``); batches and losses never are: ranks train on different shards
of the data by design.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

from ... import verdicts
from ...errors import WorkerFailed
from ...golden.divergence import Divergence, first_divergence
from ...worker import run_record
from ...worker.process.spec import rank_path
from ...worker.run_record import FailedRun, RunRecord, Trajectory

Records = dict[str, RunRecord]
Decide = Callable[[Records], tuple[str, tuple[str, str] | None, Divergence | None]]  # determinism._decide


def load(work: Path, roles: tuple[str, ...], world_size: int) -> dict[int, Records]:
    """Rank -> role -> record, for ranks 1..N-1 (rank 0's records are the runs' own)."""
    out: dict[int, Records] = {}
    for rank in range(1, world_size):
        for role in roles:
            path = work / rank_path(f"record-{role}.json", rank)
            try:
                record = run_record.read(path)
            except (OSError, json.JSONDecodeError):
                raise WorkerFailed(f"run {role}: rank {rank} wrote no record ({path.name})") from None
            if isinstance(record, FailedRun):
                raise WorkerFailed(f"run {role}, rank {rank}: {record.message or 'failed'}",
                                   kind=record.error_kind or "crash")
            out.setdefault(rank, {})[role] = record
    return out


def _compared(record: RunRecord, *, buffers: bool) -> Trajectory:
    """The record's state rows, without batches and losses (each rank has its own shard) and,
    unless ``buffers``, without buffers."""
    names = list(record.tensor_names or [])
    keep = [i for i, n in enumerate(names) if buffers or not n.startswith("buffer:")]
    final = {n: h for n, h in record.tensor_sha256.items() if buffers or not n.startswith("buffer:")}
    init = record.initial_fingerprint
    if init:
        pairs = [(n, v) for n, v in zip(init["names"], init["row"]) if buffers or not n.startswith("buffer:")]
        init = {**init, "names": [n for n, _ in pairs], "row": [v for _, v in pairs]}
    return dataclasses.replace(Trajectory.of(record), batch_fingerprints=[], losses=[],
                               tensor_names=[names[i] for i in keep],
                               fingerprints=[[row[i] for i in keep] for row in record.fingerprints],
                               tensor_sha256=final, final_sha256=json.dumps(sorted(final.items())),
                               initial_fingerprint=init)


def replica_divergence(rank0: RunRecord, other: RunRecord) -> Divergence | None:
    """Where another rank's replica first leaves rank 0's within one run, or None.

    With DDP's default ``broadcast_buffers=True`` each forward starts from rank 0's buffers
    and then updates them from the rank's own batch: at a step's end the ranks' BatchNorm
    statistics differ by design, and only rank 0's are carried on. Buffers are compared only
    where the ranks keep their own (``broadcast_buffers=False``)."""
    ddp = rank0.distributed["ddp"] if rank0.distributed else {}
    buffers = ddp.get("broadcast_buffers") is False
    div = first_divergence(_compared(rank0, buffers=buffers), _compared(other, buffers=buffers))
    if div is not None:
        div.cause, div.losses_equal = "replicas", None
    return div


def decide(records: Records, ranks: dict[int, Records],
           decide_one: Decide) -> tuple[str, tuple[str, str] | None, Divergence | None, int | None]:
    """(verdict, compared runs, divergence, rank) once rank 0's runs agree: each rank's own
    A, B, C first, then every rank's replica against rank 0's in each run."""
    for rank, own in sorted(ranks.items()):
        verdict, pair, div = decide_one(own)
        if verdict != verdicts.PASS:
            return verdict, pair, div, rank
    for role, record in records.items():
        for rank, own in sorted(ranks.items()):
            div = replica_divergence(record, own[role])
            if div is not None:
                return verdicts.REPLICAS_DIVERGE, (role, role), div, rank
    return verdicts.PASS, None, None, None


def describe(verdict: str, div: Divergence | None, pair: tuple[str, str] | None, rank: int,
             record: RunRecord) -> str:
    """The message of a failure found on a rank other than 0 (``decide`` gave its divergence)."""
    assert div is not None and pair is not None
    d = div.to_dict()
    if verdict != verdicts.REPLICAS_DIVERGE:
        return f"{pair[0]} ≠ {pair[1]} on rank {rank} {verdicts.where_text(d)}"
    text = (f"rank {rank}'s replica ≠ rank 0's in run {pair[0]} {verdicts.where_text(d)} "
            f"({div.differing_tensors} tensors differ): DDP replicas must hold identical state")
    ddp = record.distributed["ddp"] if record.distributed else {}
    if div.kind == "buffer" and ddp.get("broadcast_buffers") is False:
        text += ("; DDP was built with broadcast_buffers=False, so each rank keeps its own buffers (BatchNorm "
                 "statistics of its shard): drop it, or convert BatchNorm with SyncBatchNorm.convert_sync_batchnorm")
    elif div.cause == "replicas" and div.step == 0:
        text += "; the ranks start from different states, which DDP did not broadcast"
    return text


def shared_batches(record_a: RunRecord, ranks: dict[int, Records]) -> str | None:
    """'ranks 0 and 1 train on the same batches ...' when another rank's batch checksums equal
    rank 0's at every step of run A: each rank sees all the data, not its shard."""
    mine = record_a.batch_fingerprints
    if not mine or not any(mine):
        return None
    same = [r for r, own in sorted(ranks.items()) if "A" in own and own["A"].batch_fingerprints == mine]
    if not same:
        return None
    who = ", ".join(str(r) for r in same)
    return (f"rank 0 and rank{'s' if len(same) > 1 else ''} {who} train on the same batches at every step: the "
            "loader gives every rank all the data, not its shard (no DistributedSampler); build it with "
            "**ctx.shuffling(dataset), or DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, "
            "seed=ctx.seed)")
