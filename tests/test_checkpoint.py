"""A checkpoint holds everything a fresh process needs to continue a run bit for bit."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from reproci.worker.contract import TrainSetup
from reproci.worker.data import loader
from reproci.worker.state import checkpoint, rng
from reproci.worker.state.checkpoint import CHECKPOINT_VERSION, LoopPosition
from reproci.worker.state.state import final_hash

CPU = torch.device("cpu")


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _setup(seed: int) -> TrainSetup:
    """A tiny model whose continuation depends on every part of a checkpoint: Adam's moments,
    the scheduler's position, dropout's draws from torch's RNG, the plugin's extra state."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data_gen = torch.Generator().manual_seed(100)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=data_gen), torch.randn(16, 1, generator=data_gen))
    batches = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))
    extra = {"cursor": 0}
    return TrainSetup(model=model, optimizer=opt, loader=batches, loss_fn=_mse,
                      scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
                      get_extra_state=lambda: dict(extra), set_extra_state=extra.update)


def _step(setup: TrainSetup, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    setup.optimizer.zero_grad(set_to_none=True)
    _mse(setup.model, batch).backward()
    setup.optimizer.step()
    setup.scheduler.step()


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def _hash(setup: TrainSetup) -> str:
    return final_hash(setup.model, setup.optimizer)[0]


def test_a_loaded_checkpoint_continues_bit_for_bit(tmp_path: Path):
    batches = _batches(6)
    original = _setup(seed=0)
    for b in batches[:3]:
        _step(original, b)
    checkpoint.save(str(tmp_path / "ckpt.pt"), original, LoopPosition(step=3))
    for b in batches[3:]:
        _step(original, b)  # dropout draws move torch's RNG on

    resumed = _setup(seed=1)  # another initialisation: everything must come from the file
    assert _hash(resumed) != _hash(original)
    _, resume = checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CPU)
    assert resumed.scheduler.last_epoch == 3 and resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    rng.set_states(resume.rng)
    for b in batches[3:]:
        _step(resumed, b)
    assert _hash(resumed) == _hash(original)

    # Its twin without the checkpoint's RNG state draws other dropout masks and ends elsewhere.
    unrestored = _setup(seed=1)
    checkpoint.load(str(tmp_path / "ckpt.pt"), unrestored, CPU)
    for b in batches[3:]:
        _step(unrestored, b)
    assert _hash(unrestored) != _hash(original)


def test_position_and_resume_state_round_trip(tmp_path: Path):
    setup = _setup(seed=0)
    start = loader.snapshot(setup)
    for b in _batches(2):
        _step(setup, b)
    setup.set_extra_state({"cursor": 7})
    saved_rng = rng.states()
    pos = LoopPosition(step=6, epoch=1, batch_in_epoch=2, epoch_start=start, replayed="index")
    checkpoint.save(str(tmp_path / "ckpt.pt"), setup, pos)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # written whole, no temporary left behind

    loaded, resume = checkpoint.load(str(tmp_path / "ckpt.pt"), _setup(seed=1), CPU)
    assert (loaded.step, loaded.epoch, loaded.batch_in_epoch) == (6, 1, 2)
    assert loaded.replayed is None  # how a resumed run reached its batch is not part of a checkpoint
    assert loaded.epoch_start is not None and start.generator is not None
    assert torch.equal(loaded.epoch_start.generator, start.generator)
    assert loaded.epoch_start.extra == {"cursor": 0}
    assert loaded.epoch_start.rng["python"] == start.rng["python"]
    assert torch.equal(loaded.epoch_start.rng["torch"], start.rng["torch"])
    assert np.array_equal(loaded.epoch_start.rng["numpy"][1], start.rng["numpy"][1])
    assert resume.extra == {"cursor": 7}
    assert resume.rng["python"] == saved_rng["python"]
    assert torch.equal(resume.rng["torch"], saved_rng["torch"])


def test_a_position_without_an_epoch_start_round_trips(tmp_path: Path):
    checkpoint.save(str(tmp_path / "ckpt.pt"), _setup(seed=0), LoopPosition(step=2, batch_in_epoch=2))
    loaded, _ = checkpoint.load(str(tmp_path / "ckpt.pt"), _setup(seed=0), CPU)
    assert loaded == LoopPosition(step=2, epoch=0, batch_in_epoch=2, epoch_start=None)


@contextlib.contextmanager
def _saved_as_if_on_a_gpu() -> Iterator[None]:
    """torch.save records every CPU storage with the location "cuda:0", as a checkpoint
    written by a GPU run does."""
    def tag(storage: torch.UntypedStorage) -> str | None:
        return "cuda:0" if storage.device.type == "cpu" else None

    def restore(storage: torch.UntypedStorage, location: str) -> None:
        return None  # torch's own deserializers do the loading

    torch.serialization.register_package(0, tag, restore)  # consulted before torch's own "cpu" tag
    try:
        yield
    finally:  # torch has no unregister: take the entry out again so later saves are untouched
        torch.serialization._package_registry[:] = [e for e in torch.serialization._package_registry if e[1] is not tag]


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(tmp_path: Path):
    original = _setup(seed=0)
    start = loader.snapshot(original)
    for b in _batches(3):
        _step(original, b)
    with _saved_as_if_on_a_gpu():
        checkpoint.save(str(tmp_path / "ckpt.pt"), original, LoopPosition(step=3, batch_in_epoch=3, epoch_start=start))
    assert torch.serialization.location_tag(torch.zeros(1).untyped_storage()) == "cpu"
    if not torch.cuda.is_available():  # the file really claims a GPU: read as it is, it cannot load here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(tmp_path / "ckpt.pt", weights_only=False)

    resumed = _setup(seed=1)
    loaded, resume = checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CPU)
    assert _hash(resumed) == _hash(original)
    assert all(p.device.type == "cpu" for p in resumed.model.parameters())
    assert all(t.device.type == "cpu" for s in resumed.optimizer.state.values() for t in s.values())
    # generator states must be CPU tensors to be set at all
    rng.set_states(resume.rng)
    assert loaded.epoch_start is not None and loaded.epoch_start.generator is not None
    assert loaded.epoch_start.generator.device.type == "cpu"
    loader.restore(resumed, loaded.epoch_start)


