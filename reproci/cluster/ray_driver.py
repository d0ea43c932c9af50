"""``reproci run --backend ray``: the run's cells as tasks on a Ray cluster.

The driver (the machine where ``reproci run`` was typed) connects to the cluster named by
``--address`` (else ``RAY_ADDRESS``, else a local cluster for trying it out), asks every node
it may use for its Python, Ray and reproci versions (and, for ``--image``, whether a Docker
engine answers there), and refuses with one line when they differ from its own. It then
places each cell (one model of the run: one image, one device kind) on a node, round robin
over the nodes that match ``--node-label`` and hold the cell's resources (``num_gpus`` for
CUDA runs), pinned there so that a lost node can be named. Each task runs reproci's own
``run`` for its model on that node, Docker or local backend (``cell.run``); its run
directory and any golden it recorded come back, and the driver makes them one results file,
one verdict and one golden (``combine``), as one machine would have.

Ctrl-C cancels every task: each stops its run as Ctrl-C would (workers, containers, files)
before the driver exits 130. A node that dies mid-cell is an infrastructure error for that
cell (exit 5, the node named), never a verdict; the other cells' results are kept.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import console, errors
from ..errors import InfrastructureError, UsageError
from ..results import ResultsDocument
from ..settings.options import RunOptions
from . import across, cells, combine, ray_join
from . import cell as cell_mod
from .placement import Node, cell_cpus, first_line, nodes, usable

NODE_DEATH_WAIT_S = 10.0  # how long a cell stopped on its node waits for the cluster to say whether the node died
EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pt", "*.ckpt", ".cache", "node_modules"]


@dataclass(frozen=True)
class ClusterOptions:
    """The Ray backend's own options, checked once: where the cluster is and which nodes to use."""

    address: str | None
    node_labels: tuple[tuple[str, str], ...]
    across_nodes: bool = False  # each model's cell also on a second node, compared with it (cluster/across.py)


def cluster_options(address: str | None, node_labels: Iterable[str], env: dict[str, str] | None = None) -> ClusterOptions:
    env = dict(os.environ) if env is None else env
    pairs = []
    for text in node_labels:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--node-label {text!r} is not KEY=VALUE; write e.g. --node-label ray.io/accelerator-type=H100")
        pairs.append((key.strip(), value.strip()))
    said = "--address" if address else "RAY_ADDRESS"
    address = address or env.get("RAY_ADDRESS") or None
    return ClusterOptions(address=None if address is None else check_address(address, said), node_labels=tuple(pairs))


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?)$")  # a name, IPv4, [IPv6]
RAY_CLIENT_PORT = 10001  # ray://HOST without a port: the Ray client server's default


def check_address(address: str, said: str = "--address") -> str:
    """A cluster address in a form Ray takes: ``HOST:PORT`` (a port 1-65535), ``ray://HOST[:PORT]``
    (the Ray client), ``auto`` or ``local``; anything else is refused (exit 2) before Ray sees it."""
    text = address.strip()
    if text in ("auto", "local"):
        return text
    client = text.startswith("ray://")
    rest = text[len("ray://"):] if client else text
    host, sep, port = rest.rpartition(":")
    if client and (not sep or host.endswith(":") or "]" in port):  # ray://HOST, ray://[::1]
        host, port = rest, str(RAY_CLIENT_PORT)
    named = bool(host) and _HOST.match(host) is not None and port.isdigit()
    if named and 1 <= int(port) <= 65535:
        return text
    why = f"port {port} is out of range" if named else "it is not an address"
    raise UsageError(f"{said} {address!r}: {why}; write HOST:PORT with a port from 1 to 65535 (e.g. "
                     "10.0.0.5:6379, the head's `ray start --head --port`), ray://HOST:PORT for the Ray client, or auto")


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise UsageError("--backend ray needs Ray on this machine and every node: pip install 'reproci[ray]' "
                         "(the same Ray and Python versions everywhere)") from e
    return ray


