"""False alarms of the strict-determinism stage: every model that is reproducible must come
out reproducible, at every resume point, every time.

Runs `reproci run` REPEATS times over the reference models and the example plugin, each
time with another resume point k (cycling through the first epoch, the epoch boundaries of
every model, later epochs and the last step), and counts verdicts other than PASS/NEW.

    python benchmarks/false_alarms.py [--repeats 20] [--steps 20] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["conv", "transformer", "embedding", str(ROOT / "examples" / "mlp_plugin.py") + ":build"]
# Batches per epoch on the quick profile: conv 8, mlp_plugin 16, transformer and embedding more;
# these points put k in the first epoch, on and beside the boundaries at 8 and 16, and at N-1.
RESUME_POINTS = [1, 8, 9, 16, 17, 19, 2, 7, 15, 4, 12, 18, 3, 10, 5, 14, 6, 11, 13, 16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    alarms: list[str] = []
    checks = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):
            k = RESUME_POINTS[i % len(RESUME_POINTS)] % args.steps or 1
            cmd = [sys.executable, "-m", "reproci.cli", "run", "--steps", str(args.steps), "--resume-at", str(k),
                   "--jobs", str(args.jobs), "--results-dir", d]
            for m in MODELS:
                cmd += ["-m", m]
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            doc = json.loads((Path(d) / "latest.json").read_text())
            line = []
            for m in doc["models"]:
                checks += 1
                ok = m["verdict"] in ("PASS", "NEW")
                line.append(f"{m['model']}={m['verdict']}")
                if not ok:
                    alarms.append(f"repeat {i + 1}, k={k}: {m['model']}: {m['verdict']}: {m['message']}")
            print(f"repeat {i + 1:2} k={k:2} exit {p.returncode}: {' '.join(line)}", flush=True)
    print(f"{checks} model checks ({args.repeats} repeats x {len(MODELS)} models, N={args.steps}), "
          f"{len(alarms)} false alarms, {time.monotonic() - t0:.0f} s")
    for a in alarms:
        print("  " + a)
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main())
