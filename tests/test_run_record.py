"""A run's record as a typed document (reproci.worker.run_record): what a real run writes reads
back typed and writes the same JSON; a failed run's record too; another version is refused."""

from __future__ import annotations

import json

import pytest

from reproci.worker import run_record
from reproci.worker.run_record import FailedRun, Launched, RecordVersionError, RunRecord, Timings, Trajectory

from .helpers import Cli
from .helpers import run_record as run_record_of


def test_a_real_runs_record_reads_back_typed_and_writes_the_same_json(reproci: Cli) -> None:
    """Every key a real run writes is a field (none dropped, none added, in the file's order)."""
    r = reproci("run", "-m", "embedding", "--steps", "4", "--resume-at", "2")
    assert r.returncode == 0, r.stderr
    doc = reproci.latest()
    records = doc["models"][0]["records"]
    for role in ("A", "C"):  # C resumes; both evaluate (their records have eval)
        data = json.loads((reproci.cwd / "results" / doc["run_id"] / records[role]).read_text())
        typed = run_record.from_json(data)
        assert isinstance(typed, RunRecord) and isinstance(typed.timings, Timings)
        assert typed.role == role and typed.final_sha256 == data["final_sha256"]
        again = typed.to_json()
        assert again == data and list(again) == list(data)
        assert "eval" in data


def test_a_failed_runs_record_round_trips() -> None:
    failed = FailedRun(error_kind="crash", message="ValueError: x", traceback="Traceback ...", model="conv", role="B")
    data = failed.to_json()
    assert data["status"] == "error" and data["schema"] == "reproci.run"
    assert run_record.from_json(json.loads(json.dumps(data))) == failed


@pytest.mark.parametrize("change", [{"version": 2}, {"schema": "other"}])
def test_a_record_of_another_version_is_refused_in_one_line(change: dict) -> None:
    data = {**FailedRun("crash", "m", "t", "conv", "A").to_json(), **change}
    with pytest.raises(RecordVersionError) as e:
        run_record.from_json(data)
    assert "\n" not in str(e.value) and "version 1" in str(e.value) and "another version of reproci" in str(e.value)


def test_what_the_orchestrator_adds_to_a_record_never_reaches_the_record_file() -> None:
    """``runner.run_worker`` sets ``launched`` on the record it read; the file's JSON stays the worker's."""
    record = run_record_of(losses=[1.0, 0.5], final_sha256="f")
    written = record.to_json()
    record.launched = Launched(wall_s=2.5, start_wait_s=0.1, how={"kind": "fork"}, at=12.0)
    assert record.to_json() == written and "launched" not in json.dumps(record.to_json())
    assert run_record.from_json(written) == record  # read back equal: launched is not part of the record


def test_a_records_trajectory_is_the_same_read_typed_or_from_its_json() -> None:
    """The comparisons read a record (typed) and a golden or a test's mapping through one ``Trajectory``."""
    record = run_record_of(tensor_names=["param:w"], fingerprints=[[3]], start_step=2, losses=[0.5],
                           batch_checksum="s", batch_fingerprints=[7], fingerprint_scheme="x",
                           batch_contents_scheme="c", batch_contents=[4], batch_epochs=[1], final_sha256="f",
                           tensor_sha256={"param:w": "h"}, loader={"batches_per_epoch": 3},
                           initial_fingerprint={"step": 2, "names": ["param:w"], "row": [3], "transient": []})
    assert Trajectory.of(record) == Trajectory.of(record.to_json())
    assert Trajectory.of(record).batches_per_epoch == 3 and Trajectory.of({}) == Trajectory()
