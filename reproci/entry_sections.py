"""The shapes of a model entry's sections (``results.ModelEntry``): where runs differ, the golden
comparison, each stage's result. Declared for the type checker; at run time each is a plain dict,
so that results.json is the JSON it has always been."""

from __future__ import annotations

from typing import Any, Mapping, TypedDict


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


class Slowdown(TypedDict, total=False):
    """One mode's slowdown against the baseline (stages.throughput.slowdown, sampling.Sampler.summary)."""

    median: float
    ci_low: float
    ci_high: float
    confidence: float
    relative_width: float
    noisy: bool
    ratios: list[float]
    stop: str  # settled, budget, cap
    how_stopped: str
    pairs: int
    pairs_per_repetition: list[int]
    warmup_rounds_dropped: list[Any]
    target_half_width: float
    within_target: bool
    stopped: str
    half_width: float | None
    time_budget_s: float | None
    method: str


class ModeSummary(TypedDict, total=False):
    """One mode's speed over the repetitions (stages.throughput._mode_summary)."""

    steps_per_s: float | None
    samples_per_s: float | None
    step_ms_median: float
    data_wait_ms_median: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None
    steps_per_s_reps: list[float]


class KeptSlowdown(TypedDict, total=False):
    """What a golden keeps of a mode's slowdown: each value as the run had it, or None."""

    median: float | None
    ci_low: float | None
    ci_high: float | None
    noisy: bool | None


class ThroughputSummary(TypedDict, total=False):
    """What a golden keeps of a model's throughput (stages.throughput.throughput_summary)."""

    version: int
    device: str | None
    threads: int | None
    world_size: int
    timed_steps: int | None
    repetitions: int | None
    modes: dict[str, ModeSummary]  # steps_per_s, samples_per_s and peak_memory_bytes of each
    slowdown: dict[str, KeptSlowdown]  # mode -> its slowdown (not "slowdowns": the golden's key)


class Throughput(TypedDict, total=False):
    """The throughput stage's result: strict against default mode (stages.throughput.run_model)."""

    version: int
    device: str
    threads: int
    world_size: int
    warmup_steps: int
    timed_steps: int | None
    run_length: str  # "time" or "steps"
    time_budget_s: float | None
    repetitions: int
    max_repetitions: int
    order: str
    baseline: str
    modes: dict[str, ModeSummary]
    slowdown: Slowdown  # strict's, or empty
    slowdowns: dict[str, Slowdown]
    top_ops: list[dict[str, Any]]  # op, <mode>_ms, <baseline>_ms, delta_ms, growth, share: keys named by the modes
    records: list[str]
    error: ErrorInfo | None
    profiled_steps: int
    cpus: Any  # the CPUs a pair took its turns on
    seconds: float
    golden_summary: ThroughputSummary
    regression: str  # the same sentence as the entry's throughput_regression (golden.check)


class AgainstGolden(TypedDict, total=False):
    """This run's variance judged against the golden's (stages.variance.against)."""

    golden_run_id: str | None
    golden_k: int | None
    k: int | None
    comparisons: list[dict[str, Any]]  # stats.Judgement.to_dict() per metric
    skipped: str | None
    golden_values: dict[str, list[float]]


class MetricSpread(TypedDict, total=False):
    """A metric over K seeds (stats.describe, and its direction)."""

    values: list[float]
    mean: float | None
    std: float | None
    lower_is_better: bool


class Variance(TypedDict, total=False):
    """The variance stage's K seeds (stages.variance)."""

    version: int
    k: int
    seeds: list[int]
    steps: int | None
    metrics: dict[str, MetricSpread]  # metric -> its values over the seeds
    error: ErrorInfo | None
    seconds: float
    records: list[str]
    final_sha256: list[str | None]
    against_golden: AgainstGolden


class Audit(TypedDict, total=False):
    """The op audit (stages.audit): the ops a model runs, and what strict mode does to them on CUDA."""

    torch: str | None
    device: str
    ops_executed: int | None
    distinct_ops: int
    counts: dict[str, int]  # raises, slower, fills
    findings: list[dict[str, Any]]  # one per op of the audit table (worker.audit.audit_table)
    warnings: list[Any]
    attention: list[dict[str, Any]]  # each SDPA call: inputs, predicted CUDA backend, what ran
    inventory: list[dict[str, Any]]  # op, phase, where, count
    record: str
    error: ErrorInfo
    seconds: float


class ProbeRow(TypedDict, total=False):
    """One setting changed (stages.probes)."""

    model: str  # in a report's rows only
    probe: str
    factor: str
    change: str | None
    status: str
    evidence: Mapping[str, Any] | None  # a divergence (Evidence), or what an inspection found (its own shape)
    message: str


class Probes(TypedDict, total=False):
    """The portability probes (stages.probes)."""

    rows: list[ProbeRow]
    depends: list[str]
    seconds: float


# One factor of a bisection; "from" and "to" are keys a class body cannot name.
BisectRow = TypedDict("BisectRow", {
    "factor": str,
    "status": str,  # already off, turned off, put back, error
    "from": str,  # the factor's state in the failing check
    "to": str,  # what it was turned to
    "equal": bool,
    "evidence": Evidence | None,
    "note": str,
    "message": str,
}, total=False)


class Bisect(TypedDict, total=False):
    """The bisection by configuration (stages.bisect)."""

    model: str  # in a report's rows only
    check: str | None
    verdict: str | None
    stages: list[BisectRow]
    culprit: str | None
    runs: int
    steps: int | None
    message: str
    seconds: float


class BlameCost(TypedDict):
    images_built: int
    runs: int
    seconds: float  # the blame's own, images built included


class BlameTry(TypedDict, total=False):
    """The golden's image with one group (or a pair) of the new image's packages (stages.blame)."""

    group: list[str]
    moves: list[str]  # 'torch 2.13.0 → 2.14.1'
    pair: bool
    outcome: str  # reproduces, does not, changes otherwise, cannot swap
    why: str  # cannot swap: why
    from_step: int | None  # reproduces: the first step that differs from the golden


class Blame(TypedDict, total=False):
    """The upgrade blame by package group (stages.blame)."""

    steps: int
    tried: list[BlameTry]  # each package group alone
    pairs: list[BlameTry]  # two groups together, where none alone reproduced the change
    culprit: list[str] | None  # the group that reproduces the change
    message: str
    cost: BlameCost


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
