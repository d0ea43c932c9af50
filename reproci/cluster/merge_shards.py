"""The per-image shards of a CI matrix, merged into one verdict.

Each matrix job runs ``reproci run --image NAME`` and uploads its results directory.
The final job downloads them all and runs::

    reproci merge shards/ --matrix "$MATRIX" --output merged.json --annotations

which writes one merged document (schema ``reproci.merged``, integer ``version``),
appends a Markdown summary to ``$GITHUB_STEP_SUMMARY`` (or ``--summary FILE``), prints one
GitHub annotation per failing or drifting model, and exits with the most serious exit
code of the shards: a shard the matrix expected but that never arrived counts as an
infrastructure failure (exit 5).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, TypedDict, cast

from .. import __version__, atomic, errors, results, typed, verdicts
from ..document import Document, EnvironmentView
from ..errors import ResultsError, UsageError
from ..golden import comparison
from ..reports import github
from ..results import ResultsDocument
from .merged import Header, MergedDocument, MergedModel, Shard, ShardEnvironment

if TYPE_CHECKING:
    from ..stages.base import Stages

SCHEMA = "reproci.merged"
VERSION = 1

# --- finding and reading shards -------------------------------------------------------------

def find_results(paths: Iterable[Path]) -> list[Path]:
    """Every results.json named by or under the given paths (latest.json copies are skipped).

    A directory without one is skipped: its image then counts as missing (see ``merge``).
    """
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(path.rglob("results.json")))
        else:
            raise ResultsError(f"shard {path} does not exist; pass the directories the artifacts were downloaded to")
    return found


def load_shards(paths: Iterable[Path]) -> tuple[list[tuple[Path, ResultsDocument]], list[str]]:
    """(path, document) per shard, in the order found, and notes on superseded runs. Of two runs of
    one image that share a model the newer wins; runs of one image's other models (the cells of
    ``reproci matrix --format k8s``, one model each) are all kept."""
    loaded = [(path, results.load(path)) for path in find_results(paths)]
    read = [Document.of(doc) for _, doc in loaded]
    kept: dict[str, list[int]] = {}
    notes: list[str] = []
    newest_first = sorted(range(len(loaded)), key=lambda i: (read[i].created or "", i), reverse=True)
    for i in newest_first:
        name = read[i].image.label
        newer = next((j for j in kept.get(name, []) if _overlap(read[j], read[i])), None)
        if newer is None:
            kept.setdefault(name, []).append(i)
        else:
            notes.append(f"{name}: kept {loaded[newer][0]} ({read[newer].created}), ignored older {loaded[i][0]}")
    return [loaded[i] for i in sorted(i for ids in kept.values() for i in ids)], notes[::-1]


def _overlap(a: Document, b: Document) -> bool:
    """Whether two runs of one image checked a model in common (a run without models overlaps all)."""
    names_a, names_b = ({m.model for m in d.models} for d in (a, b))
    return not names_a or not names_b or bool(names_a & names_b)


class Expected(TypedDict):
    """A row of the matrix: an image (and its tag), and the models of its cells (``--format k8s``)."""

    image: str
    tag: str | None
    models: list[str]  # empty: the row names no cells, its image is expected whole


def expected_images(matrix: str | None) -> list[Expected]:
    """The rows of a matrix (the JSON text ``reproci matrix`` printed, or a file holding it); a row
    may list its ``models`` (``--format k8s``: one cell each), then each is expected too."""
    if not matrix:
        return []
    text = matrix
    if not matrix.lstrip().startswith("{"):
        try:
            text = Path(matrix).read_text()
        except OSError as e:
            raise UsageError(f"--matrix {matrix!r} is neither matrix JSON nor a readable file: {e}") from e
    try:
        out: list[Expected] = []
        for row in json.loads(text)["include"]:
            out.append({"image": str(row["image"]), "tag": row.get("tag"),
                        "models": [str(m) for m in row["models"]] if row.get("models") else []})
        return out
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"--matrix is not the output of `reproci matrix` ({e}); pass that JSON unchanged") from e


# --- the merged document ----------------------------------------------------------------------

def shard_exit_code(doc: ResultsDocument, stages: Stages) -> int:
    """A shard's exit code, recomputed from its verdicts and options as ``run`` computed it."""
    return verdicts.document_exit_code(doc, stages)


def _environment(env: EnvironmentView, threads: Any) -> ShardEnvironment:
    """The shard's environment, as the summary compares it; ``threads`` as the fingerprint records them."""
    return {"torch": env.torch, "cuda": env.cuda, "cudnn": env.cudnn, "nccl": env.nccl,
            "gpu_names": env.gpu.names, "gpu_count": env.gpu.count, "driver": env.gpu.driver,
            "device": env.device, "threads": threads}


