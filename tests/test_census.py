"""The state census (``reproci/worker/state/census.py``, compared by ``reproci/stages/census.py``):
private state found where users keep it, named by path and type, never the harness's own or
the checkpoint's; through the real CLI, each buggy model beside a twin that declares its state."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from torch import nn

from reproci import plugins, verdicts
from reproci.golden.divergence import first_divergence
from reproci.stages.determinism import census as compare
from reproci.worker.contract import ModelContext, TrainSetup
from reproci.worker.record import RunRecord
from reproci.worker.state import census
from reproci.worker.state.state import transient_buffers

from .helpers import PLUGINS, Cli, installed, run_record


def _setup(**kw) -> TrainSetup:
    model = kw.pop("model", None) or nn.Linear(2, 1)
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
    assert items["loss_fn.<shadow>"]["kind"] == "module" and items["loss_fn.<shadow>"]["type"] == "Linear"
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


def _shadow_item(shadow: nn.Module) -> dict:
    def loss_fn(m, b):
        return (m(b[0]) - shadow(b[0])).pow(2).mean()

    return census.take(_setup(loss_fn=loss_fn))["loss_fn.<shadow>"]


def test_a_module_outside_the_checkpoint_is_one_item_of_its_whole_state():
    """An EMA or teacher kept in a closure: hashed by its state dict, so another object with the
    same state gives the same item, and one bit of a parameter or a buffer changes it."""
    shadow = nn.BatchNorm1d(2)
    first = _shadow_item(shadow)
    assert first["kind"] == "module" and first["type"] == "BatchNorm1d"
    assert _shadow_item(copy.deepcopy(shadow)) == first  # two censuses of two objects
    for name in ("bias", "running_var"):
        nudged = copy.deepcopy(shadow)
        getattr(nudged, name).data.view(torch.int32)[1] ^= 1  # one bit
        assert _shadow_item(nudged)["sha"] != first["sha"], name


NOISE = torch.Generator().manual_seed(5)  # module state of the user's code, named by the loss below
SEEN = {"calls": 0}


def _loss_reading_globals(m, b):
    SEEN["calls"] += 1
    jitter = (lambda x: x + 0.01 * torch.randn(x.shape, generator=NOISE))  # noqa: E731 - named only by a nested function
    return (m(jitter(b[0])) - b[1]).pow(2).mean()


def test_the_census_walks_the_module_globals_a_users_function_names():
    items = census.take(_setup(loss_fn=_loss_reading_globals))
    assert items["loss_fn.<global NOISE>"]["kind"] == "rng" and items["loss_fn.<global NOISE>"]["type"] == "torch.Generator"
    assert items["loss_fn.<global SEEN>['calls']"]["value"] == "0"
    NOISE.manual_seed(6)
    assert census.take(_setup(loss_fn=_loss_reading_globals))["loss_fn.<global NOISE>"] != items["loss_fn.<global NOISE>"]
    # a library's function: its module's globals are the library's, not the plugin's state
    library = census.take(_setup(after_step=json.dumps))
    assert not [p for p in library if p.startswith("after_step")], library


class _Stepping(nn.Module):
    """State a user's submodule keeps beside its parameters, outside the state dict."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1)
        self._noise = torch.Generator().manual_seed(3)  # private, of the user's own class
        self._scale = torch.full((), 2.0)
        self.steps = 4  # a step counter the forward would read
        self.rate = 0.5
        self.verbose = True  # a flag: not state worth comparing
        self.history = [torch.zeros(1), torch.ones(1)]


class _OwnLinear(nn.Linear):
    """A user's subclass of a torch module: torch's private attributes stay torch's."""

    def __init__(self) -> None:
        super().__init__(2, 1)
        self.seen = 7
        self._torch_like = 1


def test_the_census_takes_submodule_state_the_state_dict_leaves_out():
    model = nn.Sequential(_Stepping(), _OwnLinear())
    model.register_buffer("window", torch.arange(3.0), persistent=False)
    items = census.take(_setup(model=model, state_modules={"ema": _Stepping()}))
    assert items["model.0._noise"]["kind"] == "rng"
    assert items["model.0._scale"]["type"] == "Tensor[float32, ()]"
    assert items["model.0.steps"]["value"] == "4" and items["model.0.rate"]["value"] == "0.5"
    assert items["model.0.history[1]"]["kind"] == "tensor" and items["model.window"]["kind"] == "tensor"
    assert items["model.1.seen"]["value"] == "7"
    assert items["state_modules.ema._noise"]["kind"] == "rng" and items["state_modules.ema.steps"]["value"] == "4"
    model[0].steps += 1
    model[0]._noise.seed()
    again = census.take(_setup(model=model))
    assert again["model.0.steps"]["value"] == "5" and again["model.0._noise"]["sha"] != items["model.0._noise"]["sha"]
    # never torch's own bookkeeping, a torch class's private or plain attributes, or a flag
    assert "model.0.lin.in_features" not in items and "model.1.in_features" in items  # a user's class: its own numbers
    assert not [p for p in items if p.startswith("model.") and p.rsplit(".", 1)[-1] in (
        "_parameters", "_buffers", "_modules", "training", "_torch_like", "verbose", "weight", "bias")], items


