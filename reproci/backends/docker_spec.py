"""What a worker run looks like from inside a container: mounts, paths and environment.

Pure translations, no engine needed. The image brings python3, torch and numpy (its
digest identifies the toolchain alone); reproci brings the worker code, mounted
read-only at run time. Inside a container:

    /reproci/code/reproci                                      read-only, on PYTHONPATH
    /reproci/plugins/<id>                                      read-only: a plugin model's directory
    /reproci/run                                               read-write: results/<run_id>
    /tmp                                                       tmpfs, also HOME (torch's, inductor's, Triton's caches)
    everything else                                            read-only (the image's root filesystem)

Every container is also held to a memory limit (swap included) and a limit on its processes
and threads (``Limits``); ``limit_hit`` says which one stopped a run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from ..worker.process import launch
from ..worker.process.spec import WorkerSpec

CODE = PurePosixPath("/reproci/code")
RUN = PurePosixPath("/reproci/run")
PLUGINS = PurePosixPath("/reproci/plugins")
REPO = PurePosixPath("/reproci/repo")  # a script model's working directory (read-write: it is the script's)
CODE_PACKAGES = ("reproci",)  # what the worker and plugins import from the project (the reference models in it)
PATH_FIELDS = ("output", "resume_from")  # spec fields holding paths besides *_path (relative: to the spec's directory)


@dataclass(frozen=True)
class Bind:
    source: Path  # host directory
    target: PurePosixPath  # where the container sees it
    read_only: bool = True


def code_binds() -> list[Bind]:
    """The worker's packages, each mounted read-only under /reproci/code by its import name
    (nothing else of the checkout): each from the directory it was imported from here, which
    for reproci in a checkout is the source folder reproci/."""
    return [Bind(package_dir(p), CODE / p) for p in CODE_PACKAGES]


def package_dir(name: str) -> Path:
    """The host directory of one of reproci's packages, as imported by this process."""
    return Path(str(importlib.import_module(name).__file__)).resolve().parent


def plugin_target(host_dir: Path) -> PurePosixPath:
    """A stable container directory for a host directory holding plugin code."""
    return PLUGINS / hashlib.sha256(str(host_dir).encode()).hexdigest()[:12]


def container_path(host: Path, run_dir: Path) -> PurePosixPath:
    """Where a file under the run directory appears in the container."""
    return RUN / PurePosixPath(host.resolve().relative_to(run_dir.resolve()).as_posix())


GIB = 1024**3
DEFAULT_MEMORY = 8 * GIB  # the reference models peak at 0.36 GiB a container (page cache included); a GPU's
# CUDA context and torch.compile's worker pool (a process a core, up to 32) add GiBs: headroom for those
DEFAULT_PIDS = 1024  # processes and threads: the reference models peak at 9; inductor's pool and torchrun's ranks add more
PIDS_EXHAUSTED = ("Resource temporarily unavailable", "can't start new thread", "fork: retry")  # EAGAIN from fork/clone


@dataclass(frozen=True)
class Limits:
    """What one container may use: memory in bytes (no swap beyond it) and processes plus threads."""

    memory: int = DEFAULT_MEMORY
    pids: int = DEFAULT_PIDS


class ContainerConfig(TypedDict):
    """The engine's create keywords every container gets (``container_config``)."""

    network_mode: str
    cap_drop: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]  # mount point -> its options
    shm_size: str
    mem_limit: int  # bytes
    memswap_limit: int  # bytes, memory and swap together
    pids_limit: int


def container_config(limits: Limits) -> ContainerConfig:
    """The engine's create keywords every container gets, whatever it runs: no network, no
    capabilities, no privilege gained through set-uid files, a read-only root filesystem with
    /tmp as tmpfs (HOME is there), and the limits."""
    return {"network_mode": "none", "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "read_only": True,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,mode=1777"}, "shm_size": "1g",
            "mem_limit": limits.memory, "memswap_limit": limits.memory, "pids_limit": limits.pids}


