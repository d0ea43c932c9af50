"""``reproci run`` end to end: every stage for every model through one backend, the golden
comparison, alerts, and the results file. The click command is in ``commands/run.py``;
one worker run is launched by ``runner.run_worker``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import __version__, backends, results, verdicts
from .document import Entry
from .errors import GoldenError, UsageError
from .golden import check as golden_check
from .golden import store as golden_store
from .golden.folder import require_folder
from .reports import github, history, webhook
from .results import Alerts, Image, ModelEntry, ResultsDocument
from .runner import RunContext
from .settings.options import RunOptions
from .stages import model_entry
from .stages.base import StageRun, Stages, composed
from .worker import run_record

if TYPE_CHECKING:
    from .worker.sections import Environment


def project_commit(root: Path) -> str | None:
    """The git commit of the project under test, if it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run_all(options: RunOptions, progress: Callable[[str], None] = lambda m: None,
            on_step: Callable[[str, str, int, int], None] | None = None) -> tuple[ResultsDocument, Path]:
    """Run every stage for every model; return the results document and its path.

    The run directory is removed if this is interrupted, so no partial results stay.
    """
    _check_goldens_dir(options)
    backends.require_device(options)
    old_golden = _old_golden(options)
    for gone in results.sweep_orphans(options.results_dir):
        print(f"notice: removed {gone}: the unfinished run of a reproci process that is gone", file=sys.stderr)
    run_id = results.new_run_id(options.image_name)
    run_dir = (options.results_dir / run_id).resolve()
    made = tuple(p for p in run_dir.parents if not p.exists())  # the folders this run makes, deepest first
    try:  # from the folder's making on, any end but a finished run removes it (a Ctrl-C at any moment)
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            probe = run_dir / ".writable"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise UsageError(f"--results-dir {options.results_dir}: cannot write a run there "
                             f"({e.strerror or e}); choose a writable directory") from e
        started = time.monotonic()
        _import_torch_beside()
        commit = project_commit(options.project_root)
        with backends.create(options) as backend:
            image = backend.image_info()
            ctx = RunContext(backend=backend, run_dir=run_dir, timeout=options.timeout, progress=progress)
            if on_step is not None:
                ctx.on_step = on_step
            run = StageRun(options=options, ctx=ctx, project_commit=commit, image=image, old_golden=old_golden)
            models = [model_entry.new(options, m) for m in options.models]  # NOT_CHECKED until a stage says
            stages = composed(options).selected(options.stages)
            for stage in stages:
                stage.run(run, models)
            environment = _environment(run_dir, models, composed(options))
            document = _document(options, run_id, image, environment, models, commit, time.monotonic() - started)
            for stage in stages:
                stage.conclude(run, document)
            verdicts.summarize(document, composed(options))  # counts and the exit code, once every verdict is in
            path = publish(options, run_dir, document)
            golden_check.cleanup(options, run_dir, document)
            for cache in run_dir.glob("*/inductor-cache-*"):  # any stage's compiled code: rebuilt by a re-run
                shutil.rmtree(cache, ignore_errors=True)
            return document, path
    except BaseException:
        results.discard(run_dir, made)
        raise


def publish(options: RunOptions, run_dir: Path, document: ResultsDocument) -> Path:
    """A finished run's alerts (annotations, step summary, webhook), its results file and its
    history entry (results/history/: trends for `reproci report`); the results file's path."""
    alerts_out = _alert(options, document)
    if alerts_out:
        document["alerts"] = alerts_out
    path = results.write(run_dir, document)
    history.record(options.results_dir, document, composed(options))
    return path


def _import_torch_beside() -> threading.Thread | None:
    """This process reads the runs' final states with torch once they end (``golden/check``),
    about 1.4 s to import on a CPU: imported in a thread while the first runs start instead.
    A run that ends early (Ctrl-C, an error) does not wait for it: the thread is a daemon, and
    the interpreter exits cleanly with torch's import half done (measured at 15 moments from
    0.05 to 6 s into it), where waiting for it took up to 10 s on a loaded host."""
    if "torch" in sys.modules:
        return None
    thread = threading.Thread(target=_import_torch, name="reproci-import-torch", daemon=True)
    thread.start()
    return thread