def test_a_second_loader_drawn_by_hand_is_named_by_its_generator_and_position():
    aux = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2, shuffle=True,
                                      generator=torch.Generator().manual_seed(2))
    held = {"it": iter(aux)}
    setup = _setup(after_step=lambda step: (aux, next(held["it"])))
    before = census.take(setup)
    setup.after_step(0)
    after = census.take(setup)
    assert before["after_step.<aux>.generator"]["kind"] == "rng"
    assert before["after_step.<aux>.dataset.tensors[0]"]["kind"] == "tensor"
    assert (before["after_step.<held>['it']._num_yielded"]["value"], after["after_step.<held>['it']._num_yielded"]["value"]) \
        == ("0", "1")
    assert after["after_step.<aux>.generator"]["sha"] != before["after_step.<aux>.generator"]["sha"]  # the epoch's order drawn
    # the training loader, reached from a closure: its generator is checkpointed, its parts named from the loader
    own = _setup()
    loader = own.loader
    own.loss_fn = lambda m, b: (m(b[0]) - b[1]).pow(2).mean() + 0 * len(loader)
    assert not [p for p in census.take(own) if p.startswith("loss_fn") or "generator" in p]


def _record(k: int, resume: dict, next_: dict | None = None) -> RunRecord:
    return run_record(census={"at": k, "resume": {"items": resume},
                              "next": {"items": next_ if next_ is not None else resume}})


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


def test_a_cache_filled_lazily_from_the_inputs_is_derived_and_lost_entries_are_not():
    """A dataset's dict of prepared samples: A holds every sample it has read, C those read since
    the resume; the entries both hold agree, so the rest is derived, not lost. An entry both hold
    that differs, or a container of which C holds nothing, is lost state."""
    def entry(sha: str) -> dict:
        return {"kind": "tensor", "type": "Tensor[float32, (8,)]", "sha": sha}

    filled = {f"loader.dataset.cache[{i}][0]": entry(f"x{i}") for i in range(8)}
    since_resume = {p: v for p, v in filled.items() if p[len("loader.dataset.cache["):][0] in "25"}
    a, c = _record(6, filled, filled), _record(6, {}, since_resume)
    assert compare.differences(a, c) == []
    changed = {**since_resume, "loader.dataset.cache[2][0]": entry("other")}  # a shared entry that differs
    found = compare.differences(a, _record(6, {}, changed))
    assert "loader.dataset.cache[2][0]" in [d.path for d in found] and len(found) == 7
    history = {f"after_step.<log>[{i}]": entry(f"h{i}") for i in range(3)}  # nothing of it in C
    assert [d.path for d in compare.differences(_record(6, history), _record(6, {}))] == list(history)


def _resumed(rows: list, inv_freq: int, *, transient: bool) -> dict:
    names = ["param:w", "grad:w", "buffer:rotary.inv_freq", "optim:w.m"]
    return {"tensor_names": names, "fingerprints": rows, "start_step": 2, "batch_fingerprints": [0] * len(rows),
            "losses": [1.0] * len(rows), "final_sha256": "f", "tensor_sha256": {},
            "initial_fingerprint": {"step": 2, "names": ["param:w", "buffer:rotary.inv_freq", "optim:w.m"],
                                    "row": [2, inv_freq, 2], "transient": ["buffer:rotary.inv_freq"] if transient else []}}


def test_a_non_persistent_buffer_rewritten_by_the_next_forward_is_no_restore_difference():
    """C's freshly loaded state against A's at the resume point: a non-persistent buffer (no
    checkpoint holds one) that differs there and agrees after step k+1 was recomputed from the
    batch (a rotary embedding's ``inv_freq``); one that still differs there is lost."""
    a = {**_resumed([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4]], 0, transient=True), "start_step": 0}
    a.pop("initial_fingerprint")
    assert first_divergence(a, _resumed([[3, 3, 3, 3], [4, 4, 4, 4]], 9, transient=True)) is None
    persistent = first_divergence(a, _resumed([[3, 3, 3, 3], [4, 4, 4, 4]], 9, transient=False))
    assert (persistent.step, persistent.cause, persistent.tensor) == (2, "restore", "buffer:rotary.inv_freq")
    lost = first_divergence(a, _resumed([[3, 3, 8, 3], [4, 4, 8, 4]], 9, transient=True))
    assert (lost.step, lost.cause, lost.tensor) == (2, "restore", "buffer:rotary.inv_freq")
    # what the worker marks as such: the non-persistent buffers, by the names the rows carry
    rotary = nn.Module()
    rotary.register_buffer("inv_freq", torch.ones(2), persistent=False)
    rotary.register_buffer("table", torch.ones(2))
    assert transient_buffers(nn.Sequential(nn.Linear(2, 2), rotary)) == ["buffer:1.inv_freq"]


