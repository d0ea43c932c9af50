"""Loaded by every Python process a script model's command starts (reproci puts this folder
first on PYTHONPATH): in a run of reproci it installs the step hooks before the script's first
line (``reproci.worker.script.hooks``), then runs the sitecustomize it shadows, if any."""

import os
import sys


def _reproci() -> None:
    if os.environ.get("REPROCI_SCRIPT_SPEC"):
        from reproci.worker.script.hooks import install

        install(os.environ["REPROCI_SCRIPT_SPEC"])


def _shadowed() -> None:
    """The next ``sitecustomize`` on sys.path after this folder (a distribution's, a venv's)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin or os.path.dirname(os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_reproci()
_shadowed()
