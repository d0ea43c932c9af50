"""``reproci merge``: the per-image shards of a CI matrix, merged into one verdict.

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
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import click

from . import __version__, errors, results, verdicts
from .errors import ResultsError, UsageError

SCHEMA = "reproci.merged"
VERSION = 1

# Exit codes from least to most serious. Verdict codes first (pass < drift < reproducibility
# failure < run error), then the codes of a shard that produced no verdicts at all.
SEVERITY = [*verdicts.SEVERITY, errors.EXIT_USAGE, errors.EXIT_GOLDEN, errors.EXIT_INFRA]
FAILING = {verdicts.NONDETERMINISTIC, verdicts.RESUME_BROKEN, verdicts.ERROR}
DRIFTING = {verdicts.UPGRADE_CHANGED, verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH}
ICON = {verdicts.PASS: "✅", verdicts.NEW: "🆕", verdicts.MODEL_CHANGED: "🔁", verdicts.NONDETERMINISTIC: "❌",
        verdicts.RESUME_BROKEN: "❌", verdicts.ERROR: "💥", verdicts.UPGRADE_CHANGED: "⚠️",
        verdicts.ENV_CHANGED: "⚠️", verdicts.GOLDEN_MISMATCH: "⚠️"}


def most_serious(codes: Iterable[int]) -> int:
    """The most serious of several exit codes (an unknown code counts as the most serious)."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=errors.EXIT_PASS)


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


