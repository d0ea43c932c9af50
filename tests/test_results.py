import errno
import json
import os
import subprocess

import pytest

from reproci import atomic, errors, results

from .helpers import file_size_limit, said


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


def test_a_results_write_that_fails_half_way_leaves_the_previous_files_whole(tmp_path):
    """The results file and latest.json are written beside and renamed over: a write that
    fails part of the way through (here past a file size limit, as on a full disk) leaves
    both files as they were, whole, and no temporary file; a reader never sees half of one."""
    run_dir = tmp_path / "results" / "run-1"
    results.write(run_dir, {"schema": "reproci.results", "version": 1, "models": []})
    before = {p: p.read_bytes() for p in (run_dir / "results.json", tmp_path / "results" / "latest.json")}
    big = {"schema": "reproci.results", "version": 1, "models": [{"model": f"m{i}", "message": "x" * 100} for i in range(500)]}
    with file_size_limit(8192), pytest.raises(OSError) as e:
        results.write(run_dir, big)
    assert e.value.errno == errno.EFBIG
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in (tmp_path / "results").rglob("*")) == ["latest.json", "results.json", "run-1"]
    results.write(run_dir, big)
    assert json.loads((run_dir / "results.json").read_text()) == big


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
