"""What a script model's run records, from inside the team's own unchanged script.

``install`` runs from the ``sitecustomize`` before the script's first line: it seeds every RNG
and switches strict determinism on (as a factory model's run does), watches the determinism
controls (a script that switches one off is named at file:line), and registers torch's global
hooks. ``ScriptTrace`` then follows the training as it happens:

- a step is an optimizer step (``register_optimizer_step_pre_hook``/``post_hook``), of every
  optimizer the script makes;
- the training state is found once, before the first training forward (or the first step):
  every ``torch.optim.Optimizer`` alive, and the smallest module tree that holds all their
  parameters, whose names name the tensors (``grad:NAME``, ``optim:NAME.exp_avg``);
- the batch of a step is what the outermost module was called with in training mode since the
  last step (``register_module_forward_pre_hook``/``forward_hook`` until the first such call, then
  that module's own hooks; several calls under gradient accumulation); its loss, the scalars
  ``backward`` was called on;
- after each step, the fingerprints of every parameter, gradient, buffer and optimizer-state
  tensor; after step N, the final hash; where a probe asks, a dump of the state at its step.

Run A copies its ``{out}`` as its step k + 1 begins: whatever checkpoint the script wrote after k
steps, whatever its name or format, is what run C resumes from. Only rank 0 records (``RANK``);
the record is written as the process ends (``atexit``), or at a probe's step.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import determinism
from ..__main__ import _write
from ..controls import ControlWatch
from ..data import batchtree
from ..data.batches import Accumulated
from ..data.batchlog import BatchLog
from ..process.spec import WorkerSpec, resolve
from ..run_record import FailedRun
from ..state.fingerprint import StepFingerprints, initial_row
from ..state.state import dump_state, final_hash, transient_buffers
from ..steppers import Optimizers
from . import TOP_PID_VARIABLE, record
from .discovery import find_model, find_optimizers

if TYPE_CHECKING:
    from ..sections import InitialFingerprint

_TRACE: ScriptTrace | None = None


def install(spec_path: str) -> None:
    """Strict determinism and the hooks, in this process, before the script's first line."""
    global _TRACE
    if _TRACE is not None:
        return
    spec_file = Path(spec_path)
    spec = WorkerSpec.from_json(spec_file.read_text())
    strict = spec.mode == "strict"
    determinism.make_deterministic(seed=spec.seed, threads=spec.threads, strict=strict)
    attestation = determinism.attest(seed=spec.seed, threads=spec.threads, strict=strict, hash_seed=spec.hash_seed,
                                     cpu_isa=spec.cpu_isa)
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return  # another rank: the same controls, no record
    _TRACE = ScriptTrace(spec, spec_file, attestation)
    _TRACE.install()


