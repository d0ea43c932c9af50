"""Kubernetes manifests for the matrix (``reproci matrix --format k8s``): one YAML stream that
``kubectl apply -f`` turns into a run of every cell on a cluster with the NVIDIA device plugin.

A cell is one image, one model, one device. The stream holds, in this order:

- a ReadWriteMany ``PersistentVolumeClaim`` (``<name>-results``), mounted at ``/results`` in every pod;
- a ``ConfigMap`` (``<name>-project``) with the project's ``reproci.yaml`` and the goldens of the
  selected images, mounted read-only (or, with ``goldens_on_volume``, only ``reproci.yaml``);
- a reader ``Pod`` that mounts the volume and sleeps, for ``kubectl cp`` in and out;
- one Indexed ``Job`` per image (a Job has one pod template, so one image), one completion
  index per model; the pod runs in the image by digest, reproci's pure-Python library tree
  copied in by an init container from the tool image, ``reproci run --image local`` inside;
- the merge ``Job``, created suspended: resumed once the cell Jobs are complete, it runs
  ``reproci merge`` with the cells as ``--matrix``, so a cell without results is missing (exit 5).

Every pod meets the Pod Security Standard "restricted". This module needs PyYAML and the
standard library only (no torch, no Kubernetes client); the click command is ``commands/matrix.py``,
the checks of the flags' values ``kubernetes_checks.py``, the project's files for the ConfigMap
``kubernetes_project.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Union

import yaml

from .. import __version__
from ..errors import UsageError
from ..images import load_manifest
from . import github_matrix
from .kubernetes_checks import DNS_LABEL, LABEL_VALUE, QUANTITY, check, default_name, model_cells, parse_digests
from .kubernetes_project import KeyToPath, Project, collect

UID = 1000  # runAsUser, runAsGroup and fsGroup of every pod
LIB, TOOL_LIB = "/reproci/lib", "/opt/reproci/lib"  # reproci's library tree: in the pod, in the tool image
PROJECT, RESULTS, HOME = "/reproci/project", "/results", "/home/reproci"
TTL = 7 * 86400  # finished Jobs (and their pods' logs) are kept a week; the results stay on the volume
MERGE_DEADLINE = 1800
VERDICT_CODES = "0|1|3|4"  # a verdict, judged by the merge: the cell succeeded in giving one


# --- the Kubernetes objects written, by their kinds and fields (the API's names) -----------------

class _ObjectMeta(TypedDict):
    name: str
    labels: dict[str, str]


class ObjectMeta(_ObjectMeta, total=False):
    namespace: str  # --namespace
    annotations: dict[str, str]  # a cell Job's


class TemplateMeta(TypedDict):
    """A pod template's ObjectMeta: its labels."""

    labels: dict[str, str]


class VolumeResourceRequirements(TypedDict):
    requests: dict[str, str]


class _ClaimSpec(TypedDict):
    accessModes: list[str]
    resources: VolumeResourceRequirements


class PersistentVolumeClaimSpec(_ClaimSpec, total=False):
    storageClassName: str  # --storage-class


