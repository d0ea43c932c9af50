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
