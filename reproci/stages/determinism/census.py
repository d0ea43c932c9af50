"""The state census compared: private state of runs A and C at the resume point and after
the next step (``reproci.worker.state.census`` takes it).

One rule for state outside the checkpoint: what a trainer's checkpoint holds is restored;
everything else the harness can reach is the plugin's private state, never restored on its
behalf, and compared here.

- An RNG object, a module or a tensor that differs between A and C is a resume bug: the
  verdict is RESUME_BROKEN, naming it by path and type, even when every fingerprinted tensor
  agreed (the state may enter training later, or only through the data order of a later epoch).
- A plain value that differs (a counter, a flag) is named as the likely cause when tensors
  differ too, and is a notice when they do not: a logging counter is no bug.
- The state of a torchmetrics ``Metric`` (known by what the object is: the census marks its
  items) that differs is named as the likely cause when tensors differ too (a metric whose value
  feeds the loss), and is a warning when they do not: a metric only logged is out of Lightning's
  checkpoint too (torchmetrics states are non-persistent by default), so a resumed run logs
  another epoch value for it and trains identically; ``metric.persistent(True)`` puts it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ... import typed, verdicts
from ...golden.divergence import Divergence
from ...results import StateCensus
from ...worker.run_record import RunRecord

STRONG = ("rng", "module", "tensor")  # kinds that fail a resume by themselves


@dataclass(frozen=True, kw_only=True)
class Item:
    """What the census saw at one path (``worker.state.census``)."""

    kind: str = ""  # rng, module, tensor or value
    type: str | None = None  # the object's type, as the census names it
    sha: str | None = None  # its digest
    value: str | None = None  # a plain value's text, where it is short
    metric: str | None = None  # the torchmetrics Metric class whose state it is
    owner: str | None = None  # that metric's path ("model.train_acc")


@dataclass(frozen=True, kw_only=True)
class Point:
    """One census: the items by path, or why it could not be taken."""

    items: dict[str, Item] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Census:
    """A run's census (its record's ``census``): at the resume point k and after step k+1."""

    at: int | None = None  # k
    resume: Point | None = None
    next: Point | None = None

    @classmethod
    def of(cls, record: RunRecord) -> Census:
        return typed.load(cls, record.census or {}, lenient=True)


@dataclass(frozen=True, kw_only=True)
class Row:
    """An item that differs, as the ``state_census`` section's ``differences`` say it."""

    path: str
    kind: str
    type: str
    step: int
    sides: str | None
    metric: str | None = typed.key(omit_none=True, default=None)
    owner: str | None = typed.key(omit_none=True, default=None)


@dataclass(frozen=True)
class Difference:
    path: str
    kind: str  # rng, module, tensor or value
    type: str  # as the census named it, on the side that has it (A's first)
    step: int  # the census point: k (the resume point) or k + 1
    a: Item | None  # the census items of A and C (None: absent on that side)
    c: Item | None
    metric: str | None = None  # the torchmetrics Metric class whose state this is
    owner: str | None = None  # that metric's path ("model.train_acc")

    @property
    def strong(self) -> bool:
        return self.kind in STRONG and self.metric is None

    def sides(self) -> str:
        if self.a is None or self.c is None:
            present, absent = ("A", "C") if self.a is not None else ("C", "A")
            return f"present in {present}, absent in {absent}"
        if self.a.type != self.c.type:
            return f"{self.a.type} in A, {self.c.type} in C"
        if self.kind == "value" and self.a.value is not None and self.c.value is not None:
            return f"A {self.a.value}, C {self.c.value}"
        return ""

    def sentence(self) -> str:
        """'loader.batch_sampler.rng (random.Random) differs between A and C at step 16'."""
        sides = self.sides()
        return f"{self.path} ({self.type}) differs between A and C at step {self.step}" + (f" ({sides})" if sides else "")