def test_another_checkpoint_version_is_refused_before_anything_is_restored(tmp_path: Path):
    path = tmp_path / "old.pt"
    checkpoint.save(str(path), _setup(seed=0), LoopPosition(step=1))
    state = torch.load(path, weights_only=False)
    state["version"] = CHECKPOINT_VERSION - 1
    torch.save(state, path)

    target = _setup(seed=1)
    before = _hash(target)
    with pytest.raises(ValueError, match=rf"checkpoint .*old\.pt has version {CHECKPOINT_VERSION - 1}, "
                                         rf"expected {CHECKPOINT_VERSION}"):
        checkpoint.load(str(path), target, CPU)
    assert _hash(target) == before


def test_a_bare_state_dict_is_not_a_checkpoint(tmp_path: Path):
    path = tmp_path / "weights.pt"
    torch.save(_setup(seed=0).model.state_dict(), path)
    with pytest.raises(ValueError, match=rf"has version None, expected {CHECKPOINT_VERSION}"):
        checkpoint.load(str(path), _setup(seed=1), CPU)


class _AssignsLoaded(nn.Module):
    """A module that keeps its state as plain tensor attributes and, loading, assigns the tensors
    it is given as they are: what a torchmetrics ``Metric`` with persistent states does."""

    def __init__(self) -> None:
        super().__init__()
        self.total = torch.zeros(3)
        self.seen = [torch.zeros(2)]

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[no-untyped-def]
        destination[prefix + "total"] = self.total
        destination[prefix + "seen"] = self.seen

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[no-untyped-def]
        self.total = state_dict.pop(prefix + "total")
        self.seen = state_dict.pop(prefix + "seen")


def test_state_a_module_assigns_as_loaded_goes_back_to_the_device_it_was_on(tmp_path: Path):
    """The checkpoint loads on the CPU; a module that assigns what it loads (a persistent metric)
    must not be left holding CPU tensors on a device run (on CUDA the next update raised
    "Encountered different devices"). No GPU here: the meta device stands in for one."""
    original = _setup(seed=0)
    original.model.add_module("metric", _AssignsLoaded())
    original.model.metric.total += 5
    checkpoint.save(str(tmp_path / "ckpt.pt"), original, LoopPosition(step=1))

    resumed = _setup(seed=1)
    resumed.model.add_module("metric", _AssignsLoaded().to("meta"))
    resumed.model.metric.total = resumed.model.metric.total.to("meta")
    resumed.model.metric.seen = [t.to("meta") for t in resumed.model.metric.seen]
    checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CPU)
    assert resumed.model.metric.total.device.type == "meta"
    assert [t.device.type for t in resumed.model.metric.seen] == ["meta"]
    assert all(p.device.type == "cpu" for p in resumed.model.parameters())  # the rest where it was


def test_a_persistent_torchmetrics_metric_keeps_its_device_after_a_resume(tmp_path: Path):
    """The same with a real torchmetrics metric made persistent, as the census advises (the meta
    device stands in for a GPU)."""
    classification = pytest.importorskip("torchmetrics.classification")
    original = _setup(seed=0)
    original.model.add_module("acc", classification.MulticlassAccuracy(num_classes=3))
    original.model.acc.persistent(True)
    original.model.acc.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    checkpoint.save(str(tmp_path / "ckpt.pt"), original, LoopPosition(step=1))

    resumed = _setup(seed=1)
    resumed.model.add_module("acc", classification.MulticlassAccuracy(num_classes=3))
    resumed.model.acc.persistent(True)
    resumed.model.acc.to("meta")
    checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CPU)
    assert {getattr(resumed.model.acc, s).device.type for s in ("tp", "fp", "tn", "fn")} == {"meta"}


def test_a_metrics_list_state_empty_before_the_resume_goes_to_the_metrics_device(tmp_path: Path):
    """A plain plugin (no Lightning) holding a persistent torchmetrics ``CatMetric``: its list
    state, empty in the resumed process, is given the checkpoint's CPU tensors; the metric puts
    them on its own device (on a GPU the next update raised "Encountered different devices").
    No GPU here: the meta device stands in for one."""
    from .helpers import installed

    (torchmetrics,) = installed("torchmetrics")
    original = _setup(seed=0)
    original.model.add_module("seen", torchmetrics.CatMetric())
    original.model.seen.persistent(True)
    original.model.seen.update(torch.tensor([1.0, 2.0]))
    checkpoint.save(str(tmp_path / "ckpt.pt"), original, LoopPosition(step=1))

    resumed = _setup(seed=1)
    resumed.model.add_module("seen", torchmetrics.CatMetric().to("meta"))
    resumed.model.seen.persistent(True)
    assert resumed.model.seen.value == []  # nothing in it tells where it lives
    checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CPU)
    assert [t.device.type for t in resumed.model.seen.value] == ["meta"]
    assert resumed.model.seen.device.type == "meta"
    assert all(p.device.type == "cpu" for p in resumed.model.parameters())  # the rest where it was
