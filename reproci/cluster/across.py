"""A model's cell run on two nodes (``--across-nodes``): do its results agree across machines of
one image, not only across processes on one?

The strict stage proves A = B = C on one host. The same cell run whole on a second node (its
twin: A, B, C and the replays share files, so the cell is never split) gives a second run A; the
two are compared by their per-step fingerprints and final hashes, with the comparison that
compares any two runs (``golden.divergence.first_divergence``). Runs that agree leave the verdict
as it was, and say on which nodes they agreed. Runs that differ are judged by the nodes'
environment fingerprints first: a host factor that differs (CPU instruction set, thread count,
GPU, driver, a kernel-selecting variable) is ENV_CHANGED, packages or toolchain UPGRADE_CHANGED,
as against a golden (``golden.drift``); only with equal environments is it NONDETERMINISTIC.

The comparison takes the two cells' results as any engine has them once unpacked (the node, the
model's entry of its results document, the run directory), so that every engine calls it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeVar

from .. import verdicts
from ..document import Entry
from ..entry_sections import AcrossNodes, Evidence, EvidenceView, view
from ..errors import UsageError
from ..golden import comparison, drift
from ..golden.divergence import first_divergence, tensor_magnitude
from ..golden.environment import TOOLCHAIN_KEYS, diff_keys, host_diff, package_diff
from ..results import ModelEntry, ResultsDocument
from ..settings.options import RunOptions
from ..stages.base import composed
from . import cell as cell_mod

if TYPE_CHECKING:
    import torch

TWINS_DIR = "across-nodes"  # under the run directory: each twin cell's own run directory, by cell name
TWIN = "~twin"  # a twin cell's name: its cell's, and this
N = TypeVar("N")  # an engine's node


@dataclass(frozen=True)
class CellRun:
    """One cell's run of a model, as the comparison reads it: the node it ran on (as a sentence
    names it), the model's entry of the cell's results document, and the run directory that the
    entry's record paths are relative to."""

    node: str
    entry: ModelEntry
    run_dir: Path

    def record_a(self) -> dict[str, Any] | None:
        rel = Entry.of(self.entry).records.get("A")
        path = self.run_dir / rel if rel else None
        return json.loads(path.read_text()) if path is not None and path.is_file() else None

    def final_state(self) -> dict[str, torch.Tensor] | None:
        """Run A's final parameters and buffers, where the cell kept them (``final-A.pt``)."""
        path = self.run_dir / Entry.of(self.entry).model / "final-A.pt"
        if not path.is_file():
            return None
        import torch

        return torch.load(path, map_location="cpu", weights_only=True)


def compare(first: CellRun, twin: CellRun, device: str | None) -> AcrossNodes:
    """The model's ``across_nodes`` section: the two nodes, whether their runs A agree, and when
    they do not, where they first differ (step, tensor, and the final state's magnitude where both
    cells kept it), what differs between the nodes' environments, the verdict and its sentence."""
    nodes = [first.node, twin.node]
    a, b = first.record_a(), twin.record_a()
    if a is None or b is None:
        which = " and ".join(n for n, r in zip(nodes, (a, b)) if r is None)
        return {"nodes": nodes, "agree": None, "verdict": None,
                "message": f"not compared across nodes: run A did not complete on {which}"}
    div = first_divergence(a, b)
    if div is None:
        return {"nodes": nodes, "agree": True, "verdict": None,
                "message": f"agreed across nodes {first.node} and {twin.node} (run A: every step and the final hash)"}
    evidence: Evidence = {"comparison": f"A on {first.node} vs A on {twin.node}", **div.to_dict()}
    evidence.update(_magnitude(div.tensor, first.final_state(), twin.final_state()))
    packages = package_diff(a.get("packages"), b.get("packages"))
    env_a, env_b = a.get("environment"), b.get("environment")
    toolchain = diff_keys(env_a, env_b, TOOLCHAIN_KEYS)
    host = host_diff(env_a, env_b, device)
    env_diff = {**toolchain, **host}
    changes: drift.Changes = {"packages": packages, "toolchain": toolchain, "host": host, "digest": None,
                              "env": env_diff}  # as drift reads a golden's
    read = view(EvidenceView, evidence)
    said = f"runs on {first.node} and {twin.node} differ {verdicts.where_text(read)}{_size(read)}"
    cause = verdicts.cause_text(read)
    said += f"; {cause}" if cause and div.cause in ("data", "compute") else ""
    if packages or env_diff:
        verdict, why = drift._why(changes)
        message = f"{said} (the nodes differ: {why})"
    else:
        verdict = verdicts.NONDETERMINISTIC
        message = f"{said}; the nodes' environments are the same: nondeterminism across machines"
    return {"nodes": nodes, "agree": False, "verdict": verdict, "message": message, "evidence": evidence,
            "env_diff": env_diff, "package_diff": packages}


def _magnitude(tensor: str | None, state_a: dict[str, torch.Tensor] | None, state_b: dict[str, torch.Tensor] | None
               ) -> Evidence:
    """max |Δ| and ULP of the differing tensor's parameter in the two final states, where both were kept."""
    name = drift.state_name(tensor)
    if not state_a or not state_b or name not in state_a or name not in state_b:
        return {}
    m = tensor_magnitude(state_a[name], state_b[name])
    return {"max_abs": m["max_abs"], "max_ulp": m["max_ulp"], "elements_differing": m["elements_differing"],
            "magnitude_source": f"final state of {name}"}


