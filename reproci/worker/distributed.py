"""A worker run as one rank of a DistributedDataParallel job (stdlib + torch only).

``torchrun`` starts ``world_size`` copies of the worker on one node and tells each its
rank through the environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``). Each joins the process group (gloo on the CPU, NCCL on CUDA, one GPU
per rank), builds the plugin's model with its rank in ``ModelContext``, and the harness
wraps the model in DDP: the plugin returns the plain module (one it wrapped itself is used
as it is). Bucketing is fixed (``bucket_cap_mb``), so gradients are reduced in the same
groups in every run; the plugin may set DDP's options through ``TrainSetup.ddp_options``.
Each rank records its own run; the orchestrator compares ranks' per-step fingerprints.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from .contract import TrainSetup

BUCKET_CAP_MB = 25  # DDP's default, fixed and recorded: the bucket boundaries decide the reduction groups
TIMEOUT_S = 300  # a rank that waits longer on a collective fails instead of hanging the run
NCCL_VARS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")


class RanksMismatch(Exception):
    """The process is not the rank of a job of the world size the spec asks for."""


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None  # "gloo" or "nccl" when distributed

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class _Job(TypedDict):
    rank: int
    world_size: int
    backend: str | None
    ddp: dict[str, Any]  # the DistributedDataParallel keyword arguments the model was wrapped with (``wrap``)


class Distributed(_Job, total=False):
    """What the record says of a distributed job (``distributed``)."""

    nccl: dict[str, str | None]  # on CUDA: NCCL's "version", and each of ``NCCL_VARS`` (None: unset)


def env_rank() -> int:
    """This process's rank as torchrun set it (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def join(world_size: int, device: torch.device) -> Rank:
    """Join the process group of a ``world_size``-rank job (nothing to join at 1)."""
    if world_size <= 1:
        return Rank()
    seen = int(os.environ.get("WORLD_SIZE", "1"))
    if seen != world_size:
        raise RanksMismatch(f"the spec asks for {world_size} ranks but this process is one of {seen}: "
                            f"launch it with torchrun --nproc-per-node {world_size}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    rank = Rank(env_rank(), int(os.environ.get("LOCAL_RANK", "0")), world_size, backend)
    if device.type == "cuda":
        torch.cuda.set_device(rank.local_rank)
    torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return rank


def missing_gpus(world_size: int, device: torch.device) -> str | None:
    """Why a ``world_size``-rank CUDA job cannot run here (one GPU per rank), or None."""
    if device.type != "cuda" or world_size <= 1 or torch.cuda.device_count() >= world_size:
        return None
    return (f"--world-size {world_size} needs {world_size} GPUs, one per rank, but this process sees "
            f"{torch.cuda.device_count()}: lower --world-size or make more GPUs visible")


def device_of(rank: Rank, device: torch.device) -> torch.device:
    """The device a rank trains on: its own GPU on CUDA."""
    return torch.device("cuda", rank.local_rank) if rank.distributed and device.type == "cuda" else device


def wrap(setup: TrainSetup, rank: Rank) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module the training step calls (DDP above one rank), and the DDP options it was
    built with. ``setup.model`` becomes the plain module: its state is what is hashed and
    checkpointed, under the names it has in one process (DDP's own start with ``module.``)."""
    model = setup.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):  # the plugin wrapped it
        setup.model = model.module
        return model, {"wrapped_by": "plugin", "bucket_cap_mb": model.bucket_bytes_cap / 2**20,
                       "broadcast_buffers": model.broadcast_buffers}
    if not rank.distributed:
        return model, {}
    # From 3 ranks on, a ring all-reduce sums each gradient element in an order set by its place
    # in its bucket, and DDP rebuilds its buckets after its first step (in backward order): a
    # resumed run's fresh DDP reduces step k+1 with the first-step layout where run A used the
    # rebuilt one, and differs by rounding (measured: 1 ULP at 3 ranks, gloo). With
    # find_unused_parameters DDP never rebuilds, so every process keeps one layout. Two ranks
    # sum two operands, exact in any order: DDP's defaults stay.
    kwargs = {"bucket_cap_mb": BUCKET_CAP_MB, **({"find_unused_parameters": True} if rank.world_size >= 3 else {}),
              **setup.ddp_options}
    if next(model.parameters()).device.type == "cuda":
        kwargs["device_ids"] = [rank.local_rank]
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    return ddp, {"wrapped_by": "harness", **{k: v for k, v in kwargs.items() if k != "device_ids"},
                 "broadcast_buffers": ddp.broadcast_buffers}


def describe(rank: Rank, ddp: dict[str, Any]) -> Distributed | None:
    """What the record says of the job: rank, world size, backend, DDP options, NCCL settings."""
    if not rank.distributed:
        return None
    out: Distributed = {"rank": rank.rank, "world_size": rank.world_size, "backend": rank.backend, "ddp": ddp}
    if rank.backend == "nccl":
        version = torch.cuda.nccl.version()
        out["nccl"] = {"version": ".".join(map(str, version)) if isinstance(version, tuple) else str(version),
                       **{k: os.environ.get(k) for k in NCCL_VARS}}
    return out


def leave(rank: Rank) -> None:
    """Leave the process group once every rank has finished (none tears it down under another)."""
    if rank.distributed and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
