"""Upgrade blame (``--blame``, ``reproci blame``): for each UPGRADE_CHANGED model, which changed
package, or group of packages that move together, alone reproduces the change.

For each group (``blame.images.groups``) the golden's image gets that group's files from the new
image (``blame.images.derive``); the affected models run in it to the golden's first differing
step plus one, and each run is compared with the golden's per-step checksums and with the new
image's run: equal to the new run, the group alone reproduces the change; equal to the golden,
it alone does not. When no single group reproduces a model's change, pairs of groups are tried,
at most ``MAX_PAIRS``. A group that cannot be swapped (another Python, or a run that fails in
the derived image, as a compiled package built against the new torch does) is said to be, and
the blame goes on. Images are built once and shared by the models; every image the blame
built (first stages and intermediate images included) is removed by ID when it ends or is
stopped. Each build, like each run, says on the progress line when it starts and how it ended,
with its seconds. Docker backend only: the environments are images.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from typing import Any, Mapping, cast

from ... import backends, results, typed, verdicts
from ...document import Document, Entry
from ...entry_sections import EvidenceView, view
from ...errors import InfrastructureError, WorkerFailed
from ...golden import comparison
from ...golden.divergence import step_rows
from ...golden.drift import move
from ...golden.environment import affects_results, package_diff
from ...results import ModelEntry, ResultsDocument
from ...runner import run_worker
from ...worker import run_record
from ...worker.run_record import RunRecord
from ..base import StageRun
from ..determinism.golden_cause import matches
from ..runs import base_spec
from . import images as blame_images
from .result import Blame as BlameSection
from .result import BlameCost, BlameTry, Reproduced

MAX_PAIRS = 10


def conclude(run: StageRun, document: ResultsDocument) -> None:
    options, golden = run.options, run.old_golden
    refs = {m.name: m for m in options.models}
    targets = [e for e in document["models"] if Entry.of(e).verdict == verdicts.UPGRADE_CHANGED and e["model"] in refs]
    if not targets or golden is None:
        return
    why = _refused(options, golden)
    if why:
        for entry in targets:
            _attach(entry, BlameSection(message=f"not blamed: {why}"))
        return
    from ...backends.docker_engine import Engine

    engine = Engine.connect()
    try:
        old_id, new_id = golden.image["id"], run.image["id"]
        if engine.inspect_image(old_id) is None:
            for entry in targets:
                _attach(entry, BlameSection(message=(
                    f"not blamed: the golden's image {golden.image.get('reference')} ({old_id[:19]}) is not here: "
                    "rebuild it from the golden's commit (docker/build-image.sh NAME) or pull it")))
            return
        Blame(run, engine, old_id, new_id, document).run(
            [(refs[e["model"]], e) for e in targets])
    finally:
        engine.close()


def _refused(options: Any, golden: Any) -> str | None:
    if options.backend != "docker":
        return ("blame builds images (the golden's image with one package of the new one): run with --image; "
                "the local backend has one environment only")
    if not golden.image.get("id"):
        return "the golden records no image ID (recorded on the local backend): record it with --image"
    return None


def _attach(entry: ModelEntry, result: BlameSection) -> None:
    results.add_section(entry, "blame", result.to_json())
    entry["message"] += f"; blame: {result.message}"
    if isinstance(golden := entry.get("golden"), dict):
        golden["message"] += f"; blame: {result.message}"


class Blame:
    """One blame: the groups, their images (built once), the runs per model."""

    def __init__(self, run: StageRun, engine: Any, old_id: str, new_id: str, document: ResultsDocument) -> None:
        self.options, self.ctx, self.engine, self.old_id, self.new_id = run.options, run.ctx, engine, old_id, new_id
        self.golden, self.document, self.project_commit, self.image = (run.old_golden, document, run.project_commit,
                                                                      run.image)
        self.diff = package_diff(run.old_golden.data.get("packages"), document.get("packages"))
        self.tags: dict[tuple[str, ...], str | None] = {}
        self.cannot: dict[tuple[str, ...], str] = {}
        self.runs, self.seq, self.builds, self.t0 = 0, 0, 0, time.monotonic()
        self.key = blame_images.run_key()  # labels every image this blame builds

    def run(self, targets: list[tuple[Any, ModelEntry]]) -> None:
        changed = sorted(self.diff)
        self.old = blame_images.inventory(self.engine, self.old_id, changed)
        self.new = blame_images.inventory(self.engine, self.new_id, changed)
        groups = [tuple(g) for g in blame_images.groups(changed, self.new)]
        groups.sort(key=lambda g: (not any(affects_results(n) for n in g), g))  # the numerics first
        self.ctx.progress(f"blame: {len(changed)} changed package{'s' if len(changed) != 1 else ''} in {len(groups)} "
                          f"group{'s' if len(groups) != 1 else ''}: the golden's image with each group of the new one")
        stopped = True
        try:
            for model, entry in targets:
                result = self.model(model, entry, groups)
                cost = BlameCost(images_built=sum(1 for t in self.tags.values() if t), runs=self.runs,
                                 seconds=round(time.monotonic() - self.t0, 1))
                _attach(entry, typed.replace(result, cost=cost, message=(
                    f"{result.message} (cost so far: {cost.images_built} images built, {self.runs} runs, "
                    f"{cost.seconds:.0f} s)")))
            stopped = False
        finally:
            left = blame_images.remove_built(self.engine, self.key, stopped=stopped)
            if left:
                print(f"warning: could not remove {len(left)} image{'s' if len(left) != 1 else ''} the blame built "
                      f"({', '.join(i.removeprefix('sha256:')[:12] for i in left)}); remove them with "
                      f"docker image prune -a --filter label={blame_images.LABEL}", file=sys.stderr)

    def model(self, model: Any, entry: ModelEntry, groups: list[tuple[str, ...]]) -> BlameSection:
        section = comparison.of(entry)
        evidence = view(EvidenceView, section.evidence) if section else None
        step = evidence.step if evidence else None
        steps = self.options.steps if step is None else min(self.options.steps, step + 1)
        new_record = run_record.read_ok(self.ctx.run_dir / entry["records"]["A"])
        tried = [self._try(model, g, steps, new_record) for g in groups]
        alone = [t for t in tried if t.outcome == "reproduces"]
        pairs: list[BlameTry] = []
        if not alone:
            swappable = [g for g, t in zip(groups, tried) if t.outcome in ("does not", "changes otherwise")]
            for a, b in itertools.islice(itertools.combinations(swappable, 2), MAX_PAIRS):
                pairs.append(self._try(model, tuple(sorted(a + b)), steps, new_record, pair=(a, b)))
                if pairs[-1].outcome == "reproduces":
                    break
        found = alone[0] if alone else next((p for p in pairs if p.outcome == "reproduces"), None)
        return BlameSection(steps=steps, tried=tried, pairs=pairs, culprit=found.group if found else None,
                            message=self._message(model.name, tried, pairs, found, steps, len(groups)))

    def _try(self, model: Any, group: tuple[str, ...], steps: int, new_record: RunRecord,
             pair: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> BlameTry:
        names, moves, paired = list(group), [move(n, self.diff[n]) for n in group], True if pair else None
        tag = self._image(group)
        if tag is None:
            return BlameTry(group=names, moves=moves, pair=paired, outcome="cannot swap", why=self.cannot[group])
        self.seq += 1
        spec = dataclasses.replace(base_spec(self.options, model, f"blame{self.seq}", project_commit=self.project_commit,
                                             image=self.image), steps=steps)
        spec = dataclasses.replace(spec, output=f"record-{spec.role}.json")
        t0 = time.monotonic()
        try:
            record = self._run_in(tag, spec)
        except WorkerFailed as e:
            said = str(e).removeprefix(f"run {spec.role}: ")
            self.ctx.progress(f"{model.name}: run {spec.role} failed after {time.monotonic() - t0:.1f} s: {said}")
            return BlameTry(group=names, moves=moves, pair=paired, outcome="cannot swap",
                            why=f"the model does not run with it alone: {e}")
        self.runs += 1
        if _same_rows(record, new_record, steps):
            first = next((s for s in sorted(step_rows(record)) if step_rows(record)[s] != step_rows(
                self.golden.models[model.name].as_record()).get(s)), None)
            return Reproduced(group=names, moves=moves, pair=paired, outcome="reproduces", from_step=first)
        outcome = ("does not" if matches(self.golden.models[model.name].as_record(), record, steps, self.options.steps)
                   else "changes otherwise")
        return BlameTry(group=names, moves=moves, pair=paired, outcome=outcome)

    def _image(self, group: tuple[str, ...]) -> str | None:
        if group not in self.tags:
            why = blame_images.unswappable(list(group), self.old, self.new)
            self.tags[group] = None if why else self._build(group)
            if why:
                self.cannot[group] = why
        return self.tags[group]

    def _build(self, group: tuple[str, ...]) -> str | None:
        """The derived image for ``group`` (None when it cannot be built: why in ``cannot``), its
        start and end said on the progress line with the seconds it took."""
        self.builds += 1
        said = f"blame: image {self.builds} ({', '.join(move(n, self.diff[n]) for n in group)})"
        self.ctx.progress(f"{said}: build started")
        t0 = time.monotonic()
        try:
            tag = blame_images.derive(self.engine, self.old_id, self.new_id, list(group), self.old, self.new,
                                      run=self.key)
        except InfrastructureError as e:
            self.ctx.progress(f"{said}: build failed after {time.monotonic() - t0:.1f} s: {e}")
            self.cannot[group] = str(e)
            return None
        self.ctx.progress(f"{said}: built in {time.monotonic() - t0:.1f} s")
        return tag

    def _run_in(self, tag: str, spec: Any) -> RunRecord:
        opts = dataclasses.replace(self.options, image=tag, image_reference=tag, image_entry=None, fork_server=False)
        with backends.create(opts) as backend:
            ctx = dataclasses.replace(self.ctx, backend=backend, slots=None)
            return run_worker(ctx, spec)

    def _message(self, name: str, tried: list[BlameTry], pairs: list[BlameTry], found: BlameTry | None,
                 steps: int, n_groups: int) -> str:
        def said(t: BlameTry) -> str:
            return " with ".join(t.moves)

        clear = [said(t) for t in tried if t.outcome == "does not"]
        cannot = [f"{said(t)} cannot be swapped alone ({t.why})" for t in tried if t.outcome == "cannot swap"]
        tail = "".join(f"; {c}" for c in cannot)
        if found is not None and not found.pair:
            others = f"; {', '.join(clear)} alone {'does' if len(clear) == 1 else 'do'} not" if clear else ""
            return (f"the change comes from {said(found)}: alone it reproduces {name}'s new hashes from step "
                    f"{found.from_step}{others}{tail}")
        if found is not None:
            return f"no single package reproduces {name}'s change; together {said(found)} do{tail}"
        searched = f"{len(pairs)} pair{'s' if len(pairs) != 1 else ''}" if pairs else "no pairs"
        return (f"no single package of the {n_groups} changed groups reproduces {name}'s change through step {steps}, "
                f"and {searched} searched did either{tail}")


def _same_rows(record: RunRecord, other: RunRecord, steps: int) -> bool:
    ours, theirs = step_rows(record), step_rows(other)
    return bool(ours) and all(theirs.get(s) == row for s, row in ours.items() if s <= steps)


def nothing(document: ResultsDocument) -> str | None:
    """The one line when the blame ran and had nothing to blame ('nothing to blame: ...'), saying
    why; None when it blamed (or refused to blame) a model, or did not run."""
    doc = Document.of(document)
    if "blame" not in doc.options.stages:
        return None
    if any(cast(Mapping[str, Any], m).get("blame") for m in document.get("models") or []):
        return None
    g, name = comparison.outcome_of(document), doc.image.name
    if g is None or not g.existed:
        return (f"nothing to blame: there is no golden for {name} ({g.file if g else None}) to compare with; record "
                f"one in the old image first: reproci golden update --image OLD --image-name {name}")
    by: dict[str, list[str]] = {}
    for m in doc.models:
        by.setdefault(str(m.verdict), []).append(m.model)
    if set(by) <= {verdicts.PASS}:
        return "nothing to blame: every model matches the golden (the new image changed no result)"
    said = "; ".join(f"{', '.join(names)} {v}" for v, names in by.items())
    hint = ("; ENV_CHANGED is the host or the settings, not a package: reproci bisect puts the golden's back"
            if verdicts.ENV_CHANGED in by else "")
    return (f"nothing to blame: no model is UPGRADE_CHANGED ({said}): blame explains only a change that comes "
            f"with changed packages{hint}")
