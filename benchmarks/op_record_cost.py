"""What naming the first differing op costs, measured in one run.

1. In-process, per model: one training step recorded op by op (``OpRecorder``: anomaly
   mode, a Python stack and a digest per op) over a plain step: the slowdown of the one
   step a probe replay records.
2. End to end: a probe replay of a 300-step run to its last step with the ops of that step
   recorded, against the same replay without recording (the cost the determinism stage
   adds to a NONDETERMINISTIC or RESUME_BROKEN verdict).

    python benchmarks/op_record_cost.py [--models conv transformer embedding] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reproci.backends.local import LocalBackend  # noqa: E402
from reproci.settings.options import build  # noqa: E402
from reproci.worker.audit.oprecord import OpRecorder  # noqa: E402
from reproci.worker.contract import ModelContext, load_factory, validate  # noqa: E402
from reproci.worker.determinism import deterministic_mode  # noqa: E402
from reproci.worker.process.spec import WorkerSpec  # noqa: E402
from reproci.worker.train import train_step  # noqa: E402


def step_cost(model: str, repeats: int = 5) -> tuple[float, float, int]:
    """(plain step s, recorded step s, ops per step), medians over ``repeats``."""
    with deterministic_mode(seed=0, threads=1):
        setup = validate(load_factory(model)(ModelContext(profile="quick", device=torch.device("cpu"), seed=0)), model)
        batch = next(iter(setup.loader))
        train_step(setup, setup.model, batch)
        plain, recorded, ops = [], [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            train_step(setup, setup.model, batch)
            t1 = time.perf_counter()
            with OpRecorder(setup.model, setup.optimizer) as rec:
                train_step(setup, setup.model, batch)
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            recorded.append(t2 - t1)
            ops = len(rec.rows)
    return statistics.median(plain), statistics.median(recorded), ops


def replay_cost(model: str, steps: int) -> tuple[float, float]:
    """Wall seconds of a probe replay to the last step, without and with op recording."""
    backend = LocalBackend(build({}, env={}))
    out = []
    with tempfile.TemporaryDirectory() as d:
        for ops in (None, "ops.pt"):
            spec = WorkerSpec(model_ref=model, model_name=model, role="probe", steps=steps, dump_at=steps,
                              dump_path="dump.pt", ops_path=ops, output=f"record-{bool(ops)}.json")
            path = Path(d) / f"spec-{bool(ops)}.json"
            spec.write(path)
            t0 = time.monotonic()
            result = backend.launch(spec, path, timeout=1800)
            assert result.returncode == 0, result.log_tail
            out.append(time.monotonic() - t0)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    print(f"{'model':12} {'ops/step':>8} {'step ms':>9} {'recorded ms':>12} {'ratio':>7} "
          f"{'replay s':>9} {'+record s':>10} {'ratio':>7}")
    for m in args.models:
        plain, recorded, ops = step_cost(m)
        without, with_ops = replay_cost(m, args.steps)
        print(f"{m:12} {ops:8d} {plain * 1e3:9.2f} {recorded * 1e3:12.1f} {recorded / plain:6.1f}× "
              f"{without:9.1f} {with_ops:10.1f} {with_ops / without:6.2f}×")


if __name__ == "__main__":
    main()