def load_shards(paths: Iterable[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """(path, document) per image, newest run per image name, and notes on superseded runs."""
    by_image: dict[str, tuple[Path, dict[str, Any]]] = {}
    notes: list[str] = []
    for path in find_results(paths):
        doc = results.load(path)
        name = str((doc.get("image") or {}).get("name") or "local")
        if name in by_image:
            kept, dropped = sorted([by_image[name], (path, doc)], key=lambda pd: str(pd[1].get("created", "")))[::-1]
            notes.append(f"{name}: kept {kept[0]} ({kept[1].get('created')}), ignored older {dropped[0]}")
            by_image[name] = kept
        else:
            by_image[name] = (path, doc)
    return list(by_image.values()), notes


def expected_images(matrix: str | None) -> list[dict[str, Any]]:
    """The rows of a matrix (the JSON text ``reproci matrix`` printed, or a file holding it)."""
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
        return [{"image": str(row["image"]), "tag": row.get("tag")} for row in rows]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"--matrix is not the output of `reproci matrix` ({e}); pass that JSON unchanged") from e


# --- the merged document ----------------------------------------------------------------------

def shard_exit_code(doc: dict[str, Any]) -> int:
    code = (doc.get("summary") or {}).get("exit_code")
    if isinstance(code, int):
        return code
    return verdicts.exit_code([m.get("verdict", verdicts.ERROR) for m in doc.get("models", [])])


def _environment(env: dict[str, Any] | None) -> dict[str, Any]:
    env = env or {}
    gpu = env.get("gpu") or {}
    return {"torch": env.get("torch"), "cuda": env.get("cuda"), "cudnn": env.get("cudnn"), "nccl": env.get("nccl"),
            "gpu_names": gpu.get("names") or [], "gpu_count": gpu.get("count"), "driver": gpu.get("driver"),
            "device": env.get("device"), "threads": env.get("threads")}


def merge(shards: list[tuple[Path, dict[str, Any]]], expected: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """One document for all shards: per-image identity, every model with its image, one exit code."""
    shard_rows: list[dict[str, Any]] = []
    models: list[dict[str, Any]] = []
    for path, doc in shards:
        image = doc.get("image") or {}
        name = str(image.get("name") or "local")
        shard_rows.append({
            "image": image, "run_id": doc.get("run_id"), "created": doc.get("created"), "source": str(path),
            "project_commit": doc.get("project_commit"), "reproci_version": doc.get("reproci_version"),
            "options": doc.get("options"), "environment": _environment(doc.get("environment")),
            "summary": doc.get("summary"), "exit_code": shard_exit_code(doc),
        })
        for m in doc.get("models", []):
            row = {"image": name, "model": m.get("model"), "verdict": m.get("verdict", verdicts.ERROR),
                   "message": m.get("message"), "final_sha256": m.get("final_sha256"),
                   "evidence": m.get("evidence"), "seconds": m.get("seconds")}
            for optional in ("golden", "throughput", "error"):
                if m.get(optional) is not None:
                    row[optional] = m[optional]
            models.append(row)
    # A matrix row is present when a shard carries its image name (or its tag as reference).
    present = {str(v) for row in shard_rows for v in ((row["image"] or {}).get("name") or "local",
                                                       (row["image"] or {}).get("reference")) if v}
    missing = [row["image"] for row in expected if row["image"] not in present and row.get("tag") not in present]
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
        "summary": {"verdicts": {v: vs.count(v) for v in sorted(set(vs))}, "images": len(shard_rows),
                    "models": len(models), "missing": len(missing), "exit_code": most_serious(codes)},
    }


def load_merged(path: Path) -> dict[str, Any]:
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
    return data


# --- text shared by the summary, the annotations and the pull-request body -------------------

def evidence_of(m: dict[str, Any]) -> dict[str, Any] | None:
    """The evidence behind a verdict: the run comparison's, else the golden comparison's."""
    golden = m.get("golden") if isinstance(m.get("golden"), dict) else {}
    if m.get("verdict") in DRIFTING and golden.get("evidence"):
        return golden["evidence"]
    return m.get("evidence") or golden.get("evidence")


def where(m: dict[str, Any]) -> str:
    """'step 15, buffer:bn.running_mean, |Δ| 4.66e-10 (1 ULP)' or '-'."""
    return verdicts.first_difference(evidence_of(m), code=lambda s: f"`{s}`")


def slowdown(m: dict[str, Any]) -> str:
    """'1.23× [1.20, 1.26]' from the throughput stage, '-' when it did not run."""
    sd = ((m.get("throughput") or {}).get("slowdown") or {})
    if sd.get("median") is None:
        return "-"
    text = f"{sd['median']:.2f}×"
    if sd.get("ci_low") is not None and sd.get("ci_high") is not None:
        text += f" [{sd['ci_low']:.2f}, {sd['ci_high']:.2f}]"
    return text + (" (noisy)" if sd.get("noisy") else "")


def cell(value: Any) -> str:
    """Table-safe Markdown text."""
    return str(value if value is not None else "-").replace("|", "\\|").replace("\n", " ")


# --- outputs ----------------------------------------------------------------------------------

def summary_markdown(merged: dict[str, Any]) -> str:
    s = merged["summary"]
    code = s["exit_code"]
    counts = ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()) or "no models"
    status = {errors.EXIT_PASS: "✅ reproducible", errors.EXIT_DRIFT: "⚠️ golden drift",
              errors.EXIT_REPRO_FAILURE: "❌ not reproducible", errors.EXIT_RUN_ERROR: "💥 runs failed"}
    lines = [f"## reproci: {status.get(code, '💥 infrastructure failure')} (exit {code})", "",
             f"{s['images']} image(s), {s['models']} model(s): {counts}.", ""]
    if merged["missing"]:
        lines += [f"**No results from:** {', '.join(f'`{n}`' for n in merged['missing'])} "
                  "(see those jobs' logs).", ""]
    lines += ["| image | model | verdict | first difference | final sha256 | strict slowdown |",
              "|---|---|---|---|---|---|"]
    for m in merged["models"]:
        v = m["verdict"]
        lines.append(f"| `{cell(m['image'])}` | {cell(m['model'])} | {ICON.get(v, '')} {v} | {cell(where(m))} "
                     f"| `{(m.get('final_sha256') or '-')[:12]}` | {cell(slowdown(m))} |")
    notable = [m for m in merged["models"] if m["verdict"] != verdicts.PASS]
    if notable:
        lines += ["", "### Details", ""]
        for m in notable:
            lines.append(f"- **{m['model']}** on `{m['image']}`: {m['verdict']}: {cell(m.get('message'))}")
            golden = m.get("golden") if isinstance(m.get("golden"), dict) else {}
            changed = golden.get("package_diff") or {}
            if changed:
                shown = ", ".join(f"{p} {old or '∅'} → {new or '∅'}" for p, (old, new) in sorted(changed.items())[:10])
                more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
                lines.append(f"  - packages: {shown}{more}")
    lines += ["", "### Images", "", "| image | digest | torch | CUDA | cuDNN | GPU | driver | exit |",
              "|---|---|---|---|---|---|---|---|"]
    for sh in merged["shards"]:
        img, env = sh["image"] or {}, sh["environment"]
        gpus = ", ".join(env.get("gpu_names") or []) or "-"
        lines.append(f"| `{cell(img.get('name'))}` | `{cell((img.get('digest') or '-')[:19])}` | {cell(env.get('torch'))} "
                     f"| {cell(env.get('cuda'))} | {cell(env.get('cudnn'))} | {cell(gpus)} | {cell(env.get('driver'))} "
                     f"| {sh['exit_code']} |")
    return "\n".join(lines) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(merged: dict[str, Any]) -> list[str]:
    """GitHub workflow commands: ::error for failures, ::warning for drift, ::notice for new goldens."""
    out: list[str] = []
    for name in merged["missing"]:
        out.append(f"::error title={_escape_property(f'reproci {name}')}::"
                   f"{_escape_data(f'no results from image {name}: its job failed before writing results.json')}")
    for m in merged["models"]:
        v = m["verdict"]
        if v in FAILING:
            level = "error"
        elif v in DRIFTING:
            level = "warning"
        elif v != verdicts.PASS:
            level = "notice"
        else:
            continue
        title = _escape_property(f"reproci {m['model']} on {m['image']}: {v}")
        detail = where(m)
        text = f"{v}: {m.get('message') or ''}" + (f" (first difference: {detail})" if detail != "-" else "")
        out.append(f"::{level} title={title}::{_escape_data(text)}")
    return out


