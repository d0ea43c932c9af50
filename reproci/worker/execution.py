"""How a run executes its steps beyond eager fp32: torch.compile and autocast.

``prepare`` compiles the step's module when the spec asks (``WorkerSpec.compile``), or
recognises a plugin's own ``torch.compile``d model. Either way ``setup.model`` stays the
plain module, so tensor names are the model's own (no ``_orig_mod.``) and checkpoints load
in eager runs too. Inductor's on-disk caches go to the run's own directory
(``WorkerSpec.compile_cache``): a run compiles cold unless it is given a warm cache on
purpose. Strict mode sets inductor's ``deterministic`` switch where the running torch has
one. What is recorded as ``execution`` is part of the run's identity: a compiled golden is
compared only with compiled runs; the cache settings are recorded beside it, not in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, ContextManager, TypedDict

import torch

from .contract import TrainSetup
from .process.failure import FIX_CXX, broken_compiler, compiler_named
from .process.spec import CompileSpec
from .sections import CacheDir, CompileAttestation, CompileCache, CompileIdentity, Execution

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# inductor options that change the numbers a compiled step computes (recorded, in the identity)
NUMERIC_OPTIONS = ("deterministic", "fallback_random", "max_autotune", "coordinate_descent_tuning",
                   "emulate_precision_casts", "freezing")
CACHE_OPTIONS = ("fx_graph_cache", "autotune_local_cache", "force_disable_caches")








class Facts(TypedDict):
    """A run's record of how it executed (``train._execution_facts``)."""

    execution: Execution | None  # part of the run's identity
    compile_cache: CompileCache | None
    compile_attestation: CompileAttestation | None
    scaler_state: dict[str, float] | None  # the GradScaler's (``scaler_state``)


class CompilerMissing(Exception):
    """A compiled run on the CPU where no working C++ compiler is: inductor builds C++ (an infrastructure fault)."""


def _check_compiler(device: torch.device) -> None:
    """Before anything is traced: the C++ compiler inductor will build with exists and answers
    ``--version`` (inductor's own test of it), else one line naming it and how to pick another."""
    if device.type != "cpu":
        return
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    found = [n for n in names if shutil.which(n)]
    if not found:
        raise CompilerMissing(f"torch.compile on the CPU needs a C++ compiler (inductor builds C++ kernels) and this "
                              f"environment has none ({', '.join(names)} not found): install one (g++) where the "
                              "runs execute, or drop --compile")
    broken = broken_compiler(found[0])
    if broken is not None:
        named = compiler_named() if os.environ.get("CXX") else found[0]
        raise CompilerMissing(f"torch.compile on the CPU builds inductor's C++ kernels with {named}, and that compiler "
                              f"does not work ({broken}): {FIX_CXX}")


def _optimized_module() -> type[torch.nn.Module] | None:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # pragma: no cover - a torch without dynamo
        return None
    return OptimizedModule


def unwrap(setup: TrainSetup) -> torch.nn.Module | None:
    """A plugin's own compiled model: put the plain module in ``setup.model`` and return the
    compiled one (None when the model is not compiled)."""
    optimized = _optimized_module()
    if optimized is None or not isinstance(setup.model, optimized):
        return None
    compiled = setup.model
    setup.model = compiled._orig_mod
    return compiled


def _inductor_config() -> Any:
    import torch._inductor.config as config

    return config


