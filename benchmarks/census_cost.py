"""What the state census costs, measured in one run.

Per model, in-process: one census (``reproci.worker.state.census.take``) against one training step
of the same set-up; a run that takes part in the resume check (A and C) takes two censuses,
so the cost per run is two censuses over the run's N steps.

    python benchmarks/census_cost.py [--models conv transformer embedding FILE.py:FACTORY ...] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reproci.worker.contract import ModelContext, load_factory, validate  # noqa: E402
from reproci.worker.determinism import deterministic_mode  # noqa: E402
from reproci.worker.state import census  # noqa: E402
from reproci.worker.train import train_step  # noqa: E402


def _ref(name: str) -> tuple[str, list[str]]:
    if ":" in name and name.split(":")[0].endswith(".py"):
        path = Path(name.split(":")[0]).resolve()
        return f"{path.stem}:{name.split(':')[1]}", [str(path.parent)]
    return (name if ":" in name else f"reproci.reference_models.{name}:build"), []


def measure(name: str, repeats: int = 7) -> dict[str, float]:
    ref, paths = _ref(name)
    with deterministic_mode(seed=0, threads=1):
        sys.path[:0] = paths
        setup = validate(load_factory(ref, paths)(ModelContext(profile="quick", device=torch.device("cpu"), seed=0)), ref)
        batch = next(iter(setup.loader))
        train_step(setup, setup.model, batch, 1)
        steps, takes = [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            train_step(setup, setup.model, batch, i + 2)
            steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            items = census.take(setup)
            takes.append(time.perf_counter() - t0)
    return {"step_ms": statistics.median(steps) * 1e3, "census_ms": statistics.median(takes) * 1e3,
            "items": float(len(items))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    parser.add_argument("--steps", type=int, default=30, help="steps per run (the quick profile's N)")
    args = parser.parse_args()
    print(f"{'model':<28} {'items':>5} {'census ms':>10} {'step ms':>8} {'census/step':>11} {'per run (2 / N steps)':>22}")
    for name in args.models:
        m = measure(name)
        ratio = m["census_ms"] / m["step_ms"]
        print(f"{name:<28} {int(m['items']):>5} {m['census_ms']:>10.2f} {m['step_ms']:>8.2f} {ratio:>11.2f} "
              f"{2 * m['census_ms'] / (args.steps * m['step_ms']):>21.2%}")


if __name__ == "__main__":
    main()
