"""The throughput stage in every report, each built from the same rows (``rows``, a model's
rates, slowdown, memory and the ops that grew, formatted once): its table in what ``reproci run``
prints, with its sampling notes and failures; its verdict table in the Markdown report, with how
it was measured; its section of the HTML report, with the slowdown chart; its section of the
pull-request body; its column of a merged matrix's step summary (``slowdown_cell``); the slowdown
over time in the reports' trends (``markdown_trends``, ``html_trends``). The slowdown's text
(``slowdown_text``) is every one of them."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any, TypedDict

from rich.console import Console
from rich.markup import escape as markup
from rich.table import Table

from ... import typed
from ...document import Document, Entry
from ...golden import comparison
from ...reports.mdtable import cell, code, plain_table
from ...reports.mdtable import table as md_table
from ...reports.prbody import MAX_ROWS
from ...results import ModelEntry, ResultsDocument
from . import NOISY_WIDTH
from .result import ModeSummary, Slowdown, ThroughputResult, TopOp, of

if TYPE_CHECKING:
    from ...cluster.merged import MergedModel
    from ...reports.history import Trends


def ranked_job(world_size: int) -> str:
    """How a throughput mode ran above one rank, for the reports' explanations."""
    return f"job of {world_size} ranks under DDP, timed by rank 0"


def slowdown_text(sd: Slowdown | None) -> str:
    """'1.23× [1.20, 1.26]', with how many paired steps it took when sampled sequentially
    and how the sampling stopped ('±1.8 %, settled', 'budget spent at ±4.1 %'), and
    '(wider than the ±2.0 % target)' or, for a fixed count of repetitions, '(noisy)'
    when the interval is wide; '-' when not measured."""
    if sd is None or sd.median is None:
        return "-"
    text = f"{sd.median:.3f}× [{sd.ci_low:.3f}, {sd.ci_high:.3f}]"
    if sd.pairs is not None:
        text += f", {sd.pairs} pairs"
    if sd.how_stopped:
        text += f", {sd.how_stopped}"
    if sd.target_half_width is not None:
        return text if sd.within_target else text + f" (wider than the ±{sd.target_half_width:.1%} target)"
    return text + " (noisy)" if sd.noisy else text


def sampling_text(model: str, t: ThroughputResult) -> str | None:
    """How a sequentially sampled slowdown was measured and why it stopped; None otherwise."""
    sd = t.slowdown
    if sd.stopped is None:
        return None
    per = " + ".join(str(n) for n in sd.pairs_per_repetition or [])
    return (f"{model}: {t.repetitions} repetitions, {per} pairs "
            f"(after {sum(sd.warmup_rounds_dropped or [])} unsettled rounds dropped): {sd.stopped}")


def rate_text(mode: ModeSummary) -> str:
    if not mode.steps_per_s:
        return "-"
    text = f"{mode.steps_per_s:.1f}"
    if mode.samples_per_s:
        text += f" ({mode.samples_per_s:,.0f} samples/s)"
    return text


