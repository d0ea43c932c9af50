"""The environments of the blame: the golden's image with one package (or group) from the new
image laid in, built offline.

``inventory`` asks an image which files each changed distribution installed (its
``*.dist-info/RECORD``), what it requires, and its Python. ``groups`` joins the packages that
must move together: a distribution whose new version pins another changed one exactly
(``Requires-Dist: nvidia-cudnn-cu12==9.5.1.17``, as torch pins its CUDA wheels and triton)
moves with it, transitively. ``derive`` builds the golden's image with a group's files swapped
in: a first stage from the new image copies exactly the group's RECORD files into a staging
tree, and the final stage, from the golden's image, deletes the files of the group's old
versions and copies the staging tree over ``/``. Nothing is downloaded. Every stage starts
with a ``LABEL`` of ``org.reproci.blame`` and of the blame's own run key
(``org.reproci.blame.run``), so each image the builds make carries them, the first stage's
and the intermediate ones too; ``remove_built`` removes them all by ID when the blame ends or
is stopped, and ``docker image prune -a --filter label=org.reproci.blame`` any that a killed
blame left.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

LABEL = "org.reproci.blame"
RUN_LABEL = f"{LABEL}.run"  # the blame that built the image (``run_key``)
STAGE = "/reproci-swap"
PASSES = 5  # of remove_built

# Runs in an image (stdlib only): the Python, and each named distribution's files and requirements.
_INVENTORY = r"""
import importlib.metadata as md, json, re, sys, sysconfig
names = set(json.loads(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
out = {"python": "%d.%d" % sys.version_info[:2], "purelib": sysconfig.get_paths()["purelib"], "dists": {}}
for d in md.distributions():
    name = d.metadata.get("Name") or ""
    if norm(name) in names and norm(name) not in out["dists"]:
        out["dists"][norm(name)] = {"version": d.version, "requires": d.requires or [],
                                    "files": sorted(str(d.locate_file(f).resolve()) for f in (d.files or []))}
print(json.dumps(out))
"""
_COPY_IN = r"""
import os, shutil, sys
for line in open(sys.argv[1]):
    src = line.rstrip("\n")
    if src and os.path.lexists(src):
        dst = sys.argv[2] + src
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
"""
_REMOVE = r"""
import os, sys
for line in open(sys.argv[1]):
    path = line.rstrip("\n")
    if path and (os.path.isfile(path) or os.path.islink(path)):
        os.remove(path)
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class Dist(TypedDict):
    """An installed distribution, as the inventory lists it."""

    version: str
    requires: list[str]
    files: list[str]  # resolved paths


class Inventory(TypedDict):
    """An image's Python and the named distributions installed in it (``_INVENTORY``'s output)."""

    python: str  # 3.11
    purelib: str
    dists: dict[str, Dist]  # by normalised name


def inventory(engine: Any, image: str, names: list[str]) -> Inventory:
    """The image's Python and, for each of ``names`` installed in it, its version, files and requirements."""
    found: Inventory = json.loads(engine.output(image, ["python3", "-c", _INVENTORY,
                                                             json.dumps(sorted(norm(n) for n in names))]))
    return found


_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*===?\s*([^\s;,]+)")


def groups(changed: list[str], new: Inventory) -> list[list[str]]:
    """The changed packages as groups that move together: joined where one's new version pins
    another changed package exactly (``==``), transitively; each group sorted, the groups in order."""
    parent = {n: n for n in changed}

    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    for name in changed:
        for req in _dist(new, name)["requires"]:
            m = _PIN.match(req)
            if m and norm(m.group(1)) in parent and "extra ==" not in req:
                parent[root(norm(m.group(1)))] = root(name)
    out: dict[str, list[str]] = {}
    for name in changed:
        out.setdefault(root(name), []).append(name)
    return sorted((sorted(g) for g in out.values()), key=lambda g: g[0])


def _dist(found: Inventory, name: str) -> Dist:
    """A distribution of the inventory; with nothing where the image does not have it."""
    return found["dists"].get(name) or {"version": "", "requires": [], "files": []}


def unswappable(group: list[str], old: Inventory, new: Inventory) -> str | None:
    """Why a group cannot be laid into the golden's image, or None."""
    if old["python"] != new["python"]:
        return f"the images have different Pythons ({old['python']} and {new['python']}): wheels are built per Python"
    if old["purelib"] != new["purelib"]:
        return f"the images install packages in different places ({old['purelib']} and {new['purelib']})"
    return None


def tag_for(old_id: str, new_id: str, group: list[str], run: str) -> str:
    """'reproci-blame/<hash>:<packages>', of this blame's own (two blames never share a tag)."""
    key = hashlib.sha256(f"{old_id} {new_id} {' '.join(group)} {run}".encode()).hexdigest()[:12]
    return f"reproci-blame/{key}:{'-'.join(group)[:100]}"


def run_key() -> str:
    """A key of one blame's own, the value of ``RUN_LABEL`` on every image it builds."""
    return uuid.uuid4().hex[:16]


def dockerfile(old_id: str, new_id: str, run: str) -> str:
    """The two stages; each starts with the labels, so every image either builds carries them."""
    stamp = f'LABEL {LABEL}="1" {RUN_LABEL}="{run}"\n'
    return (f"FROM {new_id} AS new\n{stamp}COPY take.txt copy_in.py /tmp/reproci/\n"
            f"RUN python3 /tmp/reproci/copy_in.py /tmp/reproci/take.txt {STAGE}\n"
            f"FROM {old_id}\n{stamp}COPY drop.txt remove.py /tmp/reproci/\n"
            f"RUN python3 /tmp/reproci/remove.py /tmp/reproci/drop.txt && rm -rf /tmp/reproci\n"
            f"COPY --from=new {STAGE}/ /\n")


def derive(engine: Any, old_id: str, new_id: str, group: list[str], old: Inventory, new: Inventory, *,
           run: str) -> str:
    """Build the golden's image with ``group``'s files from the new image; its tag."""
    take = [f for n in group for f in _dist(new, n)["files"]]
    drop = [f for n in group for f in _dist(old, n)["files"]]
    tag = tag_for(old_id, new_id, group, run)
    with tempfile.TemporaryDirectory(prefix="reproci-blame-") as tmp:
        ctx = Path(tmp)
        (ctx / "take.txt").write_text("".join(f"{f}\n" for f in take))
        (ctx / "drop.txt").write_text("".join(f"{f}\n" for f in drop))
        (ctx / "copy_in.py").write_text(_COPY_IN)
        (ctx / "remove.py").write_text(_REMOVE)
        (ctx / "Dockerfile").write_text(dockerfile(old_id, new_id, run))
        labels = {LABEL: "1", RUN_LABEL: run, f"{LABEL}.base": old_id, f"{LABEL}.from": new_id,
                  f"{LABEL}.swap": " ".join(group)}
        engine.build(str(ctx), tag, labels)
    return tag


def remove_built(engine: Any, run: str, *, stopped: bool = False) -> list[str]:
    """Remove every container and image of blame ``run``, each image by ID: the derived images,
    their first stages and the intermediate images of every step, a stopped build's too; the IDs
    the engine kept. An image goes once its children have, so it can take a second pass; after
    a stop the engine may still commit the step it was cancelling, so it looks once more."""
    label = f"{RUN_LABEL}={run}"
    for n in range(PASSES):
        if n:
            time.sleep(0.5)
        engine.remove_labelled(label)  # a build step's container carries its image's labels
        ids = engine.image_ids_labelled(label)
        if not ids and (n or not stopped):
            return []
        for image_id in ids:
            engine.remove_image(image_id)
    left: list[str] = engine.image_ids_labelled(label)
    return left
