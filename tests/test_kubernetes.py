"""``reproci matrix --format k8s``: the Kubernetes objects that run the matrix on a cluster.

No API server runs here: every object emitted is validated against the official schemas of
Kubernetes 1.37 (the newest kubernetes-validate bundles) and 1.29 (the first release where
``backoffLimitPerIndex`` is on by default) in strict mode, unknown fields refused; a corrupted
object is shown to fail the same validation. The properties the runbook relies on are read back
from the YAML, the Pod Security "restricted" rules are checked statically, and each cell's
``sh -c`` is executed with ``/bin/sh`` (python3 replaced by echo) to prove which model each
completion index runs. The merge of the cells' results is checked with ``reproci.cluster.merge_shards``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reproci import plugins
from reproci.cluster import github_matrix, merge_shards
from tests.helpers import ROOT, Cli, installed, write_shard

(kubernetes_validate,) = installed("kubernetes_validate")
from kubernetes_validate.utils import all_versions  # noqa: E402  (after the skip when it is missing)

MANIFEST = ROOT / "docker" / "manifest.yaml"
NEWEST, OLDEST = "1.37", "1.29"
SHIPPED = yaml.safe_load(MANIFEST.read_text())["images"]
GPU = "NVIDIA-H100-80GB-HBM3"
USER_MANIFEST = """\
version: 1
shipped: false
images:
  my-cpu:
    dockerfile: Dockerfile.cpu
    base: {image: base:1, digest: null}
    gpu: false
    tag: me/my-cpu:1
  my-gpu:
    dockerfile: Dockerfile.cuda
    base: {image: nvidia/cuda:12, digest: "sha256:00"}
    gpu: true
    world_size: 2
    tag: me/my-gpu:1
"""
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def digest(name: str, fill: str = "a") -> str:
    return f"--digest={name}=registry.example.com/reproci/{name}@sha256:{fill * 64}"


@pytest.fixture(autouse=True)
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder of its own as the working directory: no reproci.yaml, no goldens unless a test writes them."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def user_manifest(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(USER_MANIFEST)
    return path


def generate(cli, *args: str, manifest: Path = MANIFEST) -> list[dict]:
    code, out, err = cli("matrix", "--format", "k8s", "--manifest", str(manifest), *args)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def shipped(cli, *args: str) -> list[dict]:
    """Every image of the shipped manifest: a CPU image and GPU ones (gpu: true, or CUDA wheels)."""
    return generate(cli, *(digest(n) for n in SHIPPED), "--gpu-product", GPU, "--name", "nightly", *args)


def by_component(docs: list[dict], component: str) -> list[dict]:
    return [d for d in docs if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]


def pod_specs(docs: list[dict]) -> list[dict]:
    return [d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Pod", "Job")]


def cell_of(docs: list[dict], image: str) -> dict:
    return next(d for d in by_component(docs, "cell") if d["metadata"]["labels"]["reproci.image"] == image)


def container(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def run_script(script: str, tmp_path: Path, index: int | None = None, exit_code: int = 0) -> subprocess.CompletedProcess:
    """The container's ``sh -c`` under /bin/sh, with a python3 that prints its arguments (one a line) and exits
    ``exit_code``."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\nexit "$FAKE_EXIT"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "FAKE_EXIT": str(exit_code)}
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def argument(args: list[str], flag: str) -> str:
    """The value of the last ``flag`` (``-m MODEL`` follows ``python3 -m reproci.cli``)."""
    return args[len(args) - args[::-1].index(flag)]


