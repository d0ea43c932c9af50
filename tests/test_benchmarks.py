"""The benchmark scripts still start: each imports what it measures and parses its options."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest

from .helpers import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_each_benchmark_starts(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


GPU_CHECK = ROOT / "benchmarks" / "gpu_check.sh"


def test_the_gpu_check_script_is_valid_bash_and_passes_shellcheck():
    p = subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    from .workflow_helpers import linter

    exe = str(linter(shutil.which("shellcheck"), "shellcheck"))
    out = subprocess.run([exe, "-s", "bash", str(GPU_CHECK)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


# Stands in for the GPU machine's python: each command of a lane sleeps a little and says what it
# would; reproci runs write a results document, the compiled run fails; the script's own
# inline programs (environment, audit listing, summary) run in the real interpreter.
FAKE_PYTHON = """#!{python}
import json, os, pathlib, sys, time
args = sys.argv[1:]
if args[:1] == ["-"]:
    os.execv({python!r}, [{python!r}, *args])
if args[:1] == ["-c"]:
    print("0")
    raise SystemExit(0)
time.sleep(0.2)
joined = " ".join(args)
if "--results-dir" in args:
    out = pathlib.Path(args[args.index("--results-dir") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({{"models": [
        {{"model": "conv", "verdict": "NEW", "throughput": {{"slowdown": {{"median": 1.25}}}}}}]}}))
if "--compile" in args:
    print("the compiled run broke")
    raise SystemExit(1)
if "pytest" in args:
    print("7 passed, 2 skipped in 0.20s")
if "determinism_overhead.py" in joined:
    print("conv device record: 3 launches, 1.1x bytes, 0 syncs, 40 us host per step")
if "zoo.py" in joined:
    pathlib.Path(args[args.index("--json") + 1]).write_text(json.dumps({{
        "architectures": {{"pass": 4, "total": 4}}, "planted": {{"as_expected": 1, "total": 1}}, "entries": []}}))
"""


def test_the_gpu_check_runs_its_lanes_and_writes_one_summary_line_each(tmp_path):
    """The whole script, with a stand-in interpreter: every lane runs though one fails, each
    keeps its log, summary.txt has a line per lane (passed or failed, seconds, figures), and
    the exit code says a lane failed."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(out), "REPROCI_GPU_CHECK_DEVICE": "cpu"}
    p = subprocess.run(["bash", str(GPU_CHECK)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = {line.split()[0]: line for line in (out / "summary.txt").read_text().splitlines()}
    assert list(lines) == ["tests", "strict", "compile", "zoo", "record", "throughput", "total"]
    assert lines["compile"].split()[1] == "failed" and lines["compile"].split()[2].isdigit()
    for name in ("tests", "strict", "zoo", "record", "throughput"):
        assert lines[name].split()[1] == "passed", lines[name]
        assert (out / f"{name}.log").is_file()
    assert "the compiled run broke" in (out / "compile.log").read_text()
    assert "7 passed, 2 skipped" in lines["tests"] and "strict: conv NEW" in lines["strict"]
    assert "4/4 architectures PASS" in lines["zoo"] and "conv device record: 3 launches" in lines["record"]
    assert "conv 1.250x" in lines["throughput"]


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_in_process_benchmarks_measure_a_few_steps():
    """The benchmarks that call the worker's functions directly still match their signatures
    (a `--help` does not reach them, and the GPU check runs one of them on CUDA)."""
    fp = _load("determinism_overhead").fingerprint_overhead("embedding", steps=15)  # one block each: on, off, floor
    # Ratios of times: what they are is the benchmark's to print; here, that each was measured.
    assert fp.direct > 0 and fp.batch_us > 0 and fp.state_us > 0 and fp.step_ms > 0
    assert all(isinstance(x, float) and math.isfinite(x) for x in fp)
    record = _load("determinism_overhead").device_record("embedding", steps=1)
    # Triton is in the test set-up: the record's kernels, counted under its interpreter, within the targets;
    # each byte of the state and the batch is read at least once, so a counter that stops counting fails
    assert record.path == "triton" and 0 < record.launches <= 8 and 1.0 <= record.bytes_ratio <= 1.5, record
    assert record.syncs == 0 and record.host_us > 0, record
    plain, recorded, ops = _load("op_record_cost").step_cost("embedding", repeats=1)
    assert plain > 0 and recorded > 0 and ops > 10
