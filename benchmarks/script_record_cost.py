"""What recording a script model's steps costs, beside what recording a factory model's costs.

For each reference model, one plain training loop written as a script (the model, loader, loss and
optimizer of its factory, stepped by hand, each iteration timed by the script itself), run as
fresh processes in four ways, interleaved over ``--rounds``:

- script, bare: the loop alone, no reproci;
- script, recorded: the same command as a script model's run A (``reproci.worker.script``: the
  sitecustomize, strict determinism, the global module and optimizer hooks, the fingerprints);
- factory, recorded: the harness's run of the model with its per-step fingerprints;
- factory, unrecorded: the same run with fingerprints off.

The script's record cost is recorded/bare - 1 of its median step; the factory's is recorded/
unrecorded - 1 of its. Target: the script's is within the factory's (at most the factory's plus
3 percentage points of noise: this machine is shared), per model.

    python benchmarks/script_record_cost.py [--models conv transformer embedding] [--steps 30] [--rounds 3]
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
sys.path.insert(0, str(ROOT))

from reproci.worker.process.launch import launch_environment  # noqa: E402
from reproci.worker.process.spec import ScriptCommand, WorkerSpec  # noqa: E402

WARMUP = 5  # steps left out of each median: allocator and first-call costs
MARGIN = 0.03  # the noise a shared 2-core machine gives a ratio of medians

LOOP = '''"""A plain loop over a reference model's factory parts: MODEL STEPS OUT; its step times in OUT/times.json."""
import json, os, sys, time
import torch
from reproci.worker.contract import ModelContext, load_factory, validate

model_name, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
setup = validate(load_factory(model_name)(ModelContext(profile="quick", device=torch.device("cpu"), seed=0,
                                                         steps=steps)), model_name)
model, optimizer = setup.model, setup.optimizer
model.train()
times, taken = [], 0
while taken < steps:
    for batch in setup.loader:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out_ = setup.loss_fn(model, batch)
        loss = out_.loss if hasattr(out_, "loss") else out_["loss"] if isinstance(out_, dict) else out_
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
        taken += 1
        if taken >= steps:
            break
json.dump(times, open(os.path.join(out, "times.json"), "w"))
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPROCI_")}
    env.update(launch_environment(seed=0, threads=1, strict=True))
    env["PYTHONPATH"] = str(ROOT)
    return env


def _median(times: list[float]) -> float:
    return statistics.median(times[WARMUP:] or times)


def script_bare(work: Path, loop: Path, model: str, steps: int, i: int) -> float:
    out = work / f"bare-{model}-{i}"
    out.mkdir()
    subprocess.run([sys.executable, str(loop), model, str(steps), str(out)], check=True, env=_env(), cwd=work,
                   capture_output=True)
    return _median(json.loads((out / "times.json").read_text()))


def script_recorded(work: Path, loop: Path, model: str, steps: int, i: int) -> float:
    folder = work / f"script-{model}-{i}"
    folder.mkdir()
    command = f"python {loop} {model} {{steps}} {{out}}"
    spec = WorkerSpec(model_ref=command, model_name=model, role="A", steps=steps, output="record-A.json",
                      script=ScriptCommand(command=command, cwd=str(work), resume_at=steps // 2))
    spec.write(folder / "spec.json")
    subprocess.run([sys.executable, "-m", "reproci.worker.script", str(folder / "spec.json")], check=True,
                   env=_env(), cwd=folder, capture_output=True)
    record = json.loads((folder / "record-A.json").read_text())
    assert record["status"] == "ok" and len(record["fingerprints"]) == steps, record.get("message")
    return _median(json.loads((folder / "out-A" / "times.json").read_text()))


def factory(work: Path, model: str, steps: int, i: int, fingerprints: bool) -> float:
    folder = work / f"factory-{model}-{i}-{fingerprints}"
    folder.mkdir()
    spec = WorkerSpec(model_ref=model, model_name=model, role="A", steps=steps, output="record.json",
                      fingerprints=fingerprints, warmup_steps=WARMUP)  # the clock times the steps past it
    spec.write(folder / "spec.json")
    subprocess.run([sys.executable, "-m", "reproci.worker", str(folder / "spec.json")], check=True, env=_env(),
                   cwd=folder, capture_output=True)
    return statistics.median(json.loads((folder / "record.json").read_text())["step_times_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="reproci-script-cost-") as tmp:
        work = Path(tmp)
        loop = work / "loop.py"
        loop.write_text(LOOP)
        for model in a.models:
            runs: dict[str, list[float]] = {"bare": [], "script": [], "factory": [], "unrecorded": []}
            for i in range(a.rounds):  # interleaved: a drift in the machine's load touches every way alike
                runs["bare"].append(script_bare(work, loop, model, a.steps, i))
                runs["script"].append(script_recorded(work, loop, model, a.steps, i))
                runs["factory"].append(factory(work, model, a.steps, i, True))
                runs["unrecorded"].append(factory(work, model, a.steps, i, False))
            m = {k: statistics.median(v) for k, v in runs.items()}
            script_cost = m["script"] / m["bare"] - 1
            factory_cost = m["factory"] / m["unrecorded"] - 1
            within = script_cost <= factory_cost + MARGIN
            ok &= within
            print(f"{model:<12} step {m['bare'] * 1e3:.2f} ms; record cost: script {script_cost:+.1%}, factory "
                  f"{factory_cost:+.1%}; {'within' if within else 'NOT within'} the factory's (+{MARGIN:.0%} noise)")
    print(f"target: a script model's per-step record cost within the factory model's (+{MARGIN:.0%}): "
          f"{'met' if ok else 'missed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