def restricted_violations(spec: dict) -> list[str]:
    """What the Pod Security Standard "restricted" forbids that can be read off a pod spec."""
    bad = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC", "hostUsers") if spec.get(k)]
    bad += [f"volume {v['name']}" for v in spec.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod = spec.get("securityContext") or {}
    if (pod.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        bad.append("pod seccomp is not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        bad.append("service account token mounted")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{c['name']}: privileged or may escalate")
        if not (sc.get("runAsNonRoot") or pod.get("runAsNonRoot")) or 0 in (sc.get("runAsUser"), pod.get("runAsUser")):
            bad.append(f"{c['name']}: may run as root")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"] or (sc.get("capabilities") or {}).get("add"):
            bad.append(f"{c['name']}: capabilities not dropped")
        if not sc.get("readOnlyRootFilesystem"):
            bad.append(f"{c['name']}: writable root filesystem")
        bad += [f"{c['name']}: host port" for p in c.get("ports", []) if p.get("hostPort")]
    return bad


# --- the schemas ---------------------------------------------------------------------------------

def test_the_validator_bundles_the_versions_validated_against() -> None:
    assert {f"{NEWEST}.0", f"{OLDEST}.0"} <= set(all_versions())


@pytest.mark.parametrize("version", [NEWEST, OLDEST])
def test_every_object_for_the_shipped_manifest_is_valid_in_strict_mode(cli, version: str) -> None:
    docs = shipped(cli, "--namespace", "ci", "--storage-class", "nfs")
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "ConfigMap", "Pod"] + ["Job"] * (len(SHIPPED) + 1)
    for doc in docs:
        assert kubernetes_validate.validate(doc, version, strict=True) == version


@pytest.mark.parametrize("version", [NEWEST, OLDEST])
def test_every_object_for_a_user_manifest_with_goldens_and_a_config_is_valid(cli, user_manifest: Path, project: Path,
                                                                             version: str) -> None:
    (project / "reproci.yaml").write_text("steps: 40\n")
    (project / "goldens").mkdir()
    (project / "goldens" / "my-cpu.yaml").write_text("sidecar: {file: my-cpu.0123456789ab.npz, sha256: x}\n")
    (project / "goldens" / "my-cpu.0123456789ab.npz").write_bytes(bytes(range(256)))
    docs = generate(cli, digest("my-cpu"), digest("my-gpu", "b"), "--gpu-product", GPU, "--goldens-on-volume",
                    "-m", "conv", "-m", "reproci.reference_models.embedding:build", manifest=user_manifest)
    docs += generate(cli, digest("my-cpu"), "--image", "my-cpu", manifest=user_manifest)
    assert docs[1]["data"] == {"reproci.yaml": "steps: 40\n"} and "binaryData" in docs[-4]
    for doc in docs:
        assert kubernetes_validate.validate(doc, version, strict=True) == version


@pytest.mark.parametrize("corrupt, where", [
    (lambda job: job["spec"].update(completionsPerIndex=1), "an unknown field"),
    (lambda job: container(job).update(securityContext={"runAsNonRoot": "yes"}), "a string for a boolean"),
    (lambda job: job["spec"]["template"]["spec"]["volumes"].append({"name": "x", "hostPath": {"path": 1}}), "a number for a path"),
])
def test_the_validator_rejects_a_corrupted_job(cli, corrupt, where: str) -> None:
    job = cell_of(shipped(cli), "cpu-torch2.13")
    kubernetes_validate.validate(job, NEWEST, strict=True)
    corrupt(job)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, NEWEST, strict=True)


# --- the cells -----------------------------------------------------------------------------------

def test_each_image_is_one_indexed_job_with_one_completion_per_model(cli) -> None:
    docs = shipped(cli, "--deadline", "7200", "--parallelism", "2")
    cells = by_component(docs, "cell")
    assert sorted(c["metadata"]["labels"]["reproci.image"] for c in cells) == sorted(SHIPPED)
    assert sum(c["spec"]["completions"] for c in cells) == len(SHIPPED) * 3  # the cells: images x models
    for job in cells:
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed" and spec["completions"] == 3 and spec["parallelism"] == 2
        assert spec["backoffLimitPerIndex"] == 0 and spec["activeDeadlineSeconds"] == 7200 and spec["ttlSecondsAfterFinished"] > 0
        assert spec["suspend"] is False and spec["template"]["spec"]["restartPolicy"] == "Never"
        assert job["metadata"]["annotations"]["reproci.cells"] == "0=conv, 1=transformer, 2=embedding"
    names = [j["metadata"]["name"] for j in cells + by_component(docs, "merge")]
    assert len(set(names)) == len(names) and all(len(n) <= 63 and n.startswith("reproci-") for n in names)


