"""``reproci compare A B``: is B's final loss or metric inside A's seed-to-seed spread?

A side is a results file (a results.json, a run folder, or a results folder's latest run),
a golden file (``goldens/NAME.yaml``), or an image's latest results under a results folder.
Per model and metric, B − A with Welch's 95 % interval (``stats.judge``); fewer than 3 seeds on
either side is refused (``TooFewSeedsError``, exit 7).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ... import results, stats
from ...errors import ReprociError, TooFewSeedsError, UsageError
from ...golden import store
from ...reports import build
from .result import VarianceResult, VarianceSummary

SCHEMA = "reproci.compare"
VERSION = 1
METHOD = ("Welch's t: the difference of means B − A per model and metric, with its 95 % confidence interval; "
          "inside seed noise when the interval holds 0")


@dataclass(frozen=True)
class Side:
    label: str  # what the user named, for the output
    models: dict[str, VarianceSummary]  # model -> its variance (a golden's summary, or a run's result)


class ReportJson(TypedDict):
    """``reproci compare --json``."""

    schema: str
    version: int
    a: str
    b: str
    method: str
    confidence: float
    comparisons: list[dict[str, Any]]  # each judgement (``stats.Judgement.to_dict``)
    notes: list[str]
    inside: bool  # every metric inside seed noise
    worse: list[str]  # 'model metric' of each that moved outside it, in its bad direction


@dataclass(frozen=True)
class Report:
    """What ``reproci compare`` found: each model and metric both sides measured, judged, and
    what could not be compared."""

    a: str  # the sides as the user named them
    b: str
    judgements: list[stats.Judgement]
    notes: list[str]

    @property
    def inside(self) -> bool:
        return all(j.inside for j in self.judgements)

    @property
    def worse(self) -> list[str]:
        return [f"{j.model} {j.metric}" for j in self.judgements if _worse(j)]

    def to_json(self) -> ReportJson:
        return {"schema": SCHEMA, "version": VERSION, "a": self.a, "b": self.b, "method": METHOD,
                "confidence": stats.CONFIDENCE, "comparisons": [j.to_dict() for j in self.judgements],
                "notes": self.notes, "inside": self.inside, "worse": self.worse}


def load_side(path: Path) -> Side:
    """The variance results of a golden file (.yaml) or a results file, folder or results folder."""
    models: dict[str, VarianceSummary]
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UsageError(f"golden file {path} does not exist; name a goldens/NAME.yaml or a results.json")
        golden = store.load(path.parent, path.stem)
        models = {n: VarianceSummary.from_json(kept) for n, g in (golden.models if golden else {}).items()
                  if isinstance(kept := g.entry.get("variance"), dict)}
        hint = "record one with `reproci run --stage determinism --stage variance --update-golden`"
    else:
        doc, _ = build.locate(path)
        found = ((str(m.get("model")), VarianceResult.from_json(section)) for m in doc.get("models", [])
                 if isinstance(section := m.get("variance"), dict))
        models = {n: v for n, v in found if v.metrics}
        hint = "run `reproci run --stage variance` first"
    if not models:
        raise UsageError(f"{path} holds no variance results; {hint}")
    return Side(label=str(path), models=models)


def latest_for_image(results_dir: Path, image: str) -> Path:
    """The newest complete results file under ``results_dir`` whose image is ``image``."""
    found: list[tuple[str, Path]] = []
    for path in results_dir.glob("*/results.json"):
        try:
            doc = results.load(path)
        except ReprociError:
            continue
        if (doc.get("image") or {}).get("name") == image:
            found.append((str(doc.get("created")), path))
    if not found:
        raise UsageError(f"no results of image {image!r} under {results_dir}; run `reproci run --image {image} "
                         "--stage variance` or name the results files")
    return max(found)[1]


def compare(a: Side, b: Side) -> Report:
    """Every model and metric that both sides measured, judged; what could not be compared, noted."""
    common = [m for m in a.models if m in b.models]
    if not common:
        raise UsageError(f"no model has variance results on both sides (A: {', '.join(a.models)}; "
                         f"B: {', '.join(b.models)}); compare runs of the same models")
    few = [f"{m}: A has {a.models[m].k}, B has {b.models[m].k}" for m in common
           if min(a.models[m].k, b.models[m].k) < stats.MIN_SEEDS]
    if few:
        raise TooFewSeedsError(f"too few seeds to tell a change from seed noise ({'; '.join(few)}): Welch's interval "
                               f"needs at least {stats.MIN_SEEDS} per side; re-run with --seeds {stats.MIN_SEEDS} or more")
    notes = [f"{m}: only in {side}" for side, here, there in (("A", a, b), ("B", b, a))
             for m in here.models if m not in there.models]
    judgements = []
    for model in common:
        ma, mb = a.models[model], b.models[model]
        if ma.steps != mb.steps:
            notes.append(f"{model}: steps differ (A {ma.steps}, B {mb.steps}): a difference may be the run length")
        for metric, va in ma.metrics.items():
            if metric not in mb.metrics:
                notes.append(f"{model}: {metric} only in A")
                continue
            judgements.append(stats.judge(model, metric, va.values, mb.metrics[metric].values))
    return Report(a=a.label, b=b.label, judgements=judgements, notes=notes)


def _worse(j: stats.Judgement) -> bool:
    """Outside seed noise, in the metric's bad direction."""
    return not j.inside and (j.mean_b > j.mean_a) == bool(j.lower_is_better)


def text(report: Report) -> str:
    """The comparison for a terminal or a log: the method, then one line per model and metric."""
    lines = [f"A: {report.a}", f"B: {report.b}", f"{METHOD}."]
    for j in report.judgements:
        arrow = "↓" if j.lower_is_better else "↑"
        lines.append(f"{j.model} {j.metric} {arrow}: A {stats.number(j.mean_a)} ± {stats.number(j.std_a)} "
                     f"(K={j.k_a}), B {stats.number(j.mean_b)} ± {stats.number(j.std_b)} (K={j.k_b}): "
                     f"{j.sentence}")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def render(report: Report, as_json: bool) -> str:
    return json.dumps(report.to_json(), indent=2) + "\n" if as_json else text(report)
