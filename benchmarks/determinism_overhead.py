"""Fingerprint overhead and stage wall time, measured in one run.

1. Per-step fingerprint overhead, in-process: the median time of what a run records each
   step (the batch's order-sensitive and order-free checksums, the state's fingerprints)
   over the median training-step time (target <= 3 %); beside it, the median step time
   with them over without, in alternating blocks; and, on the CPU, its floor: the same
   values' bare reductions alone (each state tensor and gradient summed by one numpy call
   on arrays made ready, the batch's two products per tensor), with no bookkeeping; and the
   kernels the same record launches per step on a GPU, counted on the CPU.

2. What a user compares: a real ``reproci run -m MODEL`` (the determinism stage: A with a
   checkpoint at k, B, C resumed from A, as the CLI runs them) against the seed-style check
   a user writes, four fresh ``python`` processes of plain training on the same model and
   steps (full, full, stop-at-k, resume) (target ratio <= 0.9); and run A's fixed cost, its
   wall time outside its training steps over its training time (target <= 10 %).

    python benchmarks/determinism_overhead.py [--models conv transformer embedding] [--steps 30]
                                              [--device cpu|cuda] [--profile quick|full]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from reproci.backends.local import LocalBackend  # noqa: E402
from reproci.settings.options import build  # noqa: E402
from reproci.worker.contract import ModelContext, load_factory, validate  # noqa: E402
from reproci.worker.data.batchsum import device_sums, np_weights, np_words, tensors_of  # noqa: E402
from reproci.worker.data.batchtree import to_device  # noqa: E402
from reproci.worker.determinism import deterministic_mode  # noqa: E402
from reproci.worker.process.spec import WorkerSpec  # noqa: E402
from reproci.worker.record import Trace  # noqa: E402
from reproci.worker.state.state import state_tensors  # noqa: E402
from reproci.worker.state.tensor_bits import flat_int, np_bits  # noqa: E402
from reproci.worker.state.wrapping_sums import segment_sums  # noqa: E402
from reproci.worker.train import train_step  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clone(batch: object) -> object:
    """A copy of a batch's tensors, in the batch's structure."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return type(batch)({k: clone(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(clone(v) for v in batch)
    return batch


class Overhead(NamedTuple):
    """What ``fingerprint_overhead`` measured."""
    direct: float  # the median per-step recording time over the median step time
    difference: float  # the median step time with recording over without, minus 1
    batch_us: float  # the median time of the batch's checksums, before a step
    state_us: float  # the median time of the state's fingerprints, after a step
    step_ms: float  # the median training step
    floor: float  # the bare reductions of the same values over the median step time (NaN off the CPU)