def test_each_pod_runs_in_its_image_by_digest_with_reproci_copied_in_from_the_tool_image(cli) -> None:
    docs = shipped(cli, "--tool-image", "registry.example.com/reproci/tool@sha256:" + "c" * 64)
    for name in SHIPPED:
        spec = cell_of(docs, name)["spec"]["template"]["spec"]
        cell, (copy,) = spec["containers"][0], spec["initContainers"]
        assert cell["image"] == f"registry.example.com/reproci/{name}@sha256:{'a' * 64}"
        assert copy["image"].endswith("@sha256:" + "c" * 64) and copy["command"] == ["cp", "-R", "/opt/reproci/lib/.", "/reproci/lib/"]
        assert {"name": "PYTHONPATH", "value": "/reproci/lib"} in cell["env"]
        assert {"name": "lib", "mountPath": "/reproci/lib", "readOnly": True} in cell["volumeMounts"]
        assert {"name": "lib", "emptyDir": {}} in spec["volumes"]
    assert by_component(shipped(cli), "cell")[0]["spec"]["template"]["spec"]["initContainers"][0]["image"] == "reproci/tool:0.1.0"


def test_gpu_cells_ask_for_world_size_gpus_of_the_named_product_and_cpu_cells_for_cpus(cli, user_manifest: Path) -> None:
    docs = generate(cli, digest("my-cpu"), digest("my-gpu"), "--gpu-product", GPU, "--cpu", "2", "--memory", "6Gi",
                    manifest=user_manifest)
    gpu, cpu = cell_of(docs, "my-gpu"), cell_of(docs, "my-cpu")
    assert container(gpu)["resources"]["limits"] == {"cpu": "2", "memory": "6Gi", "nvidia.com/gpu": 2}  # world_size 2
    assert gpu["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": GPU}
    assert container(cpu)["resources"] == {"requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"cpu": "2", "memory": "6Gi"}}
    assert "nodeSelector" not in cpu["spec"]["template"]["spec"]
    shipped_docs = shipped(cli)
    for name, image in SHIPPED.items():
        limits = container(cell_of(shipped_docs, name))["resources"]["limits"]
        assert limits.get("nvidia.com/gpu") == (1 if github_matrix.on_gpu(image) else None)


def test_every_pod_meets_the_restricted_pod_security_standard(cli) -> None:
    docs = shipped(cli)
    assert len(pod_specs(docs)) == len(SHIPPED) + 2  # the cells, the merge, the reader
    for spec in pod_specs(docs):
        assert restricted_violations(spec) == []
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == context["runAsGroup"] == context["fsGroup"] == 1000
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["restartPolicy"] == "Never"
        mounted = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert {"/tmp", "/home/reproci"} <= mounted  # the root filesystem is read-only: these are emptyDirs


def test_the_restricted_check_finds_what_the_standard_forbids() -> None:
    spec = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}], "securityContext": {"runAsUser": 0},
            "containers": [{"name": "c", "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
                            "ports": [{"containerPort": 1, "hostPort": 1}]}]}
    assert len(restricted_violations(spec)) == 9


def test_dev_shm_is_a_size_limited_memory_emptydir(cli) -> None:
    spec = cell_of(shipped(cli, "--shm-size", "4Gi"), "cpu-torch2.13")["spec"]["template"]["spec"]
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
    assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]


def test_every_pod_mounts_the_one_readwritemany_results_claim(cli) -> None:
    docs = shipped(cli, "--results-size", "50Gi", "--storage-class", "nfs")
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "nightly-results"
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}, "storageClassName": "nfs"}
    for spec in pod_specs(docs):
        assert {"name": "results", "persistentVolumeClaim": {"claimName": "nightly-results"}} in spec["volumes"]
        assert {"name": "results", "mountPath": "/results"} in spec["containers"][0]["volumeMounts"]


