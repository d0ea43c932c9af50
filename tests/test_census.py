"""The state census (``pipeline/worker/state/census.py``, compared by ``pipeline/stages/census.py``):
private state found where users keep it, named by path and type, never the harness's own or
the checkpoint's; through the real CLI, each buggy model beside a twin that declares its state."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from reproci import verdicts
from reproci.stages import census as compare
from reproci.worker.state import census
from reproci.worker.contract import ModelContext, TrainSetup

from .helpers import PLUGINS, Cli, model_entry


def _setup(**kw) -> TrainSetup:
    model = nn.Linear(2, 1)
    data = torch.utils.data.TensorDataset(torch.ones(8, 2), torch.ones(8, 1))
    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True, generator=ctx.generator())
    kw.setdefault("loss_fn", lambda m, b: (m(b[0]) - b[1]).pow(2).mean())
    return TrainSetup(model=model, optimizer=torch.optim.Adam(model.parameters()), loader=loader, **kw)


def test_the_census_finds_private_state_by_path_and_leaves_the_checkpoints_alone():
    noise = torch.Generator().manual_seed(1)
    shadow = nn.Linear(2, 1)
    counter = {"n": 3}
    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0)

    def loss_fn(m, b):
        counter["n"] += 1
        return (m(b[0] + torch.randn(b[0].shape, generator=noise)) - shadow(b[0])).pow(2).mean() + 0 * ctx.seed

    setup = _setup(loss_fn=loss_fn)
    setup.model.register_buffer("scratch", torch.zeros(2), persistent=False)
    setup.model.tracked = torch.ones(3)  # a plain tensor attribute: not in the state dict
    items = census.take(setup)
    assert items["loss_fn.<noise>"]["kind"] == "rng" and items["loss_fn.<noise>"]["type"] == "torch.Generator"
    assert items["loss_fn.<shadow>"] == {"kind": "module", "type": "Linear", "sha": items["loss_fn.<shadow>"]["sha"]}
    assert items["loss_fn.<counter>['n']"]["value"] == "3"
    assert items["model.scratch"]["kind"] == "tensor" and items["model.tracked"]["type"] == "Tensor[float32, (3,)]"
    assert not any(p.startswith("loss_fn.<ctx>") for p in items)  # the harness's ModelContext
    assert not any("generator" in p for p in items)  # the loader generator is checkpointed
    assert not any(p.startswith("model.weight") or p.startswith("model.bias") for p in items)
    assert "loader.dataset.tensors[0]" in items  # the data is looked at, and agrees when unchanged


def test_the_census_digest_follows_every_change():
    rng_obj = random.Random(0)
    held = {"t": torch.zeros(4), "r": rng_obj}
    setup = _setup(after_step=lambda step: held)
    before = census.take(setup)
    held["t"][2] = -0.0  # one bit
    rng_obj.random()
    after = census.take(setup)
    assert before["after_step.<held>['t']"]["sha"] != after["after_step.<held>['t']"]["sha"]
    assert before["after_step.<held>['r']"]["sha"] != after["after_step.<held>['r']"]["sha"]
    assert census.take(setup) == after  # taking it changes nothing


def _record(k: int, resume: dict, next_: dict | None = None) -> dict:
    return {"census": {"at": k, "resume": {"items": resume}, "next": {"items": next_ if next_ is not None else resume}}}


def test_strong_differences_fail_and_plain_values_are_notices():
    rng_a = {"kind": "rng", "type": "random.Random", "sha": "1"}
    count = {"kind": "value", "type": "int", "sha": "a", "value": "6"}
    a = _record(6, {"x.rng": rng_a, "x.n": count})
    c = _record(6, {"x.rng": {**rng_a, "sha": "2"}, "x.n": {**count, "sha": "b", "value": "0"}})
    diffs = compare.differences(a, c)
    assert [(d.path, d.strong, d.step) for d in diffs] == [("x.rng", True, 6), ("x.n", False, 6)]
    ev = compare.divergence(diffs)
    assert ev is not None and ev.cause == "census" and ev.tensor == "x.rng"
    assert "x.rng (random.Random) differs between A and C at step 6" in compare.describe(diffs)
    only_values = [d for d in diffs if not d.strong]
    assert compare.divergence(only_values) is None
    assert compare.notice(only_values).startswith("x.n (int) differs between A and C at step 6 (A 6, C 0)")
    assert compare.differences(a, a) == []


def test_a_difference_only_after_the_next_step_is_found_there():
    t = {"kind": "tensor", "type": "Tensor[float32, (2,)]", "sha": "1"}
    a = _record(4, {"ema": t}, {"ema": {**t, "sha": "2"}})
    c = _record(4, {"ema": t}, {"ema": {**t, "sha": "3"}})
    assert [(d.path, d.step) for d in compare.differences(a, c)] == [("ema", 5)]
    gen = {"kind": "rng", "type": "torch.Generator", "sha": "1"}
    made = _record(4, {"collate_fn.generator": gen}, {"collate_fn.generator": {**gen, "sha": "2"}})
    lazily = _record(4, {}, {"collate_fn.generator": {**gen, "sha": "9"}})  # made on first use: later in C
    found = compare.differences(made, lazily)
    assert [(d.path, d.step, d.sides()) for d in found] == [("collate_fn.generator", 4, "present in A, absent in C")]


def test_a_cache_that_agrees_once_c_has_stepped_is_no_state():
    """A cache of rotary embeddings that the first forward builds: A has it at the resume point,
    C not yet; after step k+1 both hold the same. Derived, not state: no difference."""
    cache = {"kind": "tensor", "type": "Tensor[float32, (2, 74, 1, 1, 16)]", "sha": "7"}
    a = _record(3, {"model.rotary.cached": cache}, {"model.rotary.cached": cache})
    c = _record(3, {}, {"model.rotary.cached": cache})
    assert compare.differences(a, c) == []


CENSUS = PLUGINS / "census.py"
BUGGY = ("ema_after_step_hidden", "loss_ema_in_scheduler_hidden", "bucketing_sampler_hidden", "warmup_counter",
         "metrics_unsaved")
FIXED = ("ema_after_step_declared", "loss_ema_in_scheduler_declared", "bucketing_sampler_declared")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cli = Cli(tmp_path_factory.mktemp("census"))
    refs = [a for m in (*BUGGY, *FIXED, "logging_counter") for a in ("-m", f"{CENSUS}:{m}")]
    p = cli("run", "--steps", "12", "--resume-at", "6", "--jobs", "2", *refs)
    assert p.returncode == 1, p.stdout + p.stderr
    return {m["model"].removeprefix("census."): m for m in cli.latest()["models"]}


@pytest.mark.slow
def test_private_state_where_users_keep_it_is_resume_broken_and_named(run):
    expected = {
        "ema_after_step_hidden": "after_step.<ema> (AveragedModel) differs between A and C at step 6",
        "loss_ema_in_scheduler_hidden": "loss_fn.<seen>['loss_ema'] (Tensor[float32, ()]) differs between A and C at step 6",
        "bucketing_sampler_hidden": "loader.batch_sampler._rng (random.Random) differs between A and C at step 6",
        "warmup_counter": "loss_fn.<calls>['n'] (int) differs between A and C at step 6 (A 6, C 0)",
    }
    for name, sentence in expected.items():
        m = run[name]
        assert m["verdict"] == verdicts.RESUME_BROKEN, (name, m["message"])
        assert sentence in m["message"], (name, m["message"])
    # no hashed tensor differs for the hidden EMA: the census alone fails it, and says how to fix it
    ema = run["ema_after_step_hidden"]
    assert ema["evidence"]["cause"] == "census" and "declare it in TrainSetup.state_modules" in ema["message"]


@pytest.mark.slow
def test_declared_twins_pass_and_a_logging_counter_is_a_notice(run):
    for name in FIXED:
        m = run[name]
        assert m["verdict"] == verdicts.NEW and m["message"].startswith("A = B = C"), (name, m["message"])
        assert m["state_census"]["differences"] == [], (name, m["state_census"])
    log = run["logging_counter"]
    assert log["verdict"] == verdicts.NEW, log["message"]
    assert log["state_census"]["notice"].startswith("loss_fn.<calls>['n'] (int) differs between A and C at step 6")


@pytest.mark.slow
def test_the_first_differing_op_is_the_one_the_loss_reads(run):
    """Two torchmetrics metrics lose their state on resume: ``train_err`` is only logged,
    ``running`` scales the loss. The op named is the running mean's update, the one on the path
    to the loss; the logging metric's earlier update is said to differ too, as read by neither
    the loss nor the gradients; the census names the metric states outside the checkpoint."""
    m = run["metrics_unsaved"]
    assert m["verdict"] == verdicts.RESUME_BROKEN, m["message"]
    op = m["evidence"]["op"]
    assert op["op"] == "aten::add_" and op["source"].startswith("census.py:") and op["aside"]["op"] == "aten::add_"
    line = int(op["source"].split(":")[1].split()[0])
    assert line == int(op["aside"]["source"].split(":")[1].split()[0]) + 2, (op, op["aside"])  # running vs train_err
    assert "neither the loss nor the gradients read it" in m["message"]
    assert "likely cause: model.running.mean_value (Tensor[float32, ()]) differs between A and C" in m["message"]
