"""``reproci blame``: the determinism check in the new image, the golden comparison, then the
upgrade blame by package (this package). The blame's own command, listed by its stage (``stage.py``)."""

from __future__ import annotations

from typing import Any

from ...commands.run import read_settings, run_command, run_with
from ...errors import UsageError


@run_command("blame", without=("script", "resume_script", "script_name"),  # blame re-runs factory models in images
             helps={"image": "The new image (required, here or as image: in reproci.yaml; a manifest name or any "
                             "reference): the golden names the old one.",
                    "backend": "Where the runs execute: docker (the default: blame runs images), or ray: each model a "
                               "cell on a Ray cluster, run there by the Docker backend, merged here (needs "
                               "reproci[ray]); slurm: each model a task of one Slurm job array (a filesystem shared "
                               "with the nodes)."})
def blame_cmd(**kwargs: Any) -> None:
    """Run the determinism check in --image and compare with the golden; for each model an upgrade
    changed, name the package (group) of the new image that alone reproduces the change."""
    settings = read_settings(kwargs)  # reproci.yaml, read once for the check and the run
    if settings("image", None) in (None, "", "local"):  # local: the local backend's name, one environment
        raise UsageError("reproci blame compares images: name the new one with --image, or image: in reproci.yaml "
                         "(the golden names the old one)")
    run_with("blame", kwargs, settings)
