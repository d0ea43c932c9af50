import numpy as np
import pytest
import torch

from reproci.worker.data import batchsum
from reproci.worker.data.batchsum import batch_checksum, contents_checksum
from reproci.worker.state.fingerprint import (
    ABSENT,
    FINGERPRINT_SCHEME,
    StepFingerprints,
    bit_checksum,
    initial_row,
    segment_sums,
)
from reproci.worker.state.state import final_hash, state_tensors, tensor_bytes
from reproci.worker.state.tensor_bits import flat_int


def test_checksum_is_exact_and_order_independent():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(1000, generator=torch.Generator().manual_seed(1))
    # A permutation has the same multiset of bit patterns: the integer sum cannot depend on order.
    assert bit_checksum(x).item() == bit_checksum(x[perm]).item()
    assert bit_checksum(x.view(10, 100).t()).item() == bit_checksum(x).item()


def test_one_ulp_changes_the_checksum():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[17] = torch.nextafter(y[17], torch.tensor(float("inf")))
    assert bit_checksum(x).item() != bit_checksum(y).item()


def test_checksum_handles_scalars_and_dtypes():
    for t in (torch.tensor(3.0), torch.tensor(5, dtype=torch.int64), torch.ones(3, dtype=torch.bfloat16),
              torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.float64), torch.tensor([True, False])):
        assert bit_checksum(t).dtype == torch.int64


def test_final_hash_covers_buffers_and_optimizer_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    digest, per = final_hash(model, opt)
    assert any(k.startswith("buffer:1.running_mean") for k in per)
    assert any(k.startswith("optim:0.weight.exp_avg") for k in per)
    with torch.no_grad():
        model[1].running_var[0] = torch.nextafter(model[1].running_var[0], torch.tensor(10.0))
    assert final_hash(model, opt)[0] != digest
    opt.state[model[0].weight]["exp_avg_sq"][0, 0] += 1e-30
    assert final_hash(model, opt)[1]["optim:0.weight.exp_avg_sq"] != per["optim:0.weight.exp_avg_sq"]


