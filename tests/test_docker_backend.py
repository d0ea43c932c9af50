"""The Docker backend's translations, without an engine: paths and mounts, environment,
GPU requests, error messages, digests, the preflight's verdict, and options resolved once."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path, PurePosixPath

import docker.errors
import pytest

from reproci import errors
from reproci.backends import docker_backend
from reproci.backends import docker_engine as engine
from reproci.backends import docker_spec as ds
from reproci.plugins import build_options
from reproci.worker.process.spec import WorkerSpec

from .helpers import PLUGINS, ROOT

REGISTRY = ("conv", "transformer", "embedding")


def spec(**kw) -> WorkerSpec:
    return WorkerSpec(**{"model_ref": "embedding", "model_name": "embedding", "role": "A", "steps": 8, **kw})


def test_reference_models_and_relative_paths_pass_through_unchanged(tmp_path):
    s = spec(checkpoint_at=4, checkpoint_path="ckpt-4.pt", output="record-A.json", resume_from="ckpt-2.pt")
    out, binds = ds.translate_spec(s, tmp_path, registry=REGISTRY)
    assert out == s and binds == []


def test_a_plugin_file_gets_its_directory_mounted_read_only_and_its_reference_rewritten(tmp_path):
    s = spec(model_ref=f"{PLUGINS / 'faulty.py'}:crash_at_step_3", model_name="faulty.crash_at_step_3")
    out, binds = ds.translate_spec(s, tmp_path, registry=REGISTRY)
    target = ds.plugin_target(PLUGINS)
    assert out.model_ref == f"{target}/faulty.py:crash_at_step_3"
    assert str(target).startswith("/reproci/plugins/")
    assert binds == [ds.Bind(PLUGINS, target, read_only=True)]
    # the same directory always lands in the same place: specs of one model stay comparable
    assert ds.translate_spec(s, tmp_path / "other", registry=REGISTRY)[0].model_ref == out.model_ref


def test_a_plugin_module_mounts_only_its_top_level_package_and_puts_it_on_the_worker_path(tmp_path):
    s = spec(model_ref="tests.plugins.faulty:private_rng_exposed")
    out, binds = ds.translate_spec(s, tmp_path, registry=REGISTRY)
    tests_dir = ROOT / "tests"
    assert out.model_ref == s.model_ref
    assert binds == [ds.Bind(tests_dir, ds.plugin_target(tests_dir) / "tests", read_only=True)]
    assert out.plugin_paths == (str(ds.plugin_target(tests_dir)),)


def test_a_module_that_does_not_resolve_here_is_left_to_the_image(tmp_path):
    out, binds = ds.translate_spec(spec(model_ref="team_models.ranker:build"), tmp_path, registry=REGISTRY)
    assert out.model_ref == "team_models.ranker:build" and binds == [] and out.plugin_paths == ()


def test_absolute_paths_move_under_the_run_mount_and_outside_ones_are_refused(tmp_path):
    run = tmp_path / "results" / "r1"
    s = spec(checkpoint_path=str(run / "embedding" / "ckpt-4.pt"), plugin_paths=(str(PLUGINS),))
    out, binds = ds.translate_spec(s, run, registry=REGISTRY)
    assert out.checkpoint_path == "/reproci/run/embedding/ckpt-4.pt"
    assert out.plugin_paths == (str(ds.plugin_target(PLUGINS)),) and binds[0].source == PLUGINS
    with pytest.raises(ValueError, match="outside the run directory"):
        ds.translate_spec(spec(dump_path="/etc/dump.pt"), run, registry=REGISTRY)
    path_fields = [f.name for f in dataclasses.fields(WorkerSpec) if f.name.endswith("_path")]
    assert {"checkpoint_path", "dump_path"} <= set(path_fields)  # every *_path field is translated


def test_only_the_worker_packages_are_mounted_and_all_read_only():
    binds = ds.code_binds()
    assert [(b.source, str(b.target)) for b in binds] == [
        (ROOT / "reproci", "/reproci/code/reproci")]  # the reference models inside it
    assert all(b.read_only and b.source.is_dir() for b in binds)
    m = engine.mount(binds[0])
    assert m["Type"] == "bind" and m["ReadOnly"] is True and m["Target"] == "/reproci/code/reproci"
    assert ds.container_path(Path("/r/run1/conv/spec-A.json"), Path("/r/run1")) == PurePosixPath(
        "/reproci/run/conv/spec-A.json")


def test_the_container_environment_is_explicit_and_inherits_nothing(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    env = ds.environment(spec(threads=2, seed=7))
    assert env == {"PYTHONHASHSEED": "7", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2",
                   "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONPATH": "/reproci/code",
                   "HOME": "/tmp"}
    assert "CUBLAS_WORKSPACE_CONFIG" not in ds.environment(spec(mode="default"))


@pytest.mark.parametrize("text, count, ids", [
    ("all", -1, []), ("2", 2, []), ("0,1", None, ["0", "1"]), ("device=3", None, ["3"]),
    ("GPU-8f6e1c2a-1b2c-4d5e-9f00-aabbccddeeff", None, ["GPU-8f6e1c2a-1b2c-4d5e-9f00-aabbccddeeff"]),
])
def test_gpus_become_device_requests(text, count, ids):
    (req,) = engine.device_requests(text)
    assert req["Capabilities"] == [["gpu"]]
    assert req["Count"] == (count if count is not None else 0) and req["DeviceIDs"] == ids


@pytest.mark.parametrize("text", ["0", "one gpu", "1;2", "device="])
def test_bad_gpus_are_usage_errors(text):
    with pytest.raises(errors.UsageError, match="--gpus"):
        engine.device_requests(text)


def test_no_gpus_no_device_request():
    assert engine.device_requests(None) == [] and engine.device_requests("") == []


def test_containers_run_as_the_invoking_user_unless_the_engine_is_rootless():
    assert ds.container_user(1000, 1001, rootless=False) == "1000:1001"
    assert ds.container_user(1000, 1001, rootless=True) == "0:0"


def test_engine_errors_are_one_line_infrastructure_errors():
    e = engine.engine_error(docker.errors.DockerException(
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
    e = engine.start_error("img:1", docker.errors.APIError("500 Server Error", explanation=explanation), gpus)
    assert isinstance(e, errors.InfrastructureError) and fragment in str(e) and "\n" not in str(e)


def test_the_digest_is_the_repositorys_registry_digest_else_the_image_id():
    attrs = {"Id": "sha256:" + "a" * 64, "RepoDigests": ["other/x@sha256:" + "b" * 64, "team/img@sha256:" + "c" * 64]}
    assert engine.image_digest(attrs, "team/img:1") == "sha256:" + "c" * 64
    assert engine.image_digest(attrs, "localhost:5000/unknown") == "sha256:" + "b" * 64
    assert engine.image_digest({"Id": "sha256:" + "a" * 64, "RepoDigests": []}, "team/img:1") == "sha256:" + "a" * 64
    assert engine.image_digest(attrs, "team/img@sha256:" + "d" * 64) == "sha256:" + "d" * 64


def test_only_the_engine_module_imports_the_docker_sdk():
    for f in (ROOT / "reproci").rglob("*.py"):
        tree = ast.parse(f.read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        if f.name != "docker_engine.py":
            assert "docker" not in roots, f"{f.relative_to(ROOT)} imports the docker SDK"


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module a file imports, anywhere in it (functions and TYPE_CHECKING blocks too), made absolute."""
    found: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - n.level + 1] if n.level else []
            target = ".".join(base + ([n.module] if n.module else []))
            found |= {target} | {f"{target}.{a.name}" for a in n.names}
    return found


