"""The bisection (``--bisect``, ``reproci bisect``): which factor makes a failing check fail.

The practice: "When it fails, bisect: disable torch.compile, then mixed precision, then
multi-worker loading, then distributed, and re-test at each stage. The first change that
restores equality points at the culprit." For each model whose determinism check failed
(NONDETERMINISTIC, RESUME_BROKEN), the failing pair of runs (A and B, A and C, A and W) is
re-run with one more factor turned off at each stage, in that order, then one thread: each
stage keeps the factors turned off before it. Factors that were already off are skipped and
said to be. Only the first differing step plus one is re-run.

A golden drift is bisected the same way over the factors a launcher can set, each put back to
the golden's value in turn (the CPU kernel level, kernel-selecting variables, the thread count,
the world size: ``golden_cause.settings``); compile, AMP and the loader are part of the run's
identity and the model, the same on both sides by construction.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

from ... import results, typed, verdicts
from ...document import Document, Entry
from ...entry_sections import EvidenceView, view
from ...errors import WorkerFailed
from ...golden import comparison
from ...golden.divergence import first_divergence
from ...results import ModelEntry, ResultsDocument
from ...runner import RunContext, run_worker
from ...settings.models import ModelRef
from ...worker import run_record
from ...worker.process.spec import WorkerSpec
from ...worker.run_record import RunRecord
from ..base import StageRun
from ..determinism import STAGGER_S, beyond_tensors, golden_cause, plan, warm_spec
from .result import Bisect, BisectRow, PairRow


@dataclass(frozen=True)
class Factor:
    name: str
    label: str  # for "none of compile, AMP, ..."
    cause: str
    on: Callable[[WorkerSpec, RunRecord], str | None]  # the factor as the check ran it; None: already off
    off: Callable[[WorkerSpec], WorkerSpec]
    off_text: str


def _compiled(spec: WorkerSpec, record: RunRecord) -> str | None:
    c = record.execution["compile"] if record.execution else None
    if not c:
        return None
    return "compiled by the plugin" if c["source"] == "plugin" else f"torch.compile ({c['backend']})"


def _workers(spec: WorkerSpec, record: RunRecord) -> str | None:
    n = (record.loader or {}).get("num_workers") or 0
    return f"num_workers={n}" if n > 0 else None


FACTORS = (
    Factor("compile", "compile", "compilation (torch.compile) is the cause", _compiled,
           lambda s: dataclasses.replace(s, compile=None, eager=True), "eager"),
    Factor("amp", "AMP", "mixed precision (autocast) is the cause", lambda s, r: f"{s.amp} autocast" if s.amp else None,
           lambda s: dataclasses.replace(s, amp=None), "fp32"),
    Factor("workers", "workers", "the data loader's workers are the cause", _workers,
           lambda s: dataclasses.replace(s, num_workers=0), "num_workers=0"),
    Factor("ranks", "ranks", "distribution over ranks is the cause",
           lambda s, r: f"{s.world_size} ranks" if s.world_size > 1 else None,
           lambda s: dataclasses.replace(s, world_size=1), "one rank"),
    Factor("threads", "threads", "intra-op threading is the cause",
           lambda s, r: f"{s.threads} threads" if s.threads > 1 else None,
           lambda s: dataclasses.replace(s, threads=1), "one thread"),
)
BISECTED = (verdicts.NONDETERMINISTIC, verdicts.RESUME_BROKEN)


def pair_of(entry: ModelEntry) -> tuple[str, str] | None:
    """The runs whose comparison failed ("A vs B" -> ("A", "B")), or None when it was not a
    comparison of two runs (controls switched off, ranks of one run)."""
    ev = EvidenceView.of(entry)
    if ev is None or ev.rank is not None:
        return None
    parts = str(ev.comparison or "").split(" vs ")
    if len(parts) != 2 or not all(p in ("A", "B", "C", "W") for p in parts):
        return None
    return parts[0], parts[1]


def _steps(evidence: EvidenceView | None, resume_at: int | None, full: int, resumed: bool) -> int:
    """To the first differing step plus one (past the resume point, ``resume_at``, for a resume check)."""
    step = evidence.step if evidence else None
    steps = full if step is None else min(full, step + 1)
    return max(steps, int(resume_at or 1) + 1) if resumed else max(steps, 1)


def _specs(specs: dict[str, WorkerSpec], pair: tuple[str, str], stage: int, steps: int, k: int) -> list[WorkerSpec]:
    """The pair's specs for one stage: their own roles and files, ``steps`` long, A checkpointing at ``k``."""
    tag = f"bisect{stage}"
    out = []
    for role in pair:
        s = dataclasses.replace(specs[role], role=f"{tag}-{role}", output=f"record-{tag}-{role}.json", steps=steps,
                                final_dump_path=None, checkpoint_at=None, checkpoint_path=None,
                                checkpoint_after_epoch=False)
        if role == "A" and pair[1] == "C":
            s = dataclasses.replace(s, checkpoint_at=k, checkpoint_path=f"ckpt-{tag}.pt")
        if role == "C":
            s = dataclasses.replace(s, resume_from=f"ckpt-{tag}.pt", compile_cache=f"inductor-cache-{tag}-A")
        if role == "W":
            s = dataclasses.replace(s, compile_cache=f"inductor-cache-{tag}-A")
        out.append(s)
    return out


