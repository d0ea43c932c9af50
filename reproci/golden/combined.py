"""One golden from parts recorded apart: ``reproci run --backend ray`` records each model's
golden in its cell, on its node, and the driver alone writes the image's file from them,
with the store's own lock, checks and write order (``store``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GoldenError
from . import store


def write_combined(goldens_dir: Path, image_name: str, document: dict[str, Any], parts: list[store.Golden]) -> Path:
    """Record the goldens that several cells recorded apart (``reproci run --backend ray``: one
    model each, on their nodes) as one file, as one run of them all would have: each model's
    entry and arrays as its cell recorded them, under this document's run id. Models of the old
    file that no cell re-recorded are kept on the same terms as ``write``."""
    path = store.path_for(goldens_dir, image_name)
    with store.locked(goldens_dir, image_name):
        try:
            old = store.load(goldens_dir, image_name)
        except GoldenError:
            old = None
        recorded = {name: g for part in parts for name, g in part.models.items()}
        kept = {} if old is None else store._kept_models(old, dict.fromkeys(recorded), document)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        arrays: dict[str, np.ndarray] = {}
        models_yaml: dict[str, Any] = {}
        for name, g in sorted({**kept, **recorded}.items()):
            models_yaml[name] = {**g.entry, "run_id": document.get("run_id")} if name in recorded else g.entry
            store._add_arrays(arrays, name, g.names, g.fingerprints, g.batch_fingerprints, g.state, g.tensor_sha256, g.ops)
        store._commit(goldens_dir, image_name, old, document, models_yaml, arrays, now)
    return path