def write_summary(path: Path, markdown: str) -> None:
    """Append to the summary file (GitHub's step summary is appended to), atomically."""
    existing = path.read_text() if path.is_file() else ""
    results.atomic_write_text(path, existing + ("\n" if existing and not existing.endswith("\n") else "") + markdown)


@click.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Merged results file to write.")
@click.option("--summary", type=click.Path(path_type=Path), envvar="GITHUB_STEP_SUMMARY",
              help="Markdown summary to append to (default: $GITHUB_STEP_SUMMARY when set).")
@click.option("--matrix", help="The `reproci matrix` JSON (or a file): images it lists without results exit 5.")
@click.option("--annotations/--no-annotations", "annotate", default=False, envvar="GITHUB_ACTIONS",
              help="Print GitHub annotations (default: on inside GitHub Actions).")
def merge_cmd(shards: tuple[Path, ...], output: Path, summary: Path | None, matrix: str | None,
              annotate: bool) -> None:
    """Merge per-image results (SHARD: a results.json or a directory holding some) into one verdict."""
    expected = expected_images(matrix)
    loaded, notes = load_shards(shards)
    if not loaded and not expected:
        raise ResultsError(f"no results.json under {', '.join(map(str, shards))}; did the shards' `reproci run` "
                           "finish? (pass --matrix to report the missing images instead)")
    merged = merge(loaded, expected)
    results.atomic_write_text(output, json.dumps(merged, indent=2) + "\n")
    if summary is not None:
        write_summary(summary, summary_markdown(merged))
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if annotate:
        for line in annotations(merged):
            click.echo(line)
    s = merged["summary"]
    counts = ", ".join(f"{v} {n}" for v, n in s["verdicts"].items()) or "no models"
    missing = f", no results from {', '.join(merged['missing'])}" if merged["missing"] else ""
    click.echo(f"merged {s['images']} image(s), {s['models']} model(s): {counts}{missing}; "
               f"exit {s['exit_code']}; {output}")
    sys.stdout.flush()
    if s["exit_code"]:
        raise SystemExit(s["exit_code"])
