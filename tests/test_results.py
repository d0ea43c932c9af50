import json
import os
import subprocess

import pytest

from reproci import atomic, errors, results

from .helpers import said


def test_load_refuses_other_versions_with_the_fix(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": "reproci.results", "version": 2}))
    with pytest.raises(errors.ResultsError, match="upgrade reproci"):
        results.load(path)
    path.write_text(json.dumps({"schema": "reproci.results", "version": 0}))
    with pytest.raises(errors.ResultsError, match="re-run `reproci run`"):
        results.load(path)
    path.write_text("{not json")
    with pytest.raises(errors.ResultsError, match="not valid JSON"):
        results.load(path)
    with pytest.raises(errors.ResultsError, match="does not exist"):
        results.load(tmp_path / "missing.json")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic.write_text(tmp_path / "a.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    yield mnt
    subprocess.run(["umount", str(mnt)])


@pytest.mark.slow
def test_full_disk_is_an_infrastructure_error_with_nothing_half_written(reproci, tiny_disk):
    p = reproci("run", "-m", "embedding", "--steps", "6", "--resume-at", "3", "--results-dir", str(tiny_disk / "results"))
    assert p.returncode == errors.EXIT_INFRA, p.stdout + p.stderr
    assert "disk full" in p.stderr and len(said(p.stderr)) == 1
    # what was being written is named: the run's own files, not the results file written after it
    assert "disk full while run" in said(p.stderr)[0] and "results.json" not in said(p.stderr)[0]
    assert not (tiny_disk / "results").exists()  # not even the folder the run made for its results
