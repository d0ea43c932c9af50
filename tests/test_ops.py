"""The first differing op: every aten op of a step recorded with its module, source line and
output digest, and two recordings compared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from reproci import verdicts
from reproci.golden.ops import first_op_difference
from reproci.worker.audit.oprecord import OpRecorder, digest

from .helpers import model_entry

MODEL = '''
import torch


class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x, noise):
        h = self.proj(x)
        return h + noise  # line 12


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()), Pool()
'''


def load_model(tmp_path: Path):
    path = tmp_path / "usermodel.py"
    path.write_text(MODEL)
    spec = importlib.util.spec_from_file_location("usermodel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["usermodel"] = module
    spec.loader.exec_module(module)
    return module.build()


def record(tmp_path: Path, noise: float) -> dict:
    stem, pool = load_model(tmp_path)
    model = torch.nn.ModuleDict({"stem": stem, "pool": pool})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, extra = torch.arange(6.0).reshape(2, 3), torch.full((2, 3), noise)  # made outside: not an op of the step
    with OpRecorder(model, opt) as rec:
        loss = model["pool"](model["stem"](x), extra).square().mean()
        loss.backward()
        opt.step()
    return {"rows": rec.rows, "kept": rec.kept}


def test_ops_carry_module_source_line_and_pass(tmp_path):
    rows = record(tmp_path, 0.0)["rows"]
    add = next(r for r in rows if r["op"] == "add" and r["phase"] == "forward")
    assert add["module"] == "pool" and add["where"] == "usermodel.py:12 (forward)"
    assert any(r["phase"] == "backward" and r["module"] == "pool.proj" for r in rows)  # from the forward op's node
    assert any(r["phase"] == "optimizer" for r in rows)
    assert all(len(r["digest"]) >= 24 for r in rows)


def test_the_first_op_whose_output_differs_is_named_with_its_magnitude(tmp_path):
    a, b = record(tmp_path, 0.0), record(tmp_path, 2.0 ** -20)
    d = first_op_difference(a, b)
    assert d["found"] and d["op"] == "aten::add" and d["module"] == "pool" and d["phase"] == "forward"
    assert d["source"] == "usermodel.py:12 (forward)" and d["max_abs"] == pytest.approx(2.0 ** -20, rel=1e-3)
    assert all(ra["digest"] == rb["digest"] for ra, rb in zip(a["rows"][:d["index"]], b["rows"][:d["index"]]))
    text = verdicts.op_text(d)
    assert text.startswith("aten::add in pool at usermodel.py:12 (forward), forward pass, max |Δ| 9.54e-07")


def test_identical_steps_and_a_changed_op_sequence(tmp_path):
    a = record(tmp_path, 0.0)
    assert first_op_difference(a, record(tmp_path, 0.0)) == {"found": False, "ops": len(a["rows"])}
    b = {"rows": [dict(r) for r in a["rows"]], "kept": {}}
    b["rows"][3]["overload"] = "aten.mul.Tensor"
    d = first_op_difference(a, b)
    assert d["kind"] == "sequence" and d["index"] == 3
    assert "the ops themselves differ from op 3" in verdicts.op_text(d)
    assert "entered outside" in verdicts.op_text({"found": False, "ops": 10})


def test_digests_see_one_ulp_and_dtype():
    x = torch.ones(4)
    y = x.clone()
    y[2] = torch.nextafter(y[2], torch.tensor(2.0))
    assert digest(x) != digest(y) and digest(x) == digest(x.clone()) and digest(x) != digest(x.double())


@pytest.mark.slow
def test_a_clock_seeded_run_names_the_dropout_op_and_its_line(reproci):
    p = reproci("run", "-m", "transformer", "--steps", "4", "--resume-at", "2", "--fault", "clock-seed")
    assert p.returncode == 1, p.stderr
    ev = model_entry(reproci.latest(), "transformer")["evidence"]
    op = ev["op"]
    assert op["found"] and op["op"] == "aten::bernoulli_" and op["phase"] == "forward"
    assert op["module"] == "drop" and op["source"].startswith("transformer.py:")
    assert "first differing op: aten::bernoulli_ in drop at transformer.py:" in p.stdout


@pytest.mark.slow
def test_a_drift_after_the_optimizer_is_outside_every_op(reproci):
    p = reproci("run", "-m", "conv", "--steps", "6", "--resume-at", "3", "--fault", "buffer-drift")
    assert p.returncode == 1, p.stderr
    op = model_entry(reproci.latest(), "conv")["evidence"]["op"]
    assert op["found"] is False and op["ops"] > 10


def _step_with_a_logged_value(log_noise: float, loss_noise: float) -> dict:
    """One recorded step: a logged statistic first, then the loss; each perturbed on demand."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log = torch.zeros(())
    x = torch.ones(4, 3)
    with OpRecorder(model, opt) as rec:
        out = model(x)
        log.add_(out.detach().mean() + log_noise)  # read by neither the loss nor the gradients
        loss = (out + loss_noise).pow(2).mean()
        loss.backward()
        opt.step()
        rec.mark_loss(loss.detach())
    rows = [{**r, "on_path": m} for r, m in zip(rec.rows, rec.on_path())]
    return {"rows": rows, "kept": rec.kept}


