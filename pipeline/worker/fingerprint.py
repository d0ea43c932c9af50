"""Per-step tensor fingerprints and the final state hash.

A fingerprint is the wrapping sum of a tensor's raw bits (float32 viewed as int32,
bfloat16 as int16, ...), modulo 2**32 for elements of up to 32 bits and modulo 2**64
for 64-bit elements. Integer addition modulo 2**w is associative, so the sum is exact
and independent of reduction order: equal tensors always give equal fingerprints on
any device, and a one-ULP change anywhere changes it. (The final sha256 below is the
authoritative identity; a 32-bit checksum only has to locate the first difference.) It is computed
on the tensor's device; the per-step rows stay there until the run ends, so there is
no host copy per step, and state spread over several devices is checksummed per device.

The final hash is a sha256 over the name, dtype, shape and raw bytes of every
parameter, buffer and optimizer-state tensor, in sorted name order.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from typing import Any, Iterable, Iterator

import numpy as np
import torch

# Tensor kinds, in the order they are reported.
KINDS = ("param", "grad", "buffer", "optim")

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.bool: torch.uint8,
}
if hasattr(torch, "float8_e4m3fn"):
    _INT_VIEW[torch.float8_e4m3fn] = torch.uint8
    _INT_VIEW[torch.float8_e5m2] = torch.uint8


def bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """Order-independent exact checksum of a tensor's bits, as a 0-dim int64 on its device
    (the reference definition; ``segment_sums`` computes the same for many tensors at once)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    view = _INT_VIEW.get(t.dtype)
    if view is not None:
        t = t.contiguous().reshape(-1).view(view)
    total = t.sum(dtype=torch.int64)
    if t.element_size() <= 4:
        total = (total + 2**31) % 2**32 - 2**31  # modulo 2**32, as a signed value
    return total


def optimizer_state_named(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Optimizer state tensors named after their parameter: ``fc.weight.exp_avg``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    unnamed = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            pname = names.get(id(p))
            if pname is None:
                pname = f"param{unnamed}"
                unnamed += 1
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[f"{pname}.{key}"] = value
    return out


def state_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, with_grads: bool
) -> dict[str, torch.Tensor]:
    """Every tensor of the training state, keyed ``kind:name``."""
    out: dict[str, torch.Tensor] = {}
    for n, p in model.named_parameters():
        out[f"param:{n}"] = p
        if with_grads and p.grad is not None:
            out[f"grad:{n}"] = p.grad
    for n, b in model.named_buffers():
        out[f"buffer:{n}"] = b
    for n, t in optimizer_state_named(model, optimizer).items():
        out[f"optim:{n}"] = t
    return out