def _import_torch() -> None:
    """torch's import, ahead of need, and silent where it fails: a run that ends meanwhile (a Ctrl-C
    in the main thread can leave torch's modules half made under this thread's feet, which then
    says "operator ... does not exist") is not this thread's to report, and a torch that does not
    import fails again, with its own message, where the run needs it."""
    import importlib

    try:
        importlib.import_module("torch")
    except BaseException:  # noqa: B036 - see above: the main thread imports it again and says why
        pass


def _check_goldens_dir(options: RunOptions) -> None:
    """Refuse, before any run, a goldens directory a golden update cannot write; say when the
    directory to compare with does not exist (a typo makes every model NEW)."""
    d = options.goldens_dir
    require_folder(d)
    if options.update_golden:
        existing = next(p for p in (d, *d.absolute().parents) if p.exists())
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--goldens-dir {d}: {existing} is not writable, so the golden cannot be recorded; "
                             "fix its permissions or name another directory")
    elif not d.exists() and d != Path("goldens"):  # a directory named on purpose (the default: a new project)
        if options.ci:
            raise UsageError(f"--goldens-dir {d} does not exist: check the path (CI mode compares every model with "
                             "a golden)")
        print(f"notice: --goldens-dir {d} does not exist: nothing to compare with, every model is NEW", file=sys.stderr)


def _old_golden(options: RunOptions) -> golden_store.Golden | None:
    """The image's golden. A corrupt one fails before any run, unless this run re-records it."""
    try:
        return golden_store.load(options.goldens_dir, options.image_name)
    except GoldenError as e:
        if not options.update_golden:
            raise
        print(f"warning: {e}; it is replaced by this run's golden if the run is reproducible", file=sys.stderr)
        return None


@dataclass(frozen=True)
class _Environment:
    """What a run's record says of its environment (the results' environment and packages)."""

    fingerprint: Environment | None
    packages: dict[str, str] | None


def _environment(run_dir: Path, models: list[ModelEntry], stages: Stages) -> _Environment | None:
    """What the results record of the environment: from the first model whose runs succeeded,
    else from any record there is."""
    ok = (e for e in models if Entry.of(e).verdict != verdicts.ERROR)
    return next((env for e in ok if (env := _environment_of(run_dir, e, stages))), None) or \
        next((env for e in models if (env := _environment_of(run_dir, e, stages))), None)


def _environment_of(run_dir: Path, entry: ModelEntry, stages: Stages) -> _Environment | None:
    records = Entry.of(entry).records
    rec = next((records[role] for stage in stages for role in stage.records if records.get(role)), None)
    if not rec:
        return None
    record = run_record.read(run_dir / rec)  # runner.run_worker read it already: of this version
    if isinstance(record, run_record.FailedRun):
        return _Environment(fingerprint=None, packages=None)
    return _Environment(fingerprint=record.environment, packages=record.packages)


def _document(options: RunOptions, run_id: str, image: Image, environment: _Environment | None,
              models: list[ModelEntry], commit: str | None, seconds: float) -> ResultsDocument:
    return results.new_document(
        run_id=run_id,
        reproci_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        project_commit=commit,
        image=image,
        options=options.recorded(),
        environment=environment.fingerprint if environment is not None else None,
        packages=environment.packages if environment is not None else None,
        models=models,
        summary={"verdicts": {}, "exit_code": None, "seconds": round(seconds, 3)},  # verdicts.summarize
    )


def _alert(options: RunOptions, document: ResultsDocument) -> Alerts:
    """Annotations, the step summary and the webhook; failures here never change the verdict."""
    out: Alerts = {}
    if options.github_actions:
        for line in github.run_annotations(document, composed(options)):
            print(line, flush=True)
    if options.step_summary is not None:
        try:
            github.write_step_summary(document, options.step_summary, composed(options))
            out["step_summary"] = str(options.step_summary)
        except OSError as e:
            print(f"warning: could not append to the step summary {options.step_summary}: {e.strerror}", file=sys.stderr)
    if options.webhook and webhook.needs_alert(document):
        r = webhook.post(options.webhook, webhook.slack_message(document, composed(options)))
        out["webhook"] = {"ok": r.ok, "attempts": r.attempts, "status": r.status, "error": r.error}
        if not r.ok:
            print(f"warning: webhook alert not delivered after {r.attempts} attempt(s) ({r.error}); "
                  "the results are saved and the verdict stands", file=sys.stderr)
    return out
