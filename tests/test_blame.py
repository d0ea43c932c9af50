"""Upgrade blame (``pipeline/stages/blame.py``, ``pipeline/blame/images.py``) against a real
Docker engine: two images built here from the CPU test image plus tiny wheels built here, the
"upgrade" moving four packages: ``knob`` 1.0 → 2.0 (a constant the model trains with; its new
version pins ``knob-extra`` exactly, so the two move as a group), ``noop`` 1.0 → 1.1 (no number
changes) and ``abi`` 1.0 → 2.0 (imports only beside the new knob, as a compiled package needs
the torch it was built against). Blame names knob's group, clears noop, reports abi as not
swappable alone, and leaves no derived image behind."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from pipeline import errors, verdicts
from pipeline.blame import images as blame_images

from .helpers import PLUGINS, model_entry
from .test_docker_integration import IMAGE, engine  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker
MODEL = f"{PLUGINS / 'upgrade_pkgs.py'}:build"

PACKAGES = {
    "old": {"knob": ("1.0", "SCALE = 1.0\nVERSION = 1\n", []), "knob-extra": ("1.0", "", []),
            "noop": ("1.0", "NAME = 'noop'\n", []), "abi": ("1.0", "", [])},
    "new": {"knob": ("2.0", "SCALE = 1.0 + 2.0 ** -20\nVERSION = 2\n", ["knob-extra==2.0"]),
            "knob-extra": ("2.0", "", []), "noop": ("1.1", "NAME = 'noop'\nFASTER = True\n", []),
            "abi": ("2.0", "import knob\nif knob.VERSION < 2:\n    raise ImportError('abi 2.0 was built against knob 2')\n", [])},
}


def wheel(directory: Path, name: str, version: str, code: str, requires: list[str]) -> Path:
    """A pure-Python wheel of one module, with its METADATA, WHEEL and a RECORD of hashes."""
    module, dist = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}"
    files = {f"{module}.py": code, f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: " + name
             + f"\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: reproci-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(t.encode())}\n" for p, t in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in {**files, f"{dist}.dist-info/RECORD": record}.items():
            z.writestr(p, t)
    return path


@pytest.fixture(scope="module")
def upgrade(engine, tmp_path_factory):  # noqa: F811 - the imported fixture
    """The two images, tagged reproci-test/blame-{old,new}:1; removed afterwards."""
    tags = {}
    for side, packages in PACKAGES.items():
        ctx = tmp_path_factory.mktemp(f"blame-{side}")
        for name, (version, code, requires) in packages.items():
            wheel(ctx, name, version, code, requires)
        (ctx / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY *.whl /tmp/wheels/\n"
                                        "RUN python3 -m pip install -q --no-index --no-deps /tmp/wheels/*.whl "
                                        "&& rm -rf /tmp/wheels\n")
        tags[side] = f"reproci-test/blame-{side}:1"
        engine.images.build(path=str(ctx), tag=tags[side], rm=True, network_mode="none")
    yield tags
    for tag in tags.values():
        engine.images.remove(tag, force=True)


def test_blame_names_the_package_that_moved_the_numbers(upgrade, engine, reproci) -> None:  # noqa: F811
    common = ("--image-name", "blame-demo", "-m", MODEL, "--steps", "4", "--resume-at", "2")
    r = reproci("golden", "update", "--image", upgrade["old"], *common)
    assert r.returncode == 0, r.stdout + r.stderr
    r = reproci("run", "--image", upgrade["new"], *common, "--blame")
    assert r.returncode == errors.EXIT_DRIFT, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "upgrade_pkgs")
    assert entry["verdict"] == verdicts.UPGRADE_CHANGED
    blame = entry["blame"]
    assert blame["culprit"] == ["knob", "knob-extra"]  # the exact pin made them one group
    outcomes = {" ".join(t["group"]): t["outcome"] for t in blame["tried"]}
    assert outcomes == {"knob knob-extra": "reproduces", "noop": "does not", "abi": "cannot swap"}
    assert ("the change comes from knob 1.0 → 2.0 with knob-extra 1.0 → 2.0: alone it reproduces upgrade_pkgs's new "
            "hashes from step 1; noop 1.0 → 1.1 alone does not; abi 1.0 → 2.0 cannot be swapped alone") in blame["message"]
    assert "abi 2.0 was built against knob 2" in blame["message"]
    assert blame["cost"]["images_built"] == 3 and blame["cost"]["runs"] == 2
    assert "blame: the change comes from knob" in entry["golden"]["message"]  # the PR body's line
    assert "blame: the change comes from knob" in r.stdout
    assert not engine.images.list(filters={"label": blame_images.LABEL})  # every derived image removed


def test_groups_follow_exact_pins_transitively() -> None:
    new = {"dists": {"torch": {"requires": ["nvidia-cudnn-cu12==9.5.1.17; platform_system == 'Linux'",
                                            "triton==3.1.0", "numpy>=1.0", "sympy"]},
                     "nvidia-cudnn-cu12": {"requires": ["nvidia-cublas-cu12==12.4.5.8"]},
                     "nvidia-cublas-cu12": {"requires": []}, "triton": {"requires": []}, "numpy": {"requires": []}}}
    changed = ["numpy", "nvidia-cublas-cu12", "nvidia-cudnn-cu12", "torch", "triton"]
    assert blame_images.groups(changed, new) == [["numpy"], ["nvidia-cublas-cu12", "nvidia-cudnn-cu12", "torch", "triton"]]


def test_blame_needs_the_docker_backend(reproci) -> None:
    r = reproci("blame", "-m", "conv")
    assert r.returncode == 2 and "reproci blame compares images: name the new one with --image" in r.stderr
