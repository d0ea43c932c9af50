"""The stages of ``reproci run``, composed at the top, as pytest composes its plugins: this
package's, in the order they run, then each stage an installed package offers by an entry point
of the group ``reproci.stages`` (in the entry points' name order), after them.

The command line (``cli.py``, ``commands/``) alone reads this module; it hands the tuple down:
to the options (``catalog()``, the table of flags and reproci.yaml keys), to the orchestrator,
the golden and the reports. Nothing is registered by importing a module.

A package adds a stage with, in its pyproject.toml::

    [project.entry-points."reproci.stages"]
    flops = "reproci_flops:STAGE"

the entry point naming a ``stages.base.Stage`` (an instance, or its class, made with no
argument). A broken one is refused in one line that names it and its package.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any, Mapping

from .errors import UsageError
from .settings import options as options_mod
from .settings.config_file import Settings
from .settings.declared import Catalog, catalog_of
from .settings.options import RunOptions
from .stages.audit import stage as audit
from .stages.base import Stage, Stages
from .stages.bisect import stage as bisect
from .stages.blame import stage as blame
from .stages.determinism import stage as determinism
from .stages.probes import stage as probes
from .stages.throughput import stage as throughput
from .stages.variance import stage as variance

GROUP = "reproci.stages"
# determinism first (it makes the entries the others attach to), then throughput, variance (which
# reuses the determinism stage's run A), the op audit, the probes, the bisection and the upgrade
# blame (which work at conclude, after the golden comparison)
BUILTIN: tuple[Stage, ...] = (determinism.STAGE, throughput.STAGE, variance.STAGE, audit.STAGE, probes.STAGE,
                              bisect.STAGE, blame.STAGE)


def _loaded(entry: metadata.EntryPoint) -> Stage:
    """The stage an entry point names, refused in one line when it names none."""
    package = entry.dist.name if entry.dist is not None else "an installed package"
    where = f"the {GROUP} entry point {entry.name} = {entry.value} of {package}"
    try:
        found: Any = entry.load()
    except Exception as e:  # any error of a third party's import: one line, not its traceback
        raise UsageError(f"{where} does not load ({type(e).__name__}: {e}): fix or uninstall {package}") from e
    if isinstance(found, type) and issubclass(found, Stage):
        found = found()
    if not isinstance(found, Stage) or not found.name:
        raise UsageError(f"{where} names {found!r}, not a reproci.stages.base.Stage with a name: fix or uninstall "
                         f"{package}")
    return found


def compose(extra: tuple[Stage, ...] = ()) -> Stages:
    """This package's stages, then ``extra`` (the entry points' stages), checked: one name a stage,
    one option a name."""
    composed = Stages((*BUILTIN, *extra))
    try:
        Catalog(composed)
    except ValueError as e:
        raise UsageError(f"{e}: the stages of installed packages (entry points {GROUP}) clash; uninstall one") from e
    return composed


@functools.cache
def stages() -> Stages:
    """Every stage of this installation: this package's, then its entry points' (read once)."""
    found = sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name)
    return compose(tuple(_loaded(e) for e in found))


def catalog() -> Catalog:
    """The options of ``reproci run`` with every stage of this installation."""
    return catalog_of(stages())


def build_options(cli: Mapping[str, Any], env: Mapping[str, str] | None = None,
                  settings: Settings | None = None) -> RunOptions:
    """``settings.options.build`` with every stage of this installation: the frozen options of a
    command line (click parameter -> value) and its reproci.yaml."""
    return options_mod.build(cli, catalog(), env=env, settings=settings)


def read_settings(cli: Mapping[str, Any]) -> Settings:
    """A command line's settings (its reproci.yaml read once), with every stage's options."""
    return Settings.read(cli, catalog())
