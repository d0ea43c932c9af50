"""The batches of a run: across epochs, resumed where a checkpoint left off, grouped into the
micro-batches of one optimizer step, and the epoch-stepped schedulers stepped as epochs end."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ..contract import ContractError, TrainSetup
from ..faults import Faults
from ..process.spec import WorkerSpec
from ..state import rng
from ..state.checkpoint import LoopPosition, Resume
from . import loader
from .batchtree import to_device


class Accumulated(list):
    """The micro-batches of one optimizer step (``TrainSetup.accumulate`` above 1)."""


class EpochEnds:
    """Steps the epoch-stepped schedulers (timm's, ``EveryEpoch``) as the loop enters a new epoch."""

    def __init__(self, setup: TrainSetup, epoch: int) -> None:
        self.schedules, self.epoch = setup.scheduler, epoch

    def reached(self, epoch: int) -> None:
        """The next step's batch is from ``epoch``."""
        while self.epoch < epoch:
            if self.schedules is not None:
                self.schedules.epoch_ended(self.epoch)
            self.epoch += 1


def next_batch(batches: Iterator[Any], accumulate: int, device: torch.device) -> Any:
    if accumulate == 1:
        return to_device(next(batches), device)
    return Accumulated(to_device(next(batches), device) for _ in range(accumulate))


def epoch_batches(setup: TrainSetup, pos: LoopPosition, resume: Resume | None, spec: WorkerSpec,
             faults: Faults) -> Iterator[Any]:
    """Yield batches forever, across epochs, tracking the position for checkpoints.

    Each epoch starts with a snapshot (``loader.EpochStart``) and ``set_epoch``. A loader that
    checkpoints its own position (``loader.own_state``: torchdata's ``StatefulDataLoader``) is
    resumed from its saved ``state_dict``. Any other resumed
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
            if resume.loader is not None and not faults.skip_loader_position:  # the loader's own resume
                it, pos.replayed = loader.resume_own(setup, pos.epoch, resume.loader), "loader"
            else:
                if pos.epoch_start is not None:
                    loader.restore(setup, pos.epoch_start)
                skip = 0 if faults.skip_loader_position else pos.batch_in_epoch
                it, how = loader.replay_epoch(setup, pos.epoch, skip)
                pos.replayed = how
            rng.set_states(resume.rng, torch_rng=faults.restore_torch_rng)
            if setup.set_extra_state is not None and resume.extra is not None:
                setup.set_extra_state(resume.extra)
            if faults.skip_loader_position:
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