def fingerprint_overhead(model: str, steps: int = 90, device: str = "cpu", profile: str = "quick") -> Overhead:
    """The median time of what a run records each step (the batch's two checksums before the
    step, the state's fingerprints after it: ``record.Trace``, as the worker calls it) over
    the median step time, and its two parts; and the median step time with them over
    without, in alternating blocks (noisier on a shared machine: a difference of two noisy
    times)."""
    dev = torch.device(device)
    with deterministic_mode(seed=0, threads=1):
        setup = validate(load_factory(model)(ModelContext(profile=profile, device=dev, seed=0)), model)
        trace = Trace(setup, fingerprints=True, start_step=0)
        batches = []
        for b in setup.loader:
            batches.append(b)
            if len(batches) >= 4:
                break
        batches = [to_device(b, dev) for b in batches]
        for b in batches[:2]:  # warm-up, and bind the tensor list
            trace.batch(b, 0)
            trace.step(train_step(setup, setup.model, b))
        floor = Floor(setup) if dev.type == "cpu" else None
        step_times: list[float] = []
        fp_times: list[float] = []
        floor_times: list[float] = []
        parts: list[tuple[float, float]] = []
        block: dict[str, list[float]] = {"on": [], "off": [], "floor": []}
        for i in range(steps):
            batch = clone(batches[i % len(batches)])  # as a loader hands a batch over: just written
            mode = ("on", "off", "floor" if floor is not None else "off")[(i // 5) % 3]
            _sync(dev)
            t0 = time.perf_counter()
            if mode == "on":
                trace.batch(batch, 0)
            elif mode == "floor":
                floor.batch(batch)  # type: ignore[union-attr]
            _sync(dev)
            t1 = time.perf_counter()
            loss = train_step(setup, setup.model, batch)
            _sync(dev)
            t2 = time.perf_counter()
            if mode == "on":
                trace.step(loss)
            elif mode == "floor":
                floor.state()  # type: ignore[union-attr]
            _sync(dev)
            t3 = time.perf_counter()
            step_times.append(t2 - t1)
            if mode == "on":
                fp_times.append((t1 - t0) + (t3 - t2))
                parts.append((t1 - t0, t3 - t2))
            elif mode == "floor":
                floor_times.append((t1 - t0) + (t3 - t2))
            block[mode].append(t3 - t0)
    step = statistics.median(step_times)
    return Overhead(direct=statistics.median(fp_times) / step,
                    difference=statistics.median(block["on"]) / statistics.median(block["off"]) - 1,
                    batch_us=statistics.median(p[0] for p in parts) * 1e6,
                    state_us=statistics.median(p[1] for p in parts) * 1e6, step_ms=step * 1e3,
                    floor=statistics.median(floor_times) / step if floor_times else math.nan)


class Floor:
    """The least a step's record can cost on the CPU with these values: each value's bare
    reduction and nothing else. The state: one ``np.add.reduce`` per tensor, on integer views
    of the parameters, buffers and optimizer state made once (as a run binds them) and of each
    step's gradients; no check that the state still lives in those tensors, no layout, no
    row. The batch: each tensor's integer words, its position-weighted sum and its rows'
    weighted sums (the two ``einsum`` calls the checksums are made of); no mixing."""

    def __init__(self, setup) -> None:
        self.arrays = [np_bits(t) for t in state_tensors(setup.model, setup.optimizer, with_grads=False,
                                                          modules=setup.state_modules).values()]
        self.params = list(setup.model.parameters())

    def batch(self, batch: object) -> None:
        for t in tensors_of(batch):
            w = np_words(t)
            np.einsum("i,i->", w, np_weights(w.size))
            rows = w.reshape(t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 1, -1)
            np.einsum("ij,j->i", rows, np_weights(rows.shape[1]))

    def state(self) -> None:
        for a in self.arrays:
            np.add.reduce(a, dtype=np.int64 if a.itemsize == 8 else np.int32)
        for p in self.params:
            if p.grad is not None:
                g = np_bits(p.grad)
                np.add.reduce(g, dtype=np.int64 if g.itemsize == 8 else np.int32)


def stage_vs_seed_style(model: str, steps: int, device: str = "cpu", profile: str = "quick") -> dict[str, float]:
    """What a user compares: the wall time of a real ``reproci run -m MODEL`` (the
    determinism stage as the CLI runs it: fork servers started, A, B and C, records,
    verdict) against the seed-style check a user writes, four fresh ``python`` processes
    of plain training (full, full, stop at k, resume). Beside it, the fixed cost of reproci's
    run A outside its training steps (set-up, environment fingerprint, package list,
    checkpoint, hashes, held-out evaluation, record), from the record of its own process:
    a fork server's start is the invocation's, paid once however many runs it forks."""
    import json
    import subprocess

    k = steps // 2
    backend = LocalBackend(build({"fork_server": False}, env={}))
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "reproci.cli", "run", "-m", model, "--steps", str(steps),
                            "--resume-at", str(k), "--device", device, "--profile", profile,
                            "--stage", "determinism", "--results-dir", str(work / "results")],
                           cwd=work, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        ours = time.perf_counter() - t0
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        results = next((work / "results").glob("*/results.json"))
        entry = next(m for m in json.loads(results.read_text())["models"] if m["model"] == model)
        run_a = json.loads((results.parent / model / "record-A.json").read_text())
        run_a["timings"]["wall_s"] = entry["runs"]["A"]["wall_s"]  # its process, start to end

        def launch(spec: WorkerSpec) -> float:
            f = work / f"spec-{spec.role}.json"
            spec.write(f)
            res = backend.launch(spec, f, timeout=600)
            assert res.returncode == 0, res.log_tail
            return res.seconds

        plain = WorkerSpec(model_ref=model, model_name=model, role="P1", steps=steps, device=device, profile=profile,
                           fingerprints=False, output="P1.json")
        seed_style = (launch(plain) + launch(dataclasses.replace(plain, role="P2", output="P2.json"))
                      + launch(dataclasses.replace(plain, role="P3", steps=k, checkpoint_at=k,
                                                   checkpoint_path="p.pt", output="P3.json"))
                      + launch(dataclasses.replace(plain, role="P4", resume_from="p.pt", output="P4.json")))
        backend.__exit__(None, None, None)
    return {"ours": ours, "seed": seed_style, **run_a["timings"]}


def fixed_cost(t: dict[str, float]) -> dict[str, float]:
    """Run A's cost outside its training steps, as parts of its training time (the steps
    alone: the checkpoint written at k is a fixed cost). ``total`` counts everything;
    ``reproci``, what reproci adds, leaves out the plugin's own code (its factory's model,
    data and optimizer; its held-out eval_fn), which the seed-style check runs too.
    ``process``: the process's start and end (spec, import of the model's module, record
    written, exit) and what no other part names."""
    steps_s = t["train_s"] - t["checkpoint_s"]
    parts = {"build": t["build_s"], "eval": t["eval_s"], "setup": t["setup_s"] - t["build_s"],
             "checkpoint": t["checkpoint_s"], "finish": t["finish_s"]}
    parts["process"] = t["wall_s"] - steps_s - sum(parts.values())
    outside = t["wall_s"] - steps_s
    return {"total": outside / steps_s, "reproci": (outside - parts["build"] - parts["eval"]) / steps_s,
            **{k: v / steps_s for k, v in parts.items()}}


class _Kernels(TorchDispatchMode):
    """Counts the torch ops that run a kernel on a device (views and detaches do not), the bytes
    their tensors hold (read and written), and those that make the host wait for the device."""

    VIEWS = {"detach", "view", "slice", "split", "split_with_sizes", "alias", "_reshape_alias", "reshape", "select",
             "t", "transpose", "expand", "as_strided", "unbind", "lift_fresh"}
    # ops whose result the host reads, or whose output size depends on the data: each waits for the device
    SYNCS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "equal", "is_nonzero", "unique",
             "_unique2", "unique_consecutive", "tolist"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.bytes = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from reproci.worker import kernels

        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if kernels.in_launch:  # Triton's interpreter copying a kernel's arguments: counted as the launch
            return out
        if name not in self.VIEWS:
            self.count += 1
            flat = [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else [out])]
            self.bytes += sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
        self.syncs += name in self.SYNCS
        return out


