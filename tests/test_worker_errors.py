"""How the worker names its failures: one line each, with a kind the orchestrator reads."""

from __future__ import annotations

from reproci.worker.__main__ import _classify, no_deterministic_kernel
from reproci.worker.process.exitcodes import EXIT_CRASH, EXIT_NO_DETERMINISTIC_KERNEL

# What torch raises for an op without a deterministic CUDA kernel (the text of torch 2.x).
TORCH_TEXT = ("histc_cuda does not have a deterministic implementation, but you set "
              "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
              "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
              "application. You can also file an issue at https://github.com/pytorch/pytorch/issues")


def test_an_op_without_a_deterministic_kernel_is_named_in_one_line_with_the_fix():
    e = RuntimeError(TORCH_TEXT)
    assert _classify(e) == ("no-deterministic-kernel", EXIT_NO_DETERMINISTIC_KERNEL)
    line = no_deterministic_kernel(e)
    assert line is not None and "\n" not in line
    assert line.startswith("histc_cuda has no deterministic kernel on this device")
    assert "leave this model out of the strict stage" in line


def test_other_runtime_errors_stay_crashes():
    assert no_deterministic_kernel(RuntimeError("CUDA out of memory")) is None
    assert no_deterministic_kernel(ValueError(TORCH_TEXT)) is None
    assert _classify(RuntimeError("shape mismatch")) == ("crash", EXIT_CRASH)


def test_a_finite_loss_with_a_non_finite_trained_state_is_a_non_finite_run():
    """The loss alone does not decide: a run whose every loss is finite but whose parameters or
    optimizer state end holding NaN or infinity is an ERROR of kind non-finite (never compared
    or recorded); a buffer of -inf (a causal mask) is left alone."""
    import pytest
    import torch

    from reproci.worker.process.exitcodes import EXIT_NON_FINITE
    from reproci.worker.contract import TrainSetup
    from reproci.worker.finite import NonFiniteError, check_finite

    model = torch.nn.Linear(2, 1)
    model.register_buffer("mask", torch.tensor([float("-inf")]))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    setup = TrainSetup(model=model, optimizer=optimizer, loader=[(torch.ones(1, 2),)], loss_fn=lambda m, b: m(b[0]).sum())
    losses = [torch.tensor(1.0), torch.tensor(0.5)]
    check_finite(setup, losses, 0)  # finite state, finite losses, a -inf buffer: nothing to say

    with torch.no_grad():
        model.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteError) as e:
        check_finite(setup, losses, 0)
    assert str(e.value).startswith("at the end 1 state tensor hold non-finite values, first param:bias: the training diverged")
    assert _classify(e.value) == ("non-finite", EXIT_NON_FINITE)

    with torch.no_grad():
        model.bias.zero_()
        optimizer.state[model.weight]["exp_avg_sq"][0, 1] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^at the end 1 state tensor hold non-finite values, first optim:weight\.exp_avg_sq"):
        check_finite(setup, losses, 0)