def _check(ctx: RunContext, specs: list[WorkerSpec]) -> tuple[Any, int]:
    """Run the pair in turn, the second ``STAGGER_S`` after the first started; their first difference."""
    first = run_worker(ctx, specs[0])
    time.sleep(max(0.0, STAGGER_S - (time.monotonic() - first.launched_at())))
    second = run_worker(ctx, specs[1])
    return first_divergence(first, second) or beyond_tensors.divergence(first, second), 2


def bisect_model(run: StageRun, model: ModelRef, entry: ModelEntry, record_a: RunRecord) -> Bisect:
    """Turn the factors off one after another until the failing pair agrees; what each stage showed."""
    options, ctx = run.options, run.ctx
    t0 = time.monotonic()
    pair, checked = pair_of(entry), Entry.of(entry)
    if pair is None:
        why = ("the model switches determinism controls off; turn them back on first"
               if checked.evidence and checked.evidence.cause == "controls" else
               "the ranks of one run disagree; bisect with --world-size 1 runs")
        return Bisect(verdict=checked.verdict, message=f"{model.name}: not bisected: {why}")
    specs = plan(options, model, project_commit=run.project_commit, image=run.image)
    if pair[1] == "W":
        specs["W"] = warm_spec(specs)
    steps = _steps(checked.evidence, checked.resume_at, options.steps, pair[1] == "C")
    k = int(checked.resume_at or options.resume_at)
    stages: list[BisectRow] = []
    culprit, total = None, 0
    for stage, factor in enumerate(FACTORS, 1):
        state = factor.on(specs["A"], record_a)
        if state is None:
            stages.append(BisectRow(factor=factor.name, status="already off"))
            continue
        specs = {role: factor.off(s) for role, s in specs.items()}
        if pair[1] == "W":  # an eager run has no compile cache: turning compile off ends cache dependence
            row = PairRow(factor=factor.name, status="turned off", from_=state, to=factor.off_text, equal=True,
                          note="eager runs have no compile cache")
        else:
            try:
                div, runs = _check(ctx, _specs(specs, pair, stage, steps, k))
            except WorkerFailed as e:
                stages.append(BisectRow(factor=factor.name, status="error", from_=state, to=factor.off_text,
                                        message=str(e)))
                break
            total += runs
            row = PairRow(factor=factor.name, status="turned off", from_=state, to=factor.off_text,
                          equal=div is None, evidence=div.to_dict() if div is not None else None)
        stages.append(row)
        if row.equal:
            culprit = factor.name
            break
    out = Bisect(check=f"{pair[0]} vs {pair[1]}", verdict=checked.verdict, stages=stages, culprit=culprit,
                 runs=total, steps=steps)
    return typed.replace(out, message=_message(model.name, checked, out), seconds=round(time.monotonic() - t0, 3))