def _size(evidence: EvidenceView | None) -> str:
    source = str(evidence and evidence.magnitude_source or "")
    text = verdicts.magnitude_text(evidence)
    return f"; at the end {source.removeprefix('final state of ')} {text}" if text and source else ""


def judge(entry: ModelEntry, section: AcrossNodes, twin: ModelEntry | None = None) -> None:
    """The model's entry with its ``across_nodes`` section: a difference between the nodes is the
    verdict unless the first node's own runs already failed (that verdict is graver, or as grave);
    runs that agreed say so after the verdict's sentence. ``twin``: the twin cell's model entry,
    whose own failure (its A, B and C on its node) is the model's when the first node's runs passed."""
    entry["across_nodes"] = section
    own = Entry.of(entry)
    if own.verdict in verdicts.FAILING:
        return
    if twin is not None and (theirs := Entry.of(twin)).verdict in verdicts.FAILING:
        entry.update({"verdict": twin["verdict"], "evidence": twin.get("evidence"),
                      "message": f"on node {section['nodes'][1]}: {theirs.message}"})
        return
    if verdict := section.get("verdict"):
        entry.update({"verdict": verdict, "evidence": section["evidence"], "message": section["message"]})
    else:
        entry["message"] = f"{own.message}; {section['message']}"


@dataclass(frozen=True)
class Twin:
    """A cell's twin as an engine hands it back: the nodes of the cell and of its twin, and the
    twin's result (the twin runs the same model with the same arguments, records no golden)."""

    node: str
    twin_node: str
    result: cell_mod.CellResult


def placements(nodes: Sequence[N], i: int, cell: cell_mod.CellSpec, across: bool) -> list[tuple[N, cell_mod.CellSpec]]:
    """Where the ``i``-th model's cell runs, round robin over ``nodes``; ``across``: and its twin on
    the next node (the same run, recording no golden), both keeping run A's final state for the
    comparison. Fewer than two nodes cannot hold a twin: exit 2, before any cell starts."""
    if not across:
        return [(nodes[i % len(nodes)], cell)]
    if len(nodes) < 2:
        raise UsageError(f"--across-nodes runs each model's cell on two nodes, and {len(nodes)} node of the cluster "
                         "can take these cells; start a second node (`ray start --address HEAD:PORT`) or widen "
                         "--node-label")
    cell = replace(cell, keep_checkpoints=True)
    return [(nodes[i % len(nodes)], cell),
            (nodes[(i + 1) % len(nodes)], replace(cell, name=cell.name + TWIN, update_golden=False))]


def split(done: Sequence[cell_mod.CellResult], node_of: Mapping[str, str]) -> tuple[list[cell_mod.CellResult], list[Twin]]:
    """The cells that came back, and the twins among them as ``check`` takes them (``node_of``: cell
    name -> its node's name); a twin whose cell did not come back has nothing to be compared with."""
    cells = [r for r in done if not r.name.endswith(TWIN)]
    names = {r.name for r in cells}
    twins = [Twin(node=node_of[r.name.removesuffix(TWIN)], twin_node=node_of[r.name], result=r) for r in done
             if r.name.endswith(TWIN) and r.name.removesuffix(TWIN) in names]
    return cells, twins


def check(options: RunOptions, doc: ResultsDocument, run_dir: Path, twins: list[Twin]) -> None:
    """Each twin's run directory unpacked under ``run_dir/across-nodes/<cell>``, its models
    compared with the cells' (``compare``) and judged (``judge``); the option recorded, the
    golden refused when any model differs across nodes, the kept final states removed unless
    ``--keep-checkpoints``, and the summary made again."""
    by_model = {m.get("model"): m for m in doc.get("models") or []}
    for t in twins:
        if t.result.run_tar is None:
            continue
        where = run_dir / TWINS_DIR / t.result.name
        where.mkdir(parents=True)
        cell_mod.unpack(t.result.run_tar, where)
        twin_doc = json.loads((where / "results.json").read_text())
        for twin_entry in twin_doc.get("models") or []:
            entry = by_model.get(twin_entry.get("model"))
            if entry is None:
                continue
            section = compare(CellRun(t.node, entry, run_dir), CellRun(t.twin_node, twin_entry, where), options.device)
            section["twin_run_dir"] = str(where.relative_to(run_dir))
            judge(entry, section, twin_entry)
    doc.setdefault("options", {})["across_nodes"] = True
    outcome = comparison.outcome_of(doc)
    apart = differing(doc)
    if options.update_golden and outcome is not None and apart and not outcome.refused:
        doc["golden"]["refused"] = (f"golden not updated: {', '.join(apart)}; a golden is only recorded from runs "
                                    "that agree across nodes")
    if not options.keep_checkpoints:
        for kept in [*run_dir.glob("*/final-A.pt"), *run_dir.glob("*/ckpt-*.pt"),
                     *run_dir.glob(f"{TWINS_DIR}/*/*/final-A.pt"), *run_dir.glob(f"{TWINS_DIR}/*/*/ckpt-*.pt")]:
            kept.unlink(missing_ok=True)
    verdicts.summarize(doc, composed(options))


def differing(doc: ResultsDocument) -> list[str]:
    """The models whose runs differ across nodes: '<model> differs across nodes <X> and <Y>'."""
    return [f"{m['model']} differs across nodes {' and '.join(m['across_nodes']['nodes'])}"
            for m in doc.get("models") or [] if (m.get("across_nodes") or {}).get("agree") is False]