class ScriptTrace:
    """One script process's steps, as a factory run's ``record.Trace`` keeps them."""

    def __init__(self, spec: WorkerSpec, spec_file: Path, attestation: determinism.Attestation) -> None:
        assert spec.script is not None
        self.spec, self.spec_file, self.attestation = spec, spec_file, attestation
        self.t0 = time.perf_counter()
        self.resumed = spec.resume_from is not None
        self.start = spec.script.resume_at if self.resumed else 0  # the step before this process's first
        self.taken = 0  # optimizer steps recorded (up to N)
        self.beyond = 0  # optimizer steps after step N: not recorded
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.optimizer_names: list[str] = []
        self.fps: StepFingerprints | None = None
        self.initial: InitialFingerprint | None = None
        self.batches = BatchLog()
        self.opaque: list[str] = []
        self.calls: list[tuple[Any, Any]] = []  # the outermost training calls since the last step
        self.open: list[bool] = []  # per forward under way: whether it is an outermost training call
        self.losses: list[torch.Tensor] = []
        self.loss: torch.Tensor | None = None  # what backward was called on since the last step
        self.final: tuple[str, dict[str, str]] | None = None
        self.step_times: list[float] = []
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.copied = False
        self.recorder: Any = None  # a probe's op recorder (audit.oprecord), over its step's ops
        self.written = False
        self.watch = ControlWatch(step=lambda: self.start + self.taken + 1)

    # -- set-up ---------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.global_hooks = [register_module_forward_pre_hook(self._forward_pre),
                             register_module_forward_hook(self._forward, with_kwargs=True, always_call=True)]
        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)
        original = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.final is None and tensor.numel() == 1:
                value = tensor.detach().float().reshape(()).clone()
                self.loss = value if self.loss is None else self.loss + value
                if self.recorder is not None:  # the ops it was computed from are on the step's path
                    self.recorder.mark_loss(tensor)
            return original(tensor, *args, **kwargs)

        torch.Tensor.backward = backward
        if self.spec.mode == "strict":
            self.watch.__enter__()
        atexit.register(self.finish)

    def _discover(self, called: torch.nn.Module | None) -> None:
        """The optimizers and the model, once: before the first training forward, or the first step."""
        with warnings.catch_warnings():  # isinstance on a deprecated alias of torch.distributed warns
            warnings.simplefilter("ignore")
            objects = gc.get_objects()
            optimizers = find_optimizers(objects)
            model = find_model(objects, optimizers, called) if optimizers else None
        if model is None:
            return
        self.model = model
        self.optimizer = optimizers[0] if len(optimizers) == 1 else Optimizers(optimizers)
        self.optimizer_names = [type(o).__name__ for o in optimizers]
        if self.spec.fingerprints:
            names, row = initial_row(self.model, self.optimizer)
            self.initial = {"step": self.start, "names": names, "row": row.tolist(),
                            "transient": transient_buffers(self.model)}
            self.fps = StepFingerprints(self.model, self.optimizer)

    # -- hooks ----------------------------------------------------------------------------------
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        outer = not self.open and module.training and torch.is_grad_enabled() and self.final is None
        self.open.append(outer)
        if outer and self.model is None:
            self._discover(module)
        if outer and self.model is not None:  # found here, or at a step that calls its forward inside (a closure)
            self._follow(module)
            self._record_ops()

    def _follow(self, module: torch.nn.Module) -> None:
        """From the first training forward on, the batch is what that outermost module is called
        with: its own hooks then, not global ones (with a global hook every module call of the
        step takes torch's slow path: a few per cent of a small model's step)."""
        for handle in self.global_hooks:
            handle.remove()
        self.global_hooks = []  # this call's end is the module's own post-hook's, registered now
        module.register_forward_pre_hook(self._module_pre)
        module.register_forward_hook(self._forward, with_kwargs=True, always_call=True)

    def _module_pre(self, module: torch.nn.Module, args: Any) -> None:
        outer = not self.open and module.training and torch.is_grad_enabled() and self.final is None
        self.open.append(outer)
        if outer:
            self._record_ops()

    def _record_ops(self) -> None:
        """A probe's step (``ops_path``), from its first training forward to the end of its optimizer
        step: every op, as a factory run's probe records them, for the first differing op."""
        spec = self.spec
        if spec.ops_path is None or self.recorder is not None or spec.dump_at != self.start + self.taken + 1:
            return
        from ..audit.oprecord import OpRecorder

        assert self.model is not None and self.optimizer is not None
        self.recorder = OpRecorder(self.model, self.optimizer, digests=True, keep=True).__enter__()

    def _forward(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self.open and self.open.pop():
            self.calls.append((args, kwargs) if kwargs else args)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.final is not None:
            return
        if self.model is None:
            self._discover(None)
        if self.t_first is None:
            self.t_first = self.t_last = time.perf_counter()
        k = self.spec.checkpoint_at
        if not self.resumed and k is not None and self.taken == k and not self.copied:
            self._copy_out()

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.final is not None:
            self.beyond += 1
            return
        self.taken += 1
        step = self.start + self.taken
        # the step's batch: the calls since the last step ended, its forward before its optimizer's step
        # or inside it (Lightning's closure runs the training step within optimizer.step)
        calls, self.calls = self.calls, []
        batch = calls[0] if len(calls) == 1 else Accumulated(calls) if calls else None
        if self.fps is not None:
            self.batches.add(batch)
            if len(self.batches) == 1 and batch is not None:
                self.opaque = batchtree.opaque(batch)
        loss, self.loss = self.loss, None
        self.losses.append(loss if loss is not None else torch.zeros(()))
        if self.fps is not None:
            self.fps.record()
        now = time.perf_counter()
        self.step_times.append(now - (self.t_last or now))
        self.t_last = now
        spec = self.spec
        if spec.dump_at is not None and step >= spec.dump_at:
            self._dump_and_leave()
        if step >= spec.steps:
            self._final()

    # -- state ----------------------------------------------------------------------------------
    def _copy_out(self) -> None:
        """Run A's {out} as its step k + 1 begins: what run C resumes from."""
        from . import __main__ as launcher

        target = resolve(self.spec_file, self.spec.checkpoint_path)
        assert target is not None
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(launcher.out_folder(self.spec_file, self.spec.role), target, symlinks=True)
        self.copied = True

    def _final(self) -> None:
        assert self.model is not None and self.optimizer is not None
        self.final = final_hash(self.model, self.optimizer)
        path = resolve(self.spec_file, self.spec.final_dump_path)
        if path is not None:
            dump_state(self.model, self.optimizer, str(path))

    def _dump_and_leave(self) -> None:
        """A probe's step: the state dumped, the record written, the process ended here."""
        assert self.model is not None and self.optimizer is not None
        if self.recorder is not None:
            self.recorder.__exit__(None, None, None)
            self.recorder.save(str(resolve(self.spec_file, self.spec.ops_path)))
        path = resolve(self.spec_file, self.spec.dump_path)
        if path is not None:
            dump_state(self.model, self.optimizer, str(path))
        self.final = final_hash(self.model, self.optimizer)
        self.finish()
        os._exit(0)

    # -- the record -----------------------------------------------------------------------------
    def finish(self) -> None:
        """Write the record as the process ends: the steps taken, or why they do not do."""
        if self.written:
            return
        self.written = True
        if self.spec.mode == "strict":
            self.watch.__exit__(None, None, None)
        out = resolve(self.spec_file, self.spec.output)
        assert out is not None
        failure = self._failure()
        if failure is None:
            _write(out, record.build(self).to_json())
        elif self.taken or (os.environ.get(TOP_PID_VARIABLE) == str(os.getpid()) and not out.exists()):
            _write(out, FailedRun(error_kind="contract", message=failure, traceback="", model=self.spec.model_name,
                                  role=self.spec.role).to_json())

    def _failure(self) -> str | None:
        n = self.spec.steps
        if self.taken == 0:
            return ("the command ended without an optimizer step (reproci counts the steps of torch.optim "
                    "optimizers): check that it trains, and that {steps} reaches its step limit")
        if self.final is not None:
            return None
        if self.resumed:
            return (f"the resume command took {self.taken} optimizer steps and ended; resumed at k = {self.start} it "
                    f"needs {n - self.start} to reach N = {n}: pass {{steps}} to its step limit")
        return (f"the command took {self.taken} optimizer steps and ended, fewer than N = {n}: pass {{steps}} to "
                "the script's own step limit (--max_steps {steps}, say)")
