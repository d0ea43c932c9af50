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

from .. import __version__, atomic, errors, results, verdicts
from ..errors import ResultsError, UsageError
from ..reports import github
from ..results import ResultsDocument
from .merged import MergedDocument, MergedModel, Shard, ShardEnvironment

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
    kept: dict[str, list[int]] = {}
    notes: list[str] = []
    newest_first = sorted(range(len(loaded)), key=lambda i: (str(loaded[i][1].get("created", "")), i), reverse=True)
    for i in newest_first:
        path, doc = loaded[i]
        name = str((doc.get("image") or {}).get("name") or "local")
        newer = next((j for j in kept.get(name, []) if _overlap(loaded[j][1], doc)), None)
        if newer is None:
            kept.setdefault(name, []).append(i)
        else:
            notes.append(f"{name}: kept {loaded[newer][0]} ({loaded[newer][1].get('created')}), ignored older {path}")
    return [loaded[i] for i in sorted(i for ids in kept.values() for i in ids)], notes[::-1]


def _overlap(a: ResultsDocument, b: ResultsDocument) -> bool:
    """Whether two runs of one image checked a model in common (a run without models overlaps all)."""
    names_a, names_b = ({m.get("model") for m in d.get("models", [])} for d in (a, b))
    return not names_a or not names_b or bool(names_a & names_b)


class Expected(TypedDict, total=False):
    """A row of the matrix: an image (and its tag), and the models of its cells (``--format k8s``)."""

    image: str
    tag: str | None
    models: list[str]


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
        rows = json.loads(text)["include"]
        return [{"image": str(row["image"]), "tag": row.get("tag"),
                 **({"models": [str(m) for m in row["models"]]} if row.get("models") else {})} for row in rows]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"--matrix is not the output of `reproci matrix` ({e}); pass that JSON unchanged") from e


# --- the merged document ----------------------------------------------------------------------

def shard_exit_code(doc: ResultsDocument, stages: Stages) -> int:
    """A shard's exit code, recomputed from its verdicts and options as ``run`` computed it."""
    return verdicts.document_exit_code(doc, stages)


def _environment(env: dict[str, Any] | None) -> ShardEnvironment:
    env = env or {}
    gpu = env.get("gpu") or {}
    return {"torch": env.get("torch"), "cuda": env.get("cuda"), "cudnn": env.get("cudnn"), "nccl": env.get("nccl"),
            "gpu_names": gpu.get("names") or [], "gpu_count": gpu.get("count"), "driver": gpu.get("driver"),
            "device": env.get("device"), "threads": env.get("threads")}


def merge(shards: list[tuple[Path, ResultsDocument]], stages: Stages, expected: Iterable[Expected] = ()) -> MergedDocument:
    """One document for all shards: per-image identity, every model with its image (with the
    sections of the stages that have columns in the step summary, ``Stage.matrix_columns``), one
    exit code."""
    shard_rows: list[Shard] = []
    models: list[MergedModel] = []
    shown = [stage.name for stage in stages if stage.matrix_columns]  # their sections ride along
    for path, doc in shards:
        image = doc.get("image") or {}
        name = str(image.get("name") or "local")
        shard_rows.append({
            "image": image, "run_id": doc.get("run_id"), "created": doc.get("created"), "source": str(path),
            "project_commit": doc.get("project_commit"), "reproci_version": doc.get("reproci_version"),
            "options": doc.get("options"), "environment": _environment(doc.get("environment")),
            "summary": doc.get("summary"), "exit_code": shard_exit_code(doc, stages),
        })
        for m in doc.get("models", []):
            # the shard's entry copied by name, as it is (a key it lacks: None): a plain dict until whole
            row: dict[str, Any] = {"image": name, "model": m.get("model"), "verdict": m.get("verdict", verdicts.ERROR),
                                   "message": m.get("message"), "final_sha256": m.get("final_sha256"),
                                   "evidence": m.get("evidence"), "seconds": m.get("seconds"),
                                   "ci": bool((doc.get("options") or {}).get("ci"))}
            # the warning fields ride along: the merged summary and annotations print them (verdicts.warnings)
            for optional in ("golden", *shown, "error", *dict.fromkeys(p[0] for p in results.WARNING_FIELDS)):
                if m.get(optional) is not None:
                    row[optional] = m.get(optional)
            models.append(cast(MergedModel, row))
    # A matrix row is present when a shard carries its image name (or its tag as reference).
    present = {str(v) for row in shard_rows for v in ((row["image"] or {}).get("name") or "local",
                                                       (row["image"] or {}).get("reference")) if v}
    missing = [row["image"] for row in expected if row["image"] not in present and row.get("tag") not in present]
    cells = {(m["image"], m["model"]) for m in models}
    missing += [f"{row['image']} ({model})" for row in expected if row["image"] not in missing
                for model in row.get("models", ()) if (row["image"], model) not in cells]
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
                    "images": len({(row["image"] or {}).get("name") or "local" for row in shard_rows}),
                    "recorded": sum(1 for m in models if (m.get("golden") or {}).get("recorded")),
                    "models": len(models), "missing": len(missing), "exit_code": errors.most_serious(codes)},
    }


def load_merged(path: Path) -> MergedDocument:
    """A merged document, refused with the command that fixes it when it is of another version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path} is not a readable merged results file ({e}); run `reproci merge` again") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is not a reproci merged results file (schema {SCHEMA})")
    if data.get("version") != VERSION:
        raise ResultsError(f"{path} has merged format version {data.get('version')}, this reproci reads {VERSION}: "
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
