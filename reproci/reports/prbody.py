"""The evidence for a golden update, as a pull-request description (``reproci pr-body``).

The golden-update workflow runs ``reproci run --image NAME --update-golden`` and then::

    reproci pr-body results/latest.json --output body.md --require-reproducible

The body carries what a reviewer needs to approve the new golden like any code change:
old and new image digests, the package and environment diff, per-model verdicts with the
first differing step and tensor and its magnitude, and the strict-determinism slowdown.
``--require-reproducible`` refuses (exit 1) when the run was not itself reproducible: a
golden is only worth recording from runs that agree with each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import verdicts
from ..document import Document, Entry
from ..entry_sections import EvidenceView
from ..errors import NotReproducibleError
from ..golden import comparison
from ..golden.comparison import Comparison, GoldenImage, Outcome
from ..results import ModelEntry, ResultsDocument
from .mdtable import cell, code, table

if TYPE_CHECKING:
    from ..stages.base import Stages

MAX_ROWS = 200  # per table (the stages' too); GitHub refuses bodies over 65,536 characters


def reproducibility_problems(doc: ResultsDocument, stages: Stages) -> list[str]:
    """Why these results did not reproduce themselves (empty when every model's runs agreed)."""
    problems: list[str] = []
    if not any(stage.checks_reproducibility for stage in stages.ran(doc)):
        checker = next(s.name for s in stages if s.checks_reproducibility)
        problems.append(f"the {checker} stage did not run (add --stage {checker})")
    models = Document.of(doc).models
    if not models:
        problems.append("no models ran")
    for m in models:
        name = m.model
        if m.verdict in verdicts.FAILING:
            problems.append(f"{name}: {m.verdict}: {m.message}")
            continue
        hashes = {r: m.final_of(r) for r in ("A", "B", "C")}
        if None in hashes.values() or len(set(hashes.values())) != 1:
            problems.append(f"{name}: runs A, B and C did not all finish with one final hash ({hashes})")
    return problems


def golden_problems(doc: ResultsDocument) -> list[str]:
    """Why these results recorded no golden (empty when the run recorded one)."""
    golden = _outcome(doc)
    if golden.refused:
        return [f"the golden was not recorded: {golden.refused}"]
    if not golden.updated:
        return ["the golden was not recorded: this run had no --update-golden"]
    return []


def require_reproducible(doc: ResultsDocument, source: object, stages: Stages) -> None:
    """Refuse a results document that must not become a golden, saying every reason."""
    problems = reproducibility_problems(doc, stages)
    if problems:
        raise NotReproducibleError(f"{source}: not recording a golden from a run that did not reproduce "
                                   f"itself: {'; '.join(problems + golden_problems(doc))}; fix the nondeterminism first")
    unrecorded = golden_problems(doc)
    if unrecorded:
        raise NotReproducibleError(f"{source}: not recording a golden from a run that recorded none: "
                                   f"{'; '.join(unrecorded)}; record it with `reproci golden update` (or "
                                   f"`reproci run --update-golden`) first")


def _golden(m: ModelEntry) -> Comparison:
    return comparison.of(m) or Comparison()


def _outcome(doc: ResultsDocument) -> Outcome:
    return comparison.outcome_of(doc) or Outcome()


def _short(sha: str | None, n: int = 12) -> str:
    return code(sha[:n]) if sha else "-"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return table(header, rows, max_rows=MAX_ROWS)


def _diff_rows(diffs: list[dict[str, list[Any]] | None]) -> list[list[str]]:
    """Union of per-model diffs {key: [old, new]}: one row per key."""
    merged: dict[str, tuple[Any, Any]] = {}
    for diff in diffs:
        for key, pair in (diff or {}).items():
            old, new = (list(pair) + [None, None])[:2] if isinstance(pair, (list, tuple)) else (None, pair)
            merged[str(key)] = (old, new)
    return [[code(k), cell(old if old is not None else "(absent)"), cell(new if new is not None else "(absent)")]
            for k, (old, new) in sorted(merged.items())]


def render(doc: ResultsDocument, stages: Stages) -> str:
    """The pull-request body for a results document (renders whatever stages and goldens are present):
    the verdicts, the image and its changes, the models, each stage's sections (``Stage.pr_body``,
    in the order they run), the environment."""
    models = doc.get("models", [])
    has_old = any(_golden(m).golden_final_sha256 for m in models)
    lines = [*_verdict_lines(doc, stages), *_warning_lines(models), *_image_lines(doc, has_old), *_diff_lines(models, has_old),
             *_model_lines(models), *(line for stage in stages for line in stage.pr_body(doc)), *_environment_lines(doc)]
    return "\n".join(lines) + "\n"


def _verdict_lines(doc: ResultsDocument, stages: Stages) -> list[str]:
    d = Document.of(doc)
    problems, unrecorded = reproducibility_problems(doc, stages), golden_problems(doc)
    lines = [f"## Golden update for `{d.image.label}`", "",
             f"From `reproci run` {d.run_id} (reproci {d.reproci_version}, "
             f"project commit {_short(d.project_commit, 10)}, {d.created}).", ""]
    if problems:
        lines += ["**⚠️ This run was not reproducible; it must not become a golden:**", ""]
        lines += [f"- {cell(p)}" for p in problems + unrecorded]
        return lines + [""]
    lines.append(f"✅ Every model reproduced itself in this image (A = B = C, {len(d.models)} model(s)).")
    if unrecorded:
        lines += ["", "**⚠️ This run recorded no golden; it must not become a golden update:**", ""]
        lines += [f"- {cell(p)}" for p in unrecorded]
    return lines + [""]


def _warning_lines(models: list[ModelEntry]) -> list[str]:
    """Every model's warnings (``verdicts.warnings``): they never change a verdict, but a reviewer
    approves the golden knowing them."""
    found = [f"- ⚠️ **{cell(Entry.of(m).model)}**: {cell(text)}"
             for m in verdicts.by_severity(models) for _, text in verdicts.warnings(m)]
    return ["### Warnings", "", *found, ""] if found else []


def _image_lines(doc: ResultsDocument, has_old: bool) -> list[str]:
    """The golden's image identity against this run's."""
    image = Document.of(doc).image
    old = next((o for m in doc.get("models", []) if (o := _golden(m).golden_image)), GoldenImage())
    lines = ["### Image", ""]
    lines += _table(["", "current golden", "this run"], [
        ["reference", cell(old.reference or old.name), cell(image.reference or image.label)],
        ["digest", code(old.digest), code(image.digest)],
    ])
    if not has_old:
        lines += ["", "No earlier golden for this image: this is its first."]
    recorded = _outcome(doc)
    if recorded.file:
        state = "written by this run" if recorded.updated else "not written by this run"
        lines += ["", f"Golden file: {code(recorded.file)} ({state})."]
    return lines + [""]


def _diff_lines(models: list[ModelEntry], has_old: bool) -> list[str]:
    package_rows = _diff_rows([_golden(m).package_diff for m in models])
    lines = ["### Package changes", ""]
    if package_rows:
        lines += _table(["package", "golden", "this run"], package_rows)
    else:
        lines.append("No package changes." if has_old else "No earlier golden to compare packages with.")
    lines.append("")
    env_rows = _diff_rows([_golden(m).env_diff for m in models])
    if env_rows:
        lines += ["### Environment changes", ""] + _table(["key", "golden", "this run"], env_rows) + [""]
    return lines


def _model_lines(models: list[ModelEntry]) -> list[str]:
    rows = []
    for raw in models:
        m, g, ev = Entry.of(raw), _golden(raw), verdicts.evidence(raw) or EvidenceView()
        verdict, golden_verdict = m.verdict or "?", g.verdict
        rows.append([
            cell(m.model),
            cell(verdict if not golden_verdict or golden_verdict == verdict else f"{verdict} (golden: {golden_verdict})"),
            f"{_short(g.golden_final_sha256)} → {_short(m.final_sha256)}",
            cell(ev.step), code(ev.tensor),
            f"{ev.max_abs:.3g}" if ev.max_abs is not None else "-",
            cell(ev.max_ulp), cell(ev.losses_agree_digits),
        ])
    lines = ["### Models", ""]
    lines += _table(["model", "verdict", "final sha256 (golden → new)", "first differing step", "first tensor",
                     "max abs diff", "max ULP", "loss agrees to (digits)"], rows)
    messages = [f"- **{cell(m.model)}**: {cell(_golden(raw).message or m.message)}" for raw in models for m in [Entry.of(raw)]]
    return lines + ["", *messages, ""]


def _environment_lines(doc: ResultsDocument) -> list[str]:
    env = Document.of(doc).env
    return ["### Environment of this run", "",
            f"torch {cell(env.torch)}, CUDA {cell(env.cuda)}, cuDNN {cell(env.cudnn)}, "
            f"NCCL {cell(env.nccl)}; GPU {cell(', '.join(env.gpu.names) or 'none')} "
            f"(driver {cell(env.gpu.driver)}); device {cell(env.device)}, "
            f"threads {cell(env.threads.intra_op)}.", "",
            "---",
            "Approve this like any code change: the golden file in this pull request is what every later run "
            "of this image is compared against."]

