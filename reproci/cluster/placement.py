"""Which nodes of a Ray cluster a run's cells may use: the live nodes that carry every
``--node-label``, each asked (by a task pinned to it) for its Python, Ray and reproci versions
and, for ``--image``, whether a Docker engine answers there; a node that differs from the
driver is refused in one line, before any cell starts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

from .. import __version__
from ..errors import InfrastructureError
from ..settings.options import RunOptions

PROBE_TIMEOUT_S = 120.0
RETRY_S = 1.0  # between asks of a node that is not yet schedulable


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


@dataclass(frozen=True, eq=False)  # one per node: compared and hashed by identity
class Node:
    id: str
    ip: str
    labels: dict[str, str]
    resources: dict[str, float]

    @property
    def name(self) -> str:
        return f"{self.ip} ({self.id[:8]})"


def nodes(ray: Any, node_labels: tuple[tuple[str, str], ...]) -> list[Node]:
    """The live nodes whose labels match every ``--node-label``, in a stable order."""
    found = [Node(id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"), labels=dict(n.get("Labels") or {}),
                  resources=dict(n.get("Resources") or {})) for n in ray.nodes() if n.get("Alive")]
    matching = [n for n in found if all(n.labels.get(k) == v for k, v in node_labels)]
    if not matching:
        want = ", ".join(f"{k}={v}" for k, v in node_labels)
        raise InfrastructureError(f"no live node of the Ray cluster has the labels {want} ({len(found)} node(s) alive); "
                                  "start one with `ray start --labels KEY=VALUE`, or change --node-label")
    return sorted(matching, key=lambda n: (n.ip, n.id))


class Probe(TypedDict):
    """A node's answer to ``probe``: what the driver and every node must share, and Docker."""

    python: str
    ray: str
    reproci: str
    docker: str | None  # why no Docker engine answers there; None: one does


def probe() -> Probe:
    """On a node: what the driver compares with its own versions, and whether Docker answers."""
    import platform

    import ray

    docker_ok: str | None = None
    try:
        from ..backends.docker_engine import Engine

        Engine.connect().close()
    except Exception as e:  # the SDK missing, the engine down: the node cannot run --image cells
        docker_ok = first_line(e)
    return {"python": platform.python_version(), "ray": ray.__version__, "reproci": __version__, "docker": docker_ok}


def probe_all(ray: Any, candidates: list[Node]) -> tuple[dict[Node, Probe], dict[Node, str]]:
    """Each node's answer to ``probe`` (a task pinned to it), and why each that gave none did not.
    A node that joined a moment ago is not yet schedulable: it is asked again until the deadline."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(probe)
    probed: dict[Node, Probe] = {}
    failed: dict[Node, str] = {}
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    left = list(candidates)
    while left:
        refs = {n: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)).remote()
                for n in left}
        left = []
        for node, ref in refs.items():
            try:
                probed[node] = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.TaskUnschedulableError as e:
                if time.monotonic() < deadline - RETRY_S:
                    left.append(node)
                else:
                    failed[node] = first_line(e)
            except Exception as e:
                failed[node] = first_line(e)
        if left:
            time.sleep(RETRY_S)
    return probed, failed


def check_versions(probed: dict[Node, Probe], own: dict[str, str]) -> None:
    """One line naming the first node whose Python, Ray or reproci differs from the driver's
    (a node of another reproci may answer with other keys)."""
    for node, got in probed.items():
        differ = [f"{k} {got.get(k)} (this machine {own[k]})" for k in ("python", "ray", "reproci") if got.get(k) != own[k]]
        if differ:
            raise InfrastructureError(f"node {node.name} runs {', '.join(differ)}; install the same Python, Ray and "
                                      "reproci versions on the driver and every node")


def own_versions() -> dict[str, str]:
    import platform

    import ray

    return {"python": platform.python_version(), "ray": ray.__version__, "reproci": __version__}


def usable(ray: Any, candidates: list[Node], options: RunOptions, progress: Callable[[str], None]) -> list[Node]:
    """The nodes that can run this run's cells: versions checked, Docker for --image, GPUs for CUDA."""
    probed, failed = probe_all(ray, candidates)
    for node, why in failed.items():
        progress(f"node {node.name} left out: it did not answer reproci's probe ({why})")
    if not probed:
        node, why = next(iter(failed.items()))
        raise InfrastructureError(f"no node answered reproci's probe: node {node.name}: {why}; check the nodes with "
                                  "`ray status`, or choose others with --node-label")
    check_versions(probed, own_versions())
    candidates = [n for n in candidates if n in probed]
    gpus = options.world_size if options.device == "cuda" else 0
    fit = [n for n in candidates if n.resources.get("GPU", 0) >= gpus and n.resources.get("CPU", 0) >= 1]
    if options.image is not None:  # a node where no Docker engine answers cannot run an --image cell
        no_docker = [n for n in fit if probed[n]["docker"] is not None]
        for n in no_docker:
            progress(f"node {n.name} left out: no Docker engine answers there ({probed[n]['docker']})")
        fit = [n for n in fit if n not in no_docker]
    if not fit:
        needs = []
        if gpus:
            needs.append(f"{gpus} GPU(s)")
        if options.image is not None:
            needs.append("a Docker engine (" + "; ".join(f"{n.name}: {probed[n]['docker']}" for n in candidates
                                                         if probed[n]["docker"]) + ")")
        raise InfrastructureError(f"no node of the Ray cluster has {' and '.join(needs) or 'a CPU free'} for these cells; "
                                  "add such a node or change --node-label")
    return fit


def cell_cpus(options: RunOptions, node: Node, jobs_given: bool) -> tuple[int, int | None]:
    """The CPUs a cell asks of its node, so that cells never share cores a run counts on (the
    throughput stage times them): its runs at once × ``--threads`` × ``--world-size``, at most
    the node's; and, unless ``--jobs`` was given, the ``--jobs`` that fits them (None: as given)."""
    per_run = options.threads * options.world_size
    node_cpus = max(1, int(node.resources.get("CPU", 1)))
    runs = options.jobs if jobs_given else min(3, max(1, node_cpus // per_run))
    cpus = max(1, min(node_cpus, per_run * runs))
    return cpus, None if jobs_given else max(1, cpus // per_run)