def connect(ray: Any, cluster: ClusterOptions, options: RunOptions) -> None:
    """Join the cluster (or start a local one), with the project as every task's working directory."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # each cell's lines are its own: never folded across cells
    if console.is_log(sys.stderr):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # a CI log gets the cells' lines without colour codes
    excludes = EXCLUDES + [f"/{p}" for p in cells.inside(options.project_root, options.results_dir)]
    kwargs: dict[str, Any] = {"runtime_env": {"working_dir": str(options.project_root), "excludes": excludes},
                              "logging_level": "ERROR", "log_to_driver": True}
    if cluster.address is None:
        kwargs["include_dashboard"] = False
    else:
        ray_join.reachable(cluster.address)
    if (cluster.address or "").startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise UsageError(f"{cluster.address} is a Ray client address, and the Ray client needs Ray's client extra on "
                         "this machine: pip install 'ray[client]' (the cluster's Ray version), or give the head's "
                         "HOST:PORT")
    held: list[str] = []
    try:
        with ray_join.lines_held(cluster.address, held):
            ray.init(address=cluster.address, **kwargs)
    except ConnectionError as e:
        said = f"; Ray said: {held[-1]}" if held else ""
        raise InfrastructureError(f"cannot reach the Ray cluster at {cluster.address} ({first_line(e)}{said}); start it "
                                  "with `ray start --head` there, or pass --address HOST:PORT") from e
    except RuntimeError as e:
        if "version mismatch" in str(e).lower():
            raise InfrastructureError(f"this machine and the Ray cluster at {cluster.address} run different versions "
                                      f"({first_line(e)}); install the same Ray and Python on both") from e
        raise InfrastructureError(f"cannot join the Ray cluster at {cluster.address or '(local)'}: {first_line(e)}") from e
    except ValueError as e:
        raise InfrastructureError(f"the Ray cluster refused this run's project directory: {first_line(e)}; "
                                  "make the project smaller or add a .gitignore for large files") from e


def run_cells(options: RunOptions, cluster: ClusterOptions, cell_options: dict[str, Any],
              progress: Callable[[str], None], publish: combine.Publish) -> tuple[ResultsDocument, Path, list[str]]:
    """Run every cell on the cluster (``cell_options``: what each cell's run receives,
    ``settings.declared.for_cell``); return the combined document, its path, and one line per
    cell lost (its node died, or its run ended without results)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = time.monotonic()
    connect(ray, cluster, options)
    try:
        fit = usable(ray, nodes(ray, cluster.node_labels), options, progress)
        goldens = cells.golden_files(options)
        task = ray.remote(max_retries=0)(cell_mod.run)
        gpus = options.world_size if options.device == "cuda" else 0
        pending: dict[Any, tuple[cell_mod.CellSpec, Node]] = {}
        for i, model in enumerate(options.models):
            cell = cells.model_cell(options, model, cell_options, goldens)
            for node, spec in across.placements(fit, i, cell, cluster.across_nodes):  # and the cell's twin, if asked
                cpus, jobs = cell_cpus(options, node, "jobs" in cell_options)
                sent = spec if jobs is None else replace(spec, options={**spec.options, "jobs": jobs})
                ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False), num_cpus=cpus,
                                   num_gpus=gpus, name=f"cell {spec.name}").remote(sent)
                pending[ref] = (spec, node)
                progress(f"cell {spec.name}: placed on node {node.name}")
        done, lost = _collect(ray, pending, progress)
        return _finish(options, done, lost, pending, started, publish)
    finally:
        ray.shutdown()


