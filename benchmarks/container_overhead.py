"""Per-container overhead of the Docker backend against the local backend.

The same worker spec runs alternately through both backends (fresh process each time,
same torch, same thread count); the overhead is the median wall time per run in a
container minus the median wall time per run as a local subprocess (target <= 2 s).
Also printed: the same run forked from the local fork server (what a server inside
a container could save per run), the one-off start-up check per invocation, and the bare container
round trip (create, start, wait, remove of ``python3 -c pass``) against a bare local
``python3 -c pass``. The final hashes of both backends must agree.

    python benchmarks/container_overhead.py [--image reproci/cpu-torch2.13:1] [--model embedding] [--steps 8] [--reps 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reproci.backends.docker_backend import DockerBackend  # noqa: E402
from reproci.backends.local import LocalBackend  # noqa: E402
from reproci.settings import options as options_mod  # noqa: E402
from reproci.worker.process.spec import WorkerSpec  # noqa: E402


def run_once(backend, spec: WorkerSpec, run_dir: Path) -> tuple[float, str]:
    work = run_dir / spec.model_name
    work.mkdir(parents=True, exist_ok=True)
    inner = backend.prepare_spec(spec, run_dir)
    spec_file = work / f"spec-{spec.role}.json"
    inner.write(spec_file)
    result = backend.launch(inner, spec_file, timeout=600)
    record = json.loads((work / spec.output).read_text())
    if result.returncode != 0 or record.get("status") != "ok":
        raise SystemExit(f"{backend.name} run failed ({result.returncode}): {result.log_tail[-500:]}")
    return result.seconds, record["final_sha256"]


def bare_round_trips(backend: DockerBackend, reps: int) -> tuple[float, float]:
    """Median seconds of a container running ``python3 -c pass``, and of the same local subprocess."""
    container_s, local_s = [], []
    for _ in range(reps):
        t0 = time.monotonic()
        with backend._container(["python3", "-c", "pass"], role="benchmark", labels={},
                                environment={"HOME": "/tmp"}, working_dir="/tmp") as c:
            c.start()
            c.wait(60)
        container_s.append(time.monotonic() - t0)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        local_s.append(time.monotonic() - t0)
    return statistics.median(container_s), statistics.median(local_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="reproci/cpu-torch2.13:1")
    ap.add_argument("--model", default="embedding")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    opts = options_mod.build({"image": args.image, "models": (args.model,), "threads": args.threads}, env={})
    t0 = time.monotonic()
    docker = DockerBackend(opts)
    startup = time.monotonic() - t0
    local = LocalBackend(dataclasses.replace(opts, image=None, image_name="local", fork_server=False))
    forked = LocalBackend(dataclasses.replace(opts, image=None, image_name="local"))
    spec = WorkerSpec(model_ref=args.model, model_name=args.model, role="A", steps=args.steps, threads=args.threads)
    times: dict[str, list[float]] = {"local": [], "forked": [], "docker": []}
    hashes: dict[str, set[str]] = {"local": set(), "forked": set(), "docker": set()}
    try:
        with tempfile.TemporaryDirectory() as d:
            for i in range(args.reps + 1):  # the first round warms the page cache (and the fork server): not counted
                for name, backend in (("local", local), ("forked", forked), ("docker", docker)):
                    s, h = run_once(backend, dataclasses.replace(spec, role=f"{name}{i}", output=f"{name}{i}.json"),
                                    Path(d) / "run")
                    hashes[name].add(h)
                    if i:
                        times[name].append(s)
        bare_c, bare_l = bare_round_trips(docker, args.reps)
    finally:
        docker.close()
        local.close()
        forked.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"image {docker.reference} ({docker.digest[:19]}), model {args.model}, {args.steps} steps, "
          f"{args.threads} thread(s), {args.reps} runs each")
    print(f"{'':26}{'local s':>9}{'docker s':>10}{'overhead s':>12}{'ratio':>7}")
    print(f"{'worker run (median)':26}{med['local']:9.2f}{med['docker']:10.2f}{med['docker'] - med['local']:12.2f}"
          f"{med['docker'] / med['local']:7.2f}")
    print(f"{'bare python3 -c pass':26}{bare_l:9.2f}{bare_c:10.2f}{bare_c - bare_l:12.2f}{bare_c / bare_l:7.2f}")
    print(f"{'start-up check (once)':26}{'':9}{startup:10.2f}")
    print(f"{'forked local run (median)':26}{med['forked']:9.2f}   (a fresh process's imports saved: "
          f"{med['local'] - med['forked']:.2f} s; a container's start costs {med['docker'] - med['local']:.2f} s beside them)")
    same = hashes["local"] == hashes["docker"] == hashes["forked"] and len(hashes["local"]) == 1
    print(f"final sha256: local {min(hashes['local'])[:16]}, docker {min(hashes['docker'])[:16]}: "
          f"{'identical' if same else 'DIFFERENT'}")
    print("target: overhead <= 2 s per run")


if __name__ == "__main__":
    main()
