"""The shapes of a model entry's sections (``results.ModelEntry``): where runs differ, the golden
comparison, each stage's result. Declared for the type checker; at run time each is a plain dict,
so that results.json is the JSON it has always been; the ``...View`` dataclasses below are some of
them as a reader loads them (``reproci.typed``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, TypedDict, TypeVar

from . import typed


class ErrorInfo(TypedDict):
    """A run's or a stage's failure: both keys always written."""

    kind: str  # why a run or a stage could not complete: errors.py's kind of failure
    message: str


class FirstOp(TypedDict, total=False):
    """The first op whose output differs between two recordings of one step (golden.ops.first_op_difference)."""

    found: bool  # False: every op's outputs agree, the difference entered outside them
    ops: int  # ops compared
    index: int | None
    kind: str  # "output" (its output differs) or "sequence" (the ops themselves differ)
    op: str | None  # aten::name
    overload: str | None
    phase: str | None  # forward, backward, optimizer
    module: str | None
    source: str | None  # file:line
    shape: Any
    dtype: str | None
    other_op: str  # "sequence": the other recording's op there
    max_abs: float | None
    max_ulp: int | None
    elements_differing: int | None
    aside: FirstOp  # an earlier differing op that neither the loss nor the gradients read
    compiled: bool  # the runs were compiled: the recorder saw aten ops, not inductor's kernels


class SwitchedControl(TypedDict, total=False):
    """A determinism control the model switched off (the worker's record of the call), or found off by
    a re-attestation (stages.determinism.explain.controls_switched_off)."""

    control: str
    value: str  # what it was set to (repr)
    off: Any
    setter: str | None
    file: str | None
    line: int | None
    function: str | None
    where: str | None  # file:line
    step: int | None  # 0: before the first step
    found_at: str  # found off by the attestation at the checkpoint or at the end
    runs: list[str]  # the runs it was off in


class Evidence(TypedDict, total=False):
    """Where two runs first differ: ``golden.divergence.Divergence.to_dict()`` and what the comparison
    adds (which runs, the determinism controls switched off, a hint, the rank)."""

    comparison: str | None  # "A vs B", "A on node1 vs A on node2"
    step: int | None
    tensor: str | None
    kind: str | None
    cause: str
    differing_tensors: int
    loss_equal_at_step: bool | None
    losses_equal: bool | None
    losses_agree_digits: int | None  # the golden comparison: digits the final losses share
    max_abs: float | None
    max_ulp: int | None
    elements_differing: int | None
    magnitude_source: str | None
    data: str | None
    detail: dict[str, Any] | None  # causes "eval" and "extra": what differs, as each check says it
    tensors: list[str]
    only_in: str | None
    presence: str  # the sentence for a tensor present in one run only
    op: FirstOp | None
    rank: int  # found on this rank, not rank 0
    controls: list[SwitchedControl]  # determinism controls the model switched off
    hint: str


class PutBack(TypedDict, total=False):
    """The golden's settings a confirmation run puts back (stages.determinism.golden_cause.settings):
    each factor that differs and can be set from software."""

    env: dict[str, str | None]  # kernel-selecting variable -> the golden's value (None: unset there)
    threads: int  # intra-op threads
    world_size: int
    cpu_isa: str  # the golden's CPU capability, as a cap


class _Confirmed(TypedDict):
    """What every confirmation says (``golden.comparison.Confirmation`` writes these keys always)."""

    confirmed: bool | None  # None: not run (the golden's settings cannot be set here)
    settings: PutBack  # what was put back
    unsettable: list[str]  # the factors software cannot set, as sentences


class Confirmation(_Confirmed, total=False):
    """A re-run with the golden's settings that proves a drift's cause (stages.determinism.golden_cause)."""

    steps: int  # the re-run's length, where it ran
    seconds: float


class GoldenImage(TypedDict):
    """The image a golden was recorded in, as its file says (any of them may be missing there)."""

    name: str | None
    reference: str | None
    digest: str | None


class _Compared(TypedDict):
    """What every golden comparison says (``golden.comparison.Comparison`` writes these keys always)."""

    file: str | None
    golden_final_sha256: str | None
    golden_image: GoldenImage | None
    package_diff: dict[str, list[Any]]  # package -> [golden's, this run's]
    env_diff: dict[str, list[Any]]  # environment key -> [golden's, this run's]
    evidence: Evidence | None
    verdict: str
    message: str


class GoldenComparison(_Compared, total=False):
    """A model against the image's golden (reproci.golden.drift.compare): the JSON's shape, for the
    readers that keep the dict; ``reproci.golden.comparison.Comparison`` reads it by attribute."""

    recorded_at: str | None  # with a golden (not NEW)
    identity_diff: dict[str, list[Any]]  # MODEL_CHANGED: what makes the model another one
    why: str
    upgrade_checked: bool
    recorded: bool  # this run recorded the golden (--update-golden)
    confirmation: Confirmation


class RunSummary(TypedDict):
    """One run of a model's determinism check (runs A, B, C, W): every key always written."""

    final_sha256: str | None
    start_step: int
    end_step: int
    wall_s: float  # the run's process, start to end
    start_wait_s: float  # its fork server's or container's start
    setup_s: float
    train_s: float
    attested: bool
    launch: Any  # forked from a server, fresh (and why), or a container: the backend's words
    losses_last: float | None


class AcrossNodes(TypedDict, total=False):
    """--across-nodes: run A of the cell and of its twin on another node (cluster/across.py)."""

    nodes: list[str]
    agree: bool | None
    verdict: str | None
    message: str
    evidence: Evidence
    env_diff: dict[str, list[Any]]
    package_diff: dict[str, list[Any]]
    twin_run_dir: str


# The sections above that a reader reads by attribute (``reproci.typed``): where runs differ, the
# runs' summaries, an error. The TypedDicts stay what writers build and other readers still read;
# these are the same JSON loaded where it is read (``EvidenceView.of(entry)``).

S = TypeVar("S")


def view(kind: type[S], section: Any) -> S | None:
    """``section`` (a section's JSON as read, or already a ``kind``, or another dataclass of its
    fields) as a ``kind``; None where there is none (absent, null, empty)."""
    if not section:
        return None
    if isinstance(section, kind):
        return section
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        section = typed.dump(section)
    return typed.load(kind, section)


@dataclass(frozen=True, kw_only=True)
class FirstOpView:
    """``FirstOp`` read by attribute: the first op whose output differs between two recordings of one step."""

    found: bool | None = typed.key(omit_none=True, default=None)  # False: the difference entered outside the ops
    ops: int | None = typed.key(omit_none=True, default=None)  # ops compared
    index: int | None = None
    kind: str | None = typed.key(omit_none=True, default=None)  # "output" or "sequence"
    op: str | None = None  # aten::name
    overload: str | None = None
    phase: str | None = None  # forward, backward, optimizer
    module: str | None = None
    source: str | None = None  # file:line
    shape: Any = None
    dtype: str | None = None
    other_op: str | None = typed.key(omit_none=True, default=None)  # "sequence": the other recording's op there
    max_abs: float | None = None
    max_ulp: int | None = None
    elements_differing: int | None = None
    magnitude_source: str | None = typed.key(omit_none=True, default=None)
    aside: FirstOpView | None = typed.key(omit_none=True, default=None)  # an earlier op that nothing the step trains on reads
    compiled: bool | None = typed.key(omit_none=True, default=None)  # the recorder saw aten ops, not inductor's kernels


@dataclass(frozen=True, kw_only=True)
class SwitchedControlView:
    """``SwitchedControl`` read by attribute: a determinism control the model switched off."""

    control: str = ""
    value: str | None = typed.key(omit_none=True, default=None)  # what it was set to (repr)
    off: Any = typed.key(omit_none=True, default=None)
    setter: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    where: str | None = None  # file:line
    step: int | None = None  # 0: before the first step
    found_at: str | None = typed.key(omit_none=True, default=None)  # the attestation at the checkpoint or at the end
    runs: list[str] | None = typed.key(omit_none=True, default=None)  # the runs it was off in


@dataclass(frozen=True, kw_only=True)
class EvidenceView:
    """``Evidence`` read by attribute: where two runs first differ."""

    comparison: str | None = None  # "A vs B", "A on node1 vs A on node2"
    step: int | None = None
    tensor: str | None = None
    kind: str | None = None
    cause: str | None = typed.key(omit_none=True, default=None)
    differing_tensors: int | None = typed.key(omit_none=True, default=None)
    loss_equal_at_step: bool | None = None
    losses_equal: bool | None = None
    losses_agree_digits: int | None = typed.key(omit_none=True, default=None)
    max_abs: float | None = None
    max_ulp: int | None = None
    elements_differing: int | None = None
    magnitude_source: str | None = None
    data: str | None = None
    detail: dict[str, Any] | None = typed.key(omit_none=True, default=None)  # causes "eval" and "extra"
    tensors: list[str] | None = typed.key(omit_none=True, default=None)
    only_in: str | None = None
    presence: str | None = typed.key(omit_none=True, default=None)  # a tensor present in one run only
    op: FirstOpView | None = None
    rank: int | None = typed.key(omit_none=True, default=None)  # found on this rank, not rank 0
    controls: list[SwitchedControlView] | None = typed.key(omit_none=True, default=None)
    hint: str | None = typed.key(omit_none=True, default=None)

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> EvidenceView | None:
        """A model entry's (or a golden comparison's, or ``across_nodes``') ``evidence``; None where it has none."""
        return view(cls, entry.get("evidence"))


@dataclass(frozen=True, kw_only=True)
class RunSummaryView:
    """``RunSummary`` read by attribute: one run of a model's determinism check (runs A, B, C, W)."""

    final_sha256: str | None = None
    start_step: int | None = typed.key(omit_none=True, default=None)
    end_step: int | None = typed.key(omit_none=True, default=None)
    wall_s: float | None = typed.key(omit_none=True, default=None)
    start_wait_s: float | None = typed.key(omit_none=True, default=None)
    setup_s: float | None = typed.key(omit_none=True, default=None)
    train_s: float | None = typed.key(omit_none=True, default=None)
    attested: bool | None = typed.key(omit_none=True, default=None)
    launch: Any = typed.key(omit_none=True, default=None)
    losses_last: float | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> dict[str, RunSummaryView]:
        """A model entry's ``runs``, by role; empty where it has none."""
        runs = entry.get("runs") or {}
        return {role: typed.load(cls, run) for role, run in runs.items()}


@dataclass(frozen=True, kw_only=True)
class ErrorView:
    """``ErrorInfo`` read by attribute: why a run or a stage could not complete."""

    kind: str = ""  # errors.py's kind of failure
    message: str = ""

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> ErrorView | None:
        """A model entry's ``error``; None where it has none."""
        return view(cls, entry.get("error"))