def test_no_backend_module_imports_the_manifest_or_the_options():
    """The image is resolved once, in options.build (which imports images, which imports
    backends); a backend reads only what the options carry, so no import circle is left."""
    for f in (ROOT / "reproci" / "backends").glob("*.py"):
        imported = imported_modules(f, "reproci.backends")
        assert not imported & {"reproci.images", "reproci.settings.options"}, f"{f.name} imports {imported}"
    assert "reproci.images" in imported_modules(ROOT / "reproci" / "settings" / "options.py", "reproci.settings")  # the check can see it


GPU_MANIFEST = """\
version: 1
images:
  cpu-x: {tag: "reproci/cpu-x:1", base: {image: "base:1"}, requirements: req.txt}
  gpu-y: {tag: "reproci/gpu-y:1", base: {image: "nvidia/cuda:12"}, requirements: req.txt, gpu: true}
"""


@pytest.mark.parametrize("cli, gpus", [
    ({"image": "gpu-y"}, "all"),  # a GPU image of the manifest asks for the GPUs by itself
    ({"image": "reproci/gpu-y:1"}, "all"),  # by tag too
    ({"image": "gpu-y", "gpus": "0,1"}, "0,1"),
    ({"image": "cpu-x"}, None),
    ({"image": "cpu-x", "device": "cuda"}, "all"),
    ({"image": "team/unknown:3"}, None),
])
def test_gpus_requested_follow_the_options_resolved_from_the_manifest(tmp_path, monkeypatch, cli, gpus):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(GPU_MANIFEST)
    monkeypatch.chdir(tmp_path)
    assert docker_backend.requested_gpus(build_options(cli, env={})) == gpus


