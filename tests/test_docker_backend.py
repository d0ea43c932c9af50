"""The Docker backend's translations, without an engine: paths and mounts, environment,
GPU requests, error messages, digests, and image names from the manifest."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path, PurePosixPath

import docker.errors
import pytest

from pipeline import errors, images
from pipeline.backends import docker_backend as db
from pipeline.worker.spec import WorkerSpec

from .conftest import PLUGINS, ROOT

REGISTRY = ("conv", "transformer", "embedding")


def spec(**kw) -> WorkerSpec:
    return WorkerSpec(**{"model_ref": "embedding", "model_name": "embedding", "role": "A", "steps": 8, **kw})


def test_reference_models_and_relative_paths_pass_through_unchanged(tmp_path):
    s = spec(checkpoint_at=4, checkpoint_path="ckpt-4.pt", output="record-A.json", resume_from="ckpt-2.pt")
    out, binds = db.translate_spec(s, tmp_path, registry=REGISTRY)
    assert out == s and binds == []


def test_a_plugin_file_gets_its_directory_mounted_read_only_and_its_reference_rewritten(tmp_path):
    s = spec(model_ref=f"{PLUGINS / 'faulty.py'}:crash_at_step_3", model_name="faulty.crash_at_step_3")
    out, binds = db.translate_spec(s, tmp_path, registry=REGISTRY)
    target = db.plugin_target(PLUGINS)
    assert out.model_ref == f"{target}/faulty.py:crash_at_step_3"
    assert str(target).startswith("/reproci/plugins/")
    assert binds == [db.Bind(PLUGINS, target, read_only=True)]
    # the same directory always lands in the same place: specs of one model stay comparable
    assert db.translate_spec(s, tmp_path / "other", registry=REGISTRY)[0].model_ref == out.model_ref


def test_a_plugin_module_mounts_only_its_top_level_package_and_puts_it_on_the_worker_path(tmp_path):
    s = spec(model_ref="tests.plugins.faulty:private_rng_exposed")
    out, binds = db.translate_spec(s, tmp_path, registry=REGISTRY)
    tests_dir = ROOT / "tests"
    assert out.model_ref == s.model_ref
    assert binds == [db.Bind(tests_dir, db.plugin_target(tests_dir) / "tests", read_only=True)]
    assert out.plugin_paths == (str(db.plugin_target(tests_dir)),)


def test_a_module_that_does_not_resolve_here_is_left_to_the_image(tmp_path):
    out, binds = db.translate_spec(spec(model_ref="team_models.ranker:build"), tmp_path, registry=REGISTRY)
    assert out.model_ref == "team_models.ranker:build" and binds == [] and out.plugin_paths == ()


def test_absolute_paths_move_under_the_run_mount_and_outside_ones_are_refused(tmp_path):
    run = tmp_path / "results" / "r1"
    s = spec(checkpoint_path=str(run / "embedding" / "ckpt-4.pt"), plugin_paths=(str(PLUGINS),))
    out, binds = db.translate_spec(s, run, registry=REGISTRY)
    assert out.checkpoint_path == "/reproci/run/embedding/ckpt-4.pt"
    assert out.plugin_paths == (str(db.plugin_target(PLUGINS)),) and binds[0].source == PLUGINS
    with pytest.raises(ValueError, match="outside the run directory"):
        db.translate_spec(spec(dump_path="/etc/dump.pt"), run, registry=REGISTRY)
    path_fields = [f.name for f in dataclasses.fields(WorkerSpec) if f.name.endswith("_path")]
    assert {"checkpoint_path", "dump_path"} <= set(path_fields)  # every *_path field is translated


def test_only_the_worker_packages_are_mounted_and_all_read_only():
    binds = db.code_binds()
    assert [(b.source, str(b.target)) for b in binds] == [
        (ROOT / "pipeline", "/reproci/code/pipeline"), (ROOT / "reference_models", "/reproci/code/reference_models")]
    assert all(b.read_only and b.source.is_dir() for b in binds)
    m = binds[0].mount()
    assert m["Type"] == "bind" and m["ReadOnly"] is True and m["Target"] == "/reproci/code/pipeline"
    assert db.container_path(Path("/r/run1/conv/spec-A.json"), Path("/r/run1")) == PurePosixPath(
        "/reproci/run/conv/spec-A.json")


def test_the_container_environment_is_explicit_and_inherits_nothing(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    env = db.environment(spec(threads=2, seed=7))
    assert env == {"PYTHONHASHSEED": "7", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2",
                   "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONPATH": "/reproci/code",
                   "HOME": "/tmp"}
    assert "CUBLAS_WORKSPACE_CONFIG" not in db.environment(spec(mode="default"))


@pytest.mark.parametrize("text, count, ids", [
    ("all", -1, []), ("2", 2, []), ("0,1", None, ["0", "1"]), ("device=3", None, ["3"]),
    ("GPU-8f6e1c2a-1b2c-4d5e-9f00-aabbccddeeff", None, ["GPU-8f6e1c2a-1b2c-4d5e-9f00-aabbccddeeff"]),
])
def test_gpus_become_device_requests(text, count, ids):
    (req,) = db.device_requests(text)
    assert req["Capabilities"] == [["gpu"]]
    assert req["Count"] == (count if count is not None else 0) and req["DeviceIDs"] == ids


@pytest.mark.parametrize("text", ["0", "one gpu", "1;2", "device="])
def test_bad_gpus_are_usage_errors(text):
    with pytest.raises(errors.UsageError, match="--gpus"):
        db.device_requests(text)


def test_no_gpus_no_device_request():
    assert db.device_requests(None) == [] and db.device_requests("") == []


def test_containers_run_as_the_invoking_user_unless_the_engine_is_rootless():
    assert db.container_user(1000, 1001, rootless=False) == "1000:1001"
    assert db.container_user(1000, 1001, rootless=True) == "0:0"


def test_engine_errors_are_one_line_infrastructure_errors():
    e = db.engine_error(docker.errors.DockerException(
        "Error while fetching server API version: ('Connection aborted.', FileNotFoundError(2, "
        "'No such file or directory'))"), "unix:///nonexistent.sock")
    assert isinstance(e, errors.InfrastructureError) and e.return_code == errors.EXIT_INFRA
    assert str(e) == ("cannot reach the Docker engine at unix:///nonexistent.sock (no socket there): "
                      "start dockerd or set DOCKER_HOST")


@pytest.mark.parametrize("explanation, gpus, fragment", [
    (('failed to create shim task: OCI runtime create failed: runc create failed: unable to start container '
      'process: exec: "python3": executable file not found in $PATH: unknown'), None, "has no python3"),
    ('could not select device driver "" with capabilities: [[gpu]]', "all", "GPUs were requested (--gpus all)"),
    ("invalid mount config for type \"bind\": bind source path does not exist", None, "could not start a container"),
])
def test_start_errors_name_their_cause(explanation, gpus, fragment):
    e = db.start_error("img:1", docker.errors.APIError("500 Server Error", explanation=explanation), gpus)
    assert isinstance(e, errors.InfrastructureError) and fragment in str(e) and "\n" not in str(e)


def test_the_digest_is_the_repositorys_registry_digest_else_the_image_id():
    attrs = {"Id": "sha256:" + "a" * 64, "RepoDigests": ["other/x@sha256:" + "b" * 64, "team/img@sha256:" + "c" * 64]}
    assert db.image_digest(attrs, "team/img:1") == "sha256:" + "c" * 64
    assert db.image_digest(attrs, "localhost:5000/unknown") == "sha256:" + "b" * 64
    assert db.image_digest({"Id": "sha256:" + "a" * 64, "RepoDigests": []}, "team/img:1") == "sha256:" + "a" * 64
    assert db.image_digest(attrs, "team/img@sha256:" + "d" * 64) == "sha256:" + "d" * 64


def test_manifest_names_resolve_to_their_tags_and_other_references_pass_through(tmp_path):
    tag, entry = images.resolve("cpu-torch2.13")
    assert tag == "reproci/cpu-torch2.13:1" and entry is not None and entry.gpu is False
    assert entry.key_packages()["torch"] == "2.13.0+cpu"
    assert images.resolve("reproci/cpu-torch2.13:1")[1] == entry
    assert images.resolve("nvcr.io/nvidia/pytorch:24.05-py3") == ("nvcr.io/nvidia/pytorch:24.05-py3", None)
    assert images.resolve("cpu-torch2.13", tmp_path / "none.yaml") == ("cpu-torch2.13", None)
    gpu = images.entries()
    assert any(e.gpu for e in gpu.values())  # GPU images are marked, so their runs request GPUs


def test_building_an_unknown_image_is_a_usage_error(capsys):
    from pipeline.cli import main

    assert main(["images", "build", "no-such-image"]) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no image no-such-image" in err and "cpu-torch2.13" in err


def test_only_the_docker_backend_imports_the_docker_sdk():
    for f in (ROOT / "pipeline").rglob("*.py"):
        tree = ast.parse(f.read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        if f.name != "docker_backend.py":
            assert "docker" not in roots, f"{f.relative_to(ROOT)} imports docker"
