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

from .helpers import PLUGINS, Cli, installed, model_entry


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
    refs = [a for m in (*BUGGY, *FIXED, "logging_counter") for a in ("-m", f"{CENSUS}:{m}")] + [
        a for m in ("kept", "metric_in_loss", "module_state_lost", "datamodule_state_lost")
        for a in ("-m", f"{PLUGINS / 'lightning_state.py'}:{m}")]
    p = cli("run", "--steps", "12", "--resume-at", "6", "--jobs", "2", *refs)
    assert p.returncode == 1, p.stdout + p.stderr
    doc = cli.latest()
    return {**{m["model"].removeprefix("census."): m for m in doc["models"]}, "reports": {"stderr": p.stderr, "doc": doc}}


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


# -- torchmetrics, and the state a Lightning Trainer checkpoints outside the state_dict --------

def test_a_metrics_state_alone_is_a_warning_and_beside_a_trained_tensor_the_likely_cause():
    """Decided by what the object is (the worker marks a torchmetrics Metric's items), not by its
    name: a metric's state differing alone keeps PASS with a warning that says how to keep it; with
    a trained tensor differing too (a metric the loss reads) the verdict is the tensors', the metric
    its likely cause; the same tensor unmarked (a plain attribute) is a resume bug by itself."""
    from reproci.golden.compare import Divergence

    acc = {"kind": "tensor", "type": "Tensor[int64, (3,)]", "sha": "1", "metric": "MulticlassAccuracy",
           "owner": "model.train_acc"}
    diffs = compare.differences(_record(6, {"model.train_acc.tp": acc}), _record(6, {"model.train_acc.tp": {**acc, "sha": "2"}}))
    assert [(d.path, d.strong, d.metric, d.owner) for d in diffs] == [
        ("model.train_acc.tp", False, "MulticlassAccuracy", "model.train_acc")]
    assert compare.decide(verdicts.PASS, None, None, diffs) == (verdicts.PASS, None, None)
    warning = compare.metrics(diffs)
    assert warning.startswith("the state of model.train_acc (torchmetrics MulticlassAccuracy: tp) differs between A "
                              "and C at step 6"), warning
    assert "a resumed run trains identically" in warning and warning.endswith("call model.train_acc.persistent(True)")
    assert compare.notice(diffs) is None
    ev = Divergence(step=7, tensor="grad:net.2.bias", kind="grad", cause="compute")
    assert compare.decide(verdicts.RESUME_BROKEN, ("A", "C"), ev, diffs) == (verdicts.RESUME_BROKEN, ("A", "C"), ev)
    hint = compare.hint(verdicts.RESUME_BROKEN, ("A", "C"), ev, diffs)
    assert hint.startswith("likely cause: model.train_acc.tp (Tensor[int64, (3,)]) differs between A and C at step 6, "
                           "outside the checkpoint: it is the state of the torchmetrics MulticlassAccuracy"), hint
    assert "call model.train_acc.persistent(True)" in hint
    plain = {k: v for k, v in acc.items() if k not in ("metric", "owner")}
    diffs = compare.differences(_record(6, {"model.train_acc.tp": plain}),
                                _record(6, {"model.train_acc.tp": {**plain, "sha": "2"}}))
    assert compare.decide(verdicts.PASS, None, None, diffs)[0] == verdicts.RESUME_BROKEN
    assert compare.metrics(diffs) is None


def test_the_census_marks_the_state_of_a_torchmetrics_metric_by_its_class():
    (torchmetrics,) = installed("torchmetrics")

    model = nn.Linear(2, 3)
    model.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
    model.train_acc(torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]))
    model.seen = torch.zeros(3, dtype=torch.int64)  # a tensor of the user's own beside it
    items = census.take(TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=[],
                                   loss_fn=lambda m, b: m(b).sum()))
    assert {p: (i.get("metric"), i.get("owner")) for p, i in items.items() if p.startswith("model.train_acc.")} == {
        f"model.train_acc.{s}": ("MulticlassAccuracy", "model.train_acc") for s in ("fn", "fp", "tn", "tp")}
    assert "metric" not in items["model.seen"]


