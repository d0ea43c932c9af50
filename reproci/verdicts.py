"""Verdicts: few and distinct, each mapped to an exit code.

The one vocabulary of verdicts: which fail a run, which are drift, which are notices,
their order and icons in every table, the level of their GitHub annotation, the exit code
of a results document, the sentences that say where runs first differ, and the warnings
a result carries beside its verdict. Terminal tables, Markdown, HTML, annotations, the
webhook, ``merge`` and ``pr-body`` all read it from here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar, Union

from . import errors, results
from .document import Document, Entry
from .entry_sections import Evidence, EvidenceView, FirstOp, FirstOpView, view
from .golden import comparison
from .results import ModelEntry, ResultsDocument
from .worker.audit import module_text

if TYPE_CHECKING:
    from .stages.base import Stages

M = TypeVar("M", bound=ModelEntry)  # a model entry, or a merged document's row (which adds its image)
# Where runs differ as a writer hands it (the JSON, ``Evidence``) or as a reader loaded it.
Where = Union[Evidence, EvidenceView, None]
Op = Union[FirstOp, FirstOpView, None]

PASS = "PASS"
NEW = "NEW"  # no golden yet for this image and model
NONDETERMINISTIC = "NONDETERMINISTIC"  # A != B
RESUME_BROKEN = "RESUME_BROKEN"  # A == B != C
REPLICAS_DIVERGE = "REPLICAS_DIVERGE"  # above one rank: a rank's replica leaves rank 0's
UPGRADE_CHANGED = "UPGRADE_CHANGED"  # runs agree, golden differs, image/packages differ
ENV_CHANGED = "ENV_CHANGED"  # runs agree, golden differs, same image, hardware/threads differ
GOLDEN_MISMATCH = "GOLDEN_MISMATCH"  # runs agree, golden differs, identical identity
MODEL_CHANGED = "MODEL_CHANGED"  # model code/config identity differs: re-record, not an alert
ERROR = "ERROR"  # the run could not complete
NOT_CHECKED = "NOT_CHECKED"  # only the throughput stage ran: nothing was claimed about reproducibility

ALL = (PASS, NEW, NONDETERMINISTIC, RESUME_BROKEN, REPLICAS_DIVERGE, UPGRADE_CHANGED, ENV_CHANGED, GOLDEN_MISMATCH,
       MODEL_CHANGED, ERROR, NOT_CHECKED)

EXIT_CODES = {
    PASS: errors.EXIT_PASS,
    NEW: errors.EXIT_PASS,
    MODEL_CHANGED: errors.EXIT_PASS,
    NONDETERMINISTIC: errors.EXIT_REPRO_FAILURE,
    RESUME_BROKEN: errors.EXIT_REPRO_FAILURE,
    REPLICAS_DIVERGE: errors.EXIT_REPRO_FAILURE,
    UPGRADE_CHANGED: errors.EXIT_DRIFT,
    ENV_CHANGED: errors.EXIT_DRIFT,
    GOLDEN_MISMATCH: errors.EXIT_DRIFT,
    ERROR: errors.EXIT_RUN_ERROR,
    NOT_CHECKED: errors.EXIT_PASS,
}

# The runs themselves are broken: not reproducible, or they did not complete.
FAILING = frozenset({NONDETERMINISTIC, RESUME_BROKEN, REPLICAS_DIVERGE, ERROR})
# The runs agree with each other but not with the golden.
DRIFTING = frozenset({UPGRADE_CHANGED, ENV_CHANGED, GOLDEN_MISMATCH})
# Worth saying, not failing (outside CI): a first golden to record, a model to re-record.
NOTICES = frozenset({NEW, MODEL_CHANGED})
# In CI mode the notices fail as drift: a golden that is missing or cannot be compared checks nothing.
CI_DRIFT = NOTICES
# Most serious first: the order of rows wherever verdicts are listed.
ORDER = (ERROR, NONDETERMINISTIC, RESUME_BROKEN, REPLICAS_DIVERGE, UPGRADE_CHANGED, ENV_CHANGED, GOLDEN_MISMATCH, NEW, MODEL_CHANGED,
         PASS, NOT_CHECKED)
ICON = {PASS: "✅", NEW: "🆕", MODEL_CHANGED: "🔁", NONDETERMINISTIC: "❌", RESUME_BROKEN: "❌", REPLICAS_DIVERGE: "❌", ERROR: "💥",
        UPGRADE_CHANGED: "⚠️", ENV_CHANGED: "⚠️", GOLDEN_MISMATCH: "⚠️", NOT_CHECKED: "·"}

STYLE = {PASS: "green", NEW: "cyan", MODEL_CHANGED: "yellow", NONDETERMINISTIC: "bold red",
         RESUME_BROKEN: "bold red", REPLICAS_DIVERGE: "bold red", UPGRADE_CHANGED: "bold magenta", ENV_CHANGED: "magenta",
         GOLDEN_MISMATCH: "bold magenta", ERROR: "bold red", NOT_CHECKED: "dim"}


def exit_code(verdicts: list[str], *, ci: bool = False) -> int:
    """The most serious exit code; in CI mode a golden that is missing (NEW) or cannot be
    compared (MODEL_CHANGED) is drift."""
    codes = [errors.EXIT_DRIFT if (v in CI_DRIFT and ci) else EXIT_CODES.get(v, errors.EXIT_RUN_ERROR) for v in verdicts]
    return errors.most_serious(codes)  # when several models disagree, the most serious


def document_exit_code(document: ResultsDocument, stages: Stages) -> int:
    """The exit code of a results document, from its verdicts and options alone (``run``
    computes it once, ``merge`` recomputes it from each shard the same way).

    When this run recorded the golden, drift against the previous one is the evidence of
    the update, not a failure of it. Then each of ``stages`` has its say after the verdicts,
    in the order they run (``Stage.exit_code``: a stage's findings that fail a run with its
    flag, each only a run that passed otherwise), a golden update too: a dependency on the
    environment is no evidence of an update.
    """
    doc = Document.of(document)
    if doc.lost_cells:  # --backend ray: a cell that never came back is no verdict, and not a pass
        return errors.EXIT_INFRA
    vs = [m.verdict or ERROR for m in doc.models]  # an entry without a verdict exits as an error
    ci = bool(doc.options.ci)
    outcome = comparison.outcome_of(document)
    if outcome is not None and outcome.updated:
        code = exit_code([PASS if v in DRIFTING | NOTICES else v for v in vs])
    else:
        code = exit_code(vs, ci=ci)
    for stage in stages:
        code = stage.exit_code(document, code)
    return code


def summarize(document: ResultsDocument, stages: Stages) -> None:
    """Set the document's verdict counts and exit code from its models (and ``stages``' findings)."""
    vs = [str(m.verdict) for m in Document.of(document).models]
    summary = document.setdefault("summary", {})
    summary["verdicts"] = {v: vs.count(v) for v in sorted(set(vs))}
    summary["exit_code"] = document_exit_code(document, stages)


def annotation_level(verdict: str, *, ci: bool = False) -> str | None:
    """The GitHub annotation of a verdict: ``error`` when the runs are broken, ``warning``
    for drift (and NEW and MODEL_CHANGED in CI, which fail as drift), ``notice`` for them
    outside CI, none for PASS."""
    if verdict in FAILING:
        return "error"
    if verdict in DRIFTING or (verdict in CI_DRIFT and ci):
        return "warning"
    if verdict in NOTICES:
        return "notice"
    return None


def warnings(m: ModelEntry) -> list[tuple[str, str]]:
    """Every warning a model's result carries, as (kind, sentence), in the order the results
    type declares them (``results.WARNING_FIELDS``: each field typed ``WarningText``, e.g.
    ('shared_batches', 'rank 0 and rank 1 train on the same batches ...'), ('coverage.note', ...)).
    A warning never changes the verdict; every channel that shows the verdict shows these."""
    out = []
    for path in results.WARNING_FIELDS:
        value: Any = m
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value:
            out.append((".".join(path), str(value)))
    return out


def unsaid_warnings(m: ModelEntry, said: str = "") -> list[tuple[str, str]]:
    """``warnings(m)`` less those whose sentence is already in ``said`` (the verdict's message,
    where a channel prints it beside them)."""
    return [(kind, text) for kind, text in warnings(m) if text not in said]


def by_severity(models: list[M]) -> list[M]:
    """Model entries, most serious verdict first (stable within a verdict)."""
    rank = {v: i for i, v in enumerate(ORDER)}
    return sorted(models, key=lambda m: rank.get(str(Entry.of(m).verdict), -1))


def verdict_evidence(m: ModelEntry) -> Evidence | None:
    """The evidence behind a model's verdict: the golden comparison's for drift, else the
    run comparison's (A, B, C), else the golden comparison's."""
    golden = comparison.of(m)
    drift = golden.evidence if golden is not None else None
    if Entry.of(m).verdict in DRIFTING and drift:
        return drift
    return m.get("evidence") or drift


def evidence(m: ModelEntry) -> EvidenceView | None:
    """``verdict_evidence(m)`` read by attribute."""
    return view(EvidenceView, verdict_evidence(m))


def where_text(where: Where) -> str:
    """Where two runs first differ, for a sentence: 'from step 15, first at buffer:bn.running_mean',
    'before the first step, first at param:fc.weight', 'from the final state'."""
    ev = view(EvidenceView, where) or EvidenceView()
    if ev.cause == "init":
        at = "before the first step"
    elif ev.cause == "restore":
        at = f"at the resume point (step {ev.step}), before any resumed step"
    else:
        at = f"from step {ev.step}" if ev.step is not None else "from the final state"
    return f"{at}, first at {ev.tensor}" if ev.tensor else at


DATA_TEXT = {
    "reordered": "same samples, reordered within the batch (data order)",
    "order": "different batch: the epoch's samples in another order (data order)",
    "contents": "different batch contents: other samples, or other augmentation or masking draws",
}


def cause_text(where: Where) -> str:
    """What two runs' first difference says of its cause, for every sentence: 'same batch,
    different result', 'different batch contents: ...', 'different initial state', or ''."""
    ev = view(EvidenceView, where) or EvidenceView()
    cause = ev.cause
    if cause == "data":
        kind, _, epoch = (ev.data or "").partition("@")
        text = DATA_TEXT.get(kind, "different batch: other samples, or the same ones in another order")
        return f"{text} (judged on epoch {epoch}, the first that both runs took whole)" if epoch else text
    return {"compute": "same batch, different result", "init": "different initial state"}.get(cause or "", "")