def differences(a: RunRecord, c: RunRecord) -> list[Difference]:
    """Each path whose census item differs between A and C after step k+1, dated from where it
    first differs (k or k+1); strong kinds first, in path order.

    A difference at the resume point alone does not count: a value that A had made and C had
    not yet (a cache of rotary embeddings, built on the first forward) and that agrees once C
    has taken a step is derived, not state. Lost state stays lost after the next step. Nor does
    an entry of a cache that A filled and C has not filled yet, beside entries both hold and
    agree on (``_filled_lazily``).
    """
    ca, cc = Census.of(a), Census.of(c)
    k = ca.at
    if k is None or k != cc.at:
        return []

    def items(taken: Point | None) -> dict[str, Item] | None:
        return None if taken is None else taken.items

    ra, rc, na, nc = items(ca.resume), items(cc.resume), items(ca.next), items(cc.next)
    if na is None or nc is None:  # no census after k+1 (a run that failed there): the resume point's
        na, nc = ra or {}, rc or {}
    ra, rc = ra or {}, rc or {}
    lazily = _filled_lazily(na, nc)
    found = []
    for path in sorted(set(na) | set(nc)):
        if _same(na.get(path), nc.get(path)) or path in lazily:
            continue
        early = not _same(ra.get(path), rc.get(path))
        x, y = (ra.get(path), rc.get(path)) if early else (na.get(path), nc.get(path))
        seen = [d for d in (x, y, na.get(path), nc.get(path)) if d is not None]
        kind = next((s for s in STRONG if s in [d.kind for d in seen]), seen[0].kind)
        marked = next((d for d in seen if d.metric), None)
        found.append(Difference(path=path, kind=kind, type="?" if seen[0].type is None else seen[0].type,
                                step=k if early else k + 1, a=x, c=y, metric=marked.metric if marked else None,
                                owner=marked.owner if marked else None))
    return sorted(found, key=lambda d: (not d.strong, d.metric is None, d.step, d.path))


def _entries(path: str) -> list[tuple[str, str]]:
    """(entry, container) for each element step of a path, outermost first:
    ``ds.cache[3][0]`` -> (``ds.cache[3]``, ``ds.cache``), (``ds.cache[3][0]``, ``ds.cache[3]``)."""
    out, start = [], path.find("[")
    while start != -1:
        end = path.find("]", start)
        if end == -1:
            break
        out.append((path[:end + 1], path[:start]))
        start = path.find("[", end)
    return out


def _filled_lazily(a: dict[str, Item], c: dict[str, Item]) -> set[str]:
    """The paths of container entries that A holds and C has not made yet, in a container whose
    entries both hold agree (at least one): a cache the plugin fills from its inputs (a dataset's
    dict of prepared samples, keyed by index, filled in ``__getitem__``) holds what A has read and C
    only what it has read since the resume. Derived, not lost: C makes the same entry when it reads
    that sample. An entry both hold and that differs (a history list, a counter in a dict) is lost
    state, and so is an entry of a container C holds nothing of."""
    agree: dict[str, bool] = {}  # container -> every shared entry equal
    for path in set(a) & set(c):
        same = _same(a[path], c[path])
        for _, container in _entries(path):
            agree[container] = agree.get(container, True) and same
    made = {entry for path in c for entry, _ in _entries(path)}  # the entries C holds something of
    return {path for path in a if path not in c
            and any(entry not in made and agree.get(container, False) for entry, container in _entries(path))}


def _same(x: Item | None, y: Item | None) -> bool:
    if x is None or y is None:
        return x is y
    return x.kind == y.kind and x.type == y.type and x.sha == y.sha


def errors(a: RunRecord, c: RunRecord) -> list[str]:
    """Why a census could not be taken in A or C, if it could not."""
    out = []
    for role, rec in (("A", a), ("C", c)):
        census = Census.of(rec)
        for point, taken in (("resume", census.resume), ("next", census.next)):
            if taken is not None and taken.error:
                out.append(f"run {role} at the {point} point: {taken.error}")
    return out


def fix(d: Difference) -> str:
    if d.metric:
        return (f"it is the state of the torchmetrics {d.metric} {d.owner}, which torchmetrics keeps out of the "
                f"state_dict by default: call {d.owner}.persistent(True) (its state then goes into the state_dict, "
                f"and so into the checkpoint)")
    if d.kind == "module":
        return "declare it in TrainSetup.state_modules (checkpointed and fingerprinted like the model)"
    if d.kind == "rng" and d.path.startswith("loader.dataset."):
        return ("return its state from get_extra_state and put it back in set_extra_state (or, with torchdata's "
                "StatefulDataLoader, give the dataset state_dict and load_state_dict: the loader's state then holds it)")
    if d.kind == "rng":
        return "return its state from get_extra_state and put it back in set_extra_state"
    if d.kind == "tensor":
        return ("return it from get_extra_state and put it back in set_extra_state (or, on a module, register it "
                "as a persistent buffer)")
    return "return it from get_extra_state and put it back in set_extra_state"


