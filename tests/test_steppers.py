"""The training idioms the contract takes as written (``reproci/worker/steppers.py``,
``TrainSetup.accumulate``/``after_step``, ``ctx.steps``, ``loss_of``): several optimizers as
one, every kind of scheduler stepped as its library steps it, gradient accumulation exact at
every resume point, and a loss_fn that returns anything but a loss named in one line.

The unit tests use real torch optimizers and schedulers; the CLI tests run the plugins of
``tests/plugins/contract_idioms.py`` (HF transformers where the idiom is HF's) through
``reproci run`` and compare every record."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from reproci import verdicts
from reproci.worker.contract import ContractError, ModelContext, TrainSetup, loss_of, validate
from reproci.worker.steppers import EveryEpoch, Optimizers, Schedules

from .helpers import PLUGINS, Cli, model_entry
from .test_resume import sweep

IDIOMS = PLUGINS / "contract_idioms.py"
CLEAN = ("gpt2_accumulated", "plateau", "step_update_scheduler", "epoch_interval", "two_optimizers")
BROKEN = ("loss_none", "loss_per_sample", "gpt2_without_labels")


def _pair() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4, sparse=True), "head": nn.Linear(4, 1)})
    return model, torch.optim.SparseAdam(list(model["emb"].parameters()), lr=0.1), torch.optim.Adam(model["head"].parameters())


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model["head"](model["emb"](torch.tensor([1, 2, 3]))).sum().backward()
    opt.step()


def test_several_optimizers_are_one_whose_state_is_each_members_live_and_checkpointed() -> None:
    model, sparse, dense = _pair()
    both = Optimizers([sparse, dense])
    assert isinstance(both, torch.optim.Optimizer) and len(both.param_groups) == 2
    assert both.state == {}  # nothing yet: Adam's state appears at the first step
    _step(model, both)
    assert set(both.state) == {model["emb"].weight, model["head"].weight, model["head"].bias}  # seen at once
    saved = json.loads(json.dumps(both.state_dict(), default=lambda t: t.tolist()))
    assert len(saved["optimizers"]) == 2
    model2, sparse2, dense2 = _pair()
    again = Optimizers([sparse2, dense2])
    again.load_state_dict(both.state_dict())
    assert torch.equal(sparse2.state[model2["emb"].weight]["exp_avg"], sparse.state[model["emb"].weight]["exp_avg"])
    calls = []
    handle = both.register_step_pre_hook(lambda opt, args, kwargs: calls.append(opt))
    _step(model, both)
    handle.remove()
    _step(model, both)
    assert calls == [both, both]  # once per member, naming the whole


def test_a_list_of_one_optimizer_is_that_optimizer_and_a_list_of_schedulers_is_one_schedule() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    setup = validate(TrainSetup(model=model, optimizer=[opt], loader=[0], loss_fn=lambda m, b: 0,
                                scheduler=[sched]), "t")
    assert setup.optimizer is opt and isinstance(setup.scheduler, Schedules) and setup.scheduler.schedulers == [sched]


@pytest.mark.parametrize("bad, says", [
    ({"optimizer": ["adam"]}, "TrainSetup.optimizer is not a torch.optim.Optimizer, nor has its interface"),
    ({"scheduler": object()}, "TrainSetup.scheduler: object has no step()"),
    ({"accumulate": 0}, "TrainSetup.accumulate must be a whole number of micro-batches, at least 1"),
    ({"accumulate": 2.0}, "TrainSetup.accumulate must be a whole number"),
    ({"after_step": "ema"}, "TrainSetup.after_step is not callable"),
])
def test_the_new_fields_are_checked_with_a_line_that_says_what_to_give(bad, says) -> None:
    model = nn.Linear(2, 1)
    fields = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "loader": [0],
              "loss_fn": lambda m, b: 0, **bad}
    with pytest.raises(ContractError, match=f"^m: {says.replace('(', '[(]').replace(')', '[)]')}"):
        validate(TrainSetup(**fields), "m")


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no optimizer steps here
def test_each_kind_of_scheduler_is_stepped_as_its_library_steps_it() -> None:
    model = nn.Linear(2, 1)
    opts = [torch.optim.SGD(model.parameters(), lr=1.0) for _ in range(4)]
    per_step = torch.optim.lr_scheduler.LambdaLR(opts[0], lambda s: 0.5 ** s)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opts[1], factor=0.5, patience=0)
    epochly = torch.optim.lr_scheduler.StepLR(opts[2], step_size=1, gamma=0.1)

    class TimmLike:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def step(self, epoch: int, metric: float | None = None) -> None:
            self.calls.append(("step", epoch))

        def step_update(self, num_updates: int, metric: float | None = None) -> None:
            self.calls.append(("update", num_updates))

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    timm = TimmLike()
    s = Schedules.of([per_step, plateau, EveryEpoch(epochly), timm])
    assert s.problem() is None
    for step, loss in ((1, 1.0), (2, 2.0), (3, 3.0)):  # the loss rises: the plateau cuts from the second
        s.stepped(step, torch.tensor(loss))
    s.epoch_ended(0)
    s.stepped(4, torch.tensor(4.0))
    assert opts[0].param_groups[0]["lr"] == 0.5 ** 4
    assert opts[1].param_groups[0]["lr"] == 0.5 ** 3  # cut at the 2nd, 3rd and 4th (the epoch's plateau: none)
    assert opts[2].param_groups[0]["lr"] == pytest.approx(0.1)  # once, at the epoch's end
    assert timm.calls == [("update", 1), ("update", 2), ("update", 3), ("step", 1), ("update", 4)]
    restored = Schedules.of([torch.optim.lr_scheduler.LambdaLR(opts[3], lambda s: 0.5 ** s)])
    restored.load_state_dict({"schedulers": [per_step.state_dict()]})
    assert restored.schedulers[0].last_epoch == 4


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_plateau_scheduler_stepped_per_epoch_is_fed_the_new_epochs_first_loss() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    s = Schedules.of(EveryEpoch(plateau))
    s.stepped(1, torch.tensor(1.0))
    assert plateau.last_epoch == 0  # not per step
    s.epoch_ended(0)
    s.stepped(2, torch.tensor(1.0))
    s.epoch_ended(1)
    s.stepped(3, torch.tensor(2.0))
    assert plateau.last_epoch == 2 and opt.param_groups[0]["lr"] == 0.5


def test_the_loss_is_a_scalar_tensor_an_output_with_loss_or_a_dict_with_loss() -> None:
    t = torch.tensor([2.0])
    assert loss_of(t).shape == ()
    transformers = pytest.importorskip("transformers")
    assert loss_of(transformers.modeling_outputs.CausalLMOutput(loss=torch.tensor(1.5))) == 1.5
    assert loss_of({"loss": torch.tensor(3.0), "log": 1}) == 3.0
    for bad, says in ((None, "loss_fn returned NoneType"), (1.0, "loss_fn returned float"),
                      (torch.ones(3), r"loss_fn returned a loss of shape \(3,\)"),
                      (transformers.modeling_outputs.CausalLMOutput(logits=t), "whose loss is NoneType")):
        with pytest.raises(ContractError, match=says):
            loss_of(bad)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, dict]:
    cli = Cli(tmp_path_factory.mktemp("contract-idioms"))
    out = cli("run", *[a for name in (*CLEAN, *BROKEN) for a in ("-m", f"{IDIOMS}:{name}")], "--steps", "12")
    assert out.returncode == 4, out.stdout + out.stderr  # the broken loss_fns are ERRORs
    return cli, cli.latest()


def _record(run, name: str, role: str = "A") -> dict:
    cli, doc = run
    return json.loads((cli.cwd / "results" / doc["run_id"] / f"contract_idioms.{name}" / f"record-{role}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", CLEAN)
def test_models_written_with_these_idioms_are_reproducible_and_resume_exactly(run, name) -> None:
    entry = model_entry(run[1], f"contract_idioms.{name}")
    assert entry["verdict"] == verdicts.NEW, entry["message"]
    assert entry["message"].startswith("A = B = C: bitwise reproducible, resume exact"), entry["message"]
    assert _record(run, name, "C")["eval"] == _record(run, name)["eval"]  # the schedules resumed where they were


@pytest.mark.slow
def test_each_schedule_really_ran_to_its_end(run) -> None:
    """--steps 12, 4 batches an epoch: HF's linear schedule over ctx.steps ends at 0 (2
    micro-batches a step: 6 epochs); the plateau cut the rate; timm's protocol decayed by
    epoch 2 of 4; StepLR was stepped at the 2 epoch ends the run crossed."""
    assert _record(run, "gpt2_accumulated")["eval"] == {"lr0": 0.0}
    assert _record(run, "gpt2_accumulated")["accumulate"] == 2
    assert _record(run, "plateau")["eval"]["lr0"] < 0.05
    assert _record(run, "step_update_scheduler")["eval"]["lr0"] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert _record(run, "epoch_interval")["eval"]["lr0"] == pytest.approx(0.05 * 0.99 ** 12 * 0.5 ** 2)
    assert _record(run, "two_optimizers")["eval"] == pytest.approx({"lr0": 0.01 * 0.9 ** 12, "lr1": 0.01 * 0.9 ** 12})


@pytest.mark.slow
def test_both_optimizers_state_is_fingerprinted_and_hashed(run) -> None:
    record = _record(run, "two_optimizers")
    names = set(record["tensor_sha256"])
    assert {"optim:items.weight.exp_avg", "optim:items.weight.exp_avg_sq"} <= names  # SparseAdam's
    assert {"optim:head.0.weight.exp_avg", "optim:head.2.bias.exp_avg_sq"} <= names  # AdamW's
    assert "optim:items.weight.exp_avg" in record["tensor_names"]


@pytest.mark.slow
@pytest.mark.parametrize("name, says", [
    ("loss_none", "loss_fn returned NoneType; return the step's loss as a scalar tensor"),
    ("loss_per_sample", "loss_fn returned a loss of shape (4, 1); reduce it to a scalar (.mean() or .sum())"),
    ("gpt2_without_labels", "loss_fn returned CausalLMOutputWithCrossAttentions whose loss is NoneType"),
])
def test_a_loss_fn_that_returns_no_loss_is_one_contract_error_naming_it(run, name, says) -> None:
    entry = model_entry(run[1], f"contract_idioms.{name}")
    assert entry["verdict"] == verdicts.ERROR and entry["error"]["kind"] == "contract", entry
    assert entry["message"].startswith("run A: breaks the plugin contract: " + says), entry["message"]
    assert "\n" not in entry["message"] and "Traceback" not in entry["message"]


@pytest.mark.slow
def test_gradient_accumulation_resumes_exactly_at_every_step(tmp_path) -> None:
    """3 micro-batches a step over 4 batches an epoch: checkpoints inside and across epochs."""
    assert sweep(tmp_path, "accumulated_mlp", plugin=IDIOMS) == {k: None for k in range(1, 10)}


def _plain(steps: int, resume_at: int | None) -> dict:
    """A plain loop over the schedule-free plugin's parts; resumed at ``resume_at`` from the
    model's and the optimizer's own state_dicts, into new objects."""
    from .plugins import optimizer_like

    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=steps)
    model, opt, loader = optimizer_like._parts(ctx)
    step = 0
    for _ in range(2):
        for x, y in loader:
            if step == resume_at:
                saved = {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()
                model, opt, _ = optimizer_like._parts(ctx)  # the batches go on as they were
                model.load_state_dict(saved[0])
                opt.load_state_dict(saved[1])
            if step == steps:
                return model.state_dict()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            step += 1
    return model.state_dict()


def test_an_optimizer_with_torchs_interface_that_is_not_one_is_stepped_checkpointed_and_fingerprinted(tmp_path) -> None:
    """schedule-free's ScheduleFreeWrapper is not a torch.optim.Optimizer: it used to be refused
    as an ERROR. Its resume is exact in a plain loop (the ground truth here), and so is reproci's
    verdict: A = B = C, its state (the averaged iterate z) fingerprinted by parameter name."""
    from .plugins import optimizer_like

    plain, resumed = _plain(10, None), _plain(10, 5)
    assert all(torch.equal(plain[k], resumed[k]) for k in plain)
    setup = validate(optimizer_like.build(ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=4)),
                     "optimizer_like.py:build")
    assert isinstance(setup.optimizer, torch.optim.Optimizer)
    cli = Cli(tmp_path)
    out = cli("run", "-m", f"{PLUGINS / 'optimizer_like.py'}:build", "--steps", "12", "--resume-at", "10")
    assert out.returncode == 0, out.stdout + out.stderr
    entry = model_entry(cli.latest(), "optimizer_like")
    assert entry["verdict"] == verdicts.NEW and entry["message"].startswith("A = B = C"), entry.get("message")
    record = json.loads((cli.cwd / "results" / cli.latest()["run_id"] / "optimizer_like" / "record-A.json").read_text())
    assert {"optim:0.weight.z", "optim:2.bias.z"} <= set(record["tensor_names"]) & set(record["tensor_sha256"])
