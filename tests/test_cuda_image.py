"""The CUDA image built from the debootstrap base (``cuda13.0-torch2.14`` of docker/manifest.yaml),
on this GPU-less host: its wheels carry the CUDA, cuDNN and NCCL its labels say, the reference
matrix runs on the CPU inside it, ``--device cuda`` is an infrastructure error in one line, and
the CPU image's committed golden meets it as the real torch 2.13 → 2.14 upgrade.

Needs the image (``docker/build-image.sh cuda13.0-torch2.14``: about 3 GB of wheels). Skipped
without it, unless REPROCI_REQUIRE_CUDA_IMAGE=1, which ``.ci/run`` sets when it builds the
image (when docker/ changed since the image was last proven: ``.ci/cuda-image.verified``)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from reproci import errors, images, verdicts

from .helpers import ROOT, model_entry
from .test_docker_integration import engine  # noqa: F401 - the fixture

pytestmark = [pytest.mark.docker, pytest.mark.cuda_image]
NAME = "cuda13.0-torch2.14"
_VERSIONS = ("import json, torch; print(json.dumps({'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), "
             "'nccl': '.'.join(map(str, torch.cuda.nccl.version())), 'torch': torch.__version__, "
             "'gpu': torch.cuda.is_available()}))")


@pytest.fixture(scope="module")
def cuda_image(engine):  # noqa: F811 - the imported fixture
    tag = images.entries(ROOT / "docker" / "manifest.yaml")[NAME].tag
    try:
        return engine.images.get(tag)
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound, without importing docker here
        why = f"image {tag} is not built: docker/build-image.sh {NAME}"
        if os.environ.get("REPROCI_REQUIRE_CUDA_IMAGE") == "1":
            pytest.fail(f"REPROCI_REQUIRE_CUDA_IMAGE=1 but {why}")
        pytest.skip(why)


def test_the_wheels_carry_what_the_labels_say(engine, cuda_image) -> None:  # noqa: F811
    labels = cuda_image.labels
    out = json.loads(engine.containers.run(cuda_image.id, ["python3", "-c", _VERSIONS], remove=True,
                                           network_disabled=True).decode())
    assert out["torch"] == "2.14.1+cu130" and out["gpu"] is False  # a CUDA build, on a host without a GPU
    assert (out["cuda"], str(out["cudnn"]), out["nccl"]) == (
        labels["reproci.image.cuda"], labels["reproci.image.cudnn"], labels["reproci.image.nccl"])
    assert labels["reproci.image.name"] == NAME


def test_the_reference_matrix_runs_on_the_cpu_inside_it(reproci, cuda_image) -> None:
    r = reproci("run", "--image", NAME, "--device", "cpu", "--steps", "8", "--resume-at", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = reproci.latest()
    assert {m["model"]: m["verdict"] for m in doc["models"]} == {m: verdicts.NEW for m in ("conv", "transformer",
                                                                                            "embedding")}
    assert doc["environment"]["torch"] == "2.14.1+cu130" and doc["environment"]["cuda"] == "13.0"


def test_cuda_on_a_host_without_a_gpu_is_one_line_and_exit_5(reproci, cuda_image) -> None:
    r = reproci("run", "--image", NAME, "--device", "cuda", "-m", "conv", "--steps", "2")
    assert r.returncode == errors.EXIT_INFRA, r.stdout + r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "GPU" in said[0], r.stderr


def test_the_cpu_golden_meets_the_real_torch_upgrade(reproci, cuda_image) -> None:
    """The committed golden of cpu-torch2.13 (torch 2.13.0+cpu), and this image's torch 2.14.1 on
    the same CPU kernel cap: the upgrade as users meet it, said whichever way it goes."""
    shutil.copytree(ROOT / "goldens", reproci.cwd / "goldens")
    r = reproci("run", "--image", NAME, "--image-name", "cpu-torch2.13", "--device", "cpu")
    doc = reproci.latest()
    for m in ("conv", "transformer", "embedding"):
        entry = model_entry(doc, m)
        assert entry["verdict"] in (verdicts.PASS, verdicts.UPGRADE_CHANGED), entry["message"]
        if entry["verdict"] == verdicts.PASS:
            assert "unchanged by the upgrade torch 2.13.0+cpu → 2.14.1+cu130" in entry["message"]
        else:
            assert "torch 2.13.0+cpu → 2.14.1+cu130" in entry["message"]
    assert r.returncode in (0, errors.EXIT_DRIFT)
