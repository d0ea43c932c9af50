"""Per-step tensor fingerprints of the training state.

A fingerprint is the wrapping sum of a tensor's raw bits (float32 viewed as int32,
bfloat16 as int16, ...; see ``bits``), modulo 2**32 for elements of up to 32 bits and
modulo 2**64 for 64-bit elements. Integer addition modulo 2**w is associative, so the
sum is exact and independent of reduction order: equal tensors always give equal
fingerprints on any device, and a one-ULP change anywhere changes it. (The final sha256,
``state.final_hash``, is the authoritative identity; a 32-bit checksum only has to locate
the first difference.) It is computed on the tensor's device; the per-step rows stay there
until the run ends, so there is no host copy per step, and state spread over several
devices is checksummed per device.

Every row has a column for every parameter's gradient, from the first row on, whether or
not the parameter has a gradient yet (a frozen one included: it may be unfrozen later), so
runs that start at different steps carry the same names. A step at which a tensor does not
exist (a layer that LayerDrop or MoE routing skipped, a branch not taken, a frozen
parameter, optimizer state not made yet) reads ``ABSENT`` there: a value compared like any
other, and distinct from an all-zero tensor, whose checksum is 0.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from .. import kernels
from .state import Modules, sort_key, state_tensors
from .tensor_bits import INT_VIEW, flat_int, no_fill, np_bits, stored_values
from .watch import StateWatch
from .wrapping_sums import array_sums, grouped_sums, segment_sums

__all__ = ["ABSENT", "FINGERPRINT_SCHEME", "StepFingerprints", "bit_checksum", "grouped_sums", "initial_row",
           "segment_sums"]

# What a row holds for a tensor the state does not have at that step. Outside the range of
# every checksum of elements of up to 32 bits; for 64-bit elements one value in 2**64.
ABSENT = -(2**63)
# The layout of the rows, recorded beside them: before it (no scheme in a record), gradient
# columns were those of the first step, and a missing tensor read 0.
FINGERPRINT_SCHEME = "bitsum-every-grad-v2"

_EMPTY = np.zeros(0, dtype=np.int32)


def bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """Order-independent exact checksum of a tensor's bits, as a 0-dim int64 on its device
    (the reference definition; ``segment_sums`` computes the same for many tensors at once)."""
    t = stored_values(t.detach())
    if t.is_complex():
        t = torch.view_as_real(t)
    view = INT_VIEW.get(t.dtype)
    if view is not None:
        t = t.contiguous().reshape(-1).view(view)
    total = t.sum(dtype=torch.int64)
    if t.element_size() <= 4:
        total = (total + 2**31) % 2**32 - 2**31  # modulo 2**32, as a signed value
    return total


class StepFingerprints:
    """Collects one row of tensor checksums per step, kept on the tensors' devices.

    Cheap by construction: integer views of parameters, buffers and optimizer state are
    made once and follow in-place updates. Before each row it checks that the state still
    holds the very tensors it bound (by identity and data pointer): a buffer reassigned
    instead of updated in place (``self.mean = 0.99 * self.mean + ...``), an optimizer that
    replaces a state entry (HF's Adafactor), a parameter whose ``.data`` was swapped, or
    state that appears later, is rebound, so every row checksums the state as it is at that
    step. Each step then costs one view per gradient and, per device, one concatenation and
    one cumulative sum per integer width and a gather: a handful of kernel launches.
    Gradients are read afresh each step, each parameter's in its own column: which ones
    exist at a step is noted on the host (no device work) and read ``ABSENT`` in the rows.

    State may live on several devices (Adam keeps ``step`` as a CPU scalar beside CUDA
    parameters): tensors are grouped by device and each group's checksums stay on its
    device until the run ends, so a step costs no copy between devices and no sync.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 modules: Modules | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.modules = modules
        self.names: list[str] | None = None
        # per step: (binding, one row per device group, the columns of the gradients it lacked);
        # a CPU group's row is a numpy array, a device's a tensor on it
        self.rows: list[tuple[int, list[torch.Tensor | np.ndarray], tuple[int, ...]]] = []
        self._bindings: list[list[_DeviceGroup]] = []
        self._watch = StateWatch(model, optimizer, modules)

    def _current(self) -> dict[str, torch.Tensor]:
        return state_tensors(self.model, self.optimizer, with_grads=False, modules=self.modules)

    def _bind(self, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        columns = [*tensors, *(f"grad:{n}" for n in params)]  # a gradient column for every parameter
        if self.names is None:
            self.names = sorted(columns, key=sort_key)
        else:  # state that appeared since: its columns follow (earlier rows read ABSENT there)
            known = set(self.names)
            self.names += sorted((n for n in columns if n not in known), key=sort_key)
        by_device: dict[str, _DeviceGroup] = {}
        for i, name in enumerate(self.names):
            if name.startswith("grad:"):
                p = params.get(name[5:])
                if p is not None:
                    by_device.setdefault(str(p.device), _DeviceGroup(p.device)).grads.append((i, p))
            elif name in tensors:
                t = tensors[name]
                by_device.setdefault(str(t.device), _DeviceGroup(t.device)).persistent.append((i, t))
        for group in by_device.values():
            group.bind()
        self._bindings.append(list(by_device.values()))

    def record(self) -> None:
        # The state is named only when it changed: a buffer reassigned instead of updated in
        # place, state that appeared, a parameter whose ``.data`` was swapped (the bound
        # tensors are held, so an id cannot be reused by another tensor while it is compared).
        if self._watch.changed() or self.names is None:
            self._bind(self._current())
        absent: list[int] = []
        groups = self._bindings[-1]
        # numpy sums make no torch buffer to leave unfilled
        with contextlib.nullcontext() if all(g.on_cpu for g in groups) else no_fill():
            sums = [g.sums(absent) for g in groups]
        self.rows.append((len(self._bindings) - 1, sums, tuple(absent)))

    def to_lists(self) -> list[list[int]]:
        """Every step's row in name order (one host copy per device and binding, at the end);
        a tensor that did not exist at a step (a gradient, state not made yet) reads ``ABSENT``."""
        if not self.rows or self.names is None:
            return []
        out = torch.full((len(self.rows), len(self.names)), ABSENT, dtype=torch.int64)
        for b, groups in enumerate(self._bindings):
            steps = [i for i, (binding, _, _) in enumerate(self.rows) if binding == b]
            if not steps:
                continue
            for gi, group in enumerate(groups):
                block = _stack([self.rows[i][1][gi] for i in steps])
                if group.fused is not None:  # its narrow columns are read modulo 2**32 here
                    block = group.fused.normalised(block)
                out[torch.tensor(steps).unsqueeze(1), group.positions.unsqueeze(0)] = block
        where = [(i, c) for i, (_, _, absent) in enumerate(self.rows) for c in absent]
        if where:
            out[tuple(torch.tensor(where).t())] = ABSENT
        return out.tolist()


class _DeviceGroup:
    """The state tensors of one device and where their checksums go in a row."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.persistent: list[tuple[int, torch.Tensor]] = []
        self.grads: list[tuple[int, torch.nn.Parameter]] = []
        self._workspace: dict[Any, Any] = {}  # reused sum buffers (torch tensors, numpy arrays)

    def bind(self) -> None:
        self.views = [flat_int(t) for _, t in self.persistent]
        # A non-contiguous tensor's flat view is a copy, and so is a sparse tensor's: recompute
        # those every step.
        self.stale = [k for k, (_, t) in enumerate(self.persistent)
                      if t.layout != torch.strided or not t.is_contiguous()]
        self.positions = torch.tensor([i for i, _ in self.persistent] + [i for i, _ in self.grads], dtype=torch.long)
        self.no_grad = [flat_int(p.detach())[:0] for _, p in self.grads]  # a missing gradient: an empty segment
        self.on_cpu = self.device.type == "cpu" and not kernels.usable(self.device)
        # On a GPU with Triton: the whole group in one launch per element type (kernels.StateSums)
        self.fused = kernels.StateSums(self.views, [p for _, p in self.grads], self.device) \
            if not self.on_cpu and kernels.usable(self.device) and not self.stale and kernels.state_usable(self.views + self.no_grad) \
            else None
        if self.on_cpu:  # numpy arrays sharing the tensors' memory: they follow in-place updates
            self.arrays = [np_bits(t) for _, t in self.persistent]

    def sums(self, absent: list[int]) -> torch.Tensor | np.ndarray:
        """This group's checksums in its column order; the columns of the gradients that do
        not exist now are appended to ``absent`` (their checksum reads 0 here)."""
        if self.on_cpu:
            return self._cpu_sums(absent)
        if self.fused is not None:
            grads = [p.grad for _, p in self.grads]
            if all(g is None or (g.layout == torch.strided and g.is_contiguous()) for g in grads):
                absent.extend(i for (i, _), g in zip(self.grads, grads) if g is None)
                return self.fused.sums(grads)
        views = list(self.views)
        for k in self.stale:
            views[k] = flat_int(self.persistent[k][1])
        for k, (i, p) in enumerate(self.grads):
            g = p.grad
            if g is None:
                absent.append(i)
                views.append(self.no_grad[k])
            else:
                views.append(flat_int(g))
        return segment_sums(views, self._workspace)

    def _cpu_sums(self, absent: list[int]) -> np.ndarray:
        """The same wrapping sums on the CPU in numpy (``wrapping_sums.array_sums``: one copy and one
        segmented reduction per width instead of a call per tensor; identical values)."""
        arrays = list(self.arrays)
        # The layout, named by what can change from step to step: which gradients are missing
        # (an empty array), and the size of each array that is not a dense tensor's (a sparse
        # tensor's stored values). A dense gradient has its parameter's size and dtype (autograd
        # refuses any other), and every bound array keeps its own.
        varying: list[tuple[int, int]] = []
        for k in self.stale:
            a = arrays[k] = np_bits(self.persistent[k][1])
            varying.append((k, a.size))
        first = len(absent)
        append = arrays.append
        for i, p in self.grads:
            g = p.grad
            if g is None:
                absent.append(i)
                append(_EMPTY)
            else:
                append(np_bits(g))
                if g.layout != torch.strided:
                    varying.append((len(arrays), arrays[-1].size))
        return array_sums(arrays, self._workspace, key=(tuple(absent[first:]), tuple(varying)))


def _stack(rows: list[torch.Tensor] | list[np.ndarray]) -> torch.Tensor:
    """One group's rows of many steps, as one CPU tensor (a device's in one copy)."""
    if isinstance(rows[0], np.ndarray):
        return torch.from_numpy(np.stack(rows))
    return torch.stack(rows).cpu()


def initial_row(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                modules: Modules | None = None) -> tuple[list[str], torch.Tensor]:
    """Checksums of the state before the first step (parameters, buffers, any optimizer
    state, the state modules), one row on the device: an unseeded initialisation shows up
    here, as step 0."""
    tensors = state_tensors(model, optimizer, with_grads=False, modules=modules)
    names = sorted(tensors, key=sort_key)
    with no_fill():
        sums = grouped_sums([flat_int(tensors[n]) for n in names])
    return names, sums
