"""After the strict stage: compare each model's hashes with the image's golden, and record goldens on request
(the throughput stage compares its cost with the golden itself, at its conclude)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import typed, verdicts
from ..document import Entry
from ..errors import ResultsError
from ..results import ModelEntry, ResultsDocument
from ..settings.options import RunOptions
from ..worker import run_record
from ..worker.run_record import RunRecord
from . import comparison, drift, store
from .advice import rerun_command, update_command
from .comparison import Outcome, outcome_of
from .store import Golden, OpHashes

if TYPE_CHECKING:
    import torch

    from ..stages.base import Stages

OWN_FAILURES = verdicts.FAILING


def _record(run_dir: Path, entry: ModelEntry) -> RunRecord:
    path = run_dir / entry["records"]["A"]
    try:
        return run_record.read_ok(path)
    except run_record.RecordVersionError as e:
        raise ResultsError(f"{path}: {e}") from e


def _final_state(run_dir: Path, entry: ModelEntry) -> dict[str, torch.Tensor] | None:
    path = run_dir / entry["model"] / "final-A.pt"
    if not path.is_file():
        return None
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def apply(options: RunOptions, document: ResultsDocument, run_dir: Path, old: Golden | None, stages: Stages,
          ops: dict[str, OpHashes] | None = None) -> None:
    """Fill in each model's ``golden`` section and combined verdict; update goldens if asked (with
    what each of ``stages`` keeps of its results). The document's exit code is computed after this,
    once (``verdicts.document_exit_code``)."""
    for entry in document["models"]:
        m = Entry.of(entry)
        if m.verdict in OWN_FAILURES or "A" not in m.records:
            continue  # not reproducible by itself, or the strict stage did not run: nothing to compare
        record = _record(run_dir, entry)
        section = drift.compare(entry, record, _final_state(run_dir, entry), document, old, ci=options.ci,
                                image_name=options.image_name, fix=f"`{update_command(options)}`",
                                rerun=lambda golden_entry: f"`{rerun_command(options, golden_entry)}`")
        entry["golden"] = section.to_json()
        entry["verdict"] = section.verdict
        if section.verdict in (verdicts.PASS, verdicts.NEW, verdicts.MODEL_CHANGED):
            entry["message"] = f"{entry['message']}; {section.message}"  # own checks passed: say so too
        else:
            entry["message"] = section.message
    document["golden"] = Outcome(update_command=update_command(options),
                                 file=str(store.path_for(options.goldens_dir, options.image_name)),
                                 existed=old is not None, updated=False).to_json()
    if options.update_golden:
        update(options, document, run_dir, stages, ops)


def update(options: RunOptions, document: ResultsDocument, run_dir: Path, stages: Stages,
           ops: dict[str, OpHashes] | None = None) -> None:
    """Record goldens from this run, only if every model passed its own strict checks (with
    the per-op hashes of their first steps, ``stages/determinism/golden_ops.py``, where recorded,
    and what each of ``stages`` keeps of its results)."""
    entries = [Entry.of(m) for m in document["models"]]
    bad = [f"{m.model} is {m.verdict}" for m in entries if m.verdict in OWN_FAILURES]
    checker = next(s.name for s in stages if s.checks_reproducibility)
    bad += [f"{m.model} was not checked (add --stage {checker})" for m in entries
            if "A" not in m.records and m.verdict not in OWN_FAILURES]
    outcome = outcome_of(document) or Outcome()
    if bad:
        document["golden"] = typed.replace(outcome, refused=f"golden not updated: {', '.join(bad)}; a golden is only "
                                                            "recorded from runs that are reproducible by themselves").to_json()
        return
    records = {m["model"]: _record(run_dir, m) for m in document["models"]}
    states = {m["model"]: _final_state(run_dir, m) or {} for m in document["models"]}
    path = store.write(options.goldens_dir, options.image_name, document, records, states, stages, ops=ops)
    # drift is now this update's evidence (verdicts.document_exit_code)
    document["golden"] = typed.replace(outcome, updated=True, file=str(path)).to_json()
    for m in document["models"]:  # "no golden yet; record one with ..." is no longer true: say what happened
        section = comparison.of(m)
        if section is not None and section.verdict == verdicts.NEW and section.message:
            said = f"golden recorded in {path}"
            m["message"] = m["message"].replace(section.message, said)
            m["golden"] = typed.replace(section, message=said, recorded=True).to_json()


def cleanup(options: RunOptions, run_dir: Path, document: ResultsDocument) -> None:
    if options.keep_checkpoints:
        return
    for entry in document["models"]:
        (run_dir / entry["model"] / "final-A.pt").unlink(missing_ok=True)
