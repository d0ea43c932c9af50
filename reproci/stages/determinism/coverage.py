"""What the resume check covered: how many epochs the runs saw, and where k fell.

A resume inside the first epoch replays that epoch from its start and rebuilds whatever
per-epoch state it has (the order ``set_epoch`` draws, a scheduler stepped per epoch, an
epoch counter of the plugin's): a bug in carrying that state across a checkpoint shows
only when k falls in a later epoch. And a run that never crosses an epoch boundary checks
no per-epoch state at all. Without ``--resume-at``, run A moves k past the first boundary
when the run holds one (``worker.train.resume_point``); this says what came of it.
"""

from __future__ import annotations

from ...results import Coverage
from ...settings.options import RunOptions
from ...worker.run_record import RunRecord


def of(record_a: RunRecord, options: RunOptions) -> Coverage:
    """{epochs, batches_per_epoch, resume_at, resume_epoch, note}: note only when the check
    missed per-epoch state, with what to change."""
    epochs = list(record_a.batch_epochs)
    k = record_a.checkpoint_at or options.resume_at
    per_epoch = (record_a.loader or {}).get("batches_per_epoch")
    out: Coverage = {"epochs": (max(epochs) + 1) if epochs else None, "batches_per_epoch": per_epoch,
                     "resume_at": k, "resume_epoch": epochs[k - 1] if 0 < k <= len(epochs) else None, "note": None}
    if not epochs:
        return out
    steps = len(epochs)
    if max(epochs) == 0:
        size = f" (the loader has {per_epoch} batches an epoch)" if per_epoch else ""
        more = f"--steps {max(2 * per_epoch, per_epoch + 2)}" if per_epoch else "more --steps"
        out["note"] = (f"the {steps} steps never left epoch 0{size}: per-epoch state (set_epoch, each epoch's "
                       f"order, a per-epoch schedule) was not checked across a resume; run {more}, or a smaller "
                       "dataset")
    elif out["resume_epoch"] == 0:
        first_later = epochs.index(1) + 1
        fix = (f"use --resume-at {first_later}..{steps - 1}, or leave --resume-at out to let run A choose"
               if first_later <= steps - 1 else f"run more steps (--steps {first_later + 2} or more)")
        out["note"] = (f"k = {k} falls in epoch 0, whose replay rebuilds any per-epoch state: a resume inside a "
                       f"later epoch was not checked; {fix}")
    return out
