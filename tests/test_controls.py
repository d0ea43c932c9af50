"""Determinism controls switched off by a model's own code are recorded with file and line."""

import torch

from reproci.worker.controls import ControlWatch
from reproci.worker.determinism import deterministic_mode


def _library_call():
    torch.use_deterministic_algorithms(False)  # the line a user would be shown


def test_watch_records_the_callers_line_and_restores_torch():
    original = torch._C._set_deterministic_algorithms
    with deterministic_mode(), ControlWatch(step=lambda: 3) as watch:
        _library_call()
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.benchmark = False
    assert torch._C._set_deterministic_algorithms is original
    off = watch.switched_off()
    assert [e["control"] for e in off] == ["deterministic_algorithms", "cudnn_benchmark"]
    line = _library_call.__code__.co_firstlineno + 1
    assert off[0]["where"] == f"test_controls.py:{line}" and off[0]["function"] == "_library_call"
    assert off[0]["step"] == 3
    assert len(watch.events) == 3 and not watch.events[-1]["off"]  # switching back is recorded, not "off"


def test_harness_calls_are_not_recorded():
    from reproci.worker.data.batchsum import batch_checksum

    with deterministic_mode(), ControlWatch(step=lambda: 0) as watch:
        batch_checksum(torch.ones(3))  # toggles fill_uninitialized_memory around its buffers
    assert watch.events == []


def _ctc_like_block():
    with torch.backends.cudnn.flags(enabled=False):  # as transformers' CTC loss does
        pass


def _cudnn_nondeterministic_block():
    with torch.backends.cudnn.flags(enabled=True, deterministic=False):
        pass


def test_cudnn_switched_off_for_a_block_leaves_no_control_open():
    """``cudnn.flags(enabled=False)`` also sets deterministic=False and allow_tf32=True, for a
    block where cuDNN picks no kernel: not a control switched off. With cuDNN on, it is."""
    with deterministic_mode(), ControlWatch(step=lambda: 1) as watch:
        _ctc_like_block()
    assert watch.switched_off() == []
    with deterministic_mode(), ControlWatch(step=lambda: 1) as watch:
        _cudnn_nondeterministic_block()
    off = watch.switched_off()
    assert [e["control"] for e in off] == ["cudnn_deterministic", "cudnn_fp32_precision"]
    assert off[0]["function"] == "_cudnn_nondeterministic_block"
