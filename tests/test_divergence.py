import numpy as np
import torch

from reproci.golden.divergence import first_divergence, tensor_magnitude, ulp_distance


def record(rows, *, start=0, batches=None, losses=None, final="f", names=("param:w", "grad:w", "buffer:b", "optim:w.m")):
    return {"tensor_names": list(names), "fingerprints": rows, "start_step": start,
            "batch_fingerprints": batches or [0] * len(rows), "losses": losses or [1.0] * len(rows),
            "final_sha256": final, "tensor_sha256": {}}


def test_identical_records_agree():
    rows = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert first_divergence(record(rows), record(rows)) is None


def test_first_step_and_causal_first_tensor():
    a = record([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]], final="x")
    b = record([[1, 2, 3, 4], [6, 7, 7, 9], [0, 0, 0, 0]], final="y")
    d = first_divergence(a, b)
    assert d.step == 2
    assert d.tensor == "grad:w"  # the gradient is produced before the optimizer state and the parameter
    assert d.differing_tensors == 3
    assert d.cause == "compute"


def test_buffer_before_grad_and_data_cause():
    a = record([[1, 2, 3, 4]], batches=[10], final="x")
    b = record([[1, 9, 9, 4]], batches=[11], final="y")
    d = first_divergence(a, b)
    assert d.tensor == "buffer:b" and d.cause == "data"


def test_resumed_run_is_compared_on_common_steps():
    a = record([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], final="x")
    c = record([[2, 2, 2, 2], [3, 3, 3, 4]], start=1, final="y")
    d = first_divergence(a, c)
    assert d.step == 3 and d.tensor == "optim:w.m"


def test_loss_equal_but_buffer_drifted_is_a_divergence():
    a = record([[1, 2, 3, 4]], losses=[0.5], final="x")
    b = record([[1, 2, 30, 4]], losses=[0.5], final="y")
    d = first_divergence(a, b)
    assert d is not None and d.losses_equal and d.tensor == "buffer:b"


def test_final_only_difference_is_reported():
    a = record([[1, 2, 3, 4]], final="x")
    a["tensor_sha256"] = {"param:w": "1", "buffer:b": "2"}
    b = record([[1, 2, 3, 4]], final="y")
    b["tensor_sha256"] = {"param:w": "1", "buffer:b": "3"}
    d = first_divergence(a, b)
    assert d.step is None and d.tensor == "buffer:b"


def test_ulp_distance_crosses_zero_and_counts_neighbours():
    x = np.array([1.0, -0.0, 0.0], dtype=np.float32)
    y = np.array([np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, np.float32(1e-45)], dtype=np.float32)
    assert ulp_distance(x, y).tolist() == [1, 0, 1]
    assert ulp_distance(np.array([-1e-45], np.float32), np.array([1e-45], np.float32)).tolist() == [2]


def test_tensor_magnitude():
    a = torch.zeros(10)
    b = a.clone()
    b[3] = 0.25
    m = tensor_magnitude(a, b)
    assert m["max_abs"] == 0.25 and m["elements_differing"] == 1 and m["max_ulp"] > 1e9


def _with_initial(rec, step, row, names=("param:w", "buffer:b")):
    return {**rec, "initial_fingerprint": {"step": step, "names": list(names), "row": row}}


def test_initial_state_difference_is_step_zero_and_named_init():
    a = _with_initial(record([[1, 2, 3, 4]], final="x"), 0, [7, 8])
    b = _with_initial(record([[1, 2, 3, 5]], final="y"), 0, [7, 9])
    d = first_divergence(a, b)
    assert d.step == 0 and d.cause == "init" and d.tensor == "buffer:b"


def test_resumed_state_is_compared_with_the_row_at_the_resume_point():
    a = record([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], final="x")
    c = _with_initial(record([[3, 3, 3, 3]], start=2, final="x"), 2, [2, 2, 5], names=("param:w", "buffer:b", "optim:w.m"))
    d = first_divergence(a, c)
    assert d.step == 2 and d.cause == "restore" and d.tensor == "optim:w.m"
    ok = _with_initial(record([[3, 3, 3, 3]], start=2, final="x"), 2, [2, 2, 2], names=("param:w", "buffer:b", "optim:w.m"))
    assert first_divergence(a, ok) is None


def test_batch_checksums_of_different_schemes_are_not_compared():
    a = {**record([[1, 2, 3, 4]], batches=[10], final="x"), "batch_checksum": "position-weighted-v2"}
    b = record([[1, 9, 9, 4]], batches=[11], final="y")  # an older record
    assert first_divergence(a, b).cause == "unknown"


def _with_contents(rec, epochs, contents):
    return {**rec, "batch_epochs": epochs, "batch_contents": contents, "batch_contents_scheme": "row-multiset-v1"}