def _more(rest: list[Difference]) -> str:
    if not rest:
        return ""
    names = ", ".join(d.path for d in rest[:3])
    return f" (and {len(rest)} more: {names}{', …' if len(rest) > 3 else ''})"


def divergence(diffs: list[Difference]) -> Divergence | None:
    """The evidence of a resume bug that only the census saw: the first strong difference."""
    strong = [d for d in diffs if d.strong]
    if not strong:
        return None
    first = strong[0]
    return Divergence(step=first.step, tensor=first.path, kind="census", cause="census",
                      detail={"type": first.type, "census_kind": first.kind, "differences": [_row(d) for d in diffs[:10]]})


def describe(diffs: list[Difference]) -> str:
    """The verdict's sentence when the census alone found the resume bug."""
    strong = [d for d in diffs if d.strong]
    first = strong[0]
    return (f"A = B = C in every fingerprinted tensor, but {first.sentence()}: it is not in the checkpoint, so a "
            f"resumed run (here, and with the user's own trainer) does not continue from where A was; "
            f"{fix(first)}{_more(strong[1:])}")


def likely_cause(diffs: list[Difference]) -> str | None:
    """The hint beside a resume bug the tensors showed: the private state that differs."""
    if not diffs:
        return None
    first = diffs[0]
    return f"likely cause: {first.sentence()}, outside the checkpoint: {fix(first)}{_more(diffs[1:])}"


def metrics(diffs: list[Difference]) -> str | None:
    """torchmetrics states that differ while every tensor agreed: a warning, never a failure."""
    found = [d for d in diffs if d.metric]
    if not found:
        return None
    owners: dict[str, list[Difference]] = {}
    for d in found:
        owners.setdefault(d.owner or d.path, []).append(d)
    named = [f"{o} (torchmetrics {ds[0].metric}: {', '.join(d.path.removeprefix(o + '.') for d in ds)})"
             for o, ds in list(owners.items())[:3]]
    fixes = " and ".join(f"{o}.persistent(True)" for o in list(owners)[:3])
    return (f"the state of {'; '.join(named)}{' …' if len(owners) > 3 else ''} differs between A and C at step "
            f"{min(d.step for d in found)}: torchmetrics keeps a metric's state out of the state_dict by default, so "
            f"no checkpoint holds it, Lightning's included; every trained tensor agrees, so a resumed run trains "
            f"identically but logs another epoch value; to resume it too, call {fixes}")


def notice(diffs: list[Difference]) -> str | None:
    """Plain values that differ while every tensor agreed: said, never a failure."""
    values = [d for d in diffs if not d.strong and not d.metric]
    if not values:
        return None
    first = values[0]
    return (f"{first.sentence()}, outside the checkpoint; every tensor agrees, so it is taken for bookkeeping "
            f"(a logging counter is no bug): if training reads it, {fix(first)}{_more(values[1:])}")


def _row(d: Difference) -> Any:
    """The item's row of ``differences`` (its JSON)."""
    return typed.dump(Row(path=d.path, kind=d.kind, type=d.type, step=d.step, sides=d.sides() or None,
                          metric=d.metric or None, owner=d.owner if d.metric else None))


def decide(verdict: str, pair: tuple[str, str] | None, ev: Divergence | None,
           diffs: list[Difference]) -> tuple[str, tuple[str, str] | None, Divergence | None]:
    """Every hashed tensor agreed (PASS), but state outside the checkpoint did not: a resume bug
    all the same, with the census's evidence."""
    found = divergence(diffs)
    if verdict == verdicts.PASS and found is not None:
        return verdicts.RESUME_BROKEN, ("A", "C"), found
    return verdict, pair, ev


def hint(verdict: str, pair: tuple[str, str] | None, ev: Divergence | None, diffs: list[Difference]) -> str | None:
    """Beside a resume bug the tensors showed, the private state that differs: measured on the runs."""
    if verdict != verdicts.RESUME_BROKEN or pair != ("A", "C") or ev is None or ev.cause == "census":
        return None
    return likely_cause(diffs)


def summary(records: dict[str, RunRecord], diffs: list[Difference], said: str | None,
            warned: str | None = None) -> StateCensus | None:
    """The result's ``state_census`` section: what differed, the notice, the metrics' warning,
    why a census failed."""
    if "A" not in records or not records["A"].census:
        return None
    return {"differences": [_row(d) for d in diffs], "notice": said, "metrics": warned,
            "errors": errors(records["A"], records["C"])}
