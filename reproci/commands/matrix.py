"""``reproci matrix``: the GitHub Actions job matrix, one job per manifest image; with
``--format k8s``, Kubernetes Indexed Jobs for the same images, one cell per model (``cluster/kubernetes.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..cluster import github_matrix, kubernetes, kubernetes_checks, kubernetes_project
from ..errors import UsageError
from .images import manifest_option

K8S_ONLY = ("models", "digests", "tool_image", "gpu_product", "parallelism", "deadline", "cpu", "memory", "shm_size",
            "storage_class", "results_size", "goldens_dir", "goldens_on_volume", "namespace", "name")
GITHUB_ONLY = ("runner_labels",)


@click.command("matrix")
@manifest_option
@click.option("--gpu-only", is_flag=True, help="Only images marked `gpu: true`.")
@click.option("--image", "names", multiple=True,
              help="Only this image (repeatable; `local`: the local backend, no container); unknown names are refused.")
@click.option("--runner-labels", default=",".join(github_matrix.DEFAULT_RUNNER_LABELS), show_default=True,
              help="Runner labels each job runs on (its `runs_on`): comma-separated, or a JSON array.")
@click.option("--format", "format_", type=click.Choice(["github", "k8s"]), default="github", show_default=True,
              help="github: the job matrix as one line of JSON; k8s: Kubernetes Jobs as a YAML stream for kubectl apply.")
@click.option("--model", "-m", "models", multiple=True,
              help="k8s: a model of every image, one cell each (repeatable; default: reproci.yaml's models, else the reference models).")
@click.option("--digest", "digests", multiple=True, metavar="NAME=REPO@sha256:HEX",
              help="k8s: the image NAME as pushed, by digest (repeatable; one per image run).")
@click.option("--tool-image", help="k8s: the image holding reproci's library at /opt/reproci/lib (default reproci/tool:VERSION).")
@click.option("--gpu-product", help="k8s: node label nvidia.com/gpu.product the GPU cells run on (required for GPU images).")
@click.option("--parallelism", type=int, help="k8s: pods of one image's Job at once (default: all its cells).")
@click.option("--deadline", type=int, default=21600, show_default=True, help="k8s: seconds a cell Job may take.")
@click.option("--cpu", default="4", show_default=True, help="k8s: CPU request and limit of a cell.")
@click.option("--memory", default="8Gi", show_default=True, help="k8s: memory request and limit of a cell.")
@click.option("--shm-size", default="2Gi", show_default=True, help="k8s: size limit of /dev/shm (memory) in a cell.")
@click.option("--storage-class", help="k8s: storage class of the ReadWriteMany results volume (default: the cluster's).")
@click.option("--results-size", default="10Gi", show_default=True, help="k8s: size of the results volume.")
@click.option("--goldens-dir", type=click.Path(path_type=Path),
              help="k8s: goldens to carry in the ConfigMap (default: reproci.yaml's goldens_dir, else goldens).")
@click.option("--goldens-on-volume", is_flag=True,
              help="k8s: read the goldens from the results volume (copied there first) instead of a ConfigMap.")
@click.option("--namespace", help="k8s: namespace of every object (default: kubectl's current one).")
@click.option("--name", help="k8s: the run's name, a DNS-1123 label (default reproci-YYYYMMDD-HHMMSS, UTC).")
def matrix_cmd(manifest: Path, gpu_only: bool, names: tuple[str, ...], runner_labels: str, format_: str,
               **k8s_args: Any) -> None:
    """Print the GitHub Actions job matrix (one job per manifest image) as one line of JSON, or
    with --format k8s the Kubernetes Jobs of the same images (one cell per model) as YAML."""
    ctx = click.get_current_context()
    given = [p for p in ctx.command.params if p.name and ctx.get_parameter_source(p.name) != ParameterSource.DEFAULT]
    wrong = [p.opts[0] for p in given if p.name in (GITHUB_ONLY if format_ == "k8s" else K8S_ONLY)]
    if wrong:
        raise UsageError(f"{', '.join(wrong)} {'apply' if len(wrong) > 1 else 'applies'} to --format "
                         f"{'github' if format_ == 'k8s' else 'k8s'} only; drop it or pass that format")
    if format_ == "github":
        plan = github_matrix.build(manifest, gpu_only=gpu_only, names=names,
                                   runner_labels=github_matrix.parse_labels(runner_labels))
        click.echo(github_matrix.to_json(plan))
        return
    from .. import plugins  # the stages' reproci.yaml keys: here, so that --format github loads no stage

    config = kubernetes_project.config_path()
    settings = kubernetes_project.config_settings(config, plugins.catalog())
    models = k8s_args.pop("models") or settings.get("models") or kubernetes_checks.default_models()
    beside = config.parent if config is not None else Path(".")  # a reproci.yaml above: its goldens, there
    goldens_dir = k8s_args.pop("goldens_dir") or beside / str(settings.get("goldens_dir") or "goldens")
    opts = kubernetes.options(**k8s_args, models=(models,) if isinstance(models, str) else tuple(models),
                              goldens_dir=goldens_dir, config=config)
    click.echo(kubernetes.to_yaml(kubernetes.manifests(manifest, opts, gpu_only=gpu_only, names=names)), nl=False)