def _set_caches(cache_dir: Path) -> CacheDir:
    """Inductor's and Triton's caches in ``cache_dir`` (read by them at each use), and inductor's
    precompiled headers too; whether it was warm."""
    warm = cache_dir.is_dir() and any(cache_dir.iterdir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    headers = _move_headers(cache_dir / "precompiled_headers")
    return {"dir": cache_dir.name, "warm": warm, "precompiled_headers": headers}


def _move_headers(target: Path) -> bool:
    """Point inductor's precompiled C++ headers at ``target``: torch (2.13) puts them in
    ``default_cache_dir()/precompiled_headers`` (``/tmp/torchinductor_<user>``), fixed as its
    ``codecache`` module is imported, whatever TORCHINDUCTOR_CACHE_DIR says, and keeps them
    there across processes. Whether the running torch has them (False: nothing to move)."""
    try:
        from torch._inductor import codecache
    except ImportError:  # pragma: no cover - a torch without inductor
        return False
    if not hasattr(codecache, "_HEADER_DIR"):
        return False
    codecache._HEADER_DIR = str(target)
    if hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_LOCK_DIR = str(target / "locks")
    return True


def prepare(compile_spec: CompileSpec | None, cache_dir: Path | None, strict: bool, setup: TrainSetup,
            net: torch.nn.Module, own: torch.nn.Module | None,
            eager: bool = False) -> tuple[torch.nn.Module, CompileIdentity | None, CompileCache | None]:
    """The module the steps call, what identifies its compilation (None: eager), and the cache
    facts. ``own``: the plugin's compiled model (``unwrap``), reused as it is in one process;
    ``eager``: run a plugin's compiled model uncompiled (the bisection's compile factor)."""
    if eager or (compile_spec is None and own is None):
        return net, None, None
    _check_compiler(next(setup.model.parameters(), torch.empty(0)).device)
    cache = _set_caches(cache_dir) if cache_dir is not None else None
    config = _inductor_config()
    if strict and hasattr(config, "deterministic"):
        config.deterministic = True
    if compile_spec is not None:
        net = torch.compile(net, backend=compile_spec["backend"], mode=compile_spec["mode"],
                            dynamic=compile_spec["dynamic"], fullgraph=bool(compile_spec["fullgraph"]))
        source, backend, mode, dynamic, fullgraph = ("harness", compile_spec["backend"], compile_spec["mode"],
                                                     compile_spec["dynamic"], compile_spec["fullgraph"])
    else:
        assert own is not None
        net = own if net is setup.model else torch.compile(net)
        source, backend, mode, dynamic, fullgraph = "plugin", "plugin", None, None, None
    identity: CompileIdentity = {"source": source, "backend": backend, "mode": mode, "dynamic": dynamic,
                                 "fullgraph": fullgraph,
                                 "inductor": {k: getattr(config, k, None) for k in NUMERIC_OPTIONS}}
    facts = None if cache is None else CompileCache(**cache, options={k: getattr(config, k, None) for k in CACHE_OPTIONS})
    return net, identity, facts


def attest(identity: CompileIdentity | None, strict: bool) -> CompileAttestation | None:
    """Whether inductor's deterministic switch still holds (strict, compiled runs of a torch that has it)."""
    if identity is None or not strict:
        return None
    config = _inductor_config()
    if not hasattr(config, "deterministic"):
        return {"deterministic": None, "ok": True, "note": f"torch {torch.__version__} has no inductor deterministic switch"}
    return {"deterministic": bool(config.deterministic), "ok": bool(config.deterministic)}


def autocast(amp: str | None, device: torch.device) -> Callable[[], ContextManager[Any]]:
    """The context each forward and loss runs in: ``torch.autocast`` to the AMP dtype, or nothing."""
    if amp is None:
        return contextlib.nullcontext
    dtype = AMP_DTYPES[amp]
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def ensure_scaler(amp: str | None, setup: TrainSetup, device: torch.device) -> None:
    """fp16 steps need a GradScaler: the plugin's own, else one made here (checkpointed and compared)."""
    if amp == "fp16" and setup.scaler is None:
        setup.scaler = torch.amp.GradScaler(device.type)


def scaler_state(setup: TrainSetup) -> dict[str, float] | None:
    """The scaler's scale and growth tracker, to compare runs by (None without a scaler)."""
    if setup.scaler is None:
        return None
    state = setup.scaler.state_dict()
    return {k: (float(v) if isinstance(v, float) else v) for k, v in state.items()} or None


def describe(identity: CompileIdentity | None, amp: str | None) -> Execution | None:
    """The run's execution identity: None for eager fp32 (what goldens without it recorded)."""
    if identity is None and amp is None:
        return None
    return {"compile": identity, "amp": amp}
