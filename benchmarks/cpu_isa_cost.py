"""What a portable CPU golden costs: the strict stage's training time with the CPU kernels
capped (``--cpu-isa avx2``) over native (whatever the host offers), measured in one run.

Each repetition runs the determinism stage (runs A, B and C, one at a time) of every model
both ways, in ABBA order, on the local backend; the ratio is of the summed training seconds
of the three runs (set-up and imports excluded: they do not depend on the kernels). On a
host whose best level is AVX2 the two are the same kernels and the ratio is about 1.

    python benchmarks/cpu_isa_cost.py [--models conv transformer embedding] [--steps 30] [--repetitions 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train_seconds(cwd: Path, model: str, steps: int, cap: str | None) -> float:
    args = [sys.executable, "-m", "reproci.cli", "run", "-m", model, "--steps", str(steps), "-j", "1"]
    if cap:
        args += ["--cpu-isa", cap]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 3):
        raise SystemExit(f"{model} ({cap or 'native'}): exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    doc = json.loads((cwd / "results" / "latest.json").read_text())
    runs = doc["models"][0]["runs"]
    return sum(r["train_s"] for r in runs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--cap", default="avx2", choices=["avx2", "avx512"])
    a = ap.parse_args()
    import torch

    print(f"host: ATen {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}; cap {a.cap}, "
          f"{a.steps} steps, {a.repetitions} repetitions (ABBA)")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            times: dict[str, list[float]] = {"native": [], a.cap: []}
            for rep in range(a.repetitions):
                order = ("native", a.cap) if rep % 2 == 0 else (a.cap, "native")
                for mode in order:
                    times[mode].append(train_seconds(Path(tmp), model, a.steps, None if mode == "native" else a.cap))
            native, capped = statistics.median(times["native"]), statistics.median(times[a.cap])
            print(f"{model}: native {native:.2f} s, {a.cap} {capped:.2f} s of training (A+B+C): "
                  f"ratio {capped / native:.2f}")


if __name__ == "__main__":
    main()