def test_each_completion_index_runs_a_different_model_through_sh(cli, tmp_path: Path) -> None:
    docs = shipped(cli, "-m", "embedding", "-m", "conv", "-m", "reproci.reference_models.transformer:build")
    job = cell_of(docs, "cuda12.6-torch2.7")
    script = container(job)["command"][2]
    assert container(job)["command"][:2] == ["sh", "-c"]
    seen = []
    for index in range(job["spec"]["completions"]):
        done = run_script(script, tmp_path, index)
        assert done.returncode == 0, done.stderr
        args = done.stdout.splitlines()
        assert args[:5] == ["-m", "reproci.cli", "run", "--image", "local"]
        assert (argument(args, "--image-name"), argument(args, "--device"), argument(args, "--profile")) == (
            "cuda12.6-torch2.7", "cuda", "full")
        assert argument(args, "--results-dir") == f"/results/nightly/{job['metadata']['name']}/{index}"
        assert "--ci" in args and argument(args, "--goldens-dir") == "/reproci/project/goldens"
        seen.append(argument(args, "-m"))
    assert seen == ["embedding", "conv", "reproci.reference_models.transformer:build"]
    assert "--cpu-isa" in run_script(container(cell_of(docs, "cpu-torch2.13"))["command"][2], tmp_path, 0).stdout.splitlines()
    assert run_script(script, tmp_path, 3).returncode == 2  # no such index: no run at all


@pytest.mark.parametrize("code, pod", [(0, 0), (1, 0), (3, 0), (4, 0), (2, 2), (5, 5), (6, 6)])
def test_a_verdict_is_a_result_and_any_other_exit_fails_the_cell(cli, tmp_path: Path, code: int, pod: int) -> None:
    script = container(cell_of(shipped(cli), "cpu-torch2.13"))["command"][2]
    assert run_script(script, tmp_path, 1, exit_code=code).returncode == pod


# --- the merge -----------------------------------------------------------------------------------

def test_the_merge_job_is_suspended_and_expects_every_cell_on_the_same_claim(cli, tmp_path: Path) -> None:
    docs = shipped(cli, "-m", "conv", "-m", "embedding")
    (job,) = by_component(docs, "merge")
    assert job["spec"]["suspend"] is True and job["spec"]["backoffLimit"] == 0
    merge_container = container(job)
    assert merge_container["image"] == "reproci/tool:0.1.0"
    assert {"name": "PYTHONPATH", "value": "/opt/reproci/lib"} in merge_container["env"]
    done = run_script(merge_container["command"][2], tmp_path)
    *args, said = done.stdout.splitlines()
    assert args[:4] == ["-m", "reproci.cli", "merge", "/results/nightly"]
    assert argument(args, "--output") == "/results/nightly/merged.json"
    expected = merge_shards.expected_images(argument(args, "--matrix"))
    assert [(r["image"], r["models"]) for r in expected] == [(n, ["conv", "embedding"]) for n in SHIPPED]
    assert {r["tag"] for r in expected} == {c_["containers"][0]["image"] for c_ in pod_specs(by_component(docs, "cell"))}
    assert said == "reproci: the matrix exit code is 0 (summary.exit_code in merged.json)"


def result(image: str, model: str, verdict: str = "PASS", created: str = "2030-01-01T00:00:00+00:00") -> dict:
    """A cell's results document, as ``reproci run --image local --image-name IMAGE -m MODEL`` writes it."""
    return {"schema": "reproci.results", "version": 1, "run_id": f"{created[:10]}-{image}-{model}", "created": created,
            "image": {"name": image, "reference": None, "digest": None, "backend": "local"}, "options": {"ci": True},
            "models": [{"model": model, "verdict": verdict}], "summary": {}}


def test_the_merge_keeps_each_model_of_an_image_and_counts_a_cell_without_results_as_missing(tmp_path: Path) -> None:
    write_shard(tmp_path, "0", result("img", "conv"))
    write_shard(tmp_path, "1", result("img", "embedding", "NONDETERMINISTIC"))
    write_shard(tmp_path, "old", result("img", "conv", "ERROR", created="2029-01-01T00:00:00+00:00"))  # superseded
    shards, notes = merge_shards.load_shards([tmp_path])
    expected = merge_shards.expected_images(json.dumps({"include": [
        {"image": "img", "tag": "r@sha256:0", "models": ["conv", "embedding", "transformer"]},
        {"image": "gone", "tag": "g@sha256:0", "models": ["conv"]}]}))
    merged = merge_shards.merge(shards, plugins.stages(), expected)
    assert sorted((m["model"], m["verdict"]) for m in merged["models"]) == [("conv", "PASS"), ("embedding", "NONDETERMINISTIC")]
    assert len(notes) == 1 and "ignored older" in notes[0]
    assert merged["missing"] == ["gone", "img (transformer)"]
    assert merged["summary"]["images"] == 1 and merged["summary"]["exit_code"] == 5


