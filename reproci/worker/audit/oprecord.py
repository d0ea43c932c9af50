"""Every aten op of one training step, in execution order: what it was, where in the model
it ran, and a digest of its outputs. Two runs recorded at the step where they first differ
name the first op whose output differs (``reproci.golden.ops``).

Recording is for probe replays only (it is slow: anomaly mode, a Python stack per op); the
normal runs never pay for it. Forward ops take their module from forward hooks and their
source line from the Python stack; backward ops take both from the forward op that made
their autograd node (anomaly mode keeps its stack, and a function mode tags the node with
the module). Optimizer ops come after ``optimizer.step`` starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..state.tensor_bits import dense
from . import module_text
from .rows import AttentionCall, AuditFacts, OpRow

MODULE_KEY = "reproci_module"
KEEP_BYTES = 64 * 1024 * 1024  # output copies kept for magnitudes; past this, digests only
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
              os.path.dirname(os.__file__))






def user_frame(frames: list[tuple[str, int, str]]) -> str | None:
    """'model.py:47 (forward)': the innermost frame of the model's own code (not torch, not
    the harness, not the standard library)."""
    for filename, line, function in reversed(frames):
        path = os.path.abspath(filename)
        if not path.startswith(_SKIP_DIRS) and not filename.startswith("<"):
            return f"{os.path.basename(filename)}:{line} ({function})"
    return None


def _parse(formatted: list[str] | None) -> list[tuple[str, int, str]]:
    out = []
    for text in formatted or []:
        m = _FRAME.search(text)
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3)))
    return out


def digest(t: torch.Tensor) -> str:
    """The exact bits of a tensor's values (with its dtype and shape)."""
    raw = dense(t.detach()).contiguous().reshape(-1).cpu()
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=12)
    if raw.numel():
        h.update(raw.view(torch.uint8).numpy().tobytes() if raw.dtype != torch.bool else raw.numpy().tobytes())
    return h.hexdigest()


# The arguments that decide what an op does on CUDA under strict mode (``worker.audit``):
# op -> (argument position, keyword).
_VARIANT_ARGS = {"index_put": (3, "accumulate"), "index_put_": (3, "accumulate"), "_index_put_impl_": (3, "accumulate"),
                 "put_": (3, "accumulate"), "put": (3, "accumulate"), "scatter_reduce": (4, "reduce"),
                 "scatter_reduce_": (4, "reduce"), "_embedding_bag_backward": (8, "mode"),
                 "_embedding_bag_dense_backward": (7, "mode"), "bincount": (1, "weights"),
                 "nll_loss2d_forward": (3, "reduction")}
_VARIANT_DEFAULTS = {"accumulate": False, "reduction": 1, "mode": 0}  # the schema's default, when not passed
# ops whose result can depend on the order of writes to repeated indices: (position of the index)
_INDEXED = {"index_add": 2, "index_add_": 2, "index_copy": 2, "index_copy_": 2, "index_put": 1, "index_put_": 1,
            "_index_put_impl_": 1, "put_": 1, "put": 1}
_DUPLICATES_CAP = 1 << 20  # elements: larger indices are not checked (the fact stays unknown)


def audit_facts(op: str, args: Any) -> AuditFacts:
    """What the audit's conditions read from one call: whether grad flows to a tensor input,
    whether an input is sparse, and for the indexed ops whether the index repeats (None: not checked)."""
    tensors = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor)]
    facts: AuditFacts = {"grad": any(t.requires_grad for t in tensors),
                             "sparse": any(t.layout != torch.strided for t in tensors)}
    if op in _INDEXED and len(args) > _INDEXED[op]:
        index = args[_INDEXED[op]]
        if isinstance(index, (list, tuple)):
            given = [i for i in index if isinstance(i, torch.Tensor)]
            index = given[0] if len(given) == 1 else None
        if isinstance(index, torch.Tensor) and index.dtype != torch.bool and 0 < index.numel() <= _DUPLICATES_CAP:
            facts["duplicates"] = bool(index.reshape(-1).unique().numel() < index.numel())
    return facts


def variant(op: str, args: Any, kwargs: dict[str, Any]) -> str | None:
    """'accumulate=True', 'reduce=prod', 'mode=2', 'weights=tensor': the argument of an op
    that decides its CUDA behaviour, for the ops that have one."""
    if op not in _VARIANT_ARGS:
        return None
    pos, key = _VARIANT_ARGS[op]
    value = kwargs.get(key, args[pos] if len(args) > pos else _VARIANT_DEFAULTS.get(key))
    if isinstance(value, torch.Tensor):
        value = "tensor"
    return f"{key}={value}"


