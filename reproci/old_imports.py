"""Imports of reproci's old package name for one release: ``pipeline`` and ``pipeline.X`` are
``reproci`` and ``reproci.X`` (the same module objects, aliased in ``sys.modules``), with a
FutureWarning naming the new import, once per module imported that way.

A ``pipeline`` package of the user's own always wins: the finder of the top-level name is the
last on ``sys.meta_path``, so any other finder (the path finder over ``sys.path``, where the
worker puts the plugin's folder first; an editable install of theirs) is asked before it. The
finder of ``pipeline.X`` comes first, but answers only while ``pipeline`` is reproci: else the
path finder would load ``pipeline/X.py`` a second time under the old name, with classes that are
not reproci's (a TrainSetup the contract check would refuse).

Standard library only: ``import reproci`` installs the finders, in the worker too.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import warnings
from types import FrameType, ModuleType

OLD, NEW = "pipeline", "reproci"
_warned: set[str] = set()


def new_name(old: str) -> str:
    """``pipeline.worker.contract`` -> ``reproci.worker.contract``."""
    return NEW + old[len(OLD):]


class _Alias:
    """Loads an old name as the module of its new name (importing that), leaving its spec as it was."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(new_name(self.old))
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec on it; runpy and pickle read the real one
        warn(self.old)


def _spec(name: str) -> importlib.machinery.ModuleSpec:
    # A loader by its two methods: importlib.abc.Loader, its base in typeshed, is not imported here (it brings
    # importlib.resources, tempfile and random with it, before the CLI's Ctrl-C handler and in every worker).
    return importlib.machinery.ModuleSpec(name, _Alias(name))  # type: ignore[arg-type]


class OldTopLevel:
    """``pipeline`` itself, when nothing else provides it (last on sys.meta_path)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return _spec(name) if name == OLD else None


class OldSubmodules:
    """``pipeline.X`` while ``pipeline`` is reproci (first on sys.meta_path)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(OLD + ".") or NEW not in sys.modules or sys.modules.get(OLD) is not sys.modules[NEW]:
            return None
        return _spec(name)


def install() -> None:
    """Put the two finders in place, once."""
    if not any(isinstance(f, OldTopLevel) for f in sys.meta_path):
        sys.meta_path.insert(0, OldSubmodules())
        sys.meta_path.append(OldTopLevel())


def warn(name: str) -> None:
    """One FutureWarning for the module the user's import statement asked for (the whole name,
    ``pipeline.worker.contract``, not the parents imported on its way), pointing at that statement."""
    requested = _requested() or name
    if requested in _warned:
        return
    _warned.add(requested)
    warnings.warn(f"{requested} is deprecated (reproci's package is named reproci now): import from reproci "
                  f"(from reproci import ModelContext, TrainSetup, ...; {requested} is {new_name(requested)})",
                  FutureWarning, stacklevel=_stacklevel())


def _frames(frame: FrameType | None) -> list[FrameType]:
    """``frame`` and its callers, outwards."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _requested() -> str | None:
    """The outermost old name among the imports in progress: the one the statement asked for
    (its parents are imported inside it; a module importing it, such as a plugin, outside it)."""
    names = [f.f_locals.get("name") for f in _frames(sys._getframe(1))
             if f.f_code.co_name == "_find_and_load" and _importlib(f)]
    old = [n for n in names if isinstance(n, str) and (n == OLD or n.startswith(OLD + "."))]
    return old[-1] if old else None


def _stacklevel() -> int:
    """warnings.warn's stacklevel for the first frame outside the import machinery and reproci's
    package file: the user's import statement (warnings itself skips the import machinery's frames)."""
    ours = {__file__, os.path.join(os.path.dirname(__file__), "__init__.py")}
    counted = [f for f in _frames(sys._getframe(1)) if not _importlib(f)]  # [0]: warn, the caller of warnings.warn
    return next((level for level, f in enumerate(counted, start=1) if f.f_code.co_filename not in ours), 1)


def _importlib(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith("<frozen importlib")
