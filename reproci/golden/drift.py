"""Comparing a run with the golden of its image: what changed, and why.

Only runs that passed their own strict checks are compared. The verdict says why the
hashes moved: the image or its packages changed (UPGRADE_CHANGED), the same image on
different hardware or thread count (ENV_CHANGED), nothing recorded changed
(GOLDEN_MISMATCH: nondeterminism across runs or hosts), or the model itself changed
(MODEL_CHANGED: re-record, not an alert).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypedDict

from .. import typed, verdicts
from ..document import Document, Entry
from ..entry_sections import Evidence, EvidenceView
from ..results import ModelEntry, RecordedOptions, ResultsDocument
from ..worker.run_record import Run, Trajectory
from .advice import SETTINGS
from .comparison import Comparison, GoldenImage, NoGolden
from .divergence import first_divergence, tensor_magnitude
from .environment import TOOLCHAIN_KEYS, diff_keys, host_diff, host_text, package_diff, split_packages
from .store import EntryView, Golden, Identity, ModelGolden

if TYPE_CHECKING:
    import torch

    from ..worker.sections import Execution


@dataclass(frozen=True, kw_only=True)
class CompiledView:
    """How a run was compiled (``worker.execution.CompileIdentity``), read by attribute."""

    source: str | None = None  # "harness" (--compile) or "plugin" (the plugin's own compiled model)
    backend: str | None = None
    mode: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExecutionView:
    """A run's execution identity (``worker.execution.Execution``) read by attribute: a key an older
    record lacks is None."""

    compile: CompiledView | None = None
    amp: str | None = None


class Changes(TypedDict):
    """What changed between a golden's environment and a run's: each key -> [golden's, this run's]."""

    packages: dict[str, list[Any]]
    toolchain: dict[str, list[Any]]
    host: dict[str, list[Any]]
    digest: list[Any] | None  # the image digests, when both are known and differ
    env: dict[str, list[Any]]  # toolchain, host and digest together, as the model entry shows them


def state_name(tensor: str | None) -> str | None:
    """The stored final-state tensor that shows a differing tensor's magnitude: a gradient
    or optimizer state is shown through its parameter (goldens keep parameters and buffers)."""
    if tensor is None:
        return None
    kind, _, name = tensor.partition(":")
    if kind == "grad":
        return f"param:{name}"
    if kind == "optim":
        return f"param:{name.rpartition('.')[0]}"
    return tensor


def agreeing_digits(a: Any, b: Any) -> int | None:
    """Significant decimal digits on which two losses agree (None if not numbers)."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if a == b:
        return 17
    scale = max(abs(a), abs(b))
    if scale == 0 or not math.isfinite(scale):
        return 0
    return max(0, int(math.floor(-math.log10(abs(a - b) / scale))))