# --- the project's files -------------------------------------------------------------------------

def test_the_configmap_carries_reproci_yaml_and_the_goldens_of_the_images_run(cli, user_manifest: Path, project: Path) -> None:
    (project / "reproci.yaml").write_text("models: [conv, embedding]\nsteps: 40\n")
    goldens = project / "goldens"
    goldens.mkdir()
    (goldens / "my-cpu.yaml").write_text("format: 1\nsidecar: {file: my-cpu.0123456789ab.npz}\n")
    (goldens / "my-cpu.0123456789ab.npz").write_bytes(b"PK\x03\x04\xff\xfe")
    (goldens / "my-gpu.yaml").write_text("format: 1\n")  # not run: not carried
    docs = generate(cli, digest("my-cpu"), "--image", "my-cpu", manifest=user_manifest)
    config_map = docs[1]
    assert config_map["data"] == {"reproci.yaml": "models: [conv, embedding]\nsteps: 40\n",
                                  "my-cpu.yaml": "format: 1\nsidecar: {file: my-cpu.0123456789ab.npz}\n"}
    assert base64.b64decode(config_map["binaryData"]["my-cpu.0123456789ab.npz"]) == b"PK\x03\x04\xff\xfe"
    job = cell_of(docs, "my-cpu")
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "project")["configMap"]
    assert volume["items"] == [{"key": "reproci.yaml", "path": "reproci.yaml"}, {"key": "my-cpu.yaml", "path": "goldens/my-cpu.yaml"},
                               {"key": "my-cpu.0123456789ab.npz", "path": "goldens/my-cpu.0123456789ab.npz"}]
    assert {"name": "project", "mountPath": "/reproci/project", "readOnly": True} in container(job)["volumeMounts"]
    script = container(job)["command"][2]
    assert "--config /reproci/project/reproci.yaml" in script and "--goldens-dir /reproci/project/goldens" in script
    assert job["spec"]["completions"] == 2  # reproci.yaml's models


def test_without_goldens_the_configmap_is_empty(cli) -> None:
    docs = shipped(cli)
    assert docs[1]["data"] == {} and "binaryData" not in docs[1]
    assert "items" not in next(v for v in pod_specs(docs)[1]["volumes"] if v["name"] == "project")["configMap"]


def test_goldens_over_a_configmap_s_1_mib_are_refused_with_the_way_out(cli, project: Path) -> None:
    (project / "goldens").mkdir()
    (project / "goldens" / "cpu-torch2.13.yaml").write_text("sidecar: {file: cpu-torch2.13.000000000000.npz}\n")
    (project / "goldens" / "cpu-torch2.13.000000000000.npz").write_bytes(b"\xff" * 800_000)  # 1.07 MB in base64
    code, _, err = cli("matrix", "--format", "k8s", digest("cpu-torch2.13"), "--image", "cpu-torch2.13")
    assert code == 2 and "over its 1 MiB" in err and "--goldens-on-volume" in err
    docs = generate(cli, digest("cpu-torch2.13"), "--image", "cpu-torch2.13", "--goldens-on-volume")
    job = cell_of(docs, "cpu-torch2.13")
    assert docs[1]["data"] == {} and job["spec"]["suspend"] is True  # resumed once the goldens are on the volume
    assert "--goldens-dir /results/goldens" in container(job)["command"][2]


# --- names, formats and refusals -----------------------------------------------------------------

def test_every_object_carries_the_run_s_labels_and_namespace(cli) -> None:
    docs = shipped(cli, "--namespace", "reproci-ci")
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert doc["metadata"]["namespace"] == "reproci-ci"
        assert labels["app.kubernetes.io/name"] == "reproci" and labels["app.kubernetes.io/instance"] == "nightly"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
    for job in by_component(docs, "cell") + by_component(docs, "merge"):
        assert job["spec"]["template"]["metadata"]["labels"] == job["metadata"]["labels"]
    default = generate(cli, digest("cpu-torch2.13"), "--image", "cpu-torch2.13")
    assert default[0]["metadata"]["labels"]["app.kubernetes.io/instance"].startswith("reproci-2")
    assert "namespace" not in default[0]["metadata"]


