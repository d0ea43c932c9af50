"""What recording a script model's steps costs, beside what recording a factory model's costs.

For each reference model, one plain training loop written as a script (the model, loader, loss and
optimizer of its factory, stepped by hand, each iteration timed by the script itself), run as
fresh processes in four ways, interleaved over ``--rounds``:

- script, bare: the loop alone under strict determinism, nothing recorded;
- script, recorded: the same command as a script model's run A (``reproci.worker.script``: the
  sitecustomize, strict determinism, the global module and optimizer hooks, the fingerprints);
- factory, recorded: the harness's run of the model with its per-step fingerprints;
- factory, unrecorded: the same run with fingerprints off.

Whole steps, recorded over bare, are what a user pays, but on a shared 2-core machine their
ratios move by a few per cent from run to run. The target is therefore judged in one process, where
the noise is small: the record's own time a step (the factory's ``record.Trace``: the batch's
checksums and the state's fingerprints; the script's hooks: the same, with finding the batch and the
loss), the median over the steps, with the state found once before the first step left out. Target:
the script's at most 1.25x the factory's, per model.

    python benchmarks/script_record_cost.py [--models conv transformer embedding] [--steps 30] [--rounds 5]
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
RATIO = 1.25  # the script's record against the factory's, in one process: "within", with room for its hooks' calls

LOOP = '''"""A plain loop over a reference model's factory parts: MODEL STEPS OUT; its step times in OUT/times.json."""
import json, os, sys, time
import torch
from reproci.worker.contract import ModelContext, load_factory, validate

model_name, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if os.environ.get("BENCH_STRICT"):  # the bare run: strict determinism as a recorded run has it, no record
    from reproci.worker.determinism import make_deterministic
    make_deterministic(seed=0, threads=1, strict=True)
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


IN_PROCESS = '''"""One process, one model: the factory's per-step record (record.Trace) timed step by step, then
the script's (the hooks of worker.script, installed now) on the same training. MODEL STEPS SPEC"""
import json, statistics, sys, time
import torch
from reproci.worker.contract import ModelContext, load_factory, validate
from reproci.worker.determinism import make_deterministic
from reproci.worker.record import Trace
from reproci.worker.script import hooks

model_name, steps, spec_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
make_deterministic(seed=0, threads=1, strict=True)
setup = validate(load_factory(model_name)(ModelContext(profile="quick", device=torch.device("cpu"), seed=0,
                                                         steps=steps)), model_name)
model, optimizer = setup.model, setup.optimizer
model.train()


def batches():
    while True:
        yield from setup.loader


def step(batch):
    optimizer.zero_grad(set_to_none=True)
    out = setup.loss_fn(model, batch)
    loss = out.loss if hasattr(out, "loss") else out["loss"] if isinstance(out, dict) else out
    loss.backward()
    optimizer.step()
    return loss.detach()


factory, source = [], batches()
trace = Trace(setup, fingerprints=True, start_step=0)
for _ in range(steps):
    batch = next(source)
    t0 = time.perf_counter()
    trace.batch(batch, 0)
    t1 = time.perf_counter()
    loss = step(batch)
    t2 = time.perf_counter()
    trace.step(loss)
    factory.append((t1 - t0) + (time.perf_counter() - t2))
spent = [0.0]
for name in ("_forward_pre", "_module_pre", "_forward", "_before_step", "_after_step"):
    def timed(f):
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return g
    setattr(hooks.ScriptTrace, name, timed(getattr(hooks.ScriptTrace, name)))
hooks.install(spec_path)
script = []
for i in range(steps + 1):  # the first: the state found (once a run), not a step's cost
    spent[0] = 0.0
    step(next(source))
    if i:
        script.append(spent[0])
json.dump({"factory": statistics.median(factory), "script": statistics.median(script)}, sys.stdout)
'''


def in_process(work: Path, model: str, steps: int) -> dict[str, float]:
    """The per-step record's own time, median over the steps: the factory's Trace, the script's hooks."""
    program = work / "in_process.py"
    program.write_text(IN_PROCESS)
    folder = work / f"in-process-{model}"
    folder.mkdir()
    spec = WorkerSpec(model_ref="in-process", model_name=model, role="B", steps=10 * steps, output="record.json",
                      script=ScriptCommand(command="in-process {out}", cwd=str(work), resume_at=steps))
    spec.write(folder / "spec.json")
    out = subprocess.run([sys.executable, str(program), model, str(steps), str(folder / "spec.json")], check=True,
                         env=_env(), cwd=folder, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    subprocess.run([sys.executable, str(loop), model, str(steps), str(out)], check=True,
                   env={**_env(), "BENCH_STRICT": "1"}, cwd=work, capture_output=True)
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
    ap.add_argument("--rounds", type=int, default=5)
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
            own = in_process(work, model, a.steps)
            # each way against its pair of the same round, then the median over the rounds
            script_cost = statistics.median(s / b for s, b in zip(runs["script"], runs["bare"])) - 1
            factory_cost = statistics.median(f / u for f, u in zip(runs["factory"], runs["unrecorded"])) - 1
            ratio = own["script"] / own["factory"]
            within = ratio <= RATIO
            ok &= within
            print(f"{model:<12} step {m['bare'] * 1e3:.2f} ms; the record's own time a step: script "
                  f"{own['script'] * 1e6:.0f} us, factory {own['factory'] * 1e6:.0f} us, ratio {ratio:.2f} "
                  f"({'within' if within else 'NOT within'} {RATIO}); whole steps, recorded over bare: script "
                  f"{script_cost:+.1%}, factory {factory_cost:+.1%} (noise here: a few per cent)")
    print(f"target: a script model's per-step record within the factory model's (its own time a step, in one "
          f"process, at most {RATIO}x): {'met' if ok else 'missed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