CENSUS = PLUGINS / "census.py"
BUGGY = ("ema_after_step_hidden", "loss_ema_in_scheduler_hidden", "bucketing_sampler_hidden", "warmup_counter",
         "metrics_unsaved")
FIXED = ("ema_after_step_declared", "loss_ema_in_scheduler_declared", "bucketing_sampler_declared")
# clean models a plain resume loop proves clean, each beside a twin that really loses state
CLEAN = ("dataset_cache", "rotary_recomputed", "aux_loader_declared", "submodule_state_declared")
LOSING = ("dataset_cache_and_counter", "rotary_smoothed", "aux_loader_hidden", "submodule_state_hidden")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cli = Cli(tmp_path_factory.mktemp("census"))
    refs = [a for m in (*BUGGY, *FIXED, "logging_counter", *CLEAN, *LOSING) for a in ("-m", f"{CENSUS}:{m}")] + [
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
def test_derived_state_passes_and_state_really_lost_beside_it_is_resume_broken_and_named(run):
    """A dataset's cache filled as it reads (A holds more entries than C), a non-persistent rotary
    buffer rewritten each forward (C's differs where it resumes), a second loader and a submodule's
    private generator and step counter declared through the extra state: A = B = C, nothing
    differs. Their twins lose state, and the census names it: the dataset's count of reads beside
    its cache, the buffer carried from step to step, the second loader's generator and position,
    the submodule's private generator and counter."""
    for name in CLEAN:
        m = run[name]
        assert m["verdict"] == verdicts.NEW and m["message"].startswith("A = B = C"), (name, m["message"])
        assert m["state_census"]["differences"] == [] and not m["state_census"]["notice"], (name, m["state_census"])
    causes = {
        "dataset_cache_and_counter": ["likely cause: loader.dataset.reads (int) differs between A and C at step 6"],
        "aux_loader_hidden": ["likely cause: loss_fn.<aux>.generator (torch.Generator) differs between A and C at step 6",
                              "loss_fn.<held>['it']._num_yielded"],
        "submodule_state_hidden": ["likely cause: model.0._noise (torch.Generator) differs between A and C at step 6",
                                   "model.0.steps"],
    }
    for name, said in causes.items():
        m = run[name]
        assert m["verdict"] == verdicts.RESUME_BROKEN and m["evidence"]["cause"] != "census", (name, m["message"])
        assert all(s in m["message"] for s in said), (name, m["message"])
    counter = run["submodule_state_hidden"]["state_census"]["differences"]
    assert {"path": "model.0.steps", "sides": "A 6, C 0"}.items() <= next(d for d in counter if d["path"] == "model.0.steps").items()
    assert not [d for d in run["dataset_cache_and_counter"]["state_census"]["differences"] if ".cache[" in d["path"]]
    smoothed = run["rotary_smoothed"]
    assert smoothed["verdict"] == verdicts.RESUME_BROKEN, smoothed["message"]
    assert (smoothed["evidence"]["step"], smoothed["evidence"]["cause"], smoothed["evidence"]["tensor"]) == \
        (6, "restore", "buffer:0.inv_freq"), smoothed["evidence"]


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
    from reproci.golden.divergence import Divergence

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
    from reproci.reports import build

    kept = run["lightning_state.kept"]
    assert kept["verdict"] == verdicts.NEW and kept["message"].startswith("A = B = C"), kept["message"]
    warning = kept["state_census"]["metrics"]
    assert warning.startswith("the state of model.train_acc (torchmetrics MulticlassAccuracy: fn, fp, tn, tp) differs "
                              "between A and C at step 6"), warning
    assert warning.endswith("call model.train_acc.persistent(True)"), warning
    flat = " ".join(run["reports"]["stderr"].split())
    assert f"warning: lightning_state.kept: {' '.join(warning.split())}" in flat, run["reports"]["stderr"]
    assert f"- ⚠️ **lightning_state.kept**: {warning}" in build.markdown_report(run["reports"]["doc"], plugins.stages())
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