class PersistentVolumeClaim(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PersistentVolumeClaimSpec


class _ConfigMap(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    data: dict[str, str]


class ConfigMap(_ConfigMap, total=False):
    binaryData: dict[str, str]  # the files that are not UTF-8, base64


class Capabilities(TypedDict):
    drop: list[str]


class SecurityContext(TypedDict):
    allowPrivilegeEscalation: bool
    privileged: bool
    readOnlyRootFilesystem: bool
    runAsNonRoot: bool
    capabilities: Capabilities


class SeccompProfile(TypedDict):
    type: str


class PodSecurityContext(TypedDict):
    runAsNonRoot: bool
    runAsUser: int
    runAsGroup: int
    fsGroup: int
    seccompProfile: SeccompProfile


class ResourceRequirements(TypedDict):
    requests: dict[str, str]
    limits: dict[str, str | int]  # quantities, and the GPU count (nvidia.com/gpu)


class EnvVar(TypedDict):
    name: str
    value: str


class _VolumeMount(TypedDict):
    name: str
    mountPath: str


class VolumeMount(_VolumeMount, total=False):
    readOnly: bool


class _Container(TypedDict):
    name: str
    image: str
    command: list[str]
    resources: ResourceRequirements
    securityContext: SecurityContext
    volumeMounts: list[VolumeMount]


class Container(_Container, total=False):
    workingDir: str  # not the init container's
    env: list[EnvVar]


class EmptyDirVolumeSource(TypedDict, total=False):
    medium: str
    sizeLimit: str


class PersistentVolumeClaimVolumeSource(TypedDict):
    claimName: str


class _ConfigMapVolumeSource(TypedDict):
    name: str


class ConfigMapVolumeSource(_ConfigMapVolumeSource, total=False):
    items: list[KeyToPath]  # only where the ConfigMap holds files


class _Volume(TypedDict):
    name: str


class Volume(_Volume, total=False):
    """A pod's volume: one of its sources."""

    emptyDir: EmptyDirVolumeSource
    persistentVolumeClaim: PersistentVolumeClaimVolumeSource
    configMap: ConfigMapVolumeSource


class PodOptions(TypedDict, total=False):
    """The fields of a PodSpec that only some pods have."""

    initContainers: list[Container]
    nodeSelector: dict[str, str]  # nvidia.com/gpu.product: --gpu-product
    activeDeadlineSeconds: int
    terminationGracePeriodSeconds: int


class _PodSpec(TypedDict):
    restartPolicy: str
    automountServiceAccountToken: bool
    enableServiceLinks: bool
    securityContext: PodSecurityContext
    containers: list[Container]
    volumes: list[Volume]


class PodSpec(_PodSpec, PodOptions, total=False):
    pass


class PodTemplateSpec(TypedDict):
    metadata: TemplateMeta
    spec: PodSpec


class Pod(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec


class PodFailurePolicyOnPodConditionsPattern(TypedDict):
    type: str
    status: str


class PodFailurePolicyRule(TypedDict):
    action: str
    onPodConditions: list[PodFailurePolicyOnPodConditionsPattern]


class PodFailurePolicy(TypedDict):
    rules: list[PodFailurePolicyRule]


class _JobSpec(TypedDict):
    activeDeadlineSeconds: int
    ttlSecondsAfterFinished: int
    suspend: bool
    template: PodTemplateSpec


class JobSpec(_JobSpec, total=False):
    completionMode: str  # a cell Job's: Indexed, one completion a model
    completions: int
    parallelism: int
    backoffLimitPerIndex: int
    podFailurePolicy: PodFailurePolicy
    backoffLimit: int  # the merge Job's


class Job(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: JobSpec


Object = Union[PersistentVolumeClaim, ConfigMap, Pod, Job]  # what the YAML stream holds


@dataclass(frozen=True, kw_only=True)
class Options:
    """What ``--format k8s`` was given, checked once (``options``)."""

    name: str
    namespace: str | None
    models: tuple[tuple[str, str], ...]  # (what --model said, the short name results give it)
    digests: dict[str, str]  # image NAME -> repo@sha256:HEX
    tool_image: str
    gpu_product: str | None
    parallelism: int | None  # at most this many pods of one image's Job at once (None: all its cells)
    deadline: int  # activeDeadlineSeconds of each cell Job
    cpu: str
    memory: str
    shm_size: str
    results_size: str
    storage_class: str | None
    goldens_dir: Path  # on this machine: the goldens of the images run go into the ConfigMap
    config: Path | None  # the project's reproci.yaml, carried to the pods
    goldens_on_volume: bool  # the goldens are copied onto the results volume instead


def options(*, name: str | None, namespace: str | None, models: tuple[str, ...], digests: tuple[str, ...],
            tool_image: str | None, gpu_product: str | None, parallelism: int | None, deadline: int, cpu: str,
            memory: str, shm_size: str, results_size: str, storage_class: str | None, goldens_dir: Path,
            config: Path | None, goldens_on_volume: bool) -> Options:
    """The checked options; every refusal is one line naming the flag and what to pass."""
    for flag, value in (("--cpu", cpu), ("--memory", memory), ("--shm-size", shm_size), ("--results-size", results_size)):
        check(value, QUANTITY, flag, "a Kubernetes quantity such as 4, 500m, 8Gi")
    if parallelism is not None and parallelism < 1:
        raise UsageError(f"--parallelism {parallelism}: give at least 1 (pods of one image's Job at once)")
    if deadline < 60:
        raise UsageError(f"--deadline {deadline}: give the seconds a cell Job may take, at least 60")
    tool = tool_image or f"reproci/tool:{__version__}"
    if not tool.strip() or any(c.isspace() for c in tool):
        raise UsageError(f"--tool-image {tool!r} is not an image reference; pass repo:tag or repo@sha256:HEX")
    return Options(
        name=check(name or default_name(), DNS_LABEL, "--name", "a DNS-1123 label (a-z, 0-9 and -, alphanumeric at both ends)"),
        namespace=None if namespace is None else check(namespace, DNS_LABEL, "--namespace", "a DNS-1123 label"),
        models=model_cells(models), digests=parse_digests(digests), tool_image=tool,
        gpu_product=None if gpu_product is None else check(gpu_product, LABEL_VALUE, "--gpu-product",
                                                            "a label value such as NVIDIA-H100-80GB-HBM3"),
        parallelism=parallelism, deadline=deadline, cpu=cpu, memory=memory, shm_size=shm_size,
        results_size=results_size, storage_class=storage_class, goldens_dir=goldens_dir, config=config,
        goldens_on_volume=goldens_on_volume)


@dataclass(frozen=True, kw_only=True)
class ImageCells:
    """One image of the matrix and its cells: one Indexed Job, index i runs the i-th model."""

    name: str
    row: github_matrix.MatrixRow  # its `reproci matrix` row (device, profile, world_size)
    reference: str  # by digest
    cpu_isa: str | None
    job: str


def job_name(run: str, image: str) -> str:
    """``reproci-<image>-<hash>``: a DNS-1123 label, unique to this run and image."""
    digest = hashlib.sha256(f"{run}/{image}".encode()).hexdigest()[:8]
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", image.lower())).strip("-")
    return f"reproci-{slug[:45].rstrip('-')}-{digest}"


def plan(manifest: Path, opts: Options, *, gpu_only: bool, names: tuple[str, ...]) -> list[ImageCells]:
    """The images of the matrix (as ``reproci matrix`` selects them), each with its digest."""
    if github_matrix.LOCAL in names:
        raise UsageError(f"--image {github_matrix.LOCAL} is the local backend, not an image a pod can run; "
                         "name manifest images for --format k8s")
    rows = github_matrix.build(manifest, gpu_only=gpu_only, names=names)["include"]
    raw = load_manifest(manifest)
    unknown = sorted(set(opts.digests) - set(raw))  # a digest of an image not selected is fine: one list serves all
    if unknown:
        raise UsageError(f"--digest {', '.join(unknown)}: no such image in {manifest}; images: {', '.join(raw)}")
    lacking = [r["image"] for r in rows if r["image"] not in opts.digests]
    if lacking:
        example = " ".join(f"--digest {n}=REGISTRY/{n}@sha256:HEX" for n in lacking)
        raise UsageError(f"no digest for {', '.join(lacking)}: a Job must not float on a tag; push the image and "
                         f"pass {example} (docker buildx imagetools inspect shows it)")
    if opts.gpu_product is None and any(r["gpu"] for r in rows):
        gpu = ", ".join(r["image"] for r in rows if r["gpu"])
        raise UsageError(f"{gpu} run(s) on GPUs: pass --gpu-product with the node label nvidia.com/gpu.product of "
                         "the GPU to run on, such as NVIDIA-H100-80GB-HBM3 (kubectl get nodes -L nvidia.com/gpu.product)")
    return [ImageCells(name=r["image"], row=r, reference=opts.digests[r["image"]], cpu_isa=raw[r["image"]].get("cpu_isa"),
                       job=job_name(opts.name, r["image"])) for r in rows]


# --- the objects -------------------------------------------------------------------------------

def labels(opts: Options, component: str, image: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "reproci", "app.kubernetes.io/instance": opts.name,
           "app.kubernetes.io/version": __version__, "app.kubernetes.io/component": component}
    if image is not None:
        out["reproci.image"] = image if LABEL_VALUE.match(image) and len(image) <= 63 else job_name("", image)
    return out


def metadata(opts: Options, name: str, component: str, image: str | None = None,
             annotations: dict[str, str] | None = None) -> ObjectMeta:
    out: ObjectMeta
    if opts.namespace:
        out = {"name": name, "namespace": opts.namespace, "labels": labels(opts, component, image)}
    else:
        out = {"name": name, "labels": labels(opts, component, image)}
    if annotations is not None:
        out["annotations"] = annotations
    return out


def results_claim(opts: Options) -> PersistentVolumeClaim:
    """The results volume: every cell writes its own folder, so many nodes mount it at once."""
    spec: PersistentVolumeClaimSpec = {"accessModes": ["ReadWriteMany"],
                                       "resources": {"requests": {"storage": opts.results_size}}}
    if opts.storage_class:
        spec["storageClassName"] = opts.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": metadata(opts, f"{opts.name}-results", "storage"), "spec": spec}


def project_map(opts: Options, project: Project) -> ConfigMap:
    """reproci.yaml and the goldens (kubernetes_project.py); empty when there are none: the cells give NEW."""
    out: ConfigMap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(opts, f"{opts.name}-project", "storage"),
                      "data": dict(project.data)}
    if project.binary:
        out["binaryData"] = dict(project.binary)
    return out


def container_security() -> SecurityContext:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def pod_spec(opts: Options, containers: list[Container], volumes: list[Volume], extra: PodOptions | None = None) -> PodSpec:
    """A pod of the restricted profile: non-root, RuntimeDefault seccomp, no service account token."""
    return {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            **(extra or {}), "containers": containers,
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "home", "emptyDir": {}},
                        {"name": "results", "persistentVolumeClaim": {"claimName": f"{opts.name}-results"}}, *volumes]}


def env(pythonpath: str) -> list[EnvVar]:
    values = {"PYTHONPATH": pythonpath, "HOME": HOME, "USER": "reproci", "TMPDIR": "/tmp",
              "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    return [{"name": k, "value": v} for k, v in values.items()]


def mounts(*extra: VolumeMount) -> list[VolumeMount]:
    return [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME},
            {"name": "results", "mountPath": RESULTS}, *extra]


def small(cpu: str = "500m", memory: str = "512Mi") -> ResourceRequirements:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def cell_script(opts: Options, cells: ImageCells, project: Project) -> str:
    """The cell container's ``sh -c``: the model of JOB_COMPLETION_INDEX, then ``reproci run``;
    a verdict exit code is a result (the merge judges it), any other fails the cell."""
    arms = "".join(f"  {i}) model={shlex.quote(text)} ;;\n" for i, (text, _) in enumerate(opts.models))
    row = cells.row
    args = ["python3", "-m", "reproci.cli", "run", "--image", "local", "--image-name", cells.name,
            "--device", row["device"], "--profile", row["profile"], "--world-size", str(row["world_size"]),
            "--goldens-dir", project.goldens_dir, "--ci"]
    args += ["--config", f"{PROJECT}/reproci.yaml"] if project.config else []
    args += ["--cpu-isa", cells.cpu_isa] if cells.cpu_isa else []
    results = shlex.quote(f"{RESULTS}/{opts.name}/{cells.job}")
    return (f'case "$JOB_COMPLETION_INDEX" in\n{arms}'
            '  *) echo "reproci: no model for completion index $JOB_COMPLETION_INDEX" >&2; exit 2 ;;\nesac\n'
            f'{shlex.join(args)} -m "$model" --results-dir {results}/"$JOB_COMPLETION_INDEX"\n'
            f'code=$?\ncase "$code" in {VERDICT_CODES}) exit 0 ;; *) exit "$code" ;; esac\n')


def cell_job(opts: Options, cells: ImageCells, project: Project) -> Job:
    """One image's Indexed Job: index i runs model i, no retry (a failed cell is a result), a
    pod evicted by a disruption started again."""
    count = len(opts.models)
    resources = small(opts.cpu, opts.memory)
    copy: Container = {"name": "reproci-lib", "image": opts.tool_image, "command": ["cp", "-R", f"{TOOL_LIB}/.", f"{LIB}/"],
                       "securityContext": container_security(), "resources": small(),
                       "volumeMounts": [{"name": "lib", "mountPath": LIB}]}
    pod: PodOptions = {"initContainers": [copy]}
    gpus = cells.row["world_size"]
    if cells.row["gpu"] and gpus is not None and opts.gpu_product is not None:  # a GPU row has both (plan)
        resources["limits"]["nvidia.com/gpu"] = gpus
        pod["nodeSelector"] = {"nvidia.com/gpu.product": opts.gpu_product}
    cell: Container = {"name": "cell", "image": cells.reference, "command": ["sh", "-c", cell_script(opts, cells, project)],
                       "workingDir": "/tmp", "env": env(LIB), "resources": resources, "securityContext": container_security(),
                       "volumeMounts": mounts({"name": "lib", "mountPath": LIB, "readOnly": True},
                                              {"name": "shm", "mountPath": "/dev/shm"},
                                              {"name": "project", "mountPath": PROJECT, "readOnly": True})}
    config_map: ConfigMapVolumeSource = {"name": f"{opts.name}-project"}
    if project.items():
        config_map["items"] = project.items()
    volumes: list[Volume] = [{"name": "lib", "emptyDir": {}},
                             {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}},
                             {"name": "project", "configMap": config_map}]
    cells_note = ", ".join(f"{i}={short}" for i, (_, short) in enumerate(opts.models))
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": metadata(opts, cells.job, "cell", cells.name,
                                 annotations={"reproci.cells": cells_note, "reproci.image.reference": cells.reference}),
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": min(opts.parallelism or count, count),
                     "backoffLimitPerIndex": 0, "activeDeadlineSeconds": opts.deadline, "ttlSecondsAfterFinished": TTL,
                     "suspend": project.on_volume,  # goldens on the volume: resumed once they are copied there
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
                     "template": {"metadata": {"labels": labels(opts, "cell", cells.name)},
                                  "spec": pod_spec(opts, [cell], volumes, pod)}}}