def merge(shards: list[tuple[Path, ResultsDocument]], stages: Stages, expected: Iterable[Expected] = ()) -> MergedDocument:
    """One document for all shards: per-image identity, every model with its image (with the
    sections of the stages that have columns in the step summary, ``Stage.matrix_columns``), one
    exit code."""
    shard_rows: list[Shard] = []
    models: list[MergedModel] = []
    names: list[str] = []  # each shard's image
    present: set[str] = set()  # a matrix row is present when a shard carries its image name (or its tag as reference)
    recorded = 0
    shown = [stage.name for stage in stages if stage.matrix_columns]  # their sections ride along
    for path, doc in shards:
        read = Document.of(doc)
        name = read.image.label
        names.append(name)
        present.update(str(v) for v in (name, read.image.reference) if v)
        shard_rows.append({
            "image": doc.get("image") or {}, "run_id": read.run_id, "created": read.created, "source": str(path),
            "project_commit": read.project_commit, "reproci_version": read.reproci_version,
            "options": doc.get("options"),
            "environment": _environment(read.env, env.get("threads") if (env := doc.get("environment")) else None),
            "summary": read.summary, "exit_code": shard_exit_code(doc, stages),
        })
        for m, entry in zip(doc.get("models") or [], read.models):
            # the shard's entry copied by name, as it is (a key it lacks: None): a plain dict until whole
            row: dict[str, Any] = {"image": name, "model": entry.model, "verdict": entry.verdict or verdicts.ERROR,
                                   "message": entry.message, "final_sha256": entry.final_sha256,
                                   "evidence": m.get("evidence"), "seconds": entry.seconds, "ci": bool(read.options.ci)}
            # the warning fields ride along: the merged summary and annotations print them (verdicts.warnings)
            for optional in ("golden", *shown, "error", *dict.fromkeys(p[0] for p in results.WARNING_FIELDS)):
                if (value := m.get(optional)) is not None:
                    row[optional] = value
            golden = comparison.of(m)
            recorded += bool(golden and golden.recorded)
            models.append(cast(MergedModel, row))
    missing = [row["image"] for row in expected if row["image"] not in present and row["tag"] not in present]
    cells = {(m["image"], m["model"]) for m in models}
    missing += [f"{row['image']} ({model})" for row in expected if row["image"] not in missing
                for model in row["models"] if (row["image"], model) not in cells]
    codes = [row["exit_code"] for row in shard_rows] + [errors.EXIT_INFRA] * len(missing)
    vs = [m["verdict"] for m in models]
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reproci_version": __version__,
        "shards": shard_rows,
        "missing": missing,
        "models": models,
        "summary": {"verdicts": {v: vs.count(v) for v in sorted(set(vs))},
                    "images": len(set(names)),
                    "recorded": recorded,
                    "models": len(models), "missing": len(missing), "exit_code": errors.most_serious(codes)},
    }


def load_merged(path: Path) -> MergedDocument:
    """A merged document, refused with the command that fixes it when it is of another version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path} is not a readable merged results file ({e}); run `reproci merge` again") from e
    if not isinstance(data, dict) or (header := typed.load(Header, data)).schema != SCHEMA:
        raise ResultsError(f"{path} is not a reproci merged results file (schema {SCHEMA})")
    if header.version != VERSION:
        raise ResultsError(f"{path} has merged format version {header.version}, this reproci reads {VERSION}: "
                           "run `reproci merge` on the shards again with this reproci")
    return cast(MergedDocument, data)  # checked above: this schema, this version


def merge_files(shards: tuple[Path, ...], output: Path, stages: Stages, *, matrix: str | None = None,
                summary: Path | None = None) -> tuple[MergedDocument, list[str]]:
    """``reproci merge``: read the shards, write the merged document (and append the step
    summary); return it with notes on superseded shards."""
    for path, flag in ((output, "--output"), (summary, "--summary")):  # both, before either is written
        refused = None if path is None else atomic.unwritable(path, flag)
        if refused is not None:
            raise refused
    expected = expected_images(matrix)
    loaded, notes = load_shards(shards)
    if not loaded and not expected:
        raise ResultsError(f"no results.json under {', '.join(map(str, shards))}; did the shards' `reproci run` "
                           "finish? (pass --matrix to report the missing images instead)")
    merged = merge(loaded, stages, expected)
    atomic.write_output(output, json.dumps(merged, indent=2) + "\n")
    if summary is not None:
        atomic.append_output(summary, github.merged_summary_markdown(merged, stages), flag="--summary")
    return merged, notes
