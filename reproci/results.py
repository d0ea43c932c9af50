"""The results file, the versioned contract that goldens and reports build on: its document (``ResultsDocument``) and
a model's entry (``ModelEntry``), each entry's sections in ``entry_sections``, a matrix's merge in ``cluster.merged``.

Layout of one invocation's output, under ``results/`` (see docs/results-format.md):

    results/<run_id>/results.json     written last and atomically: present = complete
    results/<run_id>/<model>/spec-*.json, record-*.json   per-run specs and records
    results/latest.json               a copy of the newest complete results.json
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Mapping,
    TypedDict,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from . import atomic
from .entry_sections import (
    AcrossNodes,
    ErrorInfo,
    Evidence,
    GoldenComparison,
    RunSummary,
)
from .errors import ResultsError
from .worker.sections import Attestation, Environment, Execution

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


SCHEMA = "reproci.results"
VERSION = 1  # the one place the results format version is set; ``load`` refuses others

WARNING = "warning"
# A sentence for the user beside a model's verdict, which never changes it. Every field of this
# type, at any depth of a model entry, is printed by every channel that shows the verdict
# (``verdicts.warnings``, from ``WARNING_FIELDS``): declare a new warning with it, nothing more.
WarningText = Annotated[str | None, WARNING]


class Summary(TypedDict, total=False):
    verdicts: dict[str, int]  # verdict -> models
    exit_code: int | None  # verdicts.document_exit_code, set once every verdict is in
    seconds: float


class GoldenOutcome(TypedDict, total=False):
    """The document's ``golden``: the image's golden file, and whether this run recorded it."""

    file: str  # the image's golden file
    existed: bool
    updated: bool  # this run recorded it (--update-golden)
    refused: str  # why it was not recorded
    update_command: str  # the command that records it


class Image(TypedDict, total=False):
    """The image the runs ran in (a backend's ``image_info``)."""

    name: str
    reference: str | None
    digest: str | None
    backend: str
    id: str  # the docker backend's image ID
    torch: str | None
    gpus: Any  # what the container was given: "all", a count or device ids


class Webhook(TypedDict, total=False):
    ok: bool
    attempts: int
    status: int | None
    error: str | None


class Alerts(TypedDict, total=False):
    """Where a finished run's alerts went (orchestrate._alert); never part of the verdict."""

    step_summary: str  # the step summary file appended to
    webhook: Webhook


class RecordedOptions(TypedDict, total=False):
    """The options that shape results, as results.json records them (``RunOptions.recorded``)."""

    stages: list[str]
    profile: str
    steps: int
    resume_at: int
    seed: int
    threads: int
    world_size: int
    device: str
    cpu_isa: str | None
    fault: str | None
    ci: bool
    slowdown_fails: bool
    probes_fail: bool
    fork_server: bool
    compile: list[str]
    compile_mode: str | None
    amp: str | None
    across_nodes: bool  # cluster/across.py: runs compared across nodes


class Coverage(TypedDict, total=False):
    """What the resume check covered (reproci.stages.determinism.coverage)."""

    epochs: int | None  # epochs run A saw
    batches_per_epoch: int | None
    resume_at: int  # the k used
    resume_epoch: int | None
    note: WarningText  # per-epoch state the resume check did not cover, and what to change


class _CensusItem(TypedDict):
    """What every item of a census's ``differences`` says (stages.determinism.census.Row)."""

    path: str  # where the item lives (an attribute path from the model, the optimizer or the loader)
    kind: str
    type: str  # the item's Python type
    step: int
    sides: str | None  # the values on each side, as a sentence


class CensusItem(_CensusItem, total=False):
    """An item of private state that differs between runs A and C."""

    metric: str  # a torchmetrics state: its metric
    owner: str  # the metric's owner


class StateCensus(TypedDict, total=False):
    """Private state of runs A and C compared at the resume point and after it (reproci.stages.determinism.census)."""

    differences: list[CensusItem]  # each item that differs
    notice: WarningText  # plain values that differ while every tensor agreed (a counter): never a failure
    metrics: WarningText  # torchmetrics states that differ while every tensor agreed (a metric only logged)
    errors: list[str]  # why a census could not be taken


class ModelEntry(TypedDict, total=False):
    """One model's result: made by ``stages.model_entry.new``, filled in by the stages, completed by
    the golden check. A stage registered from outside adds its result under its own name, which
    no declaration here names (``stages.model_entry.add_result``)."""

    model: str
    ref: str
    plugin: bool
    description: str | None
    source: str
    code_sha256: str | None
    steps: int
    resume_at: int
    seed: int
    fault: str | None
    verdict: str  # one of verdicts.ALL
    message: str
    final_sha256: str | None
    config: Any  # the plugin's config: whatever its factory returned
    config_sha256: str
    batch_size: int | None
    attestation: Attestation  # the determinism controls proven in effect (worker.determinism.attest): one check a control
    evidence: Evidence | None  # where runs differ (reproci.golden.divergence.Divergence, plus probes)
    golden: GoldenComparison  # the comparison with the image's golden (reproci.golden.drift.compare)
    throughput_regression: WarningText  # strict mode slower than the golden's run
    execution: Execution | None  # compiled, autocast: part of the identity (reproci.worker.execution)
    world_size: int  # ranks per run (--world-size)
    epoch_order: WarningText  # a shuffling loader that repeated its order (reproci.stages.determinism.epochs)
    shared_batches: WarningText  # ranks that train on the same batches (reproci.stages.determinism.replicas)
    coverage: Coverage  # epochs seen, where k fell
    state_census: StateCensus | None  # private state outside the checkpoint
    runs: dict[str, RunSummary]  # role -> summary of that run
    records: dict[str, str]  # role -> record file, relative to the run directory
    across_nodes: AcrossNodes  # --across-nodes: run A of the cell and of its twin on another node (cluster/across.py)
    error: ErrorInfo | None
    seconds: float


class ResultsDocument(TypedDict, total=False):
    """``results.json``: what every later command (goldens, reports, merge) reads. Made by
    ``new_document``, written by ``write`` (its to_json) and read back by ``load`` (its from_json);
    a plain dict at run time, so that the file is exactly the JSON it has always been."""

    schema: str
    version: int
    complete: bool
    run_id: str
    reproci_version: str
    created: str
    project_commit: str | None
    image: Image
    options: RecordedOptions  # the options that shape results (stages, steps, seed, device, ci, ...)
    environment: Environment | None  # the worker's environment fingerprint: what the image's torch reports
    packages: dict[str, str] | None  # installed distribution -> version
    models: list[ModelEntry]
    golden: GoldenOutcome
    alerts: Alerts
    summary: Summary
    lost_cells: list[str]  # --backend ray: the cells that never came back, one line each (docs/distributed.md)


def sections(hint: Any) -> list[Any]:
    """The typed dicts a field holds: its type, or the members of ``Section | None``."""
    return [t for t in (get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)) if is_typeddict(t)]