UNREPRODUCED = "not reproduced by the replay"  # a magnitude_source: the probe replays left the runs' checksums


def _size(ev: EvidenceView | FirstOpView) -> str:
    ulp = f" ({ev.max_ulp} ULP)" if ev.max_ulp is not None else ""
    return f"|Δ| {ev.max_abs:.3g}{ulp}"


def magnitude_text(where: Where | Op) -> str:
    """'max |Δ| 3.1e-06 (12 ULP)', or '' when no magnitude was measured (of an ``Evidence``, or of
    the first differing op, ``Evidence['op']``: both carry max_abs, max_ulp, magnitude_source). A magnitude is the
    runs' own only when the probe replays reproduced them: otherwise it is the replays'
    ('..., between replays that did not reproduce the runs (...)'), and where the replays
    agreed there is none: '|Δ| not measured: not reproduced by the replay (...)'."""
    ev: EvidenceView | FirstOpView = (where if isinstance(where, FirstOpView)
                                      else view(EvidenceView, where) or EvidenceView())
    source = str(ev.magnitude_source or "")
    replayed = source.startswith(UNREPRODUCED)
    if ev.max_abs is None:
        return f"|Δ| not measured: {source}" if replayed else ""
    aside = source.removeprefix(UNREPRODUCED).strip()
    replays = f", between replays that did not reproduce the runs {aside}".rstrip() if replayed else ""
    return f"max {_size(ev)}{replays}"


