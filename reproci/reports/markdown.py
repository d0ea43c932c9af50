"""The Markdown report's parts: for $GITHUB_STEP_SUMMARY and pull-request comments. Each stage
shows its own sections (``stages.base.Stage.markdown``); ``reports.build.markdown_report`` puts them together."""

from __future__ import annotations

from typing import Any

from .. import verdicts
from ..stages.throughput import NOISY_WIDTH
from ..stages import audit, bisect, probes
from .mdtable import cell, code, table
from .rows import op_text, ranked_job, slowdown_text, throughput_rows
from ..entry_sections import Throughput
from ..results import ModelEntry, RecordedOptions, ResultsDocument
from .history import Trends
from ..cluster.merged import MergedDocument, MergedModel


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return table(header, [[cell(c) for c in r] for r in rows])


def _ranks(opts: RecordedOptions) -> str:
    n = opts.get("world_size") or 1
    return f" · world size {n}" if n > 1 else ""


def _fresh(throughput: Throughput) -> str:
    ranks = throughput.get("world_size") or 1
    return f"a fresh {ranked_job(ranks)}" if ranks > 1 else "in a fresh process"


def _how_sampled(t0: Throughput) -> str:
    """How the slowdowns were measured: sampled until narrow enough, or a fixed count."""
    order = ("taking turns step by step" if t0.get("order") == "step-by-step turns"
             else f"one after another, {t0.get('order')}")
    target = (t0.get("slowdown") or {}).get("target_half_width")
    if target is not None:
        return (f"the median of paired step ratios, sampled until its 95 % interval is within ±{target:.1%} "
                f"or {_budget(t0)} is spent ({_length(t0)}at most {t0.get('max_repetitions')} repetitions; the pairs each "
                f"model needed and how it stopped are beside its figure), each mode {_fresh(t0)} "
                f"({order}), after {t0.get('warmup_steps')} warm-up steps and until step times settle; the "
                "interval is a bootstrap over the repetitions and the pairs within them")
    return (f"median of {t0.get('repetitions')} repetitions (while {_budget(t0)} held another), each mode "
            f"{_fresh(t0)} ({order}), {t0.get('timed_steps')} timed steps after {t0.get('warmup_steps')} warm-up "
            f"steps; the interval is a bootstrap over repetitions, *noisy* when it is wider than {NOISY_WIDTH:.0%} "
            "of the median")


def _length(t0: Throughput) -> str:
    """What set a paired repetition's length besides time: '' or 'at most 12 timed steps a repetition, '."""
    return f"at most {t0.get('timed_steps')} timed steps a repetition, " if t0.get("run_length") == "steps" else ""


def _budget(t0: Throughput) -> str:
    seconds = t0.get("time_budget_s")
    return "the time budget" if seconds is None else f"the time budget of {seconds:g} s a model"


def head(doc: ResultsDocument, lead: list[str]) -> list[str]:
    """The run's facts, then ``lead`` (a stage's verdict table with its figures, ``Stage.markdown_verdicts``)
    or, where no stage gives one, the plain verdict table."""
    image = doc.get("image") or {}
    opts = doc.get("options") or {}
    lines = [f"## reproci · {image.get('name')} ({image.get('backend')})", "",
             f"Run `{doc.get('run_id')}` · {doc.get('created')} · commit `{(doc.get('project_commit') or '-')[:12]}` · "
             f"stages {', '.join(opts.get('stages') or [])} · device {opts.get('device')} · "
             f"threads {opts.get('threads')}{_ranks(opts)} · exit code {doc.get('summary', {}).get('exit_code')}", ""]
    if lead:
        return lines + lead
    lines += ["### Verdicts", ""]
    lines += _table(["model", "verdict", "message"],
                    [[m.get("model"), m.get("verdict"), m.get("message")] for m in doc.get("models", [])])
    return lines + [""]


