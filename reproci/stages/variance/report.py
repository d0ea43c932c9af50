"""The variance stage in every report, each built from the same rows (``rows``, per model and
metric: mean ± std over K seeds and the judgement against the golden's seeds): its lines in what
``reproci run`` prints, its section of the Markdown report and of the HTML report, with a strip
chart per model; its section of the pull-request body (``pr_body``: did the metrics move against
the old golden?) and its lines in ``reproci golden show`` (``golden_lines``)."""

from __future__ import annotations

from html import escape
from typing import TypedDict

from rich.console import Console

from ...document import Entry
from ...reports.mdtable import cell, code, table
from ...reports.prbody import MAX_ROWS
from ...results import ResultsDocument
from ...stats import number
from .result import MetricSpread, VarianceResult, VarianceSummary
from .result import of as variance_of

NOTE = ("Mean ± sample standard deviation over K strict runs with seeds seed … seed+K−1; "
        "final_loss is the last step's training loss, the other metrics come from the model's held-out "
        "eval_fn (↓: lower is better, ↑: higher is better). Against the golden: Welch's t, the 95 % "
        "confidence interval of the difference of means (this run − golden).")


def entries(doc: ResultsDocument) -> list[tuple[Entry, VarianceResult]]:
    """The model entries that carry a variance result, each with it."""
    return [(Entry.of(m), v) for m in doc.get("models", []) if (v := variance_of(m)) is not None]


def spread(metric: MetricSpread) -> str:
    if metric.mean is None:
        return "-"
    return f"{number(metric.mean)} ± {number(metric.std)}" if metric.std is not None else number(metric.mean)


class Row(TypedDict):
    """A model's metric over the seeds, as the reports show it."""

    model: str | None
    metric: str
    k: int | None
    spread: str
    values: list[float]
    direction: str  # ↓ lower is better, ↑ higher
    golden: str | None  # the judgement against the golden's seeds, or why there is none
    inside: bool | None  # inside the golden's seed noise


def rows(doc: ResultsDocument) -> list[Row]:
    """One row per model and metric: spread, per-seed values, and the judgement against the golden."""
    out: list[Row] = []
    for m, v in entries(doc):
        judged = {c.metric: c for c in v.against_golden.comparisons} if v.against_golden else {}
        if v.error:
            out.append({"model": m.model, "metric": "-", "k": v.k, "spread": "failed",
                        "values": [], "direction": "", "golden": v.error.message, "inside": None})
            continue
        skipped = v.against_golden.skipped if v.against_golden else None
        for name, metric in v.metrics.items():
            c = judged.get(name)
            out.append({"model": m.model, "metric": name, "k": v.k, "spread": spread(metric),
                        "values": metric.values, "direction": "↓" if metric.lower_is_better else "↑",
                        "golden": c.sentence if c else (skipped or "no golden variance to compare with"),
                        "inside": c.inside if c else None})
    return out


def markdown(doc: ResultsDocument) -> list[str]:
    """The Markdown section (empty when the stage did not run)."""
    r = rows(doc)
    if not r:
        return []
    lines = ["### Seed-to-seed spread (variance stage)", ""]
    lines += table(["model", "metric", "K", "mean ± std", "per seed", "against the golden"],
                   [[cell(x["model"]), cell(f"{x['metric']} {x['direction']}".strip()), cell(x["k"]),
                     cell(x["spread"]), cell(", ".join(number(v) for v in x["values"]) or "-"), cell(x["golden"])]
                    for x in r])
    return lines + ["", NOTE, ""]


def terminal_lines(doc: ResultsDocument) -> list[str]:
    """Plain lines for ``reproci run``: one per model and metric."""
    return [f"{x['model']}: variance stage failed: {x['golden']}" if x["spread"] == "failed" else
            f"{x['model']}: {x['metric']} {x['direction']} over {x['k']} seeds: {x['spread']}"
            + (f"; against the golden: {x['golden']}" if x["inside"] is not None else "")
            for x in rows(doc)]


def terminal(document: ResultsDocument, console: Console) -> None:
    """The lines, one per model and metric."""
    for line in terminal_lines(document):
        console.print(line, highlight=False, markup=False)


def html(doc: ResultsDocument) -> str:
    """The HTML section: a table per model and metric, and a strip chart per model."""
    from ...reports import charts  # matplotlib, imported when a report is made
    from ...reports import html as page

    found = rows(doc)
    if not found:
        return ""
    cells = [[escape(str(r["model"])), escape(f"{r['metric']} {r['direction']}"), escape(str(r["k"])),
              escape(r["spread"]), escape(", ".join(f"{v:.4g}" for v in r["values"]) or "-"),
              f'<span class="bad">{escape(r["golden"] or "")}</span>' if r["inside"] is False else escape(r["golden"] or "")]
             for r in found]
    out = ["<section id=\"variance\"><h2>Seed-to-seed spread</h2>",
           page.table(["model", "metric", "K", "mean ± std", "per seed", "against the golden"], cells),
           f"<p>{escape(NOTE)}</p>"]
    for m, v in entries(doc):
        if v.metrics:
            golden = (v.against_golden.golden_values if v.against_golden else None) or {}
            out.append(page.figure(charts.seed_strip(m.model, v.metrics, golden),
                                   f"seed strip chart of {m.model}",
                                   f"{m.model}: each dot one seed's value; bar: mean; band: ±1 standard deviation."))
    return "".join(out) + "</section>"


def pr_body(doc: ResultsDocument) -> list[str]:
    """Did the metrics move? This run's seeds against the old golden's (only when the variance stage ran)."""
    with_variance = entries(doc)
    if not with_variance:
        return []
    lines = ["### Did the metrics move? (variance stage)", ""]
    found = []
    for m, v in with_variance:
        comparisons = v.against_golden.comparisons if v.against_golden else []
        for c in comparisons:
            found.append([cell(m.model), code(c.metric), f"{_mean_std(c.mean_a, c.std_a)} (K={c.k_a})",
                          f"{_mean_std(c.mean_b, c.std_b)} (K={c.k_b})", cell(c.sentence)])
        if not comparisons:
            why = ((v.error.message if v.error else None) or (v.against_golden.skipped if v.against_golden else None)
                   or "the old golden has no variance results")
            found.append([cell(m.model), "-", "-",
                          cell(", ".join(f"{k} {spread(x)}" for k, x in v.metrics.items())), cell(why)])
    lines += table(["model", "metric", "old golden (mean ± std)", "this run (mean ± std)", "verdict"], found,
                   max_rows=MAX_ROWS)
    return lines + ["", "Welch's t: the 95 % confidence interval of the difference of means (this run − old golden) "
                        "over the seeds; inside seed noise when it holds 0. Bits can change while the metrics stay "
                        "inside seed noise.", ""]


def _mean_std(mean: float, std: float) -> str:
    return f"{number(mean)} ± {number(std)}"


def golden_lines(name: str, kept: VarianceSummary) -> list[str]:
    """A model's line in ``reproci golden show``: each metric's spread over the golden's seeds."""
    if not kept.metrics:
        return []
    metrics = ", ".join(f"{metric} {'↓' if x.lower_is_better else '↑'} {spread(x)}" for metric, x in kept.metrics.items())
    return [f"{name}: over {kept.k} seeds: {metrics}"]
