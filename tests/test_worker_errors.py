"""How the worker names its failures: one line each, with a kind the orchestrator reads."""

from __future__ import annotations

import pytest

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


def test_the_ctc_backward_on_cuda_is_refused_with_what_works_for_a_ctc_model():
    """Wav2Vec2ForCTC (every transformers *ForCTC) on CUDA: transformers turns cuDNN off around
    ctc_loss, so the native kernel runs and strict mode refuses its backward. The line names what
    works: the loss on the CPU, through the model's ``loss_function`` (no GPU here: torch's text
    of that refusal stands in for the run)."""
    e = RuntimeError(TORCH_TEXT.replace("histc_cuda", "ctc_loss_backward_gpu"))
    assert _classify(e) == ("no-deterministic-kernel", EXIT_NO_DETERMINISTIC_KERNEL)
    line = no_deterministic_kernel(e)
    assert line is not None and "\n" not in line
    assert line.startswith("ctc_loss_backward_gpu has no deterministic kernel on this device")
    assert "compute the CTC loss on the CPU" in line and "*ForCTC" in line and "model.loss_function" in line
    assert "leave this model out of the strict stage" in line
    # an op the audit's table does not name keeps the general advice
    other = no_deterministic_kernel(RuntimeError(TORCH_TEXT.replace("histc_cuda", "some_new_op_cuda")))
    assert other is not None and "replace it in the model with an op that has one" in other



# The advice's loss_function beside the model's own loss, on the CPU (torch's CTC kernel is
# deterministic there), gradients included; a process of its own, as a training run is: the
# process's TF32 flags are its own, not what other tests left (transformers' CTC loss reads the
# legacy one through torch.backends.cudnn.flags).
CTC_ADVICE_SCRIPT = """
import torch, transformers
from transformers.loss.loss_ctc import ForCTCLoss
from reproci.worker.audit.audit_table import CTC_FIX

cfg = transformers.Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                                  vocab_size=8, pad_token_id=0, conv_dim=(8, 8), conv_stride=(5, 2),
                                  conv_kernel=(10, 3), num_feat_extract_layers=2, num_conv_pos_embeddings=4,
                                  num_conv_pos_embedding_groups=2)
torch.manual_seed(0)
model = transformers.Wav2Vec2ForCTC(cfg).eval()
x, labels = torch.randn(2, 400), torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])

def loss_and_grads():
    model.zero_grad()
    loss = model(x, labels=labels).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

own, own_grads = loss_and_grads()
advised = CTC_FIX.split("model.loss_function = ", 1)[1].split(" (older", 1)[0]
model.loss_function = eval(advised, {"transformers": transformers, "ForCTCLoss": ForCTCLoss})
loss, grads = loss_and_grads()
assert torch.equal(loss, own), (loss, own)
assert len(grads) == len(own_grads) > 0 and all(torch.equal(g, h) for g, h in zip(grads, own_grads))
print("same loss and gradients", float(loss))
"""


def test_the_advice_for_a_ctc_model_works_on_its_loss():
    """The advice's ``loss_function`` for a transformers *ForCTC model computes the same loss as
    the model's own, and the same gradients, on the CPU (where torch's CTC kernel is
    deterministic), run in a process of its own."""
    import importlib.util
    import os
    import subprocess
    import sys

    from .helpers import ROOT

    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed (`pip install -e '.[test]'` installs it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", CTC_ADVICE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same loss and gradients" in p.stdout

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

    from reproci.worker.contract import TrainSetup
    from reproci.worker.finite import NonFiniteError, check_finite
    from reproci.worker.process.exitcodes import EXIT_NON_FINITE

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
