"""The `reproci golden update` command a run prints as advice: the run's own options, so that
running it exactly as printed records the golden the next run compares with."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..reference_models import REGISTRY
from ..settings.declared import PROFILES
from ..settings.models import ModelRef
from ..settings.options import RunOptions, golden_name

if TYPE_CHECKING:
    from .store import EntryView

# The run settings a golden records beside the model's identity: a run with others is not
# compared with it (MODEL_CHANGED), and is told how to run as the golden was recorded.
SETTINGS = ("steps", "seed", "profile", "device")


def update_command(options: RunOptions) -> str:
    """The `reproci golden update` command that records the golden this run compares with:
    the run's own image, models, steps, resume point, seed, threads, world size, device, CPU
    cap and goldens directory, so that it clears the notice when run as printed."""
    return _command(options, ["golden", "update"])


def rerun_command(options: RunOptions, golden: EntryView) -> str:
    """The `reproci run` command that compares with a golden recorded under other run settings
    (``SETTINGS``): this run's options with the golden's (those it records). Advising it, not a
    re-record, keeps an ad-hoc run (other ``--steps``) from replacing the golden the default runs
    compare with."""
    return _command(dataclasses.replace(
        options, resume_at_auto=True, steps=options.steps if golden.steps is None else golden.steps,
        seed=options.seed if golden.seed is None else golden.seed,
        profile=options.profile if golden.profile is None else golden.profile,
        device=options.device if golden.device is None else golden.device), ["run"])


def _command(options: RunOptions, verb: list[str]) -> str:
    args = ["reproci", *verb, "--image", options.image or "local"]
    if options.image_name != (golden_name(options.image, options.image_entry) if options.image else "local"):
        args += ["--image-name", options.image_name]
    if [m.name for m in options.models] != list(REGISTRY):
        args += [a for m in options.models if m.script is None for a in ("-m", shown(m, options.project_root))]
        for m in options.models:  # a script model by its commands (and its name, where it is not the file's)
            if m.script is not None:
                args += ["--script", m.script.command, "--resume-script", m.script.resume]
                args += ["--name", m.name] if m.name != m.source.stem else []
    if options.profile != "quick":
        args += ["--profile", options.profile]
    if options.steps != PROFILES[options.profile]:
        args += ["--steps", str(options.steps)]
    if not options.resume_at_auto:
        args += ["--resume-at", str(options.resume_at)]
    for flag, value, default in (("--seed", options.seed, 0), ("--threads", options.threads, 1),
                                 ("--world-size", options.world_size, 1), ("--device", options.device, "cpu")):
        if value != default:
            args += [flag, str(value)]
    if options.compiled and (options.config_file is None or len(options.compiled) == len(options.models)):
        args += ["--compile"] + (["--compile-mode", options.compile_mode] if options.compile_mode else [])
    if options.amp:
        args += ["--amp", options.amp]
    image_cap = options.image_entry.cpu_isa if options.image_entry is not None else None
    if options.cpu_isa != image_cap:
        args += ["--cpu-isa", options.cpu_isa or "native"]
    if options.goldens_dir != Path("goldens"):
        args += ["--goldens-dir", str(options.goldens_dir)]
    return shlex.join(args)


def shown(model: ModelRef, root: Path) -> str:
    """A model as ``-m`` names it: a plugin file inside the working directory by its path from
    there (where the command is run), any other by its reference."""
    path, _, factory = model.ref.rpartition(":")
    if model.plugin and path.endswith(".py") and Path(path).is_relative_to(root.resolve()):
        return f"{Path(path).relative_to(root.resolve())}:{factory}"
    return model.ref
