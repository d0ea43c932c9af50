"""Test-only faults (``spec.FAULTS``): each breaks a run on purpose, in one known way, so
that tests can prove the verdict meant to catch it fires. Never used otherwise."""

from __future__ import annotations

import time

import torch

from .contract import ContractError
from .process.spec import FAULTS


class Faults:
    """The fault a spec asks for, and where in the run it strikes."""

    def __init__(self, fault: str | None, steps: int) -> None:
        if fault is not None and fault not in FAULTS:
            raise ContractError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.fault = fault
        self.drift_step = steps // 2 if fault == "buffer-drift" else None
        self.drifted: str | None = None  # the buffer that buffer-drift moved
        # On resume: restart the interrupted epoch instead of restoring the loader position;
        # do not restore torch's RNG state.
        self.skip_loader_position = fault == "resume-skip-loader-position"
        self.restore_torch_rng = fault != "resume-drop-rng"

    def after_setup(self) -> None:
        """clock-seed: reseed torch from the clock after set-up, so no two runs agree."""
        if self.fault == "clock-seed":
            torch.manual_seed(time.time_ns() % 2**62)

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        """buffer-drift: at the middle step, move one floating buffer by one ULP."""
        if self.drift_step is not None and step == self.drift_step:
            self.drifted = _buffer_drift(model)

    def detail(self) -> dict[str, str] | None:
        """The record's ``fault_detail``: the buffer buffer-drift moved."""
        return {"buffer": self.drifted} if self.drifted else None


def _buffer_drift(model: torch.nn.Module) -> str:
    for name, b in model.named_buffers():
        if b.is_floating_point() and b.numel():
            with torch.no_grad():
                flat = b.view(-1)
                flat[0] = torch.nextafter(flat[0], flat[0] + 1)
            return name
    raise ContractError("fault buffer-drift needs a model with a floating-point buffer")