def size_text(n: int) -> str:
    """Bytes as a user writes them for --memory: ``4 GiB``, ``512 MiB``."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def limit_hit(code: int | None, oom_killed: bool, tail: list[str], limits: Limits, *,
              timed_out_at_process_limit: bool = False) -> str | None:
    """The one line that says a container limit stopped a run (the engine's OOM kill, a fork or
    thread start refused with EAGAIN, or a run that timed out with every process slot taken: a
    fork bomb that tries again when refused), or None when no limit did."""
    pids = (f"the container hit its process limit ({limits.pids} processes and threads): raise it with "
            "--pids-limit, or start fewer loader workers or threads")
    if timed_out_at_process_limit:
        return pids + " (the run waited there until its --timeout)"
    if code in (0, None):
        return None
    if oom_killed:
        return (f"the container hit its memory limit ({size_text(limits.memory)}): raise it with --memory "
                "(e.g. --memory 16g) or train a smaller configuration")
    if any(s in line for line in tail for s in PIDS_EXHAUSTED):
        return pids
    return None


def container_user(uid: int, gid: int, *, rootless: bool) -> str:
    """The container user whose files on the host belong to the invoking user."""
    return "0:0" if rootless else f"{uid}:{gid}"  # rootless engine: container root is the invoking user


def environment(spec: WorkerSpec) -> dict[str, str]:
    """The container's whole environment: determinism variables, PYTHONPATH and HOME."""
    from ..worker.process.launch import launch_environment, overridden

    env = launch_environment(seed=spec.seed, threads=spec.threads, strict=spec.mode == "strict",
                             hash_seed=spec.hash_seed, world_size=spec.world_size, cpu_isa=spec.cpu_isa)
    env["PYTHONPATH"] = str(CODE)
    env["HOME"] = "/tmp"
    return overridden(env, spec.env)


def worker_command(spec: WorkerSpec, inner_spec_file: PurePosixPath) -> list[str]:
    """The container's command: the worker on the image's python3, under torchrun when the
    spec asks for more than one rank (all ranks in this one container, GPUs as requested)."""
    return launch.worker_command("python3", str(inner_spec_file), world_size=spec.world_size,
                                 script=spec.script is not None)


def translate_spec(spec: WorkerSpec, run_dir: Path, *, registry: tuple[str, ...] = ()) -> tuple[WorkerSpec, list[Bind]]:
    """The spec as the container sees it, and the read-only binds its plugin code needs.

    Registry names and relative paths (they resolve against the spec file's directory,
    which is mounted) stay as they are; absolute paths under the run directory move to
    /reproci/run. A plugin file ``/abs/dir/f.py:factory`` becomes
    ``/reproci/plugins/<id>/f.py:factory`` with ``/abs/dir`` mounted there. A plugin
    module ``pkg.mod:factory`` that resolves on this host gets its top-level package
    mounted and put on the worker's sys.path; one that does not is looked for in the image.
    """
    binds: dict[PurePosixPath, Bind] = {}
    model_ref, extra_paths = (_translate_model_ref(spec.model_ref, registry, binds) if spec.script is None
                              else (spec.model_ref, []))  # a script's reference is its command
    plugin_paths: list[str] = []
    for p in spec.plugin_paths:
        if Path(p).is_absolute():
            host = Path(p).resolve()
            binds.setdefault(plugin_target(host), Bind(host, plugin_target(host)))
            p = str(plugin_target(host))
        plugin_paths.append(p)
    plugin_paths += [p for p in extra_paths if p not in plugin_paths]
    paths: dict[str, Any] = {name: _inside(getattr(spec, name), run_dir) for name in _path_fields(spec)}
    if spec.script is not None:  # the directory the command runs from, where the container sees it
        host = Path(spec.script.cwd).resolve()
        binds.setdefault(REPO, Bind(host, REPO, read_only=False))
        paths["script"] = replace(spec.script, cwd=str(REPO))
    return replace(spec, model_ref=model_ref, plugin_paths=tuple(plugin_paths), **paths), list(binds.values())


def _translate_model_ref(model_ref: str, registry: tuple[str, ...],
                         binds: dict[PurePosixPath, Bind]) -> tuple[str, list[str]]:
    """A plugin reference as the container sees it (adding its binds), and paths the worker must import from."""
    target, sep, factory = model_ref.rpartition(":")
    if model_ref in registry or not sep or not target:
        return model_ref, []
    if target.endswith(".py"):
        host = Path(target).expanduser().resolve()
        where = plugin_target(host.parent)
        binds.setdefault(where, Bind(host.parent, where))
        return f"{where / host.name}:{factory}", []
    top = target.split(".")[0]
    root = None if top in CODE_PACKAGES else _module_root(top)
    if root is None:
        return model_ref, []
    where = plugin_target(root) / root.name  # the package directory (or module file) alone
    binds.setdefault(where, Bind(root, where))
    return model_ref, [str(plugin_target(root))]


def _module_root(module: str) -> Path | None:
    """The host file or package directory of a top-level module, if it resolves here."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin and spec.origin not in ("built-in", "frozen") else None


def _path_fields(spec: WorkerSpec) -> list[str]:
    return [f.name for f in dataclasses.fields(spec) if f.name in PATH_FIELDS or f.name.endswith("_path")]


def _inside(p: str | None, run_dir: Path) -> str | None:
    """A spec path as the container sees it: relative ones as they are, absolute ones under /reproci/run."""
    if p is None or not Path(p).is_absolute():
        return p
    try:
        return str(RUN / Path(p).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        raise ValueError(f"spec path {p} is outside the run directory {run_dir}") from None
