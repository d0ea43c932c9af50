"""What checking compiled and mixed-precision training costs, measured in one run.

For each reference model, the determinism stage on the quick profile three ways: eager fp32,
``--compile`` (inductor, a cold cache per run, plus the warm-cache run W) and ``--amp bf16``.
Printed per model: each run's wall time (A, B, C, W), the stage's wall time, and the ratios
that matter: compiled A / eager A (what compiling costs a run), W / A compiled (what a warm
cache saves, and so what C saves by reusing A's), the compiled stage / the eager stage.

    python benchmarks/compile_cost.py [--models conv transformer embedding] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"eager": [], "compiled": ["--compile"], "bf16": ["--amp", "bf16"]}


def stage(model: str, flags: list[str], steps: int, work: Path) -> dict:
    """One determinism stage of one model: its entry in the results."""
    work.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "reproci.cli", "run", "-m", model, "--steps", str(steps), *flags],
                       cwd=work, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if p.returncode not in (0, 1):
        raise SystemExit(f"{model} {' '.join(flags)}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    doc = json.loads((work / "results" / "latest.json").read_text())
    return doc["models"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            out = {name: stage(model, flags, args.steps, Path(tmp) / model / name) for name, flags in CONFIGS.items()}
            for name, entry in out.items():
                runs = " ".join(f"{r} {v['wall_s']:.1f}" for r, v in entry["runs"].items())
                print(f"{model:12} {name:9} {entry['verdict']:17} stage {entry['seconds']:6.1f} s   runs (s): {runs}")
            eager, compiled, bf16 = (out[n]["runs"] for n in CONFIGS)
            print(f"{model:12} compiled A / eager A = {compiled['A']['wall_s'] / eager['A']['wall_s']:.2f}   "
                  f"W (warm) / A (cold) = {compiled['W']['wall_s'] / compiled['A']['wall_s']:.2f}   "
                  f"C (warm) / A (cold) = {compiled['C']['wall_s'] / compiled['A']['wall_s']:.2f}   "
                  f"compiled stage / eager stage = {out['compiled']['seconds'] / out['eager']['seconds']:.2f}   "
                  f"bf16 A / eager A = {bf16['A']['wall_s'] / eager['A']['wall_s']:.2f}", flush=True)


if __name__ == "__main__":
    main()