def merge_matrix(opts: Options, plan_: list[ImageCells]) -> str:
    """The cells as ``reproci merge --matrix``: an image or a model without results is missing."""
    rows = [{"image": c.name, "tag": c.reference, "models": [short for _, short in opts.models]} for c in plan_]
    return json.dumps({"include": rows}, separators=(",", ":"))


def merge_job(opts: Options, plan_: list[ImageCells]) -> Job:
    """The merge, suspended until the cells are complete; it succeeds once merged.json is written
    (the matrix's exit code is in it, and in its log)."""
    out = f"{RESULTS}/{opts.name}/merged.json"
    args = ["python3", "-m", "reproci.cli", "merge", f"{RESULTS}/{opts.name}", "--output", out,
            "--matrix", merge_matrix(opts, plan_), "--no-annotations"]
    script = (f"rm -f {shlex.quote(out)}\n{shlex.join(args)}\ncode=$?\n"
              'echo "reproci: the matrix exit code is $code (summary.exit_code in merged.json)"\n'
              f'if [ -f {shlex.quote(out)} ]; then exit 0; else exit "$code"; fi\n')
    merge: Container = {"name": "merge", "image": opts.tool_image, "command": ["sh", "-c", script], "workingDir": "/tmp",
                        "env": env(TOOL_LIB), "resources": small("1", "1Gi"), "securityContext": container_security(),
                        "volumeMounts": mounts()}
    name = f"reproci-merge-{hashlib.sha256(opts.name.encode()).hexdigest()[:8]}"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(opts, name, "merge"),
            "spec": {"suspend": True, "backoffLimit": 0, "activeDeadlineSeconds": MERGE_DEADLINE, "ttlSecondsAfterFinished": TTL,
                     "template": {"metadata": {"labels": labels(opts, "merge")}, "spec": pod_spec(opts, [merge], [])}}}