def throughput(doc: ResultsDocument) -> list[str]:
    """The throughput stage's verdict table: each model's verdict beside its strict and default
    rates, slowdown, memory and the op that grew most, then how it was measured."""
    rows = throughput_rows(doc)
    if not rows:
        return []
    lines = ["### Cost of strict determinism", ""]
    lines += _table(
        ["model", "verdict", "strict steps/s", "default steps/s", "slowdown (median [95 % CI])",
         "peak memory strict / default", "op that grew most"],
        [[r["model"], r["verdict"], r["strict"], r["default"], r["slowdown_text"] if not r["error"] else "failed",
          r["memory"], op_text(r["top_ops"][0]) if r["top_ops"] else "-"] for r in rows])
    lines.append("")
    t0: Throughput = next((t for m in doc.get("models", []) if (t := m.get("throughput"))), Throughput())
    lines.append(f"Slowdown = strict step time / default step time: {_how_sampled(t0)}. Added time per op: "
                 "torch.profiler self time per step, strict minus default. Peak memory: "
                 f"{rows[0]['memory_kind'] or 'not reported'}.")
    lines.append("")
    for r in rows:
        extra = [f"{mode}: {slowdown_text(sd)}" for mode, sd in r["slowdowns"].items() if mode != "strict"]
        if r["error"]:
            lines.append(f"- **{r['model']}**: the measurement failed: {cell(r['error'])}")
            continue
        if r["top_ops"]:
            lines.append(f"- **{r['model']}**, where strict mode spends the extra time: "
                         + "; ".join(f"`{op_text(op)}`" for op in r["top_ops"]))
        else:
            lines.append(f"- **{r['model']}**: no op grew under strict mode in the profiled steps")
        if extra:
            lines.append(f"  - other modes against default: {', '.join(extra)}")
    return lines + [""]


def warnings(doc: ResultsDocument | MergedDocument) -> list[str]:
    """Every model's warnings (``verdicts.warnings``), a line each, most serious verdict first;
    nothing when there are none. The report and the step summaries show this section."""
    models: list[ModelEntry] = [*(doc.get("models") or [])]  # a merged document's too (MergedModel)
    found = [(m, text) for m in verdicts.by_severity(models) for _, text in verdicts.warnings(m)]
    if not found:
        return []
    return ["### Warnings", "", *(f"- ⚠️ **{cell(m.get('model'))}**{_on(m)}: {cell(text)}" for m, text in found),
            ""]


def _on(m: ModelEntry | MergedModel) -> str:
    """' on `image`' for a merged matrix's model, whose image is part of its name."""
    image = m.get("image")
    return f" on {code(image)}" if isinstance(image, str) and image else ""


def audit_section(doc: ResultsDocument) -> list[str]:
    """The op audit, a row per finding (``stages.audit.rows``) and one per model with nothing to say."""
    found = audit.rows(doc)
    audited = [m for m in doc.get("models", []) if isinstance(m.get("audit"), dict)]
    if not audited:
        return []
    lines = ["### Op audit: what strict determinism does to these ops on CUDA", ""]
    rows = [[r["model"], code(r["op"]), r["count"], r["cuda"], r["where"], r["advice"] or r["what"]] for r in found]
    rows += [[m["model"], "—", "", "nothing", "", audit.summary(m["audit"])] for m in audited
             if not (m["audit"].get("findings") or m["audit"].get("error"))]
    return lines + _table(["model", "op", "count", "on CUDA", "where", "fix or cost"], rows) + [""]


def probes_section(doc: ResultsDocument) -> list[str]:
    """The portability probes, a row each (``stages.probes.rows``)."""
    probe_rows = probes.rows(doc)
    if not probe_rows:
        return []
    return (["### Portability probes: what the results depend on", ""]
            + _table(["model", "probe", "result", "evidence"],
                     [[r["model"], r["probe"], r["status"], r["message"]] for r in probe_rows]) + [""])


def bisect_section(doc: ResultsDocument) -> list[str]:
    """The bisection, a row per model (``stages.bisect.rows``)."""
    bisected = bisect.rows(doc)
    if not bisected:
        return []
    return (["### Bisection: the first factor whose removal restores equality", ""]
            + _table(["model", "check", "cause", "stages", "finding"],
                     [[r["model"], r["check"] or "—", r["culprit"] or "—", bisect.stages_text(r), r["message"]]
                      for r in bisected]) + [""])


def trends(trends: Trends) -> list[str]:
    lines = ["### Slowdown over time", ""]
    rows = []
    for image, models in sorted(trends.items()):
        for model, points in sorted(models.items()):
            measured = [(p, s) for p in points if (s := p.get("slowdown")) is not None]
            if not measured:
                continue
            (first, s_first), (last, s_last) = measured[0], measured[-1]
            change = (s_last / s_first - 1) * 100 if len(measured) > 1 else None
            rows.append([image, model, len(measured), f"{s_first:.3f}× ({str(first['created'])[:10]})",
                         f"{s_last:.3f}× ({str(last['created'])[:10]})",
                         f"{change:+.1f} %" if change is not None else "-", last.get("verdict")])
    if not rows:
        return lines + ["No run in the history has throughput results yet (`reproci run --stage throughput`).", ""]
    lines += _table(["image", "model", "runs", "first", "latest", "change", "latest verdict"], rows)
    return lines + [""]
