"""The cells' results made one: the document, run directory and golden a single machine
would have written for the same run.

Each cell's run directory is unpacked into the driver's run directory (a model's records
live under its own folder, so cells never collide), its models join the document in the
order the run named them, and every part of a cell's text that spoke of the cell alone (its
own ``golden update`` command, its goldens copy) is made to speak of the whole run.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import errors, results, verdicts
from ..document import Entry
from ..errors import ReprociError
from ..golden import comparison
from ..golden import store as golden_store
from ..golden.advice import update_command
from ..results import GoldenOutcome, ResultsDocument
from ..settings.options import RunOptions
from ..stages.base import composed
from . import across
from . import cell as cell_mod


def unpack_cells(done: list[cell_mod.CellResult], run_dir: Path) -> list[ResultsDocument]:
    """Each cell's run directory unpacked into ``run_dir``; its document, in the order given."""
    docs = []
    for r in done:
        if r.run_tar is None:
            continue
        where = Path(tempfile.mkdtemp(prefix=f".cell-{r.name}-", dir=run_dir))
        try:
            cell_mod.unpack(r.run_tar, where)
            docs.append(json.loads((where / "results.json").read_text()))
            for entry in where.iterdir():
                if entry.name != "results.json":
                    entry.rename(run_dir / entry.name)
        finally:
            cell_mod.remove(where)
    return docs


def document(options: RunOptions, run_id: str, created: str, seconds: float,
             docs: list[ResultsDocument]) -> ResultsDocument:
    """One document from the cells' documents: the first cell's image, environment, packages
    and options (one image and one device kind: they are the same in every cell), every
    cell's models, the run's own id, time and summary."""
    first = docs[0]
    order = {m.name: i for i, m in enumerate(options.models)}
    cell_models = [d.get("models") or [] for d in docs]
    models = sorted((m for ms in cell_models for m in ms), key=lambda m: order.get(Entry.of(m).model, len(order)))
    command = update_command(options)
    for d, ms in zip(docs, cell_models):
        outcome = comparison.outcome_of(d)
        if outcome is not None and outcome.update_command and outcome.update_command != command:
            for m in ms:
                _replace_text(m, outcome.update_command, command)
    # The first cell's keys, in the order one machine writes them; the whole run's schema, id, time,
    # models, golden and summary where the cell has them, after its keys where it has none.
    out: ResultsDocument = {**first, **results.new_document(run_id=run_id, created=created, models=models)}
    golden = _golden_section(docs, command)
    if golden is not None:
        out["golden"] = golden
    out["summary"] = {"verdicts": {}, "exit_code": None, "seconds": round(seconds, 3)}
    verdicts.summarize(out, composed(options))
    return out


def _golden_section(docs: list[ResultsDocument], command: str) -> GoldenOutcome | None:
    sections = [d["golden"] for d in docs if d.get("golden")]
    if not sections:
        return None
    read = [comparison.Outcome.from_json(s) for s in sections]
    out: GoldenOutcome = {**sections[0], "update_command": command}
    out["existed"] = any(o.existed for o in read)
    out["updated"] = False  # the driver's write says so (write_golden)
    refused = [o.refused for o in read if o.refused]
    if refused:
        out["refused"] = "; ".join(dict.fromkeys(refused))
    else:
        out.pop("refused", None)
    return out


def _replace_text(value: Any, old: str, new: str) -> Any:
    """Every string inside ``value`` (dicts and lists, in place) with ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        for k, v in value.items():
            value[k] = _replace_text(v, old, new)
    elif isinstance(value, list):
        value[:] = [_replace_text(v, old, new) for v in value]
    elif isinstance(value, str):
        return value.replace(old, new)
    return value


def write_golden(options: RunOptions, doc: ResultsDocument, done: list[cell_mod.CellResult]) -> None:
    """The driver, alone, records the golden: only when every cell recorded its part (each
    passed its own checks), from the parts the cells sent back."""
    outcome = comparison.outcome_of(doc)
    if not options.update_golden or outcome is None or outcome.refused:
        return
    section = doc["golden"]
    parts = []
    with tempfile.TemporaryDirectory(prefix="reproci-cell-goldens-") as tmp:
        for r in done:
            d = Path(tmp) / r.name
            d.mkdir()
            for name, data in r.golden_files.items():
                (d / name).write_bytes(data)
            part = golden_store.load(d, options.image_name)
            if part is None:
                section["refused"] = f"golden not updated: cell {r.name} recorded none"
                return
            parts.append(part)
        path = golden_store.write_combined(options.goldens_dir, options.image_name, doc, parts)
    section.update({"updated": True, "file": str(path)})
    summary_keys = {"verdicts", "exit_code"}
    if summary_keys <= set(doc.get("summary") or {}):
        verdicts.summarize(doc, composed(options))  # drift is now this update's evidence, as on one machine


Publish = Callable[[RunOptions, Path, ResultsDocument], Path]  # a finished run's alerts, results file, history


def finish(options: RunOptions, done: list[cell_mod.CellResult], lost: list[tuple[str, int]], started: float,
           write_cells: Callable[[Path], None], publish: Publish, twins: Sequence[across.Twin] = ()
           ) -> tuple[ResultsDocument, Path, list[str]]:
    """The cells that came back made one run: its directory, document and golden, published as one
    machine's (``publish``, the command's: ``orchestrate.publish``); ``lost`` (a line and an exit
    code per cell that did not) makes it exit 5.
    ``write_cells(run_dir)`` records where each cell ran (the engine's own ``cells.json``).
    ``twins`` (``--across-nodes``): each cell's twin from another node, compared with it (``across``)."""
    if not done:
        line, code = lost[0] if lost else ("no cell returned results", errors.EXIT_INFRA)
        more = f" (and {len(lost) - 1} more cell(s))" if len(lost) > 1 else ""
        raise error(code, line + more)
    run_id = results.new_run_id(options.image_name)
    run_dir = (options.results_dir / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=False)
    try:
        docs = unpack_cells(done, run_dir)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        doc = document(options, run_id, created, time.monotonic() - started, docs)
        if twins:
            across.check(options, doc, run_dir, list(twins))
        write_golden(options, doc, done)
        if lost:
            doc["lost_cells"] = [line for line, _ in lost]
            doc["summary"]["exit_code"] = errors.EXIT_INFRA  # as verdicts.document_exit_code reads it back
        path = publish(options, run_dir, doc)
        write_cells(run_dir)
        return doc, path, [line for line, _ in lost]
    except BaseException:
        results.discard(run_dir)
        raise


def error(code: int, line: str) -> ReprociError:
    """A one-line error with the exit code of the cell it speaks for."""
    err = ReprociError(line)
    err.return_code = code
    return err
