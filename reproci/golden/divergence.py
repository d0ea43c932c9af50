"""Comparing runs: first differing step, first differing tensor, and by how much.

Inputs are runs' trajectories (``Trajectory``: what a run record, ``reproci.worker.run_record``,
or a golden holds of a run): per-step rows of exact tensor checksums, batch checksums, losses,
and the final sha256. Magnitudes come from state
dumps of probe runs (``magnitude``), since a checksum says only *whether* a tensor
differs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

import numpy as np

from ..entry_sections import Evidence, FirstOp
from ..worker.run_record import Run, Trajectory

# The order in which a training step produces tensors: forward updates buffers
# (BatchNorm statistics), backward produces gradients, the optimizer updates its state
# and then the parameters. The first differing tensor is the earliest in this order.
CAUSAL_KIND_ORDER = {"buffer": 0, "grad": 1, "optim": 2, "param": 3, "state": 4}  # state modules follow the parameters

# What a row holds for a tensor a run does not have at that step (no gradient there: a layer
# skipped, a branch not taken, a frozen parameter), in records of FINGERPRINT_SCHEME; the
# worker's ``reproci.worker.state.fingerprint.ABSENT`` (that module needs torch; this one must not).
ABSENT = -(2**63)
FINGERPRINT_SCHEME = "bitsum-every-grad-v2"


@dataclass
class Divergence:
    step: int | None  # first differing step (None: only the final state differs)
    tensor: str | None  # "kind:name" of the first differing tensor at that step
    kind: str | None
    # "data" (the batch differs), "compute" (same batch, different result), "init" (the state
    # before the first step differs), "restore" (a resumed run's state differs at the resume
    # point, before its first step), "unknown" (batch checksums of different schemes), "eval" /
    # "extra" (every tensor agrees, the held-out metrics or the extra state do not: stages/determinism/beyond_tensors.py)
    cause: str
    differing_tensors: int = 0  # how many tensors differ at that step
    loss_equal_at_step: bool | None = None
    losses_equal: bool | None = None  # whole common trajectory
    max_abs: float | None = None
    max_ulp: int | None = None
    elements_differing: int | None = None
    magnitude_source: str | None = None  # "probe" (exact re-run dump) or "final-state"
    # With cause "data": "reordered" (the same samples in another order within the batch),
    # "order" (the epoch holds the same samples in both runs), "contents" (it does not: other
    # samples, or other augmentation or masking draws); "order@E" / "contents@E" when judged on
    # a later epoch E, the step's own not being whole in both runs; None when not known.
    data: str | None = None
    detail: dict[str, Any] | None = None  # causes "eval" and "extra" (stages/determinism/beyond_tensors.py): what differs
    tensors: list[str] = field(default_factory=list)  # up to 10 differing tensors at the step
    # The first differing tensor exists at that step in one run only ("a": the first run given
    # to first_divergence, "b": the second; a gradient in one, none in the other): no magnitude.
    only_in: str | None = None
    op: FirstOp | None = None  # the first op whose output differs in that step (reproci.golden.ops)

    def to_dict(self) -> Evidence:
        """The divergence as a model entry's evidence holds it (its fields are ``Evidence``'s)."""
        return cast("Evidence", asdict(self))


def _causal_key(name: str, index: int, n: int, one_sided: bool = False) -> tuple[int, int, int]:
    kind = name.partition(":")[0]
    order = CAUSAL_KIND_ORDER.get(kind, 9)
    # Within a kind, a tensor that exists in one run only comes first: the step took another
    # path there (a layer skipped, a branch taken), which is what the other differences follow.
    # Backward runs the registration order in reverse: the last layer's grads come first.
    return (order, 0 if one_sided else 1, n - index if kind == "grad" else index)


def step_rows(run: Run) -> dict[int, dict[str, int]]:
    """Step -> tensor name -> checksum, as the record holds them (``ABSENT`` where the run
    had no such tensor at that step, in records of ``FINGERPRINT_SCHEME``)."""
    t = Trajectory.of(run)
    return {t.start_step + i + 1: dict(zip(t.tensor_names, row)) for i, row in enumerate(t.fingerprints)}


def tracks_absence(run: Run) -> bool:
    """Whether a record's rows have a column for every gradient and say where a tensor is
    absent. Older records took their gradient columns from their first step, and a tensor
    missing at a step read 0 there, as an all-zero one does."""
    return Trajectory.of(run).fingerprint_scheme == FINGERPRINT_SCHEME


def comparable_rows(run_a: Run, run_b: Run) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]]]:
    """Both records' rows over one set of names, each value meaning the same on both sides.

    Records that track absence carry every gradient from their first row: a name one of them
    lacks is a tensor that run never had, absent at every step. With an older record on
    either side, only the names both carry are compared, and absent reads 0 as it did then
    (a gradient missing on one side and all zero on the other cannot be told apart there)."""
    a, b = Trajectory.of(run_a), Trajectory.of(run_b)
    rows_a, rows_b = step_rows(a), step_rows(b)
    names_a, names_b = list(a.tensor_names), list(b.tensor_names)
    if tracks_absence(a) and tracks_absence(b):
        known_a, known_b = set(names_a), set(names_b)
        extra_a = [n for n in names_b if n not in known_a]
        extra_b = [n for n in names_a if n not in known_b]
        for rows, extra in ((rows_a, extra_a), (rows_b, extra_b)):
            for row in rows.values():
                row.update(dict.fromkeys(extra, ABSENT))
        return rows_a, rows_b
    common = set(names_a) & set(names_b)

    def old(rows: dict[int, dict[str, int]]) -> dict[int, dict[str, int]]:
        return {s: {n: 0 if v == ABSENT else v for n, v in row.items() if n in common} for s, row in rows.items()}

    return old(rows_a), old(rows_b)


def presence_text(tensor: str, step: int | None, present: str, absent: str) -> str:
    """'grad:fc.weight exists in C at step 16, not in A': a tensor one run has and the other
    does not (for a gradient, that step took another path in one of them)."""
    return f"{tensor} exists in {present} at step {step}, not in {absent}"


def _initial(t: Trajectory) -> tuple[int, list[str], dict[str, int]] | None:
    init = t.initial_fingerprint
    if not init:
        return None
    return int(init["step"]), list(init["names"]), dict(zip(init["names"], init["row"]))


def _start_divergence(a: Trajectory, b: Trajectory, rows_a: dict[int, dict[str, int]],
                      rows_b: dict[int, dict[str, int]]) -> Divergence | None:
    """A difference before either run's first common step: at step 0 (both from scratch),
    or where the later run resumed (its loaded state against the other run's row there)."""
    ia, ib = _initial(a), _initial(b)
    if ia is not None and ib is not None and ia[0] == ib[0]:
        step, names, ra, rb = ia[0], ia[1], ia[2], ib[2]
        cause = "init" if step == 0 else "restore"
    elif ib is not None and ib[0] in rows_a:  # b resumed where a has a row
        step, names, ra, rb, cause = ib[0], ib[1], rows_a[ib[0]], ib[2], "restore"
    elif ia is not None and ia[0] in rows_b:
        step, names, ra, rb, cause = ia[0], ia[1], ia[2], rows_b[ia[0]], "restore"
    else:
        return None
    differing = [n for n in names if n in ra and n in rb and ra[n] != rb[n]]
    if cause == "restore":
        differing = [n for n in differing if not _recomputed(n, step, (a, b), rows_a, rows_b)]
    if not differing:
        return None
    return Divergence(step=step, tensor=differing[0], kind=differing[0].partition(":")[0], cause=cause,
                      differing_tensors=len(differing), tensors=differing[:10])


def _recomputed(name: str, step: int, records: tuple[Trajectory, ...], rows_a: dict[int, dict[str, int]],
                rows_b: dict[int, dict[str, int]]) -> bool:
    """A non-persistent buffer that differs where a run resumed and agrees after the next step: no
    checkpoint holds it (a rotary embedding's ``inv_freq``), and the first forward rewrote it from
    its inputs. The rule of the state census: only a difference that persists counts."""
    if not any(r.initial_fingerprint and name in (r.initial_fingerprint.get("transient") or ()) for r in records):
        return False
    na, nb = rows_a.get(step + 1), rows_b.get(step + 1)
    return na is not None and nb is not None and name in na and na.get(name) == nb.get(name)


def first_divergence(run_a: Run, run_b: Run) -> Divergence | None:
    """Where two runs first disagree over the steps both recorded, or None if they agree.

    Step 0 is the state before the first step (runs from scratch); a resumed run's state
    as loaded is compared with the other run's row at the resume step.
    """
    a, b = Trajectory.of(run_a), Trajectory.of(run_b)
    rows_a, rows_b = comparable_rows(a, b)
    common = sorted(set(rows_a) & set(rows_b))
    start_a, start_b = a.start_step, b.start_step
    names = list(a.tensor_names)
    known = set(names)
    names += [n for n in b.tensor_names if n not in known]
    index = {n: i for i, n in enumerate(names)}
    losses_a, losses_b = a.losses, b.losses
    batch_a, batch_b = a.batch_fingerprints, b.batch_fingerprints
    same_scheme = a.batch_checksum == b.batch_checksum

    def at(seq: list[Any], start: int, step: int) -> Any:
        i = step - start - 1
        return seq[i] if 0 <= i < len(seq) else None

    losses_equal = all(at(losses_a, start_a, s) == at(losses_b, start_b, s) for s in common) if common else None
    early = _start_divergence(a, b, rows_a, rows_b)
    if early is not None:
        early.losses_equal = losses_equal
        return early
    for s in common:
        ra, rb = rows_a[s], rows_b[s]
        if ra == rb:
            continue
        differing = [n for n in set(ra) | set(rb) if ra.get(n) != rb.get(n)]
        one_sided = {n for n in differing if ABSENT in (ra.get(n), rb.get(n))}
        differing.sort(key=lambda n: _causal_key(n, index.get(n, len(names)), len(names), n in one_sided))
        first = differing[0]
        if not same_scheme:
            cause = "unknown"
        else:
            cause = "data" if at(batch_a, start_a, s) != at(batch_b, start_b, s) else "compute"
        return Divergence(
            step=s, tensor=first, kind=first.partition(":")[0], cause=cause, differing_tensors=len(differing),
            data=data_difference(a, b, s) if cause == "data" else None,
            loss_equal_at_step=at(losses_a, start_a, s) == at(losses_b, start_b, s), losses_equal=losses_equal,
            tensors=differing[:10],
            only_in=("b" if ra.get(first) == ABSENT else "a") if first in one_sided else None,
        )
    if a.final_sha256 == b.final_sha256:
        return None
    # Checksums agree at every common step but the final states differ (no per-step
    # fingerprints, or a change outside the recorded steps): name tensors by final hash.
    ta, tb = a.tensor_sha256, b.tensor_sha256
    differing = sorted(n for n in set(ta) | set(tb) if ta.get(n) != tb.get(n))
    named = differing[0] if differing else None
    return Divergence(step=None, tensor=named, kind=named.partition(":")[0] if named else None, cause="compute",
                      differing_tensors=len(differing), losses_equal=losses_equal, tensors=differing[:10])


def data_difference(run_a: Run, run_b: Run, step: int) -> str | None:
    """How two runs' batches at ``step`` differ, from their order-free content checksums:
    "reordered" (the same samples in another order within the batch), "order" (the whole
    epoch holds the same samples in both runs, in another order), "contents" (it does not),
    or None (not recorded, or the epoch is not whole in both runs)."""
    a, b = Trajectory.of(run_a), Trajectory.of(run_b)
    if a.batch_contents_scheme is None or a.batch_contents_scheme != b.batch_contents_scheme:
        return None

    def by_step(t: Trajectory) -> dict[int, tuple[int, int]]:
        return {t.start_step + i + 1: (e, c) for i, (e, c) in enumerate(zip(t.batch_epochs, t.batch_contents))}

    sa, sb = by_step(a), by_step(b)
    if step not in sa or step not in sb:
        return None
    if sa[step][1] == sb[step][1]:
        return "reordered"
    # The same samples in another order give the same sum of content checksums over an epoch:
    # judged on the step's epoch, or, when a run did not record all of it (a resumed run), on
    # the first later epoch that both runs recorded whole.
    later = sorted({e for e, _ in sa.values() if e >= sa[step][0]})
    for epoch in later:
        if _whole_epoch(a, sa, epoch) and _whole_epoch(b, sb, epoch):
            totals = [sum(c for e, c in rows.values() if e == epoch) % 2**32 for rows in (sa, sb)]
            verdict = "order" if totals[0] == totals[1] else "contents"
            return verdict if epoch == sa[step][0] else f"{verdict}@{epoch}"
    return None


def _whole_epoch(t: Trajectory, rows: dict[int, tuple[int, int]], epoch: int) -> bool:
    """Whether a run recorded every batch of ``epoch``: as many as the loader has in an epoch,
    or, its length unknown, it went on into the next epoch and started before this one."""
    epochs = [e for e, _ in rows.values()]
    per_epoch = t.batches_per_epoch
    if per_epoch:
        return epochs.count(epoch) == per_epoch
    if epoch + 1 not in epochs:
        return False
    return t.start_step == 0 or min(epochs) < epoch


_ORDERED_INT = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32, np.dtype(np.float16): np.int16}


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place (floats), or absolute difference (ints)."""
    if a.dtype not in _ORDERED_INT:
        return np.abs(a.astype(np.int64) - b.astype(np.int64))
    it = _ORDERED_INT[a.dtype]
    bits = np.iinfo(it).bits

    def ordered(x: np.ndarray) -> np.ndarray:
        i = x.view(it).astype(np.int64)
        # Map sign-magnitude floats onto a line where neighbours differ by 1.
        return np.where(i < 0, -(1 << (bits - 1)) - i, i)

    return np.abs(ordered(a) - ordered(b))


class Magnitude(TypedDict, total=False):
    max_abs: float | None
    max_ulp: int | None
    elements_differing: int | None
    shape_mismatch: list[list[int]]  # the two shapes, where they differ (no magnitude then)


def tensor_magnitude(a: Any, b: Any) -> Magnitude:
    """max-abs, max-ULP and differing-element count of two tensors (torch or numpy)."""
    xa, xb = _to_numpy(a), _to_numpy(b)
    if xa.shape != xb.shape:
        return {"max_abs": None, "max_ulp": None, "elements_differing": None, "shape_mismatch": [list(xa.shape), list(xb.shape)]}
    if xa.size == 0:
        return {"max_abs": 0.0, "max_ulp": 0, "elements_differing": 0}
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(xa.astype(np.float64) - xb.astype(np.float64))
    ne = xa.view(np.uint8) != xb.view(np.uint8) if xa.dtype.itemsize == 1 else (
        xa.reshape(-1).view(f"u{xa.dtype.itemsize}") != xb.reshape(-1).view(f"u{xb.dtype.itemsize}"))
    return {
        "max_abs": float(np.nanmax(diff)) if diff.size else 0.0,
        "max_ulp": int(ulp_distance(xa.reshape(-1), xb.reshape(-1)).max()),
        "elements_differing": int(np.count_nonzero(ne)),
    }


def _to_numpy(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        import torch

        t = t.detach().cpu()
        if t.layout != torch.strided:  # a sparse gradient in a dump
            t = t.to_dense()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.contiguous().numpy()
    return np.asarray(t)


def records_agree(a: Run, b: Run) -> bool:
    return first_divergence(a, b) is None
