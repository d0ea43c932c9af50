"""The run history: one small file per run under ``results/history/``, and its trends.

Each file is named ``<run_id>-<commit12>.json`` (the run id carries the time and the image
name) and holds schema ``reproci.history`` with an integer ``version``: the run's
identity, its verdicts and, per model, each stage's keys (``Stage.history``: the throughput
summary). ``reproci report --history DIR`` turns a folder of them into trends per image and
model, each stage adding its fields to a point (``Stage.trend``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TypedDict, cast

from .. import atomic, typed
from ..document import Document, ImageView
from ..errors import ResultsError
from ..results import RecordedOptions, ResultsDocument, Summary

if TYPE_CHECKING:
    from ..stages.base import Stages
    from ..worker.sections import Gpu, Threads

SCHEMA = "reproci.history"
VERSION = 1
DIRNAME = "history"


class HistoryImage(TypedDict):
    name: str | None
    reference: str | None
    digest: str | None
    backend: str | None


class HistoryModel(TypedDict):
    """A model's point in the history: its verdict and hash, then each stage's keys (``Stage.history``)."""

    model: str | None
    verdict: str | None
    final_sha256: str | None


class HistoryEnvironment(TypedDict, total=False):
    """The versions and hardware of the environment fingerprint (``worker.process.envinfo``): those
    keys of it the run's has, as they are."""

    torch: str
    cuda: str | None
    cudnn: int | None
    device: str
    gpu: Gpu
    threads: Threads


ENVIRONMENT_KEYS = ("torch", "cuda", "cudnn", "device", "gpu", "threads")


class HistoryEntry(TypedDict):
    """One run in the history (schema reproci.history): its identity, verdicts and its stages' keys of each model."""

    schema: str
    version: int
    run_id: str | None
    created: str | None
    project_commit: str | None
    reproci_version: str | None
    image: HistoryImage
    options: RecordedOptions | None
    environment: HistoryEnvironment
    summary: Summary | None
    models: list[HistoryModel]


class TrendPoint(TypedDict):
    """A model's run in the trends (``trends``): the run and the model's verdict, then each stage's
    fields (``Stage.trend``: the throughput stage's slowdown and rates)."""

    run_id: str | None
    created: str | None
    commit: str | None
    digest: str | None
    verdict: str | None
    final_sha256: str | None
    # the throughput stage's (its trend): strict mode's slowdown and both modes' rates
    slowdown: float | None  # strict's median
    ci_low: float | None
    ci_high: float | None
    noisy: bool | None
    strict_steps_per_s: float | None
    default_steps_per_s: float | None


@dataclass(frozen=True, kw_only=True)
class ModelPoint:
    """A model's point in a history file, read back: its name, verdict and hash (each stage reads its keys)."""

    model: str | None = None
    verdict: str | None = None
    final_sha256: str | None = None


@dataclass(frozen=True, kw_only=True)
class HistoryRun:
    """A history file read back (``load``): the run's identity, its image and its models' points as written."""

    run_id: str | None = None
    created: str | None = None
    project_commit: str | None = None
    image: ImageView = field(default_factory=ImageView)
    models: list[HistoryModel] = field(default_factory=list)  # as written: a stage reads its keys (``Stage.trend``)


Trends = dict[str, dict[str, list[TrendPoint]]]  # image name -> model -> its points, oldest first


def entry_of(document: ResultsDocument, stages: Stages) -> HistoryEntry:
    """The history entry of one results document, with each of ``stages``' keys of a model."""
    doc = Document.of(document)
    env: Mapping[str, Any] = document.get("environment") or {}
    image = doc.image
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "run_id": doc.run_id,
        "created": doc.created,
        "project_commit": doc.project_commit,
        "reproci_version": doc.reproci_version,
        "image": {"name": image.name, "reference": image.reference, "digest": image.digest, "backend": image.backend},
        "options": document.get("options"),
        "environment": cast(HistoryEnvironment, {k: env.get(k) for k in ENVIRONMENT_KEYS if k in env}),
        "summary": doc.summary,
        "models": [
            cast(HistoryModel, {"model": e.model, "verdict": e.verdict, "final_sha256": e.final_sha256,
                                **{k: v for stage in stages for k, v in stage.history(m).items()}})
            for m, e in zip(document.get("models", []), doc.models)
        ],
    }


def file_name(document: ResultsDocument) -> str:
    commit = (Document.of(document).project_commit or "nocommit")[:12]
    return f"{document['run_id']}-{commit}.json"


def record(results_dir: Path, document: ResultsDocument, stages: Stages) -> Path:
    """Add this run to ``results_dir/history/`` (atomically); return the file."""
    path = results_dir / DIRNAME / file_name(document)
    atomic.write_text(path, json.dumps(entry_of(document, stages), indent=1, default=str) + "\n")
    return path


def load(directory: Path) -> list[HistoryRun]:
    """Every history entry in a folder, oldest first. Other formats fail with what to do."""
    if not directory.is_dir():
        raise ResultsError(f"history folder {directory} does not exist; `reproci run` writes one under "
                           f"<results-dir>/{DIRNAME}")
    entries: list[HistoryRun] = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path} is not valid JSON (line {e.lineno}); remove it from the history") from e
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ResultsError(f"{path} is not a reproci history file; keep only history files in {directory}")
        if data.get("version") != VERSION:
            v = data.get("version")
            fix = ("upgrade reproci (pip install -U reproci)" if isinstance(v, int) and v > VERSION
                   else "remove it, or re-create it with `reproci report --rebuild-history RESULTS_DIR`")
            raise ResultsError(f"{path} has history format version {v}, this reproci reads {VERSION}: {fix}")
        entries.append(typed.load(HistoryRun, data, lenient=True))  # checked above: this schema, this version
    entries.sort(key=lambda d: (str(d.created), str(d.run_id)))
    return entries


def trends(entries: list[HistoryRun], stages: Stages) -> Trends:
    """image name -> model -> points over time (oldest first), one per run of that model, with
    each of ``stages``' fields of the model's point (``Stage.trend``)."""
    out: Trends = {}
    for e in entries:
        image = e.image.name or "?"
        for m in e.models:
            p = typed.load(ModelPoint, m, lenient=True)
            point = {"run_id": e.run_id, "created": e.created, "commit": e.project_commit,
                     "digest": e.image.digest, "verdict": p.verdict, "final_sha256": p.final_sha256,
                     **{k: v for stage in stages for k, v in stage.trend(m).items()}}
            out.setdefault(image, {}).setdefault(p.model or "?", []).append(cast(TrendPoint, point))
    return out


def rebuild(results_dir: Path, stages: Stages) -> list[Path]:
    """Write history files for every complete run under ``results_dir`` (older reproci, lost history)."""
    from .. import results

    written = []
    for doc_path in sorted(results_dir.glob("*/results.json")):
        written.append(record(results_dir, results.load(doc_path), stages))
    return written
