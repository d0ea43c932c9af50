"""The shapes of a model entry's sections (``results.ModelEntry``): where runs differ, the golden
comparison, each stage's result. Declared for the type checker; at run time each is a plain dict,
so that results.json is the JSON it has always been."""

from __future__ import annotations

from typing import Any, TypedDict


class ErrorInfo(TypedDict, total=False):
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


class Confirmation(TypedDict, total=False):
    """A re-run with the golden's settings that proves a drift's cause (stages.determinism.golden_cause)."""

    confirmed: bool | None
    settings: dict[str, Any]  # what was put back: cpu_isa, env, threads, world_size
    unsettable: list[str]
    steps: int
    seconds: float


class GoldenImage(TypedDict):
    """The image a golden was recorded in, as its file says (any of them may be missing there)."""

    name: str | None
    reference: str | None
    digest: str | None


class GoldenComparison(TypedDict, total=False):
    """A model against the image's golden (reproci.golden.drift.compare)."""

    file: str | None
    golden_final_sha256: str | None
    golden_image: GoldenImage | None
    recorded_at: str | None
    package_diff: dict[str, list[Any]]  # package -> [golden's, this run's]
    env_diff: dict[str, list[Any]]  # environment key -> [golden's, this run's]
    identity_diff: dict[str, list[Any]]  # MODEL_CHANGED: what makes the model another one
    evidence: Evidence | None
    verdict: str
    why: str
    message: str
    upgrade_checked: bool
    recorded: bool  # this run recorded the golden (--update-golden)
    confirmation: Confirmation


class RunSummary(TypedDict, total=False):
    """One run of a model's determinism check (runs A, B, C, W)."""

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
