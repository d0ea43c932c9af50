"""Where a run's cells go beyond one machine: one interface, ``ClusterEngine``, and the table of
the engines that implement it, by their ``--backend`` name. An engine places the cells
(``cells.model_cell``), follows them, and makes what comes back one run (``combine``), as one
machine would have written it. Each is imported when a run asks for it (Ray only where used)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

from ..results import ResultsDocument
from ..settings.options import RunOptions
from .combine import Publish

# --backend NAME -> the module that implements ClusterEngine
ENGINES: dict[str, str] = {"ray": "reproci.cluster.ray_driver", "slurm": "reproci.cluster.slurm_driver"}


class ClusterEngine(Protocol):
    def run_cells(self, options: RunOptions, cluster: Any, cell_options: dict[str, Any],
                  progress: Callable[[str], None], publish: Publish) -> tuple[ResultsDocument, Path, list[str]]:
        """Run every model's cell (``cell_options``: what each cell's run receives,
        ``settings.declared.for_cell``; ``cluster``: the engine's own options, checked once);
        return the combined document (``publish``ed as one machine's), its path, and one line
        per cell lost."""
        ...


def engine(backend: str) -> ClusterEngine:
    """The engine of ``--backend NAME`` (a name of ``ENGINES``)."""
    return cast(ClusterEngine, importlib.import_module(ENGINES[backend]))


if TYPE_CHECKING:  # each module of the table implements the interface, as the type checker sees it
    from . import ray_driver, slurm_driver

    _ENGINES: tuple[ClusterEngine, ...] = (ray_driver, slurm_driver)
