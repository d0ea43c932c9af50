"""What the local backend's fork server saves, measured in one run.

1. Worker start latency: the time from launch to the worker's first training step, and to
   the end of a one-step run, for a fresh interpreter against a run forked from a warm
   server (alternating, median of --reps each); the server's own start is printed apart
   (paid once per launch environment). Target: forked latency <= 0.2 of fresh.
2. Wall time of the default ``reproci run`` (quick determinism stage, the reference
   matrix), with the server and with --no-fork-server.
3. Wall time of the quick determinism + throughput stages, with and without.
   Target: <= 60 s with the server.
4. Standing servers (``REPROCI_FORK_SERVERS``): the wall time of one short ``reproci run``
   (one model, 6 steps) that starts its own server, against the same command served by a
   standing server that an earlier invocation started (alternating, median of --reps each).

    python benchmarks/fork_server.py [--reps 5] [--model embedding] [--skip-stages]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reproci.backends.local import LocalBackend  # noqa: E402
from reproci.settings.options import build  # noqa: E402
from reproci.worker.process.spec import WorkerSpec  # noqa: E402


def latency(backend: LocalBackend, spec: WorkerSpec, work: Path) -> tuple[float, float, str]:
    """(seconds to the first step line, seconds to the end, how it started) of one run."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"spec-{spec.role}.json"
    spec.write(path)
    first: list[float] = []
    t0 = time.monotonic()
    result = backend.launch(spec, path, timeout=300, on_step=lambda step, stop: first.append(time.monotonic() - t0))
    if result.returncode != 0:
        raise SystemExit(f"run {spec.role} failed: {result.log_tail[-500:]}")
    return first[0], result.seconds, (result.launch or {}).get("mode", "?")


def stage_wall(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    cwd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "reproci.cli", *args, "--results-dir", str(cwd / "results"),
                          "--goldens-dir", str(ROOT / "goldens")], cwd=cwd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    if out.returncode not in (0, 3):
        raise SystemExit(f"reproci {' '.join(args)} exited {out.returncode}: {out.stderr[-800:]}")
    return seconds


def standing(model: str, reps: int) -> tuple[float, float]:
    """Median wall time of ``reproci run -m MODEL --steps 6`` starting its own server, and
    served by a standing one (started by a first, unmeasured invocation)."""
    folder = Path(tempfile.mkdtemp(prefix="rfb-"))
    own = {k: v for k, v in os.environ.items() if k != "REPROCI_FORK_SERVERS"}
    shared = {**own, "REPROCI_FORK_SERVERS": str(folder)}
    args = ["run", "-m", model, "--steps", "6"]
    times: dict[str, list[float]] = {"own": [], "standing": []}
    try:
        with tempfile.TemporaryDirectory() as d:
            stage_wall(args, Path(d), shared)  # starts the standing server
            for i in range(reps):
                for name, env in (("own", own), ("standing", shared)):
                    times[name].append(stage_wall(args, Path(d) / f"{name}{i}", env))
    finally:
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                if f"--stand {folder}/".encode() in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
    return statistics.median(times["own"]), statistics.median(times["standing"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="embedding")
    ap.add_argument("--skip-stages", action="store_true", help="measure the start latency only")
    args = ap.parse_args()

    fresh = LocalBackend(build({"fork_server": False}, env={}))
    forked = LocalBackend(build({}, env={}))
    spec = WorkerSpec(model_ref=args.model, model_name=args.model, role="warm", steps=1, output="record.json")
    times: dict[str, list[tuple[float, float]]] = {"fresh": [], "forked": []}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        latency(forked, spec, Path(d) / "warm")  # starts the server: paid once per launch environment
        server_s = time.monotonic() - t0
        for i in range(args.reps):
            for name, backend in (("fresh", fresh), ("forked", forked)):
                role = f"{name}{i}"
                first, end, mode = latency(backend, WorkerSpec(**{**spec.__dict__, "role": role, "output": f"{role}.json"}),
                                           Path(d) / role)
                assert mode == name, f"run {role} started {mode}"
                times[name].append((first, end))
    fresh.close()
    forked.close()
    med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()}
    print(f"worker start latency ({args.model}, 1 step, median of {args.reps}; server start once: {server_s:.2f} s)")
    print(f"{'':24}{'fresh s':>9}{'forked s':>10}{'ratio':>7}")
    for i, what in enumerate(("to the first step", "to the run's end")):
        print(f"{what:24}{med['fresh'][i]:9.2f}{med['forked'][i]:10.2f}{med['forked'][i] / med['fresh'][i]:7.2f}")
    print("target: forked latency <= 0.2 of fresh")
    own, shared = standing(args.model, args.reps)
    print(f"reproci run -m {args.model} --steps 6 (median of {args.reps}): its own server {own:.2f} s, "
          f"a standing one {shared:.2f} s, ratio {shared / own:.2f}")
    if args.skip_stages:
        return
    print(f"{'':40}{'server s':>9}{'fresh s':>9}{'ratio':>7}")
    for what, stage_args in (("reproci run (default, quick)", ["run"]),
                             ("quick determinism + throughput", ["run", "-s", "determinism", "-s", "throughput"])):
        with tempfile.TemporaryDirectory() as d:
            with_server = stage_wall(stage_args, Path(d))
        with tempfile.TemporaryDirectory() as d:
            without = stage_wall([*stage_args, "--no-fork-server"], Path(d))
        print(f"{what:40}{with_server:9.1f}{without:9.1f}{with_server / without:7.2f}")
    print("target: quick determinism + throughput <= 60 s with the server")


if __name__ == "__main__":
    main()