def test_the_objects_are_made_without_torch_or_numpy(project: Path) -> None:
    """The planning machine needs PyYAML only: a fresh interpreter where torch and numpy cannot be imported."""
    code = f"""
import sys
sys.modules["torch"] = sys.modules["numpy"] = None
from pathlib import Path
from reproci.cluster import kubernetes
opts = kubernetes.options(name="n", namespace=None, models=("conv",), digests=({digest("cpu-torch2.13")[9:]!r},),
                   tool_image=None, gpu_product=None, parallelism=None, deadline=3600, cpu="1", memory="1Gi",
                   shm_size="1Gi", results_size="1Gi", storage_class=None, goldens_dir=Path("goldens"), config=None,
                   goldens_on_volume=False)
print(kubernetes.to_yaml(kubernetes.manifests(Path({str(MANIFEST)!r}), opts, names=("cpu-torch2.13",))))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout) if d] == ["PersistentVolumeClaim", "ConfigMap", "Pod", "Job", "Job"]


def test_the_github_format_is_the_default_and_unchanged(cli) -> None:
    _, default, _ = cli("matrix", "--manifest", str(MANIFEST))
    _, github, _ = cli("matrix", "--manifest", str(MANIFEST), "--format", "github")
    assert default == github == github_matrix.to_json(github_matrix.build(MANIFEST)) + "\n"


@pytest.mark.parametrize("args, said", [
    (["--image", "cpu-torch2.13", "--name", "Nightly_1"], "--name 'Nightly_1' is not a DNS-1123 label"),
    (["--image", "cpu-torch2.13", "--name", "a" * 64], "at most 63 characters"),
    (["--image", "cuda12.6-torch2.7"], "pass --gpu-product"),
    (["--image", "cpu-torch2.13", "--parallelism", "0"], "--parallelism 0"),
    (["--image", "cpu-torch2.13", "--digest", "cpu-torch2.13=reproci/cpu-torch2.13:1"], "is not NAME=REPO@sha256:HEX"),
    (["--image", "cpu-torch2.13", digest("cuda99")], "--digest cuda99: no such image in"),
    (["--image", "local"], "local backend"),
    (["--image", "cpu-torch2.13", "-m", "my_model.py:build"], "a FILE.py stays on this machine"),
    (["--image", "cpu-torch2.13", "--memory", "lots"], "--memory 'lots' is not a Kubernetes quantity"),
    (["--image", "cpu-torch2.13", "--runner-labels", "gpu"], "--runner-labels applies to --format github only"),
])
def test_bad_k8s_input_is_refused_in_one_line(cli, args: list[str], said: str) -> None:
    code, out, err = cli("matrix", "--format", "k8s", digest("cpu-torch2.13"), digest("cuda12.6-torch2.7", "b"), *args)
    assert (code, out) == (2, "") and said in err, err


def test_a_config_setting_no_pod_can_honour_is_refused(cli, project: Path) -> None:
    (project / "reproci.yaml").write_text("gpus: all\n")
    code, _, err = cli("matrix", "--format", "k8s", digest("cpu-torch2.13"), "--image", "cpu-torch2.13")
    assert code == 2 and "reproci.yaml: gpus" in err


def test_the_real_cli_refuses_an_image_without_a_digest_and_k8s_options_with_github(project: Path) -> None:
    reproci = Cli(project)
    out = reproci("matrix", "--format", "k8s", "--image", "cpu-torch2.13", "--image", "cuda13.0-torch2.14", "--gpu-product", GPU,
                  digest("cpu-torch2.13"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["error: no digest for cuda13.0-torch2.14: a Job must not float on a tag; push the "
                                               "image and pass --digest cuda13.0-torch2.14=REGISTRY/cuda13.0-torch2.14@sha256:HEX "
                                               "(docker buildx imagetools inspect shows it)"]
    out = reproci("matrix", "--name", "nightly", "--digest", "x=y")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "--digest, --name apply to --format k8s only" in out.stderr