def compare(entry: ModelEntry, run_a: Run, final_state: dict[str, torch.Tensor] | None,
            document: ResultsDocument, golden: Golden | None, *, ci: bool, image_name: str,
            fix: str | None = None, rerun: Callable[[EntryView], str] | None = None) -> Comparison:
    """The golden section of one model's entry: its verdict against the golden, the
    evidence, and the message that says it; ``fix`` is the command that re-records it, and
    ``rerun(golden entry)`` the one that runs with the settings the golden was recorded with."""
    record_a = Trajectory.of(run_a)
    fix = fix or f"`reproci golden update --image {image_name}`"
    fails = " (CI mode: this fails)" if ci else ""
    g = golden.models.get(entry["model"]) if golden else None
    file = str(golden.path) if golden else None
    if golden is None or g is None:
        where = "no golden file" if golden is None else "no golden for this model"
        return NoGolden(file=file, verdict=verdicts.NEW,
                        message=f"{where} for image {image_name}; record one with {fix}{fails}")
    recorded = golden.file.image
    image = GoldenImage(name=recorded.name, reference=recorded.reference, digest=recorded.digest)
    out = Comparison(file=file, golden_final_sha256=g.view.final_sha256, golden_image=image,
                     recorded_at=g.view.recorded_at)
    identity = g.identity.diff(_identity(entry, document["options"]))
    if identity:
        how = execution_change(*identity["execution"]) if "execution" in identity else None
        if rerun is not None and set(identity) <= set(SETTINGS):  # the model is the same: run as the golden was
            differ = ", ".join(f"{k} {old} in the golden, {new} here" for k, (old, new) in identity.items())
            message = (f"this run's settings differ from the golden's ({differ}); not compared with the golden: "
                       f"to compare, run {rerun(g.view)}; to make these settings the golden's instead, "
                       f"re-record with {fix}")
        else:
            message = (f"the model or its run settings changed ({how or ', '.join(identity)}); "
                       f"not compared with the golden: re-record with {fix}")
        return typed.replace(out, verdict=verdicts.MODEL_CHANGED, identity_diff=identity, message=message + fails)
    changes = _changes(golden, document)
    out = typed.replace(out, package_diff=changes["packages"], env_diff=changes["env"])
    if g.view.final_sha256 == record_a.final_sha256:
        upgrade = upgrade_text(changes)
        return typed.replace(out, verdict=verdicts.PASS, upgrade_checked=True if upgrade else None,
                             message=f"unchanged by the upgrade {upgrade}: matches the golden" if upgrade
                             else "matches the golden")
    evidence = _evidence(g, record_a, final_state)
    verdict, why = _why(changes)
    return typed.replace(out, evidence=evidence, verdict=verdict, why=why,
                         message=f"differs from the golden {verdicts.where_text(evidence)}"
                                 f"{_magnitude(evidence)}{_losses(evidence)} ({why})")


def execution_text(execution: Execution | None) -> str:
    """'eager fp32', 'compiled (inductor, mode default)', 'eager, bf16 autocast', ..."""
    e = typed.load(ExecutionView, execution, lenient=True) if execution else ExecutionView()
    c, amp = e.compile, e.amp
    how = "eager" if not c else ("compiled by the plugin" if c.source == "plugin" else
                                 f"compiled ({c.backend}, mode {c.mode or 'default'})")
    return f"{how}, {amp} autocast" if amp else f"{how} fp32" if not c else how


def execution_change(golden: Execution | None, current: Execution | None) -> str:
    """How the run executes unlike its golden: compiled runs are compared only with compiled runs."""
    return (f"the golden was recorded {execution_text(golden)}, this run is {execution_text(current)}: "
            "compare compiled runs only with compiled runs, and autocast with the same autocast")


def _identity(entry: ModelEntry, options: RecordedOptions) -> Identity:
    """What identifies the model and its run settings in this run."""
    m = Entry.of(entry)
    return Identity(code_sha256=m.code_sha256, config_sha256=m.config_sha256, steps=m.steps, seed=m.seed,
                    profile=options["profile"], device=options["device"], execution=entry.get("execution"))


def _changes(golden: Golden, document: ResultsDocument) -> Changes:
    """What changed between the golden's environment and this run's."""
    doc = Document.of(document)
    env_old, env_new = golden.environment, document.get("environment")
    old_digest, new_digest = golden.file.image.digest, doc.image.digest
    toolchain, host = diff_keys(env_old, env_new, TOOLCHAIN_KEYS), host_diff(env_old, env_new, doc.options.device)
    digest = [old_digest, new_digest] if old_digest and new_digest and old_digest != new_digest else None
    return {"packages": package_diff(golden.file.packages, doc.packages), "toolchain": toolchain,
            "host": host, "digest": digest, "env": {**toolchain, **host, **({"image.digest": digest} if digest else {})}}


def move(name: str, versions: list[Any]) -> str:
    """'torch 2.13.0 → 2.14.1', 'nvidia-nccl-cu13 2.27.3 (added)', 'six 1.16 (removed)'."""
    old, new = versions
    return f"{name} {new} (added)" if old is None else f"{name} {old} (removed)" if new is None else f"{name} {old} → {new}"