def bytes_text(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def op_text(op: TopOp) -> str:
    """'aten::index_add_ +40 % (+0.120 ms/step, 35 % of the added time)'."""
    growth = "new" if op.growth is None else f"{op.growth * 100:+.0f} %"
    share = f", {op.share * 100:.0f} % of the added time" if op.share is not None else ""
    return f"{op.op} {growth} ({op.delta_ms:+.3f} ms/step{share})"


def golden_verdict(m: ModelEntry) -> str:
    """The model's verdict, with the golden comparison's when it says more."""
    v = str(m.get("verdict", "?"))
    g = comparison.of(m)
    gv = g.verdict if g is not None else None
    return v if not gv or gv == v else f"{v} (golden: {gv})"


class Row(TypedDict):
    """A model's throughput as every report shows it (``rows``)."""

    model: str | None
    verdict: str
    error: str | None
    modes: dict[str, ModeSummary]
    slowdown: Slowdown
    slowdowns: dict[str, Slowdown]
    top_ops: list[TopOp]
    regression: str | None
    strict: str
    default: str
    slowdown_text: str
    memory: str
    memory_kind: str | None


def with_results(document: ResultsDocument) -> list[tuple[ModelEntry, Entry, ThroughputResult]]:
    """Each model that has a throughput result (measured or failed): its entry, read by attribute too, and its result."""
    return [(m, Entry.of(m), t) for m in document.get("models", []) if (t := of(m)) is not None]


def rows(document: ResultsDocument) -> list[Row]:
    """One row per model that has a throughput result (measured or failed)."""
    out: list[Row] = []
    for m, e, t in with_results(document):
        out.append({
            "model": e.model, "verdict": golden_verdict(m), "error": t.error.message if t.error else None,
            "modes": t.modes, "slowdown": t.slowdown, "slowdowns": t.slowdowns, "top_ops": t.top_ops,
            "regression": t.regression, "strict": rate_text(t.mode("strict")), "default": rate_text(t.mode("default")),
            "slowdown_text": slowdown_text(t.slowdown),
            "memory": " / ".join(bytes_text(t.mode(k).peak_memory_bytes) for k in ("strict", "default")),
            "memory_kind": t.mode("strict").peak_memory_kind,
        })
    return out


def table(document: ResultsDocument) -> Table | None:
    """The terminal table; None where no model has a throughput result."""
    found = rows(document)
    if not found:
        return None
    ranks = Document.of(document).options.world_size or 1
    per_job = f"; each mode a {ranked_job(ranks)}" if ranks > 1 else ""
    t = Table(title=f"cost of strict determinism (slowdown = strict / default step time, median [95 % CI]{per_job})",
              title_justify="left")
    for name, justify in (("model", "left"), ("strict steps/s", "right"), ("default steps/s", "right"),
                          ("slowdown", "left"), ("peak mem strict / default", "right"), ("ops that grew most", "left")):
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in found:
        sd = r["slowdown_text"] if not r["error"] else "[bold red]failed[/]"
        if r["slowdown"].noisy:
            sd = f"[yellow]{sd}[/]"
        ops = "\n".join(op_text(op) for op in r["top_ops"][:3]) or "-"
        t.add_row(str(r["model"]), r["strict"].split(" (")[0], r["default"].split(" (")[0], sd, r["memory"], ops)
    return t


def terminal(document: ResultsDocument, console: Console) -> None:
    """The table, its sampling notes and its failures (the models' warnings, a throughput
    regression among them, are the determinism report's, else ``registry.print_run``'s)."""
    t = table(document)
    if t is not None:
        console.print(t)
    for _, e, result in with_results(document):
        line = sampling_text(e.model, result)
        if line:
            console.print(line, highlight=False)
    for r in rows(document):
        if r["error"]:
            console.print(f"[bold]{r['model']}[/]: throughput failed: {markup(str(r['error']))}", highlight=False)


def markdown_verdicts(doc: ResultsDocument) -> list[str]:
    """The throughput stage's verdict table: each model's verdict beside its strict and default
    rates, slowdown, memory and the op that grew most, then how it was measured."""
    found = rows(doc)
    if not found:
        return []
    lines = ["### Cost of strict determinism", ""]
    lines += plain_table(
        ["model", "verdict", "strict steps/s", "default steps/s", "slowdown (median [95 % CI])",
         "peak memory strict / default", "op that grew most"],
        [[r["model"], r["verdict"], r["strict"], r["default"], r["slowdown_text"] if not r["error"] else "failed",
          r["memory"], op_text(r["top_ops"][0]) if r["top_ops"] else "-"] for r in found])
    lines.append("")
    t0 = next((t for _, _, t in with_results(doc) if t.to_json()), ThroughputResult())  # the first section not empty
    lines.append(f"Slowdown = strict step time / default step time: {_how_sampled(t0)}. Added time per op: "
                 "torch.profiler self time per step, strict minus default. Peak memory: "
                 f"{found[0]['memory_kind'] or 'not reported'}.")
    lines.append("")
    for r in found:
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


def _fresh(throughput: ThroughputResult) -> str:
    ranks = throughput.world_size or 1
    return f"a fresh {ranked_job(ranks)}" if ranks > 1 else "in a fresh process"


def _how_sampled(t0: ThroughputResult) -> str:
    """How the slowdowns were measured: sampled until narrow enough, or a fixed count."""
    order = "taking turns step by step" if t0.order == "step-by-step turns" else f"one after another, {t0.order}"
    target = t0.slowdown.target_half_width
    if target is not None:
        return (f"the median of paired step ratios, sampled until its 95 % interval is within ±{target:.1%} "
                f"or {_budget(t0)} is spent ({_length(t0)}at most {t0.max_repetitions} repetitions; the pairs each "
                f"model needed and how it stopped are beside its figure), each mode {_fresh(t0)} "
                f"({order}), after {t0.warmup_steps} warm-up steps and until step times settle; the "
                "interval is a bootstrap over the repetitions and the pairs within them")
    return (f"median of {t0.repetitions} repetitions (while {_budget(t0)} held another), each mode "
            f"{_fresh(t0)} ({order}), {t0.timed_steps} timed steps after {t0.warmup_steps} warm-up "
            f"steps; the interval is a bootstrap over repetitions, *noisy* when it is wider than {NOISY_WIDTH:.0%} "
            "of the median")


def _length(t0: ThroughputResult) -> str:
    """What set a paired repetition's length besides time: '' or 'at most 12 timed steps a repetition, '."""
    return f"at most {t0.timed_steps} timed steps a repetition, " if t0.run_length == "steps" else ""


def _budget(t0: ThroughputResult) -> str:
    seconds = t0.time_budget_s
    return "the time budget" if seconds is None else f"the time budget of {seconds:g} s a model"


def html(doc: ResultsDocument) -> str:
    """The HTML section, with the slowdown chart; empty where no model has a throughput result."""
    from ...reports import charts  # matplotlib, imported when a report is made
    from ...reports import html as page

    found = rows(doc)
    if not found:
        return ""
    cells = []
    for r in found:
        sd_class = ' class="noisy"' if r["slowdown"].noisy else ""
        cells.append([escape(str(r["model"])), escape(r["verdict"]), escape(r["strict"]), escape(r["default"]),
                      f"<span{sd_class}>{escape(r['slowdown_text'])}</span>" if not r["error"]
                      else f'<span class="bad">failed: {escape(r["error"])}</span>',
                      escape(r["memory"])])
    out = ["<section id=\"throughput\"><h2>Cost of strict determinism</h2>",
           page.table(["model", "verdict", "strict steps/s", "default steps/s", "slowdown (median [95 % CI])",
                       "peak memory strict / default"], cells)]
    measured = [r for r in found if r["slowdown"].median is not None]
    if measured:
        bars = [{"model": r["model"], **typed.dump(r["slowdown"])} for r in measured]
        out.append(page.figure(charts.slowdown_bars(bars), "slowdown per model",
                               "Strict step time over default step time per model; bars: median over repetitions, "
                               f"whiskers: 95 % bootstrap interval; amber: {_wide_text(measured)}."))
    out.append("<h2>Where the time goes</h2>")
    for r in found:
        items = "".join(f"<li><code>{escape(op_text(op))}</code></li>" for op in r["top_ops"])
        out.append(f"<h3>{escape(str(r['model']))}</h3>"
                   + (f"<ol>{items}</ol>" if items else "<p>No op grew under strict mode in the profiled steps.</p>"))
    return "".join(out) + "</section>"


def _wide_text(measured: list[Row]) -> str:
    """What an amber bar means: an interval wider than the sampling target, or (a fixed
    count of repetitions) wider than NOISY_WIDTH."""
    target = next((t for r in measured if (t := r["slowdown"].target_half_width) is not None), None)
    if target is not None:
        return f"interval wider than the ±{target:.1%} target"
    return f"noisy (interval wider than {NOISY_WIDTH:.0%})"


def pr_body(doc: ResultsDocument) -> list[str]:
    """The pull-request body's section: each model's rates, slowdown and the op that grew most;
    a line saying the stage did not run where no model has a throughput result."""
    with_throughput = [(e, t) for _, e, t in with_results(doc)]
    lines = ["### Cost of strict determinism", ""]
    if not with_throughput:
        return lines + ["The throughput stage did not run (`--stage throughput`).", ""]
    found = []
    for m, t in with_throughput:
        top = t.top_ops[0] if t.top_ops else TopOp()
        top_text = f"{code(top.op)} {_ms(top.strict_ms)} strict vs {_ms(top.default_ms)}" if top.op else "-"
        found.append([cell(m.model), _rate(t.mode("strict")), _rate(t.mode("default")),
                      cell(slowdown_text(t.slowdown)), top_text])
    lines += md_table(["model", "strict steps/s", "default steps/s", "slowdown (median [95% CI])", "most slowed op"],
                      found, max_rows=MAX_ROWS)
    return lines + [""]


def _ms(value: Any) -> str:
    return f"{value:.2f} ms" if isinstance(value, (int, float)) else "-"


def _rate(mode: ModeSummary) -> str:
    rate = mode.steps_per_s
    return f"{rate:.2f}" if isinstance(rate, (int, float)) else "-"


def slowdown_cell(m: MergedModel) -> str:
    """A merged matrix's model's strict slowdown, for its step summary's column."""
    t = of(m)
    return slowdown_text(t.slowdown if t is not None else None)


def markdown_trends(trends: Trends) -> list[str]:
    """The Markdown report's slowdown over time: per image and model, the first and the latest
    measured slowdown of the history and the change between them."""
    lines = ["### Slowdown over time", ""]
    found = []
    for image, models in sorted(trends.items()):
        for model, points in sorted(models.items()):
            slowed = [(p, s) for p in points if (s := p["slowdown"]) is not None]
            if not slowed:
                continue
            (first, s_first), (last, s_last) = slowed[0], slowed[-1]
            change = (s_last / s_first - 1) * 100 if len(slowed) > 1 else None
            found.append([image, model, len(slowed), f"{s_first:.3f}× ({str(first['created'])[:10]})",
                         f"{s_last:.3f}× ({str(last['created'])[:10]})",
                         f"{change:+.1f} %" if change is not None else "-", last["verdict"]])
    if not found:
        return lines + ["No run in the history has throughput results yet (`reproci run --stage throughput`).", ""]
    lines += plain_table(["image", "model", "runs", "first", "latest", "change", "latest verdict"], found)
    return lines + [""]


def html_trends(trends: Trends) -> str:
    """The HTML report's slowdown over time: per image, a chart of each model's slowdown per run
    and a row per run."""
    from ...reports import charts  # matplotlib, imported when a report is made
    from ...reports import html as page

    out = ["<section id=\"history\"><h2>Slowdown over time</h2>"]
    for image, series in sorted(trends.items()):
        points = [p for pts in series.values() for p in pts if p["slowdown"] is not None]
        out.append(f"<h3>{escape(image)}</h3>")
        if not points:
            out.append("<p>No run of this image has throughput results yet.</p>")
            continue
        out.append(page.figure(charts.slowdown_history(series, f"{image}: strict slowdown per run"),
                               f"slowdown history of {image}", "One point per recorded run, oldest first; whiskers: "
                               "95 % bootstrap interval."))
        runs = [[escape(model), escape(str(p["created"])), escape((p["commit"] or "-")[:12]),
                 escape(str(p["verdict"])), f"{p['slowdown']:.3f}" if p["slowdown"] is not None else "-"]
                for model, pts in sorted(series.items()) for p in pts]
        out.append(page.table(["model", "created", "commit", "verdict", "slowdown"], runs))
    return "".join(out) + "</section>"
