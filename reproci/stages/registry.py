"""The stages of ``reproci run``, in the order they run, each one ``stages.base.Stage`` that its
own module (or package) defines.

``STAGES`` is that order: determinism first (it makes the entries the others attach to), then
throughput, variance (which reuses the determinism stage's run A), the op audit, the probes,
the bisection and the upgrade blame (which work at conclude, after the golden comparison).
The orchestrator, ``reproci run`` and the reports loop over it and never name a stage. A new
stage is a module with a ``Stage`` and one entry here, or, defined anywhere, ``register(stage)``.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..reports.terminal import print_warnings
from ..results import ResultsDocument
from ..settings import declared
from .audit import stage as audit
from .base import Stage
from .bisect import stage as bisect
from .blame import stage as blame
from .determinism import stage as determinism
from .probes import stage as probes
from .throughput import stage as throughput
from .variance import stage as variance

STAGES: tuple[Stage, ...] = (
    determinism.STAGE, throughput.STAGE, variance.STAGE, audit.STAGE, probes.STAGE, bisect.STAGE, blame.STAGE)
for _stage in STAGES:  # --stage accepts their names; their knobs are options of reproci run
    declared.add_stage(_stage)


def register(stage: Stage) -> None:
    """Add a stage defined outside this package: it runs after the stages before it, ``--stage``
    and ``reproci.yaml`` accept its name, and its knobs are options (``settings.declared.add_stage``)."""
    global STAGES
    if any(s.name == stage.name for s in STAGES):
        raise ValueError(f"a stage named {stage.name!r} is registered already")
    declared.add_stage(stage)
    STAGES = (*STAGES, stage)


def selected(names: tuple[str, ...]) -> list[Stage]:
    """The stages ``--stage`` asks for, in the order they run."""
    return [s for s in STAGES if s.name in names]


def print_run(document: ResultsDocument, names: tuple[str, ...], out: Console, err: Console, results: Path) -> None:
    """What ``reproci run`` prints: each stage's part in the order they ran; where no stage
    checked reproducibility, the models' warnings and a line saying so; then the results file."""
    stages = selected(names)
    for stage in stages:
        stage.terminal(document, out, err)
    if not any(stage.checks_reproducibility for stage in stages):
        for m in document.get("models", []):
            print_warnings(m, err)
        ran = ", ".join(stage.name for stage in stages)
        out.print(f"determinism not checked ({ran} {'stage' if len(stages) == 1 else 'stages'} only; "
                  "add --stage determinism)", highlight=False, markup=False)
    out.print(f"results: {results}", highlight=False, markup=False)