def _collect(ray: Any, pending: dict[Any, tuple[cell_mod.CellSpec, Node]],
             progress: Callable[[str], None]) -> tuple[list[cell_mod.CellResult], list[tuple[str, int]]]:
    done: list[cell_mod.CellResult] = []
    lost: list[tuple[str, int]] = []  # (line, exit code)
    waiting = list(pending)
    try:
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=None)
            for ref in ready:
                spec, node = pending[ref]
                try:
                    r: cell_mod.CellResult = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the task itself failed on the node
                    lost.append((f"cell {spec.name} failed on node {node.name}: {first_line(e.cause or e)}",
                                 errors.EXIT_RUN_ERROR))
                    continue
                except ray.exceptions.RayError as e:  # the worker or the whole node went away
                    died = isinstance(e, ray.exceptions.NodeDiedError) or not _alive(ray, node)
                    what = "was lost: the node died" if died else "was lost"
                    lost.append((f"cell {spec.name} on node {node.name} {what} ({type(e).__name__}); "
                                 "run the cell again", errors.EXIT_INFRA))
                    progress(f"cell {spec.name}: lost with node {node.name}")
                    continue
                if r.run_tar is None and r.exit_code in (errors.EXIT_INTERRUPTED, errors.EXIT_TERMINATED):
                    # stopped on its node, not from here: a node going down stops its cells' runs as it goes
                    what = "was lost: the node died" if _died(ray, node) else "was stopped on its node"
                    lost.append((f"cell {spec.name} on node {node.name} {what} (its run exited {r.exit_code}); "
                                 "run the cell again", errors.EXIT_INFRA))
                    progress(f"cell {spec.name}: lost with node {node.name}")
                    continue
                if r.run_tar is None:
                    said = next((line for line in reversed(r.stderr_tail) if line.strip()), f"exit {r.exit_code}")
                    lost.append((f"cell {spec.name} on node {node.name}: {said.removeprefix('error: ')}", r.exit_code))
                else:
                    done.append(r)
                progress(f"cell {spec.name}: finished on node {node.name} in {r.seconds:.1f} s (exit {r.exit_code})")
    except KeyboardInterrupt:
        _cancel(ray, waiting)
        raise
    order = {spec.name: i for i, (spec, _) in enumerate(pending.values())}
    return sorted(done, key=lambda r: order[r.name]), lost


def _died(ray: Any, node: Node, within: float = NODE_DEATH_WAIT_S) -> bool:
    """Whether the cluster marks ``node`` dead within ``within`` seconds (it notices a lost node a
    little after the node's tasks notice it)."""
    deadline = time.monotonic() + within
    while _alive(ray, node):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _alive(ray: Any, node: Node) -> bool:
    """Whether the cluster lists ``node`` as alive."""
    return any(n.get("NodeID") == node.id and n.get("Alive") for n in ray.nodes())


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel every task still running, then wait while each stops its run and its containers."""
    for ref in refs:
        try:
            ray.cancel(ref)
        except Exception:
            pass
    deadline = time.monotonic() + cell_mod.CANCEL_GRACE_S + 10
    left = list(refs)
    while left and time.monotonic() < deadline:
        try:
            _, left = ray.wait(left, num_returns=len(left), timeout=1.0)
        except KeyboardInterrupt:
            break  # a second Ctrl-C: leave now


def _finish(options: RunOptions, done: list[cell_mod.CellResult], lost: list[tuple[str, int]],
            pending: dict[Any, tuple[cell_mod.CellSpec, Node]], started: float, publish: combine.Publish
            ) -> tuple[ResultsDocument, Path, list[str]]:
    placed = {spec.name: node for spec, node in pending.values()}
    own, twins = across.split(done, {name: node.name for name, node in placed.items()})
    return combine.finish(options, own, lost, started, lambda run_dir: _write_cells(run_dir, done, placed, lost),
                          publish, twins)


def _write_cells(run_dir: Path, done: list[cell_mod.CellResult], placed: dict[str, Node],
                 lost: list[tuple[str, int]]) -> None:
    """``cells.json`` beside the results: where each cell ran and for how long (not part of
    results.json, which reads as one machine's)."""
    import json

    from .. import atomic

    rows = [{"cell": r.name, "node_id": placed[r.name].id, "node_ip": placed[r.name].ip, "host": r.host,
             "labels": placed[r.name].labels, "seconds": r.seconds, "exit_code": r.exit_code} for r in done]
    atomic.write_text(run_dir / "cells.json", json.dumps({"cells": rows, "lost": [line for line, _ in lost]},
                                                         indent=2) + "\n")