def reader_pod(opts: Options) -> Pod:
    """A pod that mounts the results volume and waits, for ``kubectl cp`` (merged.json out, goldens in)."""
    reader: Container = {"name": "reader", "image": opts.tool_image, "command": ["sleep", "infinity"], "workingDir": "/tmp",
                         "env": env(TOOL_LIB), "resources": small("100m", "64Mi"), "securityContext": container_security(),
                         "volumeMounts": mounts()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(opts, f"{opts.name}-reader", "reader"),
            "spec": pod_spec(opts, [reader], [], {"activeDeadlineSeconds": opts.deadline + 86400,
                                                  "terminationGracePeriodSeconds": 5})}


def manifests(manifest: Path, opts: Options, *, gpu_only: bool = False, names: tuple[str, ...] = ()) -> list[Object]:
    """Every object, in the order ``kubectl apply`` should create them."""
    plan_ = plan(manifest, opts, gpu_only=gpu_only, names=names)
    project = collect(opts.goldens_dir, opts.config, [c.name for c in plan_], on_volume=opts.goldens_on_volume)
    return [results_claim(opts), project_map(opts, project), reader_pod(opts),
            *(cell_job(opts, c, project) for c in plan_), merge_job(opts, plan_)]


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, with a script of several lines written as a literal block."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def to_yaml(documents: list[Object]) -> str:
    """The YAML stream ``kubectl apply -f`` reads (``yaml.safe_dump_all`` with readable scripts)."""
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