def _trained(make_optimizer, steps: int):
    """A small linear model trained ``steps`` steps, its fingerprints recorded after each."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(model.parameters())
    fps = StepFingerprints(model, opt)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        fps.record()
    return model, opt, fps


def test_step_fingerprints_rows_follow_training():
    _, _, fps = _trained(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), steps=3)
    rows = fps.to_lists()
    assert len(rows) == 3 and len(rows[0]) == len(fps.names)
    assert fps.names[:2] == ["param:weight", "param:bias"]
    assert "optim:weight.momentum_buffer" in fps.names
    assert rows[0] != rows[1]


def test_batch_checksum_sees_swapped_inputs():
    a, b = torch.randn(4), torch.randn(4)
    assert batch_checksum((a, b)).item() != batch_checksum((b, a)).item()
    assert batch_checksum({"x": a}).item() == batch_checksum({"x": a.clone()}).item()
    assert batch_checksum([object()]) is None  # nothing it can see: no checksum
    assert batch_checksum(["a", a]).item() != batch_checksum(["b", a]).item()  # strings are data too


def test_segment_sums_equal_per_tensor_checksums():
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(5, 3, generator=g), torch.tensor(2.5), torch.empty(0), torch.arange(7),
          torch.randn(4, generator=g).double(), torch.tensor([True, False, True]), torch.randn(9, generator=g)]
    got = segment_sums([flat_int(t) for t in ts]).tolist()
    assert got == [bit_checksum(t).item() if t.numel() else 0 for t in ts]


def test_fingerprints_follow_replaced_state_tensors():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    fps.record()
    with torch.no_grad():
        model.weight.data = model.weight.data + 1  # a new tensor, not an in-place update
    fps.record()
    rows = fps.to_lists()
    i = fps.names.index("param:weight")
    assert rows[0][i] != rows[1][i] and rows[1][i] == bit_checksum(model.weight).item()


def test_fingerprints_follow_in_place_updates_of_non_contiguous_buffers():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("t", torch.zeros(3, 2).t())  # non-contiguous

    model = M()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    fps.record()
    model.t.add_(1.0)
    fps.record()
    i = fps.names.index("buffer:t")
    rows = fps.to_lists()
    assert rows[0][i] != rows[1][i]


def test_checksums_wrap_exactly_on_overflow():
    big = torch.full((1001,), 2**31 - 1, dtype=torch.int32)
    expected = (1001 * (2**31 - 1) + 2**31) % 2**32 - 2**31
    assert bit_checksum(big).item() == expected
    assert segment_sums([flat_int(torch.ones(3)), flat_int(big)]).tolist()[1] == expected
    huge = torch.full((5,), 2**62, dtype=torch.int64)
    assert bit_checksum(huge).item() == segment_sums([huge]).item()


def test_batch_checksum_sees_rows_reordered_within_a_batch():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 8, 8, generator=g), torch.randint(10, (32,), generator=g)
    base = batch_checksum((x, y)).item()
    for seed in range(20):
        p = torch.randperm(32, generator=torch.Generator().manual_seed(seed))
        if torch.equal(p, torch.arange(32)):
            continue
        assert batch_checksum((x[p], y[p])).item() != base
    tokens = torch.arange(12).view(3, 4)
    assert batch_checksum(tokens).item() != batch_checksum(tokens.flip(1)).item()  # order within a row too
    assert batch_checksum((x.clone(), y.clone())).item() == base  # exact: equal bits, equal checksum


def test_batch_checksum_sees_one_ulp_and_handles_every_dtype():
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[50] = torch.nextafter(y[50], torch.tensor(float("inf")))
    assert batch_checksum(x).item() != batch_checksum(y).item()
    for t in (torch.tensor([2**62, -1]), torch.ones(3, dtype=torch.bfloat16), torch.tensor([True, False]),
              torch.arange(5, dtype=torch.uint8), torch.arange(-3, 3, dtype=torch.int8), torch.tensor(1.5)):
        assert batch_checksum(t).dtype == torch.int64
    assert batch_checksum(torch.tensor([2**40, 0])).item() != batch_checksum(torch.tensor([0, 2**40])).item()


@pytest.mark.parametrize("seed", range(3))
def test_the_cpu_batch_checksums_equal_the_reference_arithmetic(seed):
    """On the CPU both batch checksums run in numpy; their values are those of the torch
    ops every other device runs, for every width, sign, shape and extreme value."""
    g = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(64, 7, generator=g), torch.randn(3, 4, 5, generator=g).to(torch.bfloat16),
        torch.randint(-2**62, 2**62, (33, 6), generator=g), torch.tensor([2**63 - 1, -2**63, 0, -1]),
        torch.randint(0, 255, (17, 3), generator=g, dtype=torch.uint8), torch.rand(9, generator=g) > 0.5,
        torch.randint(-128, 127, (5, 2), generator=g, dtype=torch.int8), torch.randn(8, 3, generator=g).half(),
        torch.tensor(1.5), torch.zeros(0, 4), torch.randn(6, 2, generator=g, dtype=torch.float64),
        torch.randint(-2**31, 2**31 - 1, (40,), generator=g, dtype=torch.int32),
        torch.randn(4, 6, generator=g).t(),  # not contiguous
    ]
    for t in tensors:
        assert batchsum.cpu_checksum([t]) == batchsum.device_checksum([t]).item(), t.dtype
        assert batchsum.cpu_contents([t]) == batchsum.device_contents([t]).item(), t.dtype
    assert batchsum.cpu_checksum(tensors) == batchsum.device_checksum(tensors).item()
    assert batchsum.cpu_contents(tensors) == batchsum.device_contents(tensors).item()
    assert batch_checksum(tuple(tensors)).item() == batchsum.device_checksum(tensors).item()
    assert contents_checksum(tuple(tensors)).item() == batchsum.device_contents(tensors).item()
    # the device's fused form (a GPU step's), here on the CPU
    for ts in [[t] for t in tensors] + [tensors, tensors[::-1], tensors[3:7]]:
        both = batchsum.device_sums(ts)
        assert [v.item() for v in both] == [batchsum.device_checksum(ts).item(), batchsum.device_contents(ts).item()]


def test_position_weights_are_those_of_their_position_whatever_size_was_asked_first():
    """One weight array per device serves every size as a prefix: a small batch after a large
    one (and the reverse) reads the weights of its own positions, as the formula gives them."""
    def formula(n):
        pos = torch.arange(n, dtype=torch.int64)
        return (((pos * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1).to(torch.int32)

    for n in (5, 70_000, 3, 140_001, 64):
        assert torch.equal(batchsum._position_weights(n, torch.device("cpu")), formula(n))
        assert np.array_equal(batchsum.np_weights(n), formula(n).numpy())
    x = torch.arange(7, dtype=torch.int32)
    assert batch_checksum(x).item() == int((x.long() * formula(7).long()).sum()) % 2**32


def test_initial_row_sees_an_unseeded_initialisation():
    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        return model, torch.optim.Adam(model.parameters())
    names, row = initial_row(*build(0))
    assert names[0] == "param:0.weight" and "buffer:1.running_mean" in names
    assert initial_row(*build(0))[1].tolist() == row.tolist()
    other = initial_row(*build(1))[1].tolist()
    assert other[names.index("param:0.weight")] != row.tolist()[names.index("param:0.weight")]


def test_fingerprints_of_state_on_several_devices_are_grouped_per_device():
    """Adam's ``step`` is a CPU scalar beside the parameters. On a GPU that is two devices;
    here both are the CPU (no GPU on this machine), so this proves only that the grouping
    keeps rows in name order and exact; the CUDA case is unproven until run on a GPU."""
    model, opt, fps = _trained(torch.optim.Adam, steps=2)
    rows = fps.to_lists()
    tensors = {**{f"param:{n}": p for n, p in model.named_parameters()},
               **{f"grad:{n}": p.grad for n, p in model.named_parameters()}}
    for name in ("param:weight", "grad:bias", "optim:weight.step", "optim:bias.exp_avg_sq"):
        kind, _, rest = name.partition(":")
        t = tensors.get(name)
        if t is None:
            pname, _, key = rest.rpartition(".")
            t = opt.state[dict(model.named_parameters())[pname]][key]
        assert rows[-1][fps.names.index(name)] == bit_checksum(t).item(), name


class _ReassignedStats(torch.nn.Module):
    """A running mean kept as a buffer that is reassigned every forward, not updated in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("mean", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.mean(0)
        return self.lin(x - self.mean)


def _rows_follow_the_state(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> StepFingerprints:
    """Each row equals the checksums of the state as it is at that step, recomputed from scratch."""
    fps = StepFingerprints(model, opt)
    expected = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        fps.record()
        tensors = state_tensors(model, opt, with_grads=True)
        expected.append([bit_checksum(tensors[n]).item() if n in tensors else 0 for n in fps.names])
    assert fps.to_lists() == expected
    return fps


def test_a_reassigned_buffer_is_fingerprinted_as_it_is_at_every_step():
    torch.manual_seed(0)
    model = _ReassignedStats()
    fps = _rows_follow_the_state(model, torch.optim.SGD(model.parameters(), lr=0.1))
    col = fps.names.index("buffer:mean")
    assert len({row[col] for row in fps.to_lists()}) == 3  # a new value each step, not the first one repeated


def test_an_optimizer_that_replaces_its_state_tensors_is_followed():
    """Like HF's Adafactor, which assigns new tensors to some state entries each step."""

    class Replacing(torch.optim.SGD):
        def step(self, closure=None):  # noqa: ANN001
            super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    st = self.state[p]
                    st["rms"] = p.detach().pow(2).mean() + st.get("rms", torch.tensor(0.0))

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    fps = _rows_follow_the_state(model, Replacing(model.parameters(), lr=0.1))
    assert "optim:weight.rms" in fps.names


def test_sparse_gradients_are_fingerprinted_and_hashed_exactly():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
    fps = StepFingerprints(emb, opt)
    opt.zero_grad(set_to_none=True)
    emb(torch.tensor([1, 1, 4])).sum().backward()
    assert emb.weight.grad.is_sparse
    dense_grad = emb.weight.grad.to_dense()
    fps.record()
    opt.step()
    row = dict(zip(fps.names, fps.to_lists()[0]))
    assert row["grad:weight"] == bit_checksum(dense_grad).item() != 0
    # Hashed and dumped as its dense form: index 1 twice (uncoalesced) sums as the dense gradient does.
    assert tensor_bytes(emb.weight.grad) == tensor_bytes(emb.weight.grad.coalesce()) == dense_grad.numpy().tobytes()
    names, first = initial_row(emb, opt)
    assert first[names.index("param:weight")].item() == bit_checksum(emb.weight).item()
    digest, per = final_hash(emb, opt)
    exp_avg = opt.state[emb.weight]["exp_avg"]  # the rows the sparse step touched, one ULP moved
    exp_avg[1, 0] = torch.nextafter(exp_avg[1, 0], torch.tensor(1.0))
    again, per_again = final_hash(emb, opt)
    assert again != digest and [n for n in per if per[n] != per_again[n]] == ["optim:weight.exp_avg"]


def test_a_state_module_is_part_of_every_row_and_of_the_final_hash():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt, {"ema": ema})
    opt.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    ema.update_parameters(model)
    fps.record()
    assert "state:ema.module.weight" in fps.names and "state:ema.n_averaged" in fps.names
    before, without = final_hash(model, opt, {"ema": ema})[0], final_hash(model, opt)[0]
    assert before != without  # declared, the state module is hashed with the rest
    with torch.no_grad():
        ema.module.weight[0, 0] += 1.0
    assert final_hash(model, opt, {"ema": ema})[0] != before
    assert final_hash(model, opt)[0] == without  # undeclared, its change is not part of the hash


# -- gradients that exist at some steps only ---------------------------------------------------

class _Branchy(torch.nn.Module):
    """A trunk every step, and a branch on the steps ``use`` picks (its gradient exists then only)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(3, 1)
        self.branch = torch.nn.Linear(3, 1)
        self.use: bool | str = False  # True, False, or "zero": taken, but times 0 (an all-zero gradient)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.trunk(x)
        if self.use:
            y = y + self.branch(x) * (0.0 if self.use == "zero" else 1.0)
        return y


def _step(model: _Branchy, opt: torch.optim.Optimizer, fps: StepFingerprints | list[StepFingerprints], use: bool | str,
          seed: int) -> None:
    model.use = use
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()
    for f in fps if isinstance(fps, list) else [fps]:
        f.record()


def test_a_gradient_that_appears_at_step_3_is_fingerprinted_from_step_3():
    torch.manual_seed(0)
    model = _Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    for step, use in enumerate((False, False, True, False, True), start=1):
        _step(model, opt, fps, use, step)
        if step == 3:
            at_3 = bit_checksum(model.branch.weight.grad).item()
    assert "grad:branch.weight" in fps.names and "grad:branch.bias" in fps.names  # a column from the first row
    col = [row[fps.names.index("grad:branch.weight")] for row in fps.to_lists()]
    assert col[0] == col[1] == col[3] == ABSENT
    assert col[2] == at_3 and col[4] == bit_checksum(model.branch.weight.grad).item() and ABSENT not in (col[2], col[4])


def test_an_absent_gradient_and_an_all_zero_gradient_read_differently():
    torch.manual_seed(0)
    model = _Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    _step(model, opt, fps, False, 1)
    _step(model, opt, fps, "zero", 2)
    assert torch.count_nonzero(model.branch.weight.grad) == 0  # a gradient, all +0.0: checksum 0
    absent, zero = (row[fps.names.index("grad:branch.weight")] for row in fps.to_lists())
    assert (absent, zero) == (ABSENT, 0)


def test_runs_that_start_at_different_steps_carry_the_same_names_and_rows():
    """A run from scratch whose first step skips the branch, and one started at step 3 (a
    resumed run) whose first step takes it: the same columns, equal rows where both recorded."""
    torch.manual_seed(0)
    model = _Branchy()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    whole = StepFingerprints(model, opt)
    uses = (False, True, True, False, True)
    for step, use in enumerate(uses[:2], start=1):
        _step(model, opt, whole, use, step)
    later = StepFingerprints(model, opt)
    for step, use in enumerate(uses[2:], start=3):
        _step(model, opt, [whole, later], use, step)
    assert set(whole.names) == set(later.names)
    rows_whole = [dict(zip(whole.names, r)) for r in whole.to_lists()][2:]
    assert rows_whole == [dict(zip(later.names, r)) for r in later.to_lists()]
    assert rows_whole[1]["grad:branch.bias"] == ABSENT != rows_whole[0]["grad:branch.bias"]


def test_a_frozen_parameter_reads_absent_until_it_is_unfrozen():
    torch.manual_seed(0)
    model = _Branchy()
    model.branch.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    _step(model, opt, fps, True, 1)
    model.branch.requires_grad_(True)
    _step(model, opt, fps, True, 2)
    frozen, unfrozen = (row[fps.names.index("grad:branch.weight")] for row in fps.to_lists())
    assert frozen == ABSENT and unfrozen == bit_checksum(model.branch.weight.grad).item()


def test_the_device_path_reads_absent_gradients_as_the_cpu_path_does():
    """Off the CPU the checksums are segment sums over one concatenation whose layout changes
    with the gradients present; here that path is forced on CPU tensors (no GPU on this machine)
    and must give the numpy path's rows, step for step."""
    torch.manual_seed(0)
    model = _Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu, device = StepFingerprints(model, opt), StepFingerprints(model, opt)
    for step, use in enumerate((False, True, "zero", False, True, True), start=1):
        _step(model, opt, [cpu, device], use, step)
        for group in device._bindings[-1]:
            group.on_cpu = False  # every row after the first: the segment-sum path
    assert cpu.to_lists() == device.to_lists()
    assert ABSENT in sum(cpu.to_lists(), [])


def test_segment_sums_with_a_workspace_follow_a_changing_total():
    g = torch.Generator().manual_seed(0)
    big, small = torch.randn(50, generator=g), torch.randn(7, generator=g)
    workspace: dict = {}
    for ts in ([big, small], [small], [big, big, small], [torch.empty(0), small]):
        assert segment_sums([flat_int(t) for t in ts], workspace).tolist() == [bit_checksum(t).item() for t in ts]


def test_absent_is_the_value_the_host_side_compares():
    from reproci.golden import divergence

    assert divergence.ABSENT == ABSENT and divergence.FINGERPRINT_SCHEME == FINGERPRINT_SCHEME


def test_sparse_gradients_whose_sizes_change_from_step_to_step_keep_exact_columns():
    """A sparse gradient stores as many values as rows the step touched, so the arrays a row
    sums change size from step to step, here with the total unchanged (two tables trading
    rows): every row's gradient columns are still their dense gradients' checksums."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Embedding(10, 3, sparse=True), "b": torch.nn.Embedding(10, 3, sparse=True)})
    opt = torch.optim.SparseAdam(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)
    expected = []
    for ids_a, ids_b in (([1, 2], [3, 4, 5]), ([1, 2, 3], [4, 5]), ([7], [1, 2, 3, 4]), ([1, 2], [3, 4, 5])):
        opt.zero_grad(set_to_none=True)
        (model["a"](torch.tensor(ids_a)).sum() + model["b"](torch.tensor(ids_b)).sum()).backward()
        expected.append({f"grad:{n}": bit_checksum(model[n].weight.grad.to_dense()).item() for n in "ab"})
        fps.record()
        opt.step()
    rows = [dict(zip(fps.names, r)) for r in fps.to_lists()]
    assert [{k: r[k] for k in ("grad:a.weight", "grad:b.weight")} for r in rows] == [
        {"grad:a.weight": e["grad:a"], "grad:b.weight": e["grad:b"]} for e in expected]


def test_gradients_that_trade_sparse_and_dense_layouts_keep_exact_columns():
    """The layout a CPU row is summed in is named by which gradients are missing and by the
    size and place of each sparse one: two gradients that trade layouts between steps, with
    the same stored sizes, are not read in the other's layout."""
    model = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(4, 3)), "b": torch.nn.Parameter(torch.zeros(4, 3))})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fps = StepFingerprints(model, opt)

    def sparse(rows, value):
        idx = torch.tensor([rows])
        return torch.sparse_coo_tensor(idx, torch.full((len(rows), 3), value), (4, 3), check_invariants=True)

    expected = []
    for a, b in ((sparse([0, 1], 1.5), torch.full((4, 3), 2.0)), (torch.full((4, 3), 3.0), sparse([2, 3], 0.25)),
                 (None, sparse([0, 1], 1.5)), (sparse([1, 2], -1.0), None)):
        model["a"].grad, model["b"].grad = a, b
        expected.append([None if g is None else bit_checksum(g.to_dense()).item() for g in (a, b)])
        fps.record()
    rows = [dict(zip(fps.names, r)) for r in fps.to_lists()]
    assert [[r["grad:a"], r["grad:b"]] for r in rows] == [[ABSENT if v is None else v for v in e] for e in expected]