def test_a_batch_difference_says_reorder_order_or_contents():
    rows = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    other = [[1, 2, 3, 4], [5, 7, 7, 8], [9, 8, 9, 9]]
    epochs = [0, 0, 1]
    a = _with_contents(record(rows, batches=[1, 2, 3], final="x"), epochs, [10, 20, 30])
    # the same rows of batch 2, in another order within it
    b = _with_contents(record(other, batches=[1, 5, 3], final="y"), epochs, [10, 20, 30])
    assert first_divergence(a, b).data == "reordered"
    # epoch 0's samples regrouped across its batches: the epoch's sum of contents is the same
    b = _with_contents(record([[1, 9, 3, 4], *other[1:]], batches=[7, 5, 3], final="y"), epochs, [12, 18, 30])
    assert first_divergence(a, b).data == "order"
    # other contents (masking, augmentation)
    b = _with_contents(record([[1, 9, 3, 4], *other[1:]], batches=[7, 5, 3], final="y"), epochs, [11, 20, 30])
    d = first_divergence(a, b)
    assert d.cause == "data" and d.data == "contents"
    from reproci import verdicts

    assert verdicts.cause_text(d.to_dict()).startswith("different batch contents: other samples, or other augmentation")


def test_an_epoch_not_whole_in_both_runs_does_not_claim_order_or_contents():
    a = _with_contents(record([[1, 2, 3, 4], [5, 6, 7, 8]], batches=[1, 2], final="x"), [0, 0], [10, 20])
    b = _with_contents(record([[1, 9, 3, 4], [5, 6, 7, 8]], batches=[7, 2], final="y"), [0, 0], [11, 20])
    d = first_divergence(a, b)
    assert d.cause == "data" and d.data is None


def test_a_resumed_run_is_judged_on_the_first_later_epoch_both_took_whole():
    """C resumed inside epoch 1: its epoch 1 is partial, epoch 2 is whole in both runs."""
    rows = [[i, i, i, i] for i in range(1, 7)]
    a = _with_contents(record(rows, batches=[1, 2, 3, 4, 5, 6], final="x"), [0, 0, 1, 1, 2, 2], [1, 2, 3, 4, 5, 6])
    c_rows = [[9, 9, 9, 9], [9, 9, 9, 8], [9, 9, 9, 7]]  # resumed after step 3, inside epoch 1
    c = _with_contents(record(c_rows, start=3, batches=[8, 9, 9], final="y"), [1, 2, 2], [7, 8, 9])
    a["loader"] = c["loader"] = {"batches_per_epoch": 2}
    d = first_divergence(a, c)
    assert (d.step, d.cause, d.data) == (4, "data", "contents@2")
    from reproci import verdicts

    assert verdicts.cause_text(d.to_dict()).endswith("(judged on epoch 2, the first that both runs took whole)")
    c = _with_contents(c, [1, 2, 2], [7, 6, 5])  # epoch 2: the same samples, the other way round
    assert first_divergence(a, c).data == "order@2"


def _recorded_run(scale: float) -> tuple[dict, list[str]]:
    """Two SGD steps of a three-layer model, recorded as the worker records them (one gradient
    column per parameter); the second batch is multiplied by ``scale``. Also returns the order
    in which backward produced the gradients (post-accumulate hooks)."""
    from reproci.golden.divergence import FINGERPRINT_SCHEME
    from reproci.worker.state.fingerprint import StepFingerprints

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    produced: list[str] = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, name=name: produced.append(name))
    fps = StepFingerprints(model, optimizer)
    batch = torch.randn(2, 3)
    for step, x in enumerate((batch, batch * scale)):
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
        fps.record()
        if step == 0:
            first_backward = list(produced)
    rows = fps.to_lists()
    return ({"tensor_names": fps.names, "fingerprints": rows, "start_step": 0, "batch_fingerprints": [0] * len(rows),
             "losses": [1.0] * len(rows), "final_sha256": str(scale), "tensor_sha256": {},
             "fingerprint_scheme": FINGERPRINT_SCHEME}, first_backward)


def test_the_first_differing_gradient_is_the_first_backward_produced():
    """Records with a gradient column for every parameter, as the worker writes them: when every
    gradient of a step differs, the one named is the one backward produced first (the last
    layer's), not the first in registration order; of any differing subset, the earliest in
    backward order."""
    a, backward = _recorded_run(1.0)
    b, _ = _recorded_run(1.5)
    grads = [n for n in a["tensor_names"] if n.startswith("grad:")]
    assert len(grads) == 6 and backward == ["4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"]
    d = first_divergence(a, b)
    row_a, row_b = (dict(zip(r["tensor_names"], r["fingerprints"][1])) for r in (a, b))
    assert all(row_a[n] != row_b[n] for n in grads)  # every gradient differs at step 2
    assert d.step == 2 and d.cause == "compute" and d.tensor == f"grad:{backward[0]}"

    # only some gradients differ: the earliest of them in backward order
    at = {n: i for i, n in enumerate(a["tensor_names"])}
    row = list(a["fingerprints"][1])
    for name in ("grad:0.bias", "grad:2.weight", "grad:0.weight"):
        row[at[name]] += 1
    c = {**a, "fingerprints": [a["fingerprints"][0], row], "final_sha256": "c"}
    assert first_divergence(a, c).tensor == "grad:2.weight"
