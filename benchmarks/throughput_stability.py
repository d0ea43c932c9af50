"""Back-to-back agreement of the throughput stage's median slowdown.

Runs ``reproci run --stage throughput`` twice in a row, each in a fresh scratch folder,
and prints per model the two median slowdown ratios (strict / default step time), their
difference in %, each interval, and each invocation's wall time (target: |difference|
<= 3 %; the stage itself well under 2 minutes for the three reference models).

    python benchmarks/throughput_stability.py [--models conv transformer embedding] [--repetitions 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_PCT = 3.0


def invoke(models: list[str], repetitions: int, extra: list[str]) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "reproci.cli", "run", "--stage", "throughput",
               "--repetitions", str(repetitions), *[a for m in models for a in ("-m", m)], *extra]
        t0 = time.monotonic()
        r = subprocess.run(cmd, cwd=d, env={**os.environ, "PYTHONPATH": str(ROOT), "CI": ""},
                           capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit(f"reproci run failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        return json.loads((Path(d) / "results" / "latest.json").read_text()), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="more `reproci run` arguments, after --")
    args = ap.parse_args()
    runs = [invoke(args.models, args.repetitions, args.extra) for _ in range(2)]
    print(f"{'model':12} {'median 1':>9} {'median 2':>9} {'diff %':>7}   {'interval 1':>16} {'interval 2':>16}")
    worst = 0.0
    for name in args.models:
        sds = [next(m for m in doc["models"] if m["model"] == name)["throughput"]["slowdown"] for doc, _ in runs]
        diff = (sds[1]["median"] / sds[0]["median"] - 1) * 100
        worst = max(worst, abs(diff))
        iv = [f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]" + ("*" if s["noisy"] else " ") for s in sds]
        print(f"{name:12} {sds[0]['median']:9.4f} {sds[1]['median']:9.4f} {diff:+7.2f}   {iv[0]:>16} {iv[1]:>16}")
    print(f"wall time per invocation: {runs[0][1]:.1f} s, {runs[1][1]:.1f} s "
          f"({len(args.models)} models, {args.repetitions} repetitions)")
    print(f"largest difference {worst:.2f} % (target <= {TARGET_PCT:g} %; * = interval flagged noisy)")


if __name__ == "__main__":
    main()