def _message(name: str, entry: Entry, out: Bisect) -> str:
    """'conv: NONDETERMINISTIC with num_workers=2; equal with num_workers=0 (compile and AMP were
    already off): the data loader's workers are the cause'."""
    rows = out.stages
    already = [FACTOR[r.factor].label for r in rows if r.status == "already off"]
    off_note = f" ({_and(already)} {'was' if len(already) == 1 else 'were'} already off)" if already else ""
    tried = [r for r in rows if r.status == "turned off"]
    bad = next((r for r in rows if r.status == "error"), None)
    if bad is not None:
        return f"{name}: bisection stopped: the run with {FACTOR[bad.factor].label} off failed ({bad.message})"
    if out.culprit is not None:
        hit = tried[-1]
        before = [f"{FACTOR[r.factor].label} off" for r in tried[:-1]]
        still = f"; still unequal with {_and(before)}" if before else ""
        return (f"{name}: {out.verdict} with {hit.from_}{still}; equal with {hit.to}{off_note}: "
                f"{FACTOR[hit.factor].cause}")
    op = verdicts.op_text(entry.evidence.op if entry.evidence else None)
    where = "the cause is in the model's code" + (f"; first differing op: {op}" if op else "")
    if not tried:
        return f"{name}: {_and(already)} were all off already: {where}"
    return f"{name}: none of {_and([FACTOR[r.factor].label for r in tried])} restores equality{off_note}: {where}"


FACTOR = {f.name: f for f in FACTORS}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


DRIFT = (verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH, verdicts.UPGRADE_CHANGED)


def _with_env(name: str, value: str | None) -> Callable[[WorkerSpec], WorkerSpec]:
    """A run's spec with the variable ``name`` set to ``value`` (None: unset)."""
    return lambda s: dataclasses.replace(s, env={**s.env, name: value})


def _drift_changes(env_diff: dict[str, list[Any]]) -> list[tuple[str, Callable[[WorkerSpec], WorkerSpec]]]:
    """The golden's settable factors, in the order they are put back: each as it is said, and
    what putting it back does to a run's spec."""
    change, _ = golden_cause.settings(env_diff)
    out: list[tuple[str, Callable[[WorkerSpec], WorkerSpec]]] = []
    if "cpu_isa" in change:
        isa = change["cpu_isa"]
        out.append((f"CPU kernel level {isa}", lambda s: dataclasses.replace(s, cpu_isa=isa)))
    for k, v in (change.get("env") or {}).items():
        out.append((f"{k}={v}" if v is not None else f"{k} unset", _with_env(k, v)))
    if "threads" in change:
        threads = change["threads"]
        out.append((f"--threads {threads}", lambda s: dataclasses.replace(s, threads=threads)))
    if "world_size" in change:
        world_size = change["world_size"]
        out.append((f"--world-size {world_size}", lambda s: dataclasses.replace(s, world_size=world_size)))
    return out


def bisect_drift(run: StageRun, model: ModelRef, entry: ModelEntry) -> Bisect:
    """Put the golden's settable factors back one after another until the golden's checksums come back."""
    options, ctx, golden = run.options, run.ctx, run.old_golden
    t0 = time.monotonic()
    section = comparison.of(entry)
    why = section.why if section else None
    steps = _steps(view(EvidenceView, section.evidence) if section else None, None, options.steps, False)
    stages: list[BisectRow] = []
    culprit, runs = None, 0
    spec = dataclasses.replace(plan(options, model, project_commit=run.project_commit, image=run.image)["A"], steps=steps,
                               checkpoint_at=None, checkpoint_path=None, final_dump_path=None,
                               checkpoint_after_epoch=False)
    g = golden.models[model.name].as_record()
    for stage, (said, back) in enumerate(_drift_changes((section.env_diff if section else None) or {}), 1):
        spec = dataclasses.replace(back(spec), role=f"bisect{stage}-A", output=f"record-bisect{stage}-A.json")
        try:
            record = run_worker(ctx, spec)
        except WorkerFailed as e:
            stages.append(BisectRow(factor=said, status="error", message=str(e)))
            break
        runs += 1
        equal = golden_cause.matches(g, record, steps, options.steps)
        stages.append(BisectRow(factor=said, status="put back", equal=equal))
        if equal:
            culprit = said
            break
    verdict = Entry.of(entry).verdict
    put_back = [r.factor for r in stages if r.status == "put back"]
    if culprit is not None:
        before = f" (after {_and(put_back[:-1])}, which did not)" if len(put_back) > 1 else ""
        message = (f"{model.name}: {verdict}; with the golden's {culprit}{before} it matches the "
                   f"golden bit for bit through step {steps}: that factor is the cause")
    elif put_back:
        message = (f"{model.name}: {verdict}; still differs from the golden with {_and(put_back)} put back "
                   "(compile, AMP and the loader match the golden by its identity): the cause is what cannot be "
                   "set from software" + (f" ({why})" if why else ""))
    else:
        message = (f"{model.name}: {verdict}; nothing the launcher sets differs from the golden's run "
                   f"(compile, AMP and the loader match it by its identity): {why or 'see the evidence'}")
    return Bisect(check="A vs the golden", verdict=verdict, stages=stages, culprit=culprit, runs=runs, steps=steps,
                  message=message, seconds=round(time.monotonic() - t0, 3))


