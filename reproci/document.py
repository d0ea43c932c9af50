"""results.json read by attribute: ``Document.of(doc)`` is the whole document, ``Entry.of(m)`` one
model's entry, each a frozen dataclass (``reproci.typed``) over the JSON the run wrote.

The run writes the document as plain JSON (``results.ModelEntry``, ``results.ResultsDocument``:
what a writer builds); every reader after it (reports, merge, goldens, compare) reads it through
these views, so that a key that is missing is the field's default, checked by mypy, and not a
chain of ``.get(... or {})``. A view is for reading: the JSON stays what the writers wrote, and a
stage's result is read from the entry by its stage (``Stage.result(entry)``), not from here.

    doc = Document.of(results.load(path))
    doc.image.name, doc.environment.torch, doc.options.steps
    for m in doc.models:
        m.model, m.verdict, m.runs["A"].final_sha256, m.evidence.step if m.evidence else None
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import typed
from .entry_sections import (
    AcrossNodes,
    ErrorView,
    EvidenceView,
    GoldenComparison,
    RunSummaryView,
)
from .results import Alerts, Coverage, GoldenOutcome, StateCensus, Summary
from .worker.sections import Attestation, Execution


@dataclass(frozen=True, kw_only=True)
class ImageView:
    """The image the runs ran in (a backend's ``image_info``)."""

    name: str | None = None
    reference: str | None = None
    digest: str | None = None
    backend: str | None = None
    id: str | None = None  # the docker backend's image ID
    torch: str | None = None
    gpus: Any = None  # what the container was given: "all", a count or device ids

    @property
    def label(self) -> str:
        """The image's name as every report says it: ``local`` where the document names none."""
        return self.name or "local"


@dataclass(frozen=True, kw_only=True)
class GpuView:
    """The GPUs the worker saw (``worker.process.envinfo``)."""

    count: int | None = None
    names: list[str] = field(default_factory=list)
    capability: list[str] = field(default_factory=list)
    driver: str | None = None


@dataclass(frozen=True, kw_only=True)
class ThreadsView:
    intra_op: int | None = None
    inter_op: int | None = None


@dataclass(frozen=True, kw_only=True)
class CpuIdView:
    """The CPU as /proc/cpuinfo names it (``worker.sections.CpuId``)."""

    vendor: str | None = None
    family: str | None = None
    model: str | None = None
    stepping: str | None = None
    isa: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TorchBuildView:
    """The libraries torch was built with (``worker.sections.TorchBuild``)."""

    onednn: str | None = None
    mkl: str | None = None
    blas: str | None = None
    lapack: str | None = None
    parallel: str | None = None  # ATen's parallel backend


@dataclass(frozen=True, kw_only=True)
class EnvironmentView:
    """The worker's environment fingerprint: what the image's torch reports (``worker.process.envinfo``).
    The golden check compares it as JSON; the reports read it here."""

    torch: str | None = None
    torch_git: str | None = None
    cuda: str | None = None
    cudnn: Any = None
    nccl: Any = None
    hip: str | None = None
    gpu: GpuView = field(default_factory=GpuView)
    device: str | None = None
    cpu: str | None = None  # the CPU's model name
    cpu_id: CpuIdView | None = None
    cpu_capability: str | None = None  # the CPU capability ATen dispatches to
    torch_build: TorchBuildView = field(default_factory=TorchBuildView)
    kernel_env: dict[str, str] = field(default_factory=dict)  # the kernel-selecting variables that are set
    machine: str | None = None
    cpu_count: int | None = None
    threads: ThreadsView = field(default_factory=ThreadsView)
    python: str | None = None
    numpy: str | None = None
    seed: int | None = None
    world_size: int | None = None
    project_commit: str | None = None


@dataclass(frozen=True, kw_only=True)
class OptionsView:
    """The options that shaped the results (``results.RecordedOptions``)."""

    stages: list[str] = field(default_factory=list)
    profile: str | None = None
    steps: int | None = None
    resume_at: int | None = None
    seed: int | None = None
    threads: int | None = None
    world_size: int = 1
    device: str | None = None
    cpu_isa: str | None = None
    fault: str | None = None
    ci: bool = False
    slowdown_fails: bool = False
    probes_fail: bool = False
    fork_server: bool = False
    compile: list[str] = field(default_factory=list)
    compile_mode: str | None = None
    amp: str | None = None
    across_nodes: bool = False


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One model's entry (``results.ModelEntry``) read by attribute. Its golden comparison is read
    by ``golden.comparison.of``; a stage's result by the stage (``Stage.result``)."""

    model: str = ""
    ref: str | None = None
    plugin: bool = False
    description: str | None = None
    source: str | None = None
    code_sha256: str | None = None
    steps: int | None = None
    resume_at: int | None = None
    seed: int | None = None
    fault: str | None = None
    verdict: str | None = None  # one of verdicts.ALL; None in an entry a run never finished
    message: str | None = None
    final_sha256: str | None = None
    config: Any = None
    config_sha256: str | None = None
    batch_size: int | None = None
    attestation: Attestation | None = None  # the determinism controls proven in effect: one check a control
    evidence: EvidenceView | None = None
    golden: GoldenComparison | None = None
    throughput_regression: str | None = None
    execution: Execution | None = None  # compiled, autocast: part of the identity (None: eager fp32)
    world_size: int | None = None
    epoch_order: str | None = None
    shared_batches: str | None = None
    coverage: Coverage | None = None
    state_census: StateCensus | None = None
    runs: dict[str, RunSummaryView] = field(default_factory=dict)
    records: dict[str, str] = field(default_factory=dict)  # role -> record file, relative to the run directory
    across_nodes: AcrossNodes | None = None
    error: ErrorView | None = None
    seconds: float | None = None

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Entry:
        return typed.load(cls, entry, lenient=True)

    def final_of(self, role: str) -> str | None:
        """The final state hash of run ``role`` (A, B, C, W); None where that run has none."""
        run = self.runs.get(role)
        return run.final_sha256 if run else None


@dataclass(frozen=True, kw_only=True)
class Document:
    """``results.json`` (``results.ResultsDocument``) read by attribute."""

    schema: str | None = None
    version: int | None = None
    complete: bool | None = None
    run_id: str | None = None
    reproci_version: str | None = None
    created: str | None = None
    project_commit: str | None = None
    image: ImageView = field(default_factory=ImageView)
    options: OptionsView = field(default_factory=OptionsView)
    environment: EnvironmentView | None = None
    packages: dict[str, str] | None = None
    models: list[Entry] = field(default_factory=list)
    golden: GoldenOutcome | None = None
    alerts: Alerts | None = None
    summary: Summary | None = None
    lost_cells: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> Document:
        return typed.load(cls, document, lenient=True)

    @property
    def env(self) -> EnvironmentView:
        """The environment, or an empty one where the document has none (a run that never started)."""
        return self.environment or EnvironmentView()