def test_the_op_named_is_the_first_the_loss_or_gradients_read():
    a = _step_with_a_logged_value(0.0, 0.0)
    b = _step_with_a_logged_value(1.0, 0.5)  # the log differs first, the loss later
    op = first_op_difference(a, b)
    line = _step_with_a_logged_value.__code__.co_firstlineno
    assert op["found"] and op["phase"] == "forward" and op["source"].startswith(f"test_ops.py:{line + 10} "), op
    assert op["aside"]["source"].startswith(f"test_ops.py:{line + 9} ") and op["index"] > op["aside"]["index"], op
    assert "neither the loss nor the gradients read it" in verdicts.op_text(op)
    only_log = first_op_difference(a, _step_with_a_logged_value(1.0, 0.0))
    assert only_log["found"] and only_log["source"].startswith(f"test_ops.py:{line + 9} ") and "aside" not in only_log


@pytest.mark.parametrize("parts", [1, 2])
def test_the_training_step_records_the_ops_of_the_users_step_and_no_more(parts):
    """A golden's per-op hashes are the ops of the user's step: reproci's step (``train_step``)
    adds none of its own inside the recording (a view of the scalar loss before the backward, the
    loss detached before the optimizer's step), so goldens recorded before it still line up op
    for op; with gradient accumulation, the micro-batches' losses are taken after the step too."""
    from reproci.worker.contract import TrainSetup
    from reproci.worker.data.batches import Accumulated
    from reproci.worker.train import train_step

    def by_hand() -> list[str]:
        torch.manual_seed(0)
        model, x = torch.nn.Linear(3, 2), torch.arange(6.0).reshape(2, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with OpRecorder(model, opt) as rec:
            opt.zero_grad(set_to_none=True)
            losses = []
            for _ in range(parts):
                loss = model(x).square().mean()
                (loss / parts if parts > 1 else loss).backward()
                losses.append(loss)
            opt.step()
            total = losses[0].detach()
            for more in losses[1:]:
                total = total + more.detach()
            _ = total / parts if parts > 1 else total
        return [r["op"] for r in rec.rows]

    def by_reproci() -> list[str]:
        torch.manual_seed(0)
        model, x = torch.nn.Linear(3, 2), torch.arange(6.0).reshape(2, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        setup = TrainSetup(model=model, optimizer=opt, loss_fn=lambda m, b: m(b).square().mean(), loader=[])
        with OpRecorder(model, opt) as rec:
            train_step(setup, model, Accumulated([x] * parts) if parts > 1 else x, step=1)
        return [r["op"] for r in rec.rows]

    assert by_reproci() == by_hand()