@pytest.mark.slow
def test_a_logged_metric_is_a_warning_in_every_report_and_a_metric_the_loss_reads_is_resume_broken(run):
    """Lightning's documented logging of a torchmetrics accuracy: every trained tensor agrees, the
    accuracy's counts do not (they are in no checkpoint, Lightning's included): A = B = C with the
    metric named in a warning, on the terminal and in the Markdown report. A running mean that
    scales the loss, its twin, is RESUME_BROKEN with the metric as the likely cause."""
    from reproci.reports import markdown

    kept = run["lightning_state.kept"]
    assert kept["verdict"] == verdicts.NEW and kept["message"].startswith("A = B = C"), kept["message"]
    warning = kept["state_census"]["metrics"]
    assert warning.startswith("the state of model.train_acc (torchmetrics MulticlassAccuracy: fn, fp, tn, tp) differs "
                              "between A and C at step 6"), warning
    assert warning.endswith("call model.train_acc.persistent(True)"), warning
    flat = " ".join(run["reports"]["stderr"].split())
    assert f"warning: lightning_state.kept: {' '.join(warning.split())}" in flat, run["reports"]["stderr"]
    assert f"- ⚠️ **lightning_state.kept**: {warning}" in markdown.render(run["reports"]["doc"])
    fed = run["lightning_state.metric_in_loss"]
    assert fed["verdict"] == verdicts.RESUME_BROKEN and fed["evidence"]["cause"] != "census", fed["message"]
    assert ("likely cause: model.running.mean_value (Tensor[float32, ()]) differs between A and C at step 6, outside "
            "the checkpoint: it is the state of the torchmetrics MeanMetric model.running") in fed["message"], fed["message"]
    assert not fed["state_census"]["metrics"]


@pytest.mark.slow
def test_state_a_trainer_checkpoints_outside_the_state_dict_is_kept_and_its_twins_lose_it(run):
    """on_save_checkpoint/on_load_checkpoint (the module's jitter generator) and a datamodule's
    state_dict/load_state_dict (its collate noise generator) are checkpointed as the Trainer does:
    the census finds nothing but the logged metric. Without the hooks the state is lost: each twin
    is RESUME_BROKEN, its generator the likely cause."""
    kept = run["lightning_state.kept"]
    assert [d["path"] for d in kept["state_census"]["differences"] if not d.get("metric")] == []
    for name, path in (("module_state_lost", "model.jitter"), ("datamodule_state_lost", "loader.collate_fn.__self__.noise")):
        m = run[f"lightning_state.{name}"]
        assert m["verdict"] == verdicts.RESUME_BROKEN, (name, m["message"])
        assert f"likely cause: {path} (torch.Generator) differs between A and C at step 6" in m["message"], m["message"]


@pytest.mark.slow
@pytest.mark.parametrize("name, resumes", [("kept", True), ("metric_in_loss", False), ("module_state_lost", False),
                                           ("datamodule_state_lost", False)])
def test_lightnings_own_trainer_resumes_what_reproci_calls_kept_and_not_what_it_calls_lost(tmp_path, name, resumes):
    """The same objects under a real Trainer: fit, save_checkpoint at the first epoch's end, resume
    fresh objects with fit(ckpt_path=...): the weights equal an uninterrupted fit's exactly where
    reproci said the resume is kept (a logged metric's counts notwithstanding), and only there."""
    installed("pytorch_lightning", "torchmetrics")
    from .plugins import lightning_state

    through = lightning_state.fit_through(name, str(tmp_path))
    resumed = lightning_state.fit(name, str(tmp_path))
    assert all(torch.equal(through[k], resumed[k]) for k in through) is resumes