def _flat_int(t: torch.Tensor) -> torch.Tensor:
    """A flat integer view of a tensor's bits (shares its storage when contiguous)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    view = _INT_VIEW.get(t.dtype)
    return t.view(view) if view is not None else t


def _np_bits(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's raw bits as a flat numpy integer array (sharing its memory when it is
    contiguous), with the same integer reading as ``_flat_int``: floats as signed integers
    of their width, bool as uint8, integer types as themselves."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.element_size() <= 2 and t.dtype in _INT_VIEW:  # bfloat16, float16, bool, float8: not numpy types
        t = t.view(_INT_VIEW[t.dtype])
    a = t.contiguous().numpy().reshape(-1)
    return a if a.dtype.kind in "iu" else a.view(f"i{a.itemsize}")


class StepFingerprints:
    """Collects one row of tensor checksums per step, kept on the tensors' devices.

    Cheap by construction: integer views of parameters, buffers and optimizer state are
    made once (they are updated in place, so the views follow them; a replaced tensor is
    noticed by its data pointer and the views are rebuilt). Each step then costs one
    view per gradient and, per device, one concatenation and one cumulative sum per
    integer width and a gather: a handful of kernel launches, not several per tensor.

    State may live on several devices (Adam keeps ``step`` as a CPU scalar beside CUDA
    parameters): tensors are grouped by device and each group's checksums stay on its
    device until the run ends, so a step costs no copy between devices and no sync.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.names: list[str] | None = None
        self.rows: list[list[torch.Tensor]] = []  # per step, one tensor per device group
        self._groups: list[_DeviceGroup] = []
        self._ptrs: list[int] = []

    def _bind(self) -> None:
        tensors = state_tensors(self.model, self.optimizer, with_grads=True)
        if self.names is None:
            self.names = sorted(tensors, key=_sort_key)
        params = dict(self.model.named_parameters())
        by_device: dict[str, _DeviceGroup] = {}
        for i, name in enumerate(self.names):
            if name.startswith("grad:"):
                p = params[name[5:]]
                group = by_device.setdefault(str(p.device), _DeviceGroup(p.device))
                group.grads.append((i, p))
            elif name in tensors:
                t = tensors[name]
                group = by_device.setdefault(str(t.device), _DeviceGroup(t.device))
                group.persistent.append((i, t))
        for group in by_device.values():
            group.bind()
        self._groups = list(by_device.values())
        self._ptrs = [t.data_ptr() for g in self._groups for _, t in g.persistent]

    def record(self) -> None:
        if self.names is None or [t.data_ptr() for g in self._groups for _, t in g.persistent] != self._ptrs:
            self._bind()
        with _no_fill():
            self.rows.append([g.sums() for g in self._groups])

    def to_lists(self) -> list[list[int]]:
        """Every step's row in name order (one host copy per device, at the end)."""
        if not self.rows or self.names is None:
            return []
        out = torch.zeros(len(self.rows), len(self.names), dtype=torch.int64)
        for gi, group in enumerate(self._groups):
            block = torch.stack([row[gi] for row in self.rows]).cpu()
            out[:, group.positions] = block
        return out.tolist()