def test_tensors_of_reads_plain_containers_in_the_order_of_the_walk():
    """A tuple, list or dict of plain dense tensors is read without the walk, in the walk's
    order (a dict's keys sorted); any other batch goes through the walk as before."""
    from collections import namedtuple

    from reproci.worker.data import batchtree

    a, b, c = torch.arange(3), torch.ones(2, 2), torch.zeros(1, dtype=torch.float64)
    pair = namedtuple("Pair", "y x")
    batches = [(a, b, c), [c, a], {"z": a, "b": b, "a": c}, {2: a, 10: b}, pair(a, b), (a, 3, "s"),
               (torch.nn.Parameter(b), a), (b.to_sparse(), a), {"x": [a, b]}, [], {}]
    for batch in batches:
        walked = [batchsum._as_tensor(leaf) for _, leaf in batchtree.leaves(batch)]
        got = batchsum.tensors_of(batch)
        assert len(got) == len([w for w in walked if w is not None])
        for x, y in zip(got, [w for w in walked if w is not None]):
            assert x.dtype == y.dtype and x.layout == y.layout and torch.equal(x, y)


def test_a_device_step_is_fingerprinted_without_a_copy_to_the_host():
    """The state's rows stay on the device until the run ends (no wait for it per step). The
    meta device stands in for a GPU here: it has no data, so any copy to the host raises."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("meta")
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    fps = StepFingerprints(model, opt)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4, device="meta")).sum().backward()
        opt.step()
        fps.record()
    groups = [[getattr(part, "device", None) for part in row] for _, row, _ in fps.rows]
    # Adam's step counts are CPU scalars beside the parameters: their group's row is numpy
    assert groups == [[torch.device("meta"), "cpu"]] * 3 or groups == [["cpu", torch.device("meta")]] * 3
