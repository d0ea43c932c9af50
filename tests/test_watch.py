"""StateWatch answers what ``state_identity`` answers, every step, without walking the tree
when nothing moved."""

import collections

import pytest
import torch

from reproci.worker.state import watch
from reproci.worker.state.state import state_identity
from reproci.worker.state.watch import StateWatch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2, bias=False))
        self.register_buffer("mean", torch.zeros(2))


def _setup():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters())
    ema = torch.nn.Linear(3, 4)
    return model, opt, {"ema": ema}


def _step(model, opt):
    model.body(torch.randn(5, 3)).sum().backward()
    opt.step()
    opt.zero_grad()


MUTATIONS = {
    "an in-place update": lambda m, o, s: (_step(m, o), m.mean.add_(1)),
    "a buffer reassigned": lambda m, o, s: setattr(m, "mean", m.mean * 0.9),
    "a parameter's .data swapped": lambda m, o, s: setattr(m.body[0].weight, "data", torch.randn(4, 3)),
    "a child replaced": lambda m, o, s: m.body.__setitem__(1, torch.nn.BatchNorm1d(4)),
    "a child added": lambda m, o, s: setattr(m, "extra", torch.nn.Linear(1, 1)),
    "a parameter set to None": lambda m, o, s: setattr(m.body[0], "bias", None),
    "optimizer state replaced": lambda m, o, s: o.state[m.body[2].weight].__setitem__("exp_avg", torch.zeros(2, 4)),
    "a parameter group added": lambda m, o, s: o.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}),
    "a state module's tensor reassigned": lambda m, o, s: setattr(s["ema"], "weight", torch.nn.Parameter(torch.ones(4, 3))),
    "a slot dictionary replaced whole": lambda m, o, s: m.__dict__.__setitem__(
        "_buffers", collections.OrderedDict(mean=torch.ones(2))),
    "an int in optimizer state counting": lambda m, o, s: o.state[m.body[2].weight].__setitem__(
        "count", o.state[m.body[2].weight].get("count", 0) + 1),
    "an int in optimizer state become a tensor": lambda m, o, s: o.state[m.body[2].weight].__setitem__(
        "count", torch.tensor(1)),
    "nothing": lambda m, o, s: None,
}


def test_it_agrees_with_the_walk_after_every_kind_of_change():
    """After each change (and after each change followed by nothing), ``changed()`` is
    whether ``state_identity`` changed: every way a tensor can move shows, nothing else does."""
    model, opt, mods = _setup()
    _step(model, opt)
    w = StateWatch(model, opt, mods)
    assert w.changed()  # the first call: nothing seen yet
    before = state_identity(model, opt, mods)
    for name, mutate in MUTATIONS.items():
        for _ in range(2):  # the change, then the same again (an int counts on; the rest stands)
            mutate(model, opt, mods)
            now = state_identity(model, opt, mods)
            assert w.changed() == (now != before), name
            before = now
            mutate = MUTATIONS["nothing"] if name != "an int in optimizer state counting" else mutate


def test_nothing_moved_costs_no_walk(monkeypatch):
    """Steps that only update in place (and count in a Python int) never walk the tree again."""
    model, opt, mods = _setup()
    w = StateWatch(model, opt, mods)
    _step(model, opt)
    w.changed()
    walks = []
    monkeypatch.setattr(watch, "state_identity", lambda *a: walks.append(1) or state_identity(*a))
    for i in range(5):
        _step(model, opt)
        opt.state[model.body[2].weight]["count"] = i
        assert not w.changed()
    assert walks == [1]  # the int appeared once (a new slot), then only counted


@pytest.mark.parametrize("sparse", [False, True])
def test_a_sparse_tensor_in_the_state_is_watched_by_identity(sparse):
    """A sparse tensor has no data pointer: it is watched by which object it is."""
    model = torch.nn.Embedding(10, 3, sparse=sparse)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.register_buffer("counts", torch.zeros(10).to_sparse() if sparse else torch.zeros(10))
    w = StateWatch(model, opt)
    assert w.changed()
    assert not w.changed()
    model.counts = model.counts * 2
    assert w.changed()