class _DeviceGroup:
    """The state tensors of one device and where their checksums go in a row."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.persistent: list[tuple[int, torch.Tensor]] = []
        self.grads: list[tuple[int, torch.nn.Parameter]] = []
        self._workspace: dict[Any, torch.Tensor] = {}

    def bind(self) -> None:
        self.views = [_flat_int(t) for _, t in self.persistent]
        # A non-contiguous tensor's flat view is a copy: recompute those every step.
        self.stale = [k for k, (_, t) in enumerate(self.persistent) if not t.is_contiguous()]
        self.positions = torch.tensor([i for i, _ in self.persistent] + [i for i, _ in self.grads], dtype=torch.long)
        self.on_cpu = self.device.type == "cpu"
        if self.on_cpu:  # numpy arrays sharing the tensors' memory: they follow in-place updates
            self.arrays = [_np_bits(t) for _, t in self.persistent]

    def sums(self) -> torch.Tensor:
        if self.on_cpu:
            return self._cpu_sums()
        views = list(self.views)
        for k in self.stale:
            views[k] = _flat_int(self.persistent[k][1])
        for _, p in self.grads:
            g = p.grad
            views.append(_flat_int(g) if g is not None else torch.zeros(1, dtype=torch.int32, device=self.device))
        return segment_sums(views, self._workspace)

    def _cpu_sums(self) -> torch.Tensor:
        """The same wrapping sums on the CPU, one numpy reduction per tensor: no
        concatenation, no running sum, and numpy's small call overhead instead of torch's
        (about three times cheaper than ``segment_sums`` there; both give identical values)."""
        arrays = list(self.arrays)
        for k in self.stale:
            arrays[k] = _np_bits(self.persistent[k][1])
        for _, p in self.grads:
            g = p.grad
            arrays.append(_np_bits(g) if g is not None else _EMPTY)
        out = np.empty(len(arrays), dtype=np.int64)
        for i, a in enumerate(arrays):
            out[i] = np.add.reduce(a, dtype=np.int64 if a.itemsize == 8 else np.int32)  # wraps like int32 adds
        return torch.from_numpy(out)


_EMPTY = np.zeros(0, dtype=np.int32)


def grouped_sums(views: list[torch.Tensor]) -> torch.Tensor:
    """``segment_sums`` over tensors on any mix of devices, as one CPU row in input order
    (one host copy per device: for one-off rows, not per step)."""
    out = torch.zeros(len(views), dtype=torch.int64)
    by_device: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        by_device.setdefault(str(v.device), []).append(i)
    for idxs in by_device.values():
        out[idxs] = segment_sums([views[i] for i in idxs]).cpu()
    return out


_INDEX_CACHE: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _segment_index(lengths: tuple[int, ...], idxs: tuple[int, ...], device: torch.device):
    """(segment end positions, empty-segment mask, output positions), made once per layout."""
    key = (lengths, idxs, str(device))
    hit = _INDEX_CACHE.get(key)
    if hit is None:
        ends = [max(e - 1, 0) for e in itertools.accumulate(lengths)]
        hit = (torch.tensor(ends, dtype=torch.long, device=device),
               torch.tensor([n == 0 for n in lengths], dtype=torch.bool, device=device),
               torch.tensor(idxs, dtype=torch.long, device=device))
        _INDEX_CACHE[key] = hit
    return hit


@contextlib.contextmanager
def _no_fill() -> Iterator[None]:
    """Skip filling fresh buffers with NaN/garbage while checksumming: every buffer made
    here is written in full before it is read, so the fill only costs time."""
    det = getattr(torch.utils, "deterministic", None)
    saved = getattr(det, "fill_uninitialized_memory", None)
    if saved:
        det.fill_uninitialized_memory = False  # type: ignore[union-attr]
    try:
        yield
    finally:
        if saved:
            det.fill_uninitialized_memory = saved  # type: ignore[union-attr]


def segment_sums(views: list[torch.Tensor], workspace: dict[Any, torch.Tensor] | None = None) -> torch.Tensor:
    """Wrapping sum of each flat integer tensor, in input order, in few kernels.

    ``workspace`` keeps the concatenation and running-sum buffers between calls: large
    fresh CPU buffers cost page faults on every step, reused ones do not.
    """
    if not views:
        return torch.zeros(0, dtype=torch.int64)
    device = views[0].device
    groups: dict[torch.dtype, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v.dtype, []).append(i)
    out = torch.zeros(len(views), dtype=torch.int64, device=device)
    for dtype, idxs in groups.items():
        members = [views[i] for i in idxs]
        lengths = tuple(m.numel() for m in members)
        total = sum(lengths)
        if total == 0:
            continue
        ends, empty, where = _segment_index(lengths, tuple(idxs), device)
        # Exact: integer adds wrap modulo 2**w, and so do the differences of the running
        # sums. Elements of up to 32 bits accumulate in int32 (half the memory traffic of
        # widening to int64), 64-bit elements in int64.
        acc = torch.int64 if members[0].element_size() == 8 else torch.int32
        if workspace is None:
            running = torch.cat(members).cumsum(0, dtype=acc)
        else:
            key = (dtype, total, str(device))
            if key not in workspace:
                workspace[key] = torch.empty(total, dtype=dtype, device=device)
                workspace[(key, "sum")] = torch.empty(total, dtype=acc, device=device)
            flat = torch.cat(members, out=workspace[key])
            running = torch.cumsum(flat, 0, dtype=acc, out=workspace[(key, "sum")])
        totals = running[ends]
        sums = torch.diff(totals, prepend=totals.new_zeros(1))
        out[where] = sums.masked_fill(empty, 0).to(torch.int64)
    return out


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=like.device)


def _sort_key(name: str) -> int:
    """Group by kind; the stable sort keeps registration (forward) order within a kind."""
    kind = name.partition(":")[0]
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


# Batch checksum scheme, recorded with every run: checksums of different schemes are never compared.
BATCH_CHECKSUM = "position-weighted-v2"
_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def _position_weights(n: int, device: torch.device) -> torch.Tensor:
    """One odd pseudo-random int32 weight per position (Knuth's multiplicative hash): a
    change of one word always changes the sum, and swapping two words changes it unless
    their difference times the weights' difference vanishes modulo 2**32."""
    key = (n, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        pos = torch.arange(n, dtype=torch.int64, device=device)
        w = (((pos * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1).to(torch.int32)
        _WEIGHTS[key] = w
    return w


_NP_WEIGHTS: dict[int, np.ndarray] = {}


def _np_weights(n: int) -> np.ndarray:
    w = _NP_WEIGHTS.get(n)
    if w is None:
        w = _NP_WEIGHTS[n] = _position_weights(n, torch.device("cpu")).numpy()
    return w


def _words(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits as int32 words in memory order (64-bit elements give two words,
    narrower ones are widened)."""
    flat = _flat_int(t)
    if flat.element_size() == 8:
        return flat.view(torch.int32)
    return flat if flat.dtype == torch.int32 else flat.to(torch.int32)


def batch_checksum(batch: object, workspace: dict[Any, torch.Tensor] | None = None) -> torch.Tensor | None:
    """Exact, order-sensitive checksum over every tensor of a (nested) batch: tells data
    order from compute. Each 32-bit word of raw bits is multiplied by a weight of its
    position, modulo 2**32 (int32 products wrap), and summed in int64: rows or tokens
    reordered within a batch change it, not only a different set of samples, and the value
    is the same on every device. Two kernels per tensor, on the batch's device.
    Pass the same ``workspace`` every step to reuse its buffers (weights are cached by size).
    """
    tensors = list(_iter_tensors(batch))
    if not tensors:
        return None
    if all(t.device.type == "cpu" for t in tensors):  # the same arithmetic in numpy, without torch's per-op cost
        total = 0
        for i, t in enumerate(tensors):
            bits = _np_bits(t)
            words = bits.view(np.int32) if bits.itemsize == 8 else bits if bits.dtype == np.int32 else bits.astype(np.int32)
            products = workspace.get(("np", words.size)) if workspace is not None else None
            if products is None:
                products = np.empty(words.size, dtype=np.int32)
                if workspace is not None:
                    workspace[("np", words.size)] = products  # type: ignore[assignment]
            np.multiply(words, _np_weights(words.size), out=products)  # int32 products wrap modulo 2**32
            s = int(np.add.reduce(products, dtype=np.int32)) % 2**32
            total += s * (2 * i + 1)
        return torch.tensor(total, dtype=torch.int64)
    acc = None
    with _no_fill():
        for i, t in enumerate(tensors):
            words = _words(t)
            s = (words * _position_weights(words.numel(), words.device)).sum(dtype=torch.int64) % 2**32
            s = s * (2 * i + 1)  # which input of the batch it is
            acc = s if acc is None else acc + s.to(acc.device)
    return acc


def initial_row(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[str], torch.Tensor]:
    """Checksums of the state before the first step (parameters, buffers, any optimizer
    state), one row on the device: an unseeded initialisation shows up here, as step 0."""
    tensors = state_tensors(model, optimizer, with_grads=False)
    names = sorted(tensors, key=_sort_key)
    with _no_fill():
        sums = grouped_sums([_flat_int(tensors[n]) for n in names])
    return names, sums


def _iter_tensors(obj: object) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj):
            yield from _iter_tensors(obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _iter_tensors(v)


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)  # 0-dim tensors cannot be viewed as bytes
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def final_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole state, sha256 per tensor) over params, buffers, optimizer state."""
    tensors = state_tensors(model, optimizer, with_grads=False)
    whole = hashlib.sha256()
    per: dict[str, str] = {}
    for name in sorted(tensors):
        t = tensors[name]
        header = f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}\n".encode()
        data = tensor_bytes(t)
        whole.update(header)
        whole.update(data)
        per[name] = hashlib.sha256(header + data).hexdigest()
    return whole.hexdigest(), per


def dump_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Every state tensor (grads included) on the CPU, for magnitude comparisons."""
    tensors = state_tensors(model, optimizer, with_grads=True)
    torch.save({k: v.detach().cpu().clone() for k, v in tensors.items()}, path)
