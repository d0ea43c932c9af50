"""A run's record as a typed document (reproci.worker.run_record): what a real run writes reads
back typed and writes the same JSON; a failed run's record too; another version is refused."""

from __future__ import annotations

import json

import pytest

from reproci.worker import run_record
from reproci.worker.run_record import FailedRun, RecordVersionError, RunRecord, Timings

from .helpers import Cli


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