def first_difference(where: Where, *, code: Callable[[str], str] = str) -> str:
    """The one short spelling of where runs first differ, for every table:
    'step 15, buffer:bn.running_mean, |Δ| 4.66e-10 (1 ULP)', 'step 0 (initial state), param:fc.weight',
    'controls off at model.py:52', or '-'. ``code`` formats a name (backticks in Markdown)."""
    ev = view(EvidenceView, where)
    if ev is None:
        return "-"
    controls = ev.controls or []
    if ev.cause == "controls" and controls:
        c = controls[0]
        return f"controls off at {code(c.where)}" if c.where else f"{code(c.control)} off at the {c.found_at}"
    step = ev.step
    parts = [("step 0 (initial state)" if step == 0 else f"step {step}") if step is not None else "final state"]
    if tensor := ev.tensor:
        parts.append(code(tensor) + (f" (only in {ev.only_in})" if ev.only_in else "")
                     + (" (outside the checkpoint)" if ev.cause == "census" else ""))
    if ev.max_abs is not None:
        parts.append(_size(ev) + (" (replays)" if str(ev.magnitude_source or "").startswith(UNREPRODUCED) else ""))
    return ", ".join(parts)


def op_text(first: Op) -> str:
    """'aten::native_dropout in blocks.0.drop at model.py:52 (forward), forward pass, max |Δ| 2 (…)'
    for the first op whose output differs; '' when no op was recorded."""
    op = view(FirstOpView, first)
    if op is None:
        return ""
    if not op.found and op.compiled:
        return (f"no op output outside the compiled graphs differs in that step ({op.ops} ops compared): "
                "inductor's kernels are not seen op by op; bisect (--bisect) or run eager to see the op")
    if not op.found:
        return f"no op output differs in that step ({op.ops} ops compared): the difference entered outside them"
    where = "".join([f" in {module_text(op.module)}" if op.module else "", f" at {op.source}" if op.source else ""])
    pass_ = {"forward": "forward pass", "backward": "backward pass", "optimizer": "optimizer step"}.get(str(op.phase), "")
    if op.kind == "sequence":
        return f"the ops themselves differ from op {op.index}: {op.op}{where}" + (f", {pass_}" if pass_ else "")
    mag = magnitude_text(op)
    aside = op.aside
    earlier = ""
    if aside:  # an earlier op differs too, but nothing the step trains on reads it
        at = "".join([f" in {module_text(aside.module)}" if aside.module else "",
                      f" at {aside.source}" if aside.source else ""])
        earlier = f" (earlier, {aside.op}{at} differs too, but neither the loss nor the gradients read it)"
    return f"{op.op}{where}" + (f", {pass_}" if pass_ else "") + (f", {mag}" if mag else "") + earlier