def test_the_docker_backend_refuses_options_not_made_by_build():
    from reproci.settings.options import RunOptions

    with pytest.raises(ValueError, match="options.build"):
        docker_backend.DockerBackend(RunOptions(models=(), image="reproci/cpu-torch2.13:1"))


def preflight_line(**found) -> str:
    return "REPROCI-PREFLIGHT " + json.dumps({"python": [3, 11, 2], "missing": [], "torch": "2.13.0", **found})


def test_the_preflight_returns_what_the_image_has():
    found = docker_backend.preflight_verdict("img:1", 0, ["noise", preflight_line()], cuda=False)
    assert found["torch"] == "2.13.0" and found["python"] == [3, 11, 2]


@pytest.mark.parametrize("code, tail, cuda, fragment", [
    (None, [], False, "did not run `python3 -c ...` within 120 s"),
    (127, ['exec: "python3": executable file not found'], False, "image img:1 has no python3 on its PATH"),
    (1, ["Traceback", "SyntaxError: bad"], False, "failed a start-up check (exit 1): SyntaxError: bad"),
    (0, [preflight_line(python=[3, 8, 10])], False, "python3 in image img:1 is 3.8.10; the worker needs 3.10"),
    (0, [preflight_line(missing=["torch"])], False, "image img:1 has python3 but no torch"),
    (0, [preflight_line(cuda_devices=0)], True, "--device cuda was asked for but torch in image img:1 sees no GPU"),
])
def test_the_preflight_names_what_the_image_lacks(code, tail, cuda, fragment):
    with pytest.raises(errors.InfrastructureError) as e:
        docker_backend.preflight_verdict("img:1", code, tail, cuda=cuda)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_every_container_is_made_without_network_privileges_or_a_writable_root_and_within_its_limits():
    """The create keywords of every container (worker, preflight, fork server); the Ctrl-C test in
    tests/test_docker_integration.py reads the same back from a live container."""
    config = ds.container_config(ds.Limits(memory=512 * 1024**2, pids=64))
    assert config["network_mode"] == "none" and config["cap_drop"] == ["ALL"]
    assert config["security_opt"] == ["no-new-privileges"]
    assert config["read_only"] is True and set(config["tmpfs"]) == {"/tmp"}  # HOME is /tmp: every cache goes there
    assert config["mem_limit"] == config["memswap_limit"] == 512 * 1024**2 and config["pids_limit"] == 64
    assert set(config) <= engine._HOST_CONFIG_KEYS  # each one reaches the engine's HostConfig


@pytest.mark.parametrize("code, oom, tail, said", [
    (137, True, [], "the container hit its memory limit (512 MiB): raise it with --memory"),
    (1, False, ["BlockingIOError: [Errno 11] Resource temporarily unavailable"],
     "the container hit its process limit (64 processes and threads): raise it with --pids-limit"),
    (1, False, ["RuntimeError: can't start new thread"], "the container hit its process limit (64"),
    (1, False, ["ValueError: bad shape"], None),  # a crash of its own
    (0, True, [], None),  # a finished run: whatever the engine remembers, no limit stopped it
])
def test_a_run_stopped_by_a_container_limit_is_named_in_one_line(code, oom, tail, said):
    line = ds.limit_hit(code, oom, tail, ds.Limits(memory=512 * 1024**2, pids=64))
    assert (line is None) if said is None else (line.startswith(said) and "\n" not in line)


def test_a_run_that_timed_out_with_every_process_slot_taken_is_named_by_the_process_limit():
    """A fork bomb that tries again when refused never fails: its run times out (no exit code of its own)."""
    limits = ds.Limits(memory=512 * 1024**2, pids=64)
    assert ds.limit_hit(None, False, [], limits) is None  # a timeout alone
    line = ds.limit_hit(None, False, [], limits, timed_out_at_process_limit=True)
    assert line is not None and line.startswith("the container hit its process limit (64 processes and threads)")
