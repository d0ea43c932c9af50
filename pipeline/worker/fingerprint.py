"""Per-step tensor fingerprints and the final state hash.

A fingerprint is the wrapping sum of a tensor's raw bits (float32 viewed as int32,
bfloat16 as int16, ...), modulo 2**32 for elements of up to 32 bits and modulo 2**64
for 64-bit elements. Integer addition modulo 2**w is associative, so the sum is exact
and independent of reduction order: equal tensors always give equal fingerprints on
any device, and a one-ULP change anywhere changes it. (The final sha256 below is the
authoritative identity; a 32-bit checksum only has to locate the first difference.) It is computed
on the tensor's device; the per-step rows stay there until the run ends, so there is
no host copy per step.

The final hash is a sha256 over the name, dtype, shape and raw bytes of every
parameter, buffer and optimizer-state tensor, in sorted name order.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from typing import Any, Iterable, Iterator

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


class StepFingerprints:
    """Collects one row of tensor checksums per step, kept on the device.

    Cheap by construction: integer views of parameters, buffers and optimizer state are
    made once (they are updated in place, so the views follow them; a replaced tensor is
    noticed by its data pointer and the views are rebuilt). Each step then costs one
    view per gradient, one concatenation and one cumulative sum per integer width, and
    a gather: a handful of kernel launches, not several per tensor.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.names: list[str] | None = None
        self.rows: list[torch.Tensor] = []
        self._workspace: dict[Any, torch.Tensor] = {}

    def _bind(self) -> None:
        tensors = state_tensors(self.model, self.optimizer, with_grads=True)
        if self.names is None:
            self.names = sorted(tensors, key=_sort_key)
        names = self.names
        params = dict(self.model.named_parameters())
        self._grad_params = [params[n[5:]] for n in names if n.startswith("grad:")]
        self._persistent = [tensors[n] for n in names if not n.startswith("grad:") and n in tensors]
        self._persistent_views = [_flat_int(t) for t in self._persistent]
        # A non-contiguous tensor's flat view is a copy: recompute those every step.
        self._stale = [i for i, t in enumerate(self._persistent) if not t.is_contiguous()]
        self._ptrs = [t.data_ptr() for t in self._persistent]
        # Row order: grads are appended after the persistent tensors, then permuted back.
        order = [n for n in names if not n.startswith("grad:")] + [n for n in names if n.startswith("grad:")]
        pos = {n: i for i, n in enumerate(order)}
        self._device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        self._perm = torch.tensor([pos[n] for n in names], dtype=torch.long, device=self._device)

    def record(self) -> None:
        if self.names is None or [t.data_ptr() for t in self._persistent] != self._ptrs:
            self._bind()
        views = list(self._persistent_views)
        for i in self._stale:
            views[i] = _flat_int(self._persistent[i])
        for p in self._grad_params:
            g = p.grad
            views.append(_flat_int(g) if g is not None else torch.zeros(1, dtype=torch.int32, device=self._device))
        with _no_fill():
            self.rows.append(segment_sums(views, self._workspace)[self._perm])

    def to_lists(self) -> list[list[int]]:
        if not self.rows:
            return []
        return torch.stack(self.rows).cpu().tolist()


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


def batch_checksum(batch: object, workspace: dict[Any, torch.Tensor] | None = None) -> torch.Tensor | None:
    """Checksum over every tensor in a (nested) batch: tells data order from compute.
    Pass the same ``workspace`` every step to reuse its buffers."""
    tensors = list(_iter_tensors(batch))
    if not tensors:
        return None
    with _no_fill():
        sums = segment_sums([_flat_int(t) for t in tensors], workspace)
    # Weight by position so swapping two inputs of a batch is seen.
    weights = torch.arange(1, 2 * len(tensors), 2, dtype=torch.int64, device=sums.device)
    return (sums * weights).sum()


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
