"""Exact resume at every step, and every detection proven on a buggy model beside a fixed twin.

The sweep runs A once with a checkpoint at every step, then a resumed process from each one
(forked by the local backend, as the stage's runs are), and compares each with A exactly as
the stage does. The verdict tests drive the
real CLI with the plugins of ``tests/plugins/resumable.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reproci import errors, plugins
from reproci.backends.local import LocalBackend
from reproci.golden.divergence import first_divergence
from reproci.worker.process.spec import WorkerSpec

from .helpers import PLUGINS, ROOT

pytestmark = pytest.mark.slow
RESUMABLE = PLUGINS / "resumable.py"
STEPS = 10  # 4 batches an epoch: boundaries after steps 4 and 8


@functools.cache
def _backend() -> LocalBackend:
    """The local backend as ``reproci run`` makes it: each run forked from a fork server (the
    session's standing ones), in the strict launch environment of its spec."""
    return LocalBackend(plugins.build_options({}, env=dict(os.environ)))


def _launch(spec: WorkerSpec, path: Path) -> dict:
    spec.write(path)
    result = _backend().launch(spec, path, timeout=300)
    record = json.loads((path.parent / spec.output).read_text())
    assert result.returncode == 0 and record["status"] == "ok", record.get("message", result.log_tail)
    assert result.launch["mode"] == "forked", result.launch
    return record


def sweep(tmp_path: Path, factory: str, ks: tuple[int, ...] = tuple(range(1, STEPS)),
          plugin: Path = RESUMABLE) -> dict[int, object]:
    """{k: first divergence of the run resumed at k from the full run (None when exact)}."""
    base = WorkerSpec(model_ref=f"{plugin}:{factory}", model_name=factory, role="A", steps=STEPS,
                      output="record-A.json", checkpoint_steps=ks)
    a = _launch(base, tmp_path / "spec-A.json")

    def resume(k: int) -> dict:
        spec = dataclasses.replace(base, role=f"C{k}", output=f"record-C{k}.json", checkpoint_steps=(),
                                   resume_from=f"ckpt-{k}.pt")
        return _launch(spec, tmp_path / f"spec-C{k}.json")

    with ThreadPoolExecutor(max_workers=2) as pool:
        resumed = dict(zip(ks, pool.map(resume, ks)))
    return {k: first_divergence(a, c) for k, c in resumed.items()}


EVERY = tuple(range(1, STEPS))  # first epoch, both boundaries (4, 8), later epochs, the last step
AROUND_BOUNDARIES = (2, 4, 5, 9)


@pytest.mark.parametrize("factory, how, ks", [
    ("dataset_rng_exposed", "index", EVERY),  # dataset RNG in extra state, no workers: skipped without fetching
    ("stream_exposed", "fetch", EVERY),  # an IterableDataset with state
    ("worker_augmented", "fetch", EVERY),  # augmentation in 2 worker processes
    ("dataset_rng_exposed_ragged", "index", (4, 5, 6)),  # drop_last off, a short last batch: boundary at 5
    ("own_sampler", "index", AROUND_BOUNDARIES),  # a sampler that seeds itself, keeps a cursor, uses set_epoch
    ("drawing_sampler_exposed", "index", AROUND_BOUNDARIES),  # a sampler's generator across epochs, in extra state
])
def test_resume_is_exact_at_every_step(tmp_path, factory, how, ks):
    result = sweep(tmp_path, factory, ks)
    assert {k: d for k, d in result.items() if d is not None} == {}
    record = json.loads((tmp_path / f"record-C{ks[1]}.json").read_text())
    assert record["replayed"] == how and record["start_step"] == ks[1]


def test_hidden_dataset_rng_is_caught_at_every_step_first_epoch_included(tmp_path):
    result = sweep(tmp_path, "dataset_rng_hidden")
    for k, div in result.items():
        assert div is not None, f"resume at {k} passed although the dataset's generator is not checkpointed"
        assert div.step == k + 1 and div.cause == "data", (k, div)


def _run(reproci, *models: str, k: int = 6) -> dict:
    refs = [a for m in models for a in ("-m", f"{RESUMABLE}:{m}")]
    p = reproci("run", "--steps", str(STEPS), "--resume-at", str(k), "--jobs", "2", *refs)
    assert p.returncode in (0, errors.EXIT_REPRO_FAILURE), p.stdout + p.stderr
    return {m["model"].removeprefix("resumable."): m for m in reproci.latest()["models"]}


def test_hidden_state_is_resume_broken_and_exposed_twins_pass(reproci):
    v = _run(reproci, "dataset_rng_hidden", "dataset_rng_exposed", "drawing_sampler_hidden",
             "drawing_sampler_exposed", "stream_hidden", "stream_exposed", "own_sampler", "persistent_workers",
             "worker_augmented")
    for buggy, rng in (("dataset_rng_hidden", "loader.dataset.rng (numpy.random.Generator)"),
                       ("stream_hidden", "loader.dataset.gen (torch.Generator)")):
        ev = v[buggy]["evidence"]
        assert v[buggy]["verdict"] == "RESUME_BROKEN", (buggy, v[buggy]["message"])
        assert ev["comparison"] == "A vs C" and ev["step"] == 7 and ev["cause"] == "data", (buggy, ev)
        # the state census names the generator, measured on the runs
        assert f"likely cause: {rng} differs between A and C at step 6" in v[buggy]["message"], v[buggy]["message"]
    # A sampler's own generator (under .rng) is private state, not restored on the plugin's behalf:
    # resumed in epoch 2, run C draws another order, and the census names the generator.
    ds = v["drawing_sampler_hidden"]
    assert ds["verdict"] == "RESUME_BROKEN" and ds["evidence"]["cause"] == "data", ds["message"]
    assert ("likely cause: loader.sampler.rng (numpy.random.Generator) differs between A and C at step 6"
            in ds["message"]), ds["message"]
    pw = v["persistent_workers"]  # worker RNG that carries across epochs: the cause is named
    assert pw["verdict"] == "RESUME_BROKEN" and pw["evidence"]["cause"] == "data"
    assert "persistent worker processes" in pw["message"] and "set persistent_workers=False" in pw["evidence"]["hint"]
    for fixed in ("dataset_rng_exposed", "drawing_sampler_exposed", "stream_exposed", "own_sampler", "worker_augmented"):
        assert v[fixed]["verdict"] == "NEW" and v[fixed]["message"].startswith("A = B = C"), (fixed, v[fixed]["message"])


def test_unseeded_initialisation_differs_before_the_first_step(reproci):
    v = _run(reproci, "unseeded_init", "seeded_init")
    m = v["unseeded_init"]
    assert m["verdict"] == "NONDETERMINISTIC" and m["evidence"]["step"] == 0 and m["evidence"]["cause"] == "init"
    assert m["evidence"]["tensor"].startswith("param:")
    assert m["message"].startswith(f"A ≠ B before the first step, first at {m['evidence']['tensor']}")
    assert "the initial parameters/buffers are not seeded" in m["message"]
    assert v["seeded_init"]["verdict"] == "NEW"


def test_rows_reordered_within_a_batch_are_blamed_on_data(reproci):
    v = _run(reproci, "rows_in_completion_order", "rows_in_order")
    m = v["rows_in_completion_order"]
    assert m["verdict"] == "NONDETERMINISTIC" and m["evidence"]["cause"] == "data", m["message"]
    assert v["rows_in_order"]["verdict"] == "NEW"


def test_controls_switched_off_by_the_model_are_named_with_file_and_line(reproci):
    v = _run(reproci, "flags_off_in_factory", "flags_off_in_forward", "flags_untouched")
    source = RESUMABLE.read_text().splitlines()
    line = next(i for i, s in enumerate(source, 1) if "torch.use_deterministic_algorithms(False)" in s)
    m = v["flags_off_in_factory"]
    assert m["verdict"] == "NONDETERMINISTIC"
    assert f"deterministic_algorithms set to False at resumable.py:{line} (flags_off_in_factory, before the first step)" in m["message"]
    assert m["evidence"]["controls"][0]["runs"] == ["A", "B", "C"]
    fwd = v["flags_off_in_forward"]
    line = next(i for i, s in enumerate(source, 1) if "torch.backends.cudnn.benchmark = True" in s)
    assert fwd["verdict"] == "NONDETERMINISTIC"
    assert f"cudnn_benchmark set to True at resumable.py:{line} (_benchmark_in_forward, in step 1)" in fwd["message"]
    assert v["flags_untouched"]["verdict"] == "NEW"


def test_readme_example_resumes_exactly_on_an_epoch_boundary(reproci):
    """16 batches an epoch: k = 16 is the last batch of the first epoch."""
    p = reproci("run", "-m", str(ROOT / "examples" / "mlp_plugin.py") + ":build", "--steps", "20",
                "--resume-at", "16", "--jobs", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    m = reproci.latest()["models"][0]
    assert m["verdict"] == "NEW" and m["message"].startswith("A = B = C") and m["runs"]["C"]["start_step"] == 16


def test_a_checkpoint_whose_step_may_move_is_not_named_by_the_step_it_may_leave():
    """Run A moves k past the loader's first epoch unless --resume-at is given: C's progress line
    ("resuming from ...") then names A's checkpoint, not ckpt-15.pt for one taken at step 24."""
    from reproci.settings.models import resolve
    from reproci.settings.options import RunOptions
    from reproci.stages import determinism

    for auto, name in ((True, "ckpt-A.pt"), (False, "ckpt-15.pt")):
        options = RunOptions(models=(resolve("embedding"),), steps=30, resume_at=15, resume_at_auto=auto)
        specs = determinism.plan(options, options.models[0], project_commit=None, image={})
        assert specs["A"].checkpoint_path == specs["C"].resume_from == name


STATEFUL = PLUGINS / "stateful_loader.py"


def _plain_stateful(factory: str, steps: int, resume_at: int | None) -> dict:
    """A plain loop over the plugin's parts that checkpoints as torchtitan does: the model's,
    the optimizer's and the loader's own state_dict, put back into new objects at ``resume_at``."""
    import torch

    from reproci.worker.contract import ModelContext

    from .plugins import stateful_loader as sl

    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=steps)
    dataset = sl.Kept if factory == "kept" else sl.Noisy
    model, opt, loader = sl.parts(ctx, dataset)
    it, step = iter(loader), 0
    while step < steps:
        if step == resume_at:
            saved = model.state_dict(), opt.state_dict(), loader.state_dict()
            model, opt, loader = sl.parts(ctx, dataset)
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
            loader.load_state_dict(saved[2])
            it = iter(loader)
        batch = next(it, None)
        if batch is None:
            it = iter(loader)
            continue
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(batch[0]), batch[1]).backward()
        opt.step()
        step += 1
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_stateful_dataloader_is_checkpointed_through_its_own_state_at_every_step(tmp_path):
    """torchdata's StatefulDataLoader over a dataset that saves its generator through it (the
    Stateful protocol): the loader's own state_dict used to be left out of the checkpoint, a
    false RESUME_BROKEN ("loader.dataset.rng ... outside the checkpoint"). Ground truth: a plain
    loop that checkpoints loader.state_dict() resumes it exactly inside the second epoch, and not
    in the first or at its end (torchdata 0.11 then draws the next epoch's order from another
    generator state: the loader's own gap, which reproci finds at exactly those steps); one whose
    dataset keeps its generator to itself never resumes exactly."""
    import torch

    def exact(factory: str, k: int) -> bool:
        full, resumed = _plain_stateful(factory, STEPS, None), _plain_stateful(factory, STEPS, k)
        return all(torch.equal(full[n], resumed[n]) for n in full)

    truth = {k: exact("kept", k) for k in EVERY}
    assert truth[9] and not any(exact("forgetful", k) for k in (5, 9))
    found = {k: d is None for k, d in sweep(tmp_path, "kept", EVERY, plugin=STATEFUL).items()}
    assert found == truth
    assert json.loads((tmp_path / "record-C9.json").read_text())["replayed"] == "loader"


def test_a_stateful_dataloader_whose_dataset_keeps_its_generator_to_itself_is_resume_broken(reproci):
    refs = [a for m in ("kept", "forgetful") for a in ("-m", f"{STATEFUL}:{m}")]
    p = reproci("run", "--steps", "12", "--resume-at", "10", *refs)
    assert p.returncode == errors.EXIT_REPRO_FAILURE, p.stdout + p.stderr
    v = {m["model"].removeprefix("stateful_loader."): m for m in reproci.latest()["models"]}
    assert v["kept"]["verdict"] == "NEW" and v["kept"]["message"].startswith("A = B = C"), v["kept"]["message"]
    broken = v["forgetful"]
    assert broken["verdict"] == "RESUME_BROKEN" and broken["evidence"]["cause"] == "data", broken["message"]
    assert "likely cause: loader.dataset.rng (torch.Generator) differs between A and C at step 10" in broken["message"]
    assert "give the dataset state_dict and load_state_dict" in broken["message"]