def upgrade_text(changes: Changes) -> str | None:
    """'torch 2.13.0+cpu → 2.14.1+cu130 (and 14 other packages)': what an upgrade moved, most
    telling first; None when no package or toolchain field changed."""
    pkgs = changes["packages"]
    toolchain = {k: v for k, v in changes["toolchain"].items() if not k.startswith("torch_")}  # torch's own build
    if not toolchain and not pkgs:
        return None
    relevant, other = split_packages(pkgs)
    said = [move(k, v) for k, v in list(toolchain.items())[:2]]
    named = [k for k in toolchain]
    ranked = sorted(relevant.items(), key=lambda kv: (kv[0] != "torch", kv[0])) + list(other.items())
    said += [move(k, v) for k, v in ranked if k not in named][:max(0, 2 - len(said))]
    shown = {s.split(" ", 1)[0] for s in said}
    rest = len({*toolchain, *pkgs} - shown)
    return ", ".join(said) + (f" (and {rest} other package{'s' if rest != 1 else ''})" if rest else "")


def _why(changes: Changes) -> tuple[str, str]:
    """The drift verdict, and the changes that explain it, most telling first, each once.

    An upgrade is a toolchain or package change. An image digest alone is not: images rebuilt
    from the same wheels get new digests. Then the host factors (ENV_CHANGED: what selects
    kernels first), and only when nothing recorded differs, GOLDEN_MISMATCH."""
    toolchain, pkgs, host, digest = changes["toolchain"], changes["packages"], changes["host"], changes["digest"]
    rebuilt = (f"image rebuilt, same packages (digest {str(digest[0])[:19]} → {str(digest[1])[:19]})"
               if digest and not pkgs and not toolchain else None)
    if pkgs or toolchain:
        said = [move(k, v) for k, v in list(toolchain.items())[:3]]
        relevant, other = split_packages(pkgs)
        said += [move(k, v) for k, v in [*relevant.items(), *other.items()]
                 if f"{k} " not in " ".join(said)][:4]
        more = len(toolchain) + len(pkgs) - len(said[:5])
        return verdicts.UPGRADE_CHANGED, ", ".join(said[:5]) + (f" (and {more} more)" if more > 0 else "")
    if host:
        said = [host_text(k, *v) for k, v in host.items()]
        return verdicts.ENV_CHANGED, ", ".join(said[:5]) + (f" (and {len(said) - 5} more)" if len(said) > 5 else "") + (
            f"; {rebuilt}" if rebuilt else "")
    nothing = "nothing recorded differs: nondeterminism across runs or hosts, or a factor reproci does not record"
    return verdicts.GOLDEN_MISMATCH, f"{rebuilt}; {nothing}" if rebuilt else f"same image, packages and host: {nothing}"


def _evidence(g: ModelGolden, record_a: Trajectory, final_state: dict[str, torch.Tensor] | None) -> Evidence:
    """Where the run first leaves the golden's trajectory, and by how much at the end (from
    the golden's sidecar, which keeps the final parameters and buffers)."""
    div = first_divergence(g.as_record(), record_a)
    evidence: Evidence = {}
    if div is not None:
        evidence = {"step": div.step, "tensor": div.tensor, "kind": div.kind, "cause": div.cause,
                    "differing_tensors": div.differing_tensors, "losses_equal": div.losses_equal}
        name_t = state_name(div.tensor)
        if final_state and name_t in g.state and name_t in final_state:
            m = tensor_magnitude(g.state[name_t], final_state[name_t])
            evidence.update({"max_abs": m["max_abs"], "max_ulp": m["max_ulp"],
                             "elements_differing": m["elements_differing"], "magnitude_source": f"final state of {name_t}"})
    losses_old, losses_new = g.view.losses, record_a.losses
    evidence["losses_agree_digits"] = agreeing_digits(losses_old[-1] if losses_old else None,
                                                      losses_new[-1] if losses_new else None)
    return evidence


def _magnitude(evidence: Evidence) -> str:
    e = typed.load(EvidenceView, evidence, lenient=True)
    if e.max_abs is None:
        return ""
    return f"; at the end {(e.magnitude_source or '').removeprefix('final state of ')} {verdicts.magnitude_text(evidence)}"


def _losses(evidence: Evidence) -> str:
    e = typed.load(EvidenceView, evidence, lenient=True)
    digits = e.losses_agree_digits
    if e.losses_equal:
        return "; losses identical"
    if digits is not None and digits < 17:
        return f"; final loss agrees to {digits} digits"
    return "; final loss identical"