def warning_fields(kind: Any = None, prefix: tuple[str, ...] = (), within: tuple[Any, ...] = ()
                   ) -> tuple[tuple[str, ...], ...]:
    """The path of every ``WarningText`` field of a model entry, at any depth, in declaration
    order: ('throughput_regression',), ..., ('coverage', 'note'). A section that holds its own
    kind (a first differing op's ``aside``) is read once: ``within`` are the kinds above it."""
    kind = kind or ModelEntry
    out: list[tuple[str, ...]] = []
    for name, hint in get_type_hints(kind, include_extras=True).items():
        if WARNING in getattr(hint, "__metadata__", ()):
            out.append((*prefix, name))
        for section in sections(hint):
            if section not in (kind, *within):
                out += warning_fields(section, (*prefix, name), (*within, kind))
    return tuple(out)


WARNING_FIELDS = warning_fields()


def new_document(**fields: Unpack[ResultsDocument]) -> ResultsDocument:
    """A results document of the current schema and version: ``fields`` are its other keys."""
    return {"schema": SCHEMA, "version": VERSION, "complete": True, **fields}


def add_section(entry: ModelEntry, name: str, section: Mapping[str, Any]) -> None:
    """``entry[name] = section``: a stage's result under the stage's name, which ``ModelEntry``
    declares for the stages of this package, not for a stage registered from outside it."""
    cast(dict[str, Any], entry)[name] = section


def new_run_id(image_name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{image_name}-{os.getpid()}"


def write(run_dir: Path, document: ResultsDocument) -> Path:
    """The document's to_json: ``results.json`` of the run directory, and its copy ``latest.json``."""
    text = json.dumps(document, indent=2, sort_keys=False, default=str) + "\n"
    path = run_dir / "results.json"
    atomic.write_text(path, text)
    atomic.write_text(run_dir.parent / "latest.json", text)
    return path


def load(path: Path) -> ResultsDocument:
    """The document's from_json: ``path`` (a results.json, or the run directory holding one) read
    back, refused in one line that says what to do when it is not a results file of this version."""
    if path.is_dir():
        path = path / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ResultsError(f"results file {path} does not exist; run `reproci run` first") from e
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path} is not valid JSON (line {e.lineno}); it was not written by reproci") from e
    except UnicodeDecodeError as e:
        raise ResultsError(f"{path} is not text (byte {e.start}); it was not written by reproci") from e
    except IsADirectoryError as e:
        raise ResultsError(f"{path} is a directory without a results.json; name a run folder or its results.json") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is not a reproci results file")
    version = data.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        fix = "upgrade reproci (pip install -U reproci)" if newer else "re-run `reproci run` to produce a current file"
        raise ResultsError(f"{path} has results format version {version}, this reproci reads {VERSION}: {fix}")
    return cast(ResultsDocument, data)  # checked above: this schema, this version


def sweep_orphans(results_dir: Path) -> list[Path]:
    """Remove the unfinished run directories (no results.json) of reproci processes that are
    gone (a run killed by SIGKILL or out of memory): a run directory is named after the pid of
    the process that owns it. Returns what was removed."""
    removed = []
    for d in sorted(results_dir.glob("*-*")) if results_dir.is_dir() else []:
        pid = d.name.rpartition("-")[2]
        if not d.is_dir() or not pid.isdigit() or (d / "results.json").exists() or alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def alive(pid: int) -> bool:
    """Whether a process of this host has that pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def discard(run_dir: Path, made: tuple[Path, ...] = ()) -> None:
    """Remove an unfinished run directory (Ctrl-C, fatal error): nothing half-written stays;
    and the folders above it this run made (``made``, deepest first), where they are empty."""
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty (another run's, a history), or already gone
            break
