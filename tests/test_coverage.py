"""Where k falls and what the resume check covered (``reproci/stages/coverage.py``,
``worker.train.resume_point``)."""

from __future__ import annotations

import pytest
import torch

from reproci.plugins import build_options
from reproci.stages.determinism import coverage
from reproci.worker.contract import TrainSetup
from reproci.worker.data.loader import resume_point
from reproci.worker.process.spec import WorkerSpec

from .helpers import run_record


def _setup(batches: int) -> TrainSetup:
    model = torch.nn.Linear(1, 1)
    loader = torch.utils.data.DataLoader(torch.zeros(batches, 1), batch_size=1)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=lambda m, b: m(b).sum())


@pytest.mark.parametrize("batches,steps,k,auto,expected", [
    (8, 30, 15, True, 15),     # k already in a later epoch
    (20, 30, 15, True, 25),    # moved midway between the boundary (20) and the end
    (29, 30, 15, True, 15),    # no room after the boundary
    (28, 30, 15, True, 29),
    (20, 30, 15, False, 15),   # --resume-at given: kept
])
def test_run_a_moves_k_past_the_first_epoch_only_when_asked_and_possible(batches, steps, k, auto, expected):
    spec = WorkerSpec(model_ref="m", model_name="m", role="A", steps=steps, checkpoint_at=k, checkpoint_after_epoch=auto)
    assert resume_point(spec, _setup(batches)) == expected


def _options(**kw):
    return build_options({"models": ("conv",), **kw}, env={})


def test_coverage_says_when_the_run_never_crossed_an_epoch():
    record = run_record(batch_epochs=[0] * 12, checkpoint_at=6, loader={"batches_per_epoch": 40})
    out = coverage.of(record, _options(steps=12))
    assert out["epochs"] == 1 and out["resume_epoch"] == 0
    assert "--steps 80" in out["note"]


def test_coverage_says_when_k_falls_in_the_first_epoch_and_which_k_would_not():
    record = run_record(batch_epochs=[0, 0, 0, 0, 1, 1, 1, 1, 2, 2], checkpoint_at=3, loader={"batches_per_epoch": 4})
    out = coverage.of(record, _options(steps=10, resume_at=3))
    assert out["note"].startswith("k = 3 falls in epoch 0") and "--resume-at 5..9" in out["note"]
    record.checkpoint_at = 6
    assert coverage.of(record, _options(steps=10, resume_at=6))["note"] is None


def test_the_resume_point_is_automatic_unless_given():
    assert _options().resume_at_auto and not _options(resume_at=4).resume_at_auto