class Proxies(NamedTuple):
    """What a step's record issues on a GPU, counted on the CPU (``device_record``)."""
    path: str  # "triton" (reproci.worker.kernels) or "torch" (the reference arithmetic: Triton absent)
    launches: float  # kernel launches and host-to-device copies per step
    bytes_ratio: float  # bytes its launches read and write over the bytes of the state and batch it covers
    syncs: float  # host synchronisations per step
    host_us: float  # the record's host time per step, without the time its kernels take to run here


def device_record(model: str, steps: int = 3) -> Proxies:
    """``count_device_record`` in a fresh process: Triton's interpreter is chosen by
    ``TRITON_INTERPRET=1`` when triton is imported, and this process may run kernels on a GPU."""
    import json
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, __file__, "--count-record", model, str(steps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return Proxies(**json.loads(out.splitlines()[-1]))


def count_device_record(model: str, steps: int = 3, profile: str = "quick") -> Proxies:
    """The per-step record (the batch's checksums, the state's fingerprints) on the code path a
    GPU takes, run here on CPU tensors: ``record.Trace`` with Triton's kernels under its
    interpreter (``TRITON_INTERPRET=1``) where Triton is installed; else the reference torch
    arithmetic a GPU without Triton runs (``device_sums``, ``segment_sums``). Counted over
    ``steps`` steps after a first (which makes the tables once); the training steps are not counted."""
    from reproci.worker import kernels
    kernels.interpret_on_cpu = True
    path = "triton" if kernels.usable(torch.device("cpu")) else "torch"
    try:
        with deterministic_mode(seed=0, threads=1):
            setup = validate(load_factory(model)(ModelContext(profile=profile, device=torch.device("cpu"), seed=0)),
                             model)
            trace = Trace(setup, fingerprints=True, start_step=0)
            workspace: dict = {}
            batches = iter(setup.loader)
            counted = _Kernels()
            covered, host = 0, 0.0
            base = dict(kernels.COUNTS)
            for i in range(2 * steps + 1):  # a first step; steps counted; steps timed (the counting costs time)
                batch = next(batches)
                if i == 1:
                    base = dict(kernels.COUNTS)
                if i == steps + 1:
                    counted_launches, moved = kernels.COUNTS["launches"] - base["launches"], kernels.COUNTS["bytes"] - base["bytes"]
                counting = counted if 0 < i <= steps else contextlib.nullcontext()
                ran = kernels.COUNTS["launch_s"]
                t0 = time.perf_counter()
                with counting:
                    if path == "triton":
                        trace.batch(batch, 0)
                    else:
                        device_sums(tensors_of(batch))
                t1 = time.perf_counter()
                loss = train_step(setup, setup.model, batch)
                state = state_tensors(setup.model, setup.optimizer, with_grads=True, modules=setup.state_modules)
                t3 = time.perf_counter()
                with counting:
                    if path == "triton":
                        trace.step(loss)
                    else:
                        segment_sums([flat_int(t) for t in state.values()], workspace)
                t4 = time.perf_counter()
                if 0 < i <= steps:
                    covered += sum(t.numel() * t.element_size() for t in [*tensors_of(batch), *state.values()])
                elif i > steps:  # the host's part: without the kernels' run time here (the interpreter's)
                    host += (t1 - t0) + (t4 - t3) - (kernels.COUNTS["launch_s"] - ran)
    finally:
        kernels.interpret_on_cpu = False
    return Proxies(path, (counted.count + counted_launches) / steps, (counted.bytes + moved) / covered,
                   counted.syncs / steps, host / steps * 1e6)


# Device benchmark models, by name: on a CPU their proxies only (one step)
DEVICE_MODELS = {"gpt2_small": f"{ROOT / 'benchmarks' / 'device_models' / 'gpt2_small.py'}:build"}


def _ref(model: str) -> str:
    return DEVICE_MODELS.get(model, model)


FIXED_PARTS = ("setup", "checkpoint", "finish", "process", "build", "eval")


def main() -> None:
    if sys.argv[1:2] == ["--count-record"]:  # device_record's process
        import json
        print(json.dumps(count_device_record(sys.argv[2], int(sys.argv[3]))._asdict()))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["conv", "transformer", "embedding"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--stage-models", nargs="*", default=None,
                    help="models whose stage wall time is measured (default: every --models)")
    ap.add_argument("--profile", default="quick", choices=["quick", "full"])
    args = ap.parse_args()
    models = []
    for m in args.models:
        if m in DEVICE_MODELS and importlib.util.find_spec("transformers") is None:
            print(f"{m}: skipped: transformers is not installed (pip install 'reproci[hf]')")
        else:
            models.append(m)
    proxies = {m: device_record(_ref(m), steps=1 if m in DEVICE_MODELS else 3) for m in models}
    path = next(iter(proxies.values())).path if proxies else "triton"
    print("what a step's record issues on a GPU, counted here on the CPU on the "
          + ("Triton path (reproci.worker.kernels, under TRITON_INTERPRET=1):" if path == "triton" else
             "reference torch path (Triton is not installed here):"))
    for m, p in proxies.items():
        print(f"{m} device record: {p.launches:.0f} launches, {p.bytes_ratio:.2f}× bytes, {p.syncs:.0f} syncs, "
              f"{p.host_us:.0f} µs host per step", flush=True)
    print("targets: at most 8 launches per step whatever the tensor count, at most 1.5× the bytes covered, 0 syncs")
    parts: list[str] = []
    recorded: list[str] = []
    print(f"{'model':12} {'fingerprint cost':>17} {'with/without':>13} {'reproci run s':>14} {'seed-style s':>13} "
          f"{'ratio':>6} {'run A fixed cost':>17} {'+ plugin':>10}")
    for m in models:
        if m in DEVICE_MODELS and args.device == "cpu":
            continue  # on a CPU its proxies only: a step takes seconds here
        # a device model at its own size on a GPU (its quick profile is for the counts a CPU makes)
        fp = fingerprint_overhead(_ref(m), device=args.device, profile="full" if m in DEVICE_MODELS else args.profile)
        direct, difference = fp.direct, fp.difference
        recorded.append(f"{m:12} batch checksums {fp.batch_us:.0f} us, state fingerprints {fp.state_us:.0f} us, "
                        f"step {fp.step_ms:.2f} ms; floor (the bare reductions) {fp.floor * 100:.2f}%")
        if (args.stage_models is None and m not in DEVICE_MODELS) or m in (args.stage_models or ()):
            st = stage_vs_seed_style(m, args.steps, device=args.device, profile=args.profile)
            fixed = fixed_cost(st)
            stage = (f"{st['ours']:14.2f} {st['seed']:13.2f} {st['ours'] / st['seed']:6.2f} "
                     f"{fixed['reproci'] * 100:16.1f}% {fixed['total'] * 100:9.1f}%")
            parts.append(f"{m:12} " + "  ".join(f"{k} {fixed[k] * 100:.1f}%" for k in FIXED_PARTS))
        else:
            stage = f"{'-':>14} {'-':>13} {'-':>6} {'-':>17} {'-':>10}"
        print(f"{m:12} {direct * 100:16.2f}% {difference * 100:12.2f}% {stage}", flush=True)
    print("what a step records, by part (medians):")
    print("\n".join(recorded))
    if parts:
        print("run A's fixed cost, by part (of its training steps' time; build and eval are the plugin's own code):")
        print("\n".join(parts))
    print("targets: fingerprint cost <= 3 % (GPT-2 small: <= 2 %), ratio <= 0.9, run A's fixed cost (its process's "
          "wall time outside its training steps and the plugin's own build and eval_fn, over the steps' time) <= 10 %")


if __name__ == "__main__":
    main()
