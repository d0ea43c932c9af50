"""A run's cells as every cluster engine sends them (``engines``: Ray, Slurm): one cell a model,
named ``MODEL@IMAGE``, with the user's options, the model (its ``-m`` text, or a script's
commands), and the image's golden to compare with, under the goldens directory the driver's own
run names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from ..golden.advice import shown
from ..settings.models import ModelRef
from ..settings.options import RunOptions
from . import cell as cell_mod


def inside(root: Path, path: Path) -> list[str]:
    """``path`` relative to ``root``, in a list of one; empty where it is not under it."""
    try:
        return [str(path.resolve().relative_to(root.resolve()))]
    except ValueError:
        return []


def golden_files(options: RunOptions) -> dict[str, bytes]:
    """The image's golden and its sidecar, as the cells need them to compare (nothing if none)."""
    from ..golden.folder import golden_path

    path = golden_path(options.goldens_dir, options.image_name)
    if not path.is_file():
        return {}
    files = {path.name: path.read_bytes()}
    for side in options.goldens_dir.glob(f"{options.image_name}.*.npz"):
        files[side.name] = side.read_bytes()
    return files


def cell_goldens_dir(options: RunOptions) -> str:
    """The goldens directory as the cells name it: the driver's, relative to the project, so
    that every path and command a cell writes reads the same on the driver."""
    under = inside(options.project_root, options.goldens_dir)
    return under[0] if under else "goldens"


def cell_name(options: RunOptions, model: str) -> str:
    return f"{model}@{options.image_name}"


class ScriptOptions(TypedDict, total=False):
    """A script model's options in its cell: all three, or none for a factory model."""

    script: str  # --script
    resume_script: str  # --resume-script
    script_name: str  # --name


def script_options(model: ModelRef) -> ScriptOptions:
    """A script model's commands and name as its cell's options (``--script``, ``--resume-script``,
    ``--name``); none for a factory model, which its cell names with ``-m``."""
    if model.script is None:
        return {}
    return {"script": model.script.command, "resume_script": model.script.resume, "script_name": model.name}


def model_cell(options: RunOptions, model: ModelRef, cell_options: dict[str, Any],
               golden_files: dict[str, bytes] | None = None) -> cell_mod.CellSpec:
    """The cell of one model of the run: its name, its model as ``-m`` names it (a script model's
    commands and name among its options), the user's options, and the golden to compare with."""
    return cell_mod.CellSpec(name=cell_name(options, model.name), model=shown(model, options.project_root),
                             options={**cell_options, **script_options(model)},
                             goldens_dir=cell_goldens_dir(options), golden_files=golden_files or {},
                             update_golden=options.update_golden, keep_checkpoints=options.keep_checkpoints)