class _Tagger(TorchFunctionMode):
    """Marks the autograd node of each forward output with the module that made it."""

    def __init__(self, recorder: "OpRecorder") -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.recorder.attention is not None and func is torch.nn.functional.scaled_dot_product_attention:
            out = self._attention(func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        module = self.recorder.module()
        if module is not None and self.recorder.phase == "forward":
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    t.grad_fn.metadata.setdefault(MODULE_KEY, module)
        return out


    def _attention(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """An SDPA call, for the audit: its inputs, where it was made and the backend it ran (``attention``)."""
        from . import attention

        calls = self.recorder.attention
        assert calls is not None  # the caller records attention only where there is a list for it
        facts = attention.call_facts(tuple(args), kwargs)
        start = len(self.recorder.rows)
        calls.append(facts)
        out = func(*args, **kwargs)
        place = [p for p in (module_text(self.recorder.module()), user_frame([(f.filename, f.lineno or 0, f.name)
                                                                   for f in traceback.extract_stack()])) if p]
        facts["ran"] = attention.ran(self.recorder.rows[start:])
        facts["place"] = " at ".join(place) or None
        return out


class OpRecorder(TorchDispatchMode):
    """Use around one training step: ``with OpRecorder(model, optimizer) as rec: step()``."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, digests: bool = True,
                 keep: bool = True) -> None:
        super().__init__()
        self.digests = digests  # False: an inventory of ops (the audit), no output digests or copies
        self.keep = keep and digests  # copies of outputs, for magnitudes (probe replays, not goldens)
        self.names = {m: name or type(model).__name__ for name, m in model.named_modules()}
        self.optimizer = optimizer
        self.stack: list[str] = []
        self.phase = "forward"
        self.rows: list[OpRow] = []
        self.kept: dict[int, torch.Tensor] = {}
        self._kept_bytes = 0
        self._handles: list[Any] = []
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
        self._tagger = _Tagger(self)
        self.attention: list[AttentionCall] | None = None if digests else []  # SDPA calls (the audit's)
        self._writers: dict[int, int] = {}  # storage -> the row that last wrote it (data flow between ops)
        self._loss_row: int | None = None

    def module(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def __enter__(self) -> "OpRecorder":
        nn = torch.nn.modules.module
        self._handles = [nn.register_module_forward_pre_hook(self._enter_module),
                         nn.register_module_forward_hook(self._leave_module),
                         self.optimizer.register_step_pre_hook(self._optimizer_step)]
        self._anomaly.__enter__()
        self._tagger.__enter__()
        return super().__enter__()

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        self.stack.append(self.names.get(module, type(module).__name__))

    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:  # None: output unchanged
        if self.stack:
            self.stack.pop()

    def _optimizer_step(self, *args: Any) -> None:
        self.phase = "optimizer"

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._tagger.__exit__(*exc)
        self._anomaly.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.layout == torch.strided]
        if not tensors:
            return out
        node = torch._C._current_autograd_node()
        if node is not None:
            phase, module = "backward", node.metadata.get(MODULE_KEY)
            where = user_frame(_parse(node.metadata.get("traceback_")))
        else:
            phase, module = self.phase, self.module()
            where = user_frame([(f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack()])
        index = len(self.rows)
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        reads = sorted({w for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                        for w in (self._writers.get(_storage(t)),) if w is not None})
        for t in tensors:  # in place or new: this row's output is what the storage now holds
            self._writers[_storage(t)] = index
        row: OpRow = {"op": name, "overload": str(func), "phase": phase, "module": module, "where": where,
                      "reads": reads,
                      "shape": list(tensors[0].shape), "dtype": str(tensors[0].dtype),
                      "device": tensors[0].device.type, "variant": variant(name, args, kwargs or {}),
                      "digest": "".join(digest(t) for t in tensors) if self.digests else None}
        if not self.digests:
            row.update(audit_facts(name, args))
        self.rows.append(row)
        if not self.keep:
            return out
        first = tensors[0]
        size = first.numel() * first.element_size()
        if self._kept_bytes + size <= KEEP_BYTES:
            self.kept[index] = first.detach().cpu().clone()
            self._kept_bytes += size
        return out

    def mark_loss(self, loss: torch.Tensor) -> None:
        """The step's loss, as the step returned it: the ops it was computed from are on its path."""
        if isinstance(loss, torch.Tensor) and loss.layout == torch.strided:
            self._loss_row = self._writers.get(_storage(loss))

    def on_path(self) -> list[bool]:
        """Per row: whether its output enters the loss or the gradients: an ancestor (by data flow)
        of the loss or of a backward op, or a backward or optimizer op itself."""
        marked = [False] * len(self.rows)
        todo = [i for i, r in enumerate(self.rows) if r["phase"] in ("backward", "optimizer")]
        if self._loss_row is not None:
            todo.append(self._loss_row)
        while todo:
            i = todo.pop()
            if marked[i]:
                continue
            marked[i] = True
            todo.extend(j for j in self.rows[i]["reads"] if not marked[j])
        return marked

    def save(self, path: str) -> None:
        marks = self.on_path() if self._loss_row is not None else None
        rows: list[OpRow] = [{**r, "on_path": m} for r, m in zip(self.rows, marks)] if marks is not None else self.rows
        torch.save({"rows": rows, "kept": self.kept}, path)


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, functional)
        return id(t)