def conclude(run: StageRun, document: ResultsDocument) -> None:
    """Bisect every model whose check failed or whose results left the golden; the result
    lands on its entry as ``bisect``."""
    options, ctx, golden = run.options, run.ctx, run.old_golden
    refs = {m.name: m for m in options.models}
    for entry in document["models"]:
        model = refs.get(entry["model"])
        if model is None:
            continue
        verdict = Entry.of(entry).verdict
        if verdict in BISECTED:
            record_a = run_record.read_ok(ctx.run_dir / entry["records"]["A"])
            results.add_section(entry, "bisect", bisect_model(run, model, entry, record_a).to_json())
        elif verdict in DRIFT and golden is not None and model.name in golden.models:
            results.add_section(entry, "bisect", bisect_drift(run, model, entry).to_json())


def rows(document: ResultsDocument) -> list[tuple[str, Bisect]]:
    """Each bisected model's name and its bisection, for the reports."""
    return [(m["model"], Bisect.from_json(section)) for m in document.get("models") or []
            if (section := cast(Mapping[str, Any], m).get("bisect"))]


def stages_text(row: Bisect) -> str:
    """'compile: already off · workers: num_workers=2 → num_workers=0, equal' (one bisection's stages)."""
    parts = []
    for s in row.stages:
        if s.status == "already off":
            parts.append(f"{s.factor}: already off")
        elif s.status == "error":
            parts.append(f"{s.factor}: run failed")
        else:
            to = f"{s.from_} → {s.to}, " if s.from_ else ""
            parts.append(f"{s.factor}: {to}{'equal' if s.equal else 'still differs'}")
    return " · ".join(parts) + (f" ({row.runs} runs to step {row.steps}, {row.seconds:.0f} s)" if row.steps else "")


def nothing(document: ResultsDocument) -> str | None:
    """The one line when the bisection ran and had nothing to bisect ('nothing to bisect: every
    check passed'), saying why; None when it bisected a model or did not run."""
    doc = Document.of(document)
    if "bisect" not in doc.options.stages or rows(document):
        return None
    by: dict[str, list[str]] = {}
    for m in doc.models:
        by.setdefault(str(m.verdict), []).append(m.model)
    if by and set(by) == {verdicts.NOT_CHECKED}:
        return "nothing to bisect: no determinism check ran (add --stage determinism)"
    if by.get(verdicts.ERROR):
        return (f"nothing to bisect: no check failed, but {_and(by[verdicts.ERROR])} could not run (ERROR): "
                "fix what its message says first")
    other = {v: names for v, names in by.items() if v in verdicts.FAILING or v in DRIFT}
    if other:  # failures the bisection does not take apart (the ranks of one run)
        said = "; ".join(f"{_and(names)} {v}" for v, names in other.items())
        return f"nothing to bisect: {said}: the bisection compares two runs or a run and its golden, not ranks"
    return "nothing to bisect: every check passed"
