"""Upgrade blame (``reproci/stages/blame/``, ``reproci/stages/blame/images.py``) against a real
Docker engine: two images built here from the CPU test image plus tiny wheels built here, the
"upgrade" moving four packages: ``knob`` 1.0 → 2.0 (a constant the model trains with; its new
version pins ``knob-extra`` exactly, so the two move as a group), ``noop`` 1.0 → 1.1 (no number
changes) and ``abi`` 1.0 → 2.0 (imports only beside the new knob, as a compiled package needs
the torch it was built against). Blame names knob's group, clears noop, reports abi as not
swappable alone, says each build and run as it starts and ends, and leaves no image behind:
no derived image, no first stage, no intermediate image, neither when it ends nor when SIGTERM
stops it. Images are counted among those built on the two test images (every image a blame
builds is), so that another user of the engine cannot change the count."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import signal
import zipfile
from pathlib import Path

import pytest

from reproci import errors, verdicts
from reproci.stages.blame import images as blame_images

from .helpers import PLUGINS, Cli, model_entry, said
from .test_docker_integration import IMAGE, engine, start  # noqa: F401 - the fixture

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


def built_on(engine, tags: dict[str, str]) -> set[str]:  # noqa: F811 - the imported fixture
    """Every local image, untagged and intermediate ones included, built on the two test images."""
    roots = {engine.images.get(t).id for t in tags.values()}
    parents = {i.id: i.attrs.get("Parent") or None for i in engine.images.list(all=True)}
    out = set()
    for image in parents:
        at = parents[image]
        while at is not None and at not in roots:
            at = parents.get(at)
        if at is not None:
            out.add(image)
    return out


COMMON = ("--image-name", "blame-demo", "-m", MODEL, "--steps", "4", "--resume-at", "2")


@pytest.fixture(scope="module")
def old_golden(upgrade, tmp_path_factory) -> Path:
    """The golden recorded in the old image, once for the module: its goldens directory."""
    cli = Cli(tmp_path_factory.mktemp("blame-golden"))
    r = cli("golden", "update", "--image", upgrade["old"], *COMMON)
    assert r.returncode == 0, r.stdout + r.stderr
    return cli.cwd / "goldens"


def test_blame_names_the_package_that_moved_the_numbers(upgrade, old_golden, engine, reproci) -> None:  # noqa: F811
    shutil.copytree(old_golden, reproci.cwd / "goldens")
    images_before = built_on(engine, upgrade)
    r = reproci("run", "--image", upgrade["new"], *COMMON, "--blame")
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
    assert built_on(engine, upgrade) == images_before  # no derived image, no first stage, no intermediate one
    assert not engine.images.list(all=True, filters={"label": blame_images.LABEL})
    progress = [re.sub(r"^\[\s*[\d.]+ s\] ", "", line) for line in r.stderr.splitlines() if line not in said(r.stderr)]
    for n, moves in enumerate(("abi 1.0 → 2.0", "knob 1.0 → 2.0, knob-extra 1.0 → 2.0", "noop 1.0 → 1.1"), 1):
        assert f"blame: image {n} ({moves}): build started" in progress, progress
        assert any(re.fullmatch(rf"blame: image {n} \({moves}\): built in \d+\.\d s", p) for p in progress), progress
    assert any(re.match(r"upgrade_pkgs: run blame1 failed after \d+\.\d s: .*abi 2\.0 was built against knob 2", p)
               for p in progress), progress  # abi's run, which cannot import beside the old knob
    for role in ("blame2", "blame3"):
        assert f"upgrade_pkgs: run {role} started (2 steps)" in progress, progress
        assert any(re.match(rf"upgrade_pkgs: run {role} done: 2 steps, .*\d s$", p) for p in progress), progress


def test_nothing_to_blame_is_said_and_a_stopped_blame_leaves_no_image(upgrade, old_golden, engine, reproci) -> None:  # noqa: F811
    """No golden (refused before any run), then no drift: one line each. Then a blame stopped by SIGTERM while it builds
    its second image (the first built, its first stage beside it): exit 143, and every image it
    built is gone."""
    images_before = built_on(engine, upgrade)
    r = reproci("blame", "--image", upgrade["new"], *COMMON)
    assert r.returncode == errors.EXIT_USAGE, r.stdout + r.stderr
    assert ("there is no golden for blame-demo (goldens/blame-demo.yaml); record one in the old image first: reproci "
            "golden update --image OLD --image-name blame-demo") in r.stderr
    shutil.copytree(old_golden, reproci.cwd / "goldens")
    r = reproci("blame", "--image", upgrade["old"], *COMMON)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to blame: every model matches the golden (the new image changed no result)" in r.stdout
    proc = start(reproci.cwd, "blame", "--image", upgrade["new"], *COMMON)
    seen = []
    for line in proc.stderr:  # the progress lines, as they come
        seen.append(line)
        if re.search(r"blame: image 2 \(.*\): build started", line):
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == errors.EXIT_TERMINATED, "".join(seen) + err
    assert "blame: image 1 (abi 1.0 → 2.0): built in" in "".join(seen)
    assert built_on(engine, upgrade) == images_before, "".join(seen) + err  # image 1, its stage, image 2's steps
    assert not engine.images.list(all=True, filters={"label": blame_images.LABEL})


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


@pytest.mark.parametrize("argv", [("blame",), ("run", "--blame"), ("run", "--stage", "blame")])
def test_blame_without_a_golden_is_refused_before_any_run(cli, tmp_path: Path, argv: tuple[str, ...]) -> None:
    """A blame compares with the golden of --image: with none it is one line and exit 2 at once,
    not runs in the new image followed by 'nothing to blame'."""
    results = tmp_path / "results"
    code, out, err = cli(*argv, "--image", "example.org/new:1", "--image-name", "new", "-m", "conv",
                         "--goldens-dir", str(tmp_path / "goldens"), "--results-dir", str(results))
    assert code == errors.EXIT_USAGE and out == "", err
    assert err == (f"error: {'--blame' if '--blame' in argv else '--stage blame'} compares the new image with the "
                   f"golden, which names the old one, and there is no golden for new ({tmp_path}/goldens/new.yaml); "
                   "record one in the old image first: reproci golden update --image OLD --image-name new")
    assert not results.exists()


def test_nothing_to_blame_names_the_verdicts_that_are_not_an_upgrade() -> None:
    from reproci.stages import blame

    doc = {"options": {"stages": ["determinism", "blame"]}, "image": {"name": "img"}, "golden": {"existed": True},
           "models": [{"model": "conv", "verdict": verdicts.ENV_CHANGED}, {"model": "m", "verdict": verdicts.NEW}]}
    assert blame.nothing(doc) == (
        "nothing to blame: no model is UPGRADE_CHANGED (conv ENV_CHANGED; m NEW): blame explains only a change that "
        "comes with changed packages; ENV_CHANGED is the host or the settings, not a package: reproci bisect puts "
        "the golden's back")
    doc["models"][0]["blame"] = {"message": "not blamed: ..."}
    assert blame.nothing(doc) is None  # a model's own message says why it was not blamed
    assert blame.nothing({**doc, "options": {"stages": ["determinism"]}}) is None
