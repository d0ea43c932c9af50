"""``reproci golden show`` and ``golden diff`` as text: a golden's identity, environment and
hashes per model; and what differs between two images' goldens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import typed, verdicts
from ..document import CpuIdView, EnvironmentView
from ..golden.environment import split_packages
from ..golden.store import Golden

if TYPE_CHECKING:
    from ..stages.base import Stages
    from ..worker.sections import Environment

OTHER_PACKAGES_SHOWN = 8


def environment_line(env: Environment | None) -> str:
    """'torch 2.13.0+cpu · Python 3.11.2 · threads 1 · no GPU': only what was recorded."""
    e = typed.load(EnvironmentView, env or {}, lenient=True)
    parts = [f"{label} {value}" for value, label in ((e.torch, "torch"), (e.cuda, "CUDA"), (e.cudnn, "cuDNN"),
                                                     (e.nccl, "NCCL"), (e.hip, "ROCm")) if value is not None]
    names = ", ".join(e.gpu.names)
    parts.append(f"GPU {names}" + (f" (driver {e.gpu.driver})" if e.gpu.driver else "") if names else "no GPU")
    if e.threads.intra_op is not None:
        parts.append(f"threads {e.threads.intra_op}")
    if e.python:
        parts.append(f"Python {e.python}")
    return " · ".join(parts)


def kernels_line(env: Environment | None) -> str | None:
    """'CPU AMD EPYC (AuthenticAMD family 25 model 17 stepping 1), ATen AVX2, oneDNN 3.12.0, MKL
    2024.2, OpenMP · kernel variables ATEN_CPU_CAPABILITY=avx2 ...': what selects the kernels."""
    k = typed.load(EnvironmentView, env or {}, lenient=True)
    if k.cpu_id is None and not k.cpu_capability:
        return None
    cpu, build = k.cpu_id or CpuIdView(), k.torch_build
    ident = " ".join(f"{name} {value}" for name, value in (("family", cpu.family), ("model", cpu.model),
                                                           ("stepping", cpu.stepping)) if value is not None)
    parts = [f"CPU {k.cpu} ({cpu.vendor} {ident})".replace(" )", ")"), f"ATen {k.cpu_capability}"]
    parts += [f"{label} {value}" for value, label in ((build.onednn, "oneDNN"), (build.mkl, "MKL")) if value]
    parts += [str(build.parallel)] if build.parallel else []
    line = ", ".join(parts)
    if cpu.isa:
        line += f" · ISA {' '.join(cpu.isa)}"
    line += " · kernel variables " + (" ".join(f"{name}={value}" for name, value in k.kernel_env.items()) or "none set")
    return line


def print_golden(g: Golden, console: Console, stages: Stages) -> None:
    """A golden's image, recording and environment, its models' hashes, then each model's lines of
    each stage (``Stage.golden_lines``: the variance stage's spread over the seeds)."""
    img, rec, env = g.file.image, g.file.recorded, g.environment
    console.print(f"[bold]{escape(str(g.path))}[/]  image {img.name} {img.reference or ''} "
                  f"{img.digest or '(local)'}")
    console.print(f"recorded {rec.at} from commit {rec.project_commit or '-'} "
                  f"(reproci {rec.reproci_version})")
    console.print(environment_line(env))
    kernels = kernels_line(env)
    if kernels:
        console.print(kernels, highlight=False, markup=False)
    t = Table()
    for col in ("model", "final sha256", "steps", "seed", "final loss", "recorded"):
        t.add_column(col, overflow="fold")
    for m, mg in g.models.items():
        e = mg.view
        losses = e.losses
        t.add_row(m, str(e.final_sha256)[:16], str(e.steps), str(e.seed),
                  f"{losses[-1]:.6g}" if losses and isinstance(losses[-1], float) else "-", str(e.recorded_at))
    console.print(t)
    for m, mg in g.models.items():
        for line in (line for stage in stages for line in stage.golden_lines(m, mg.entry)):
            console.print(line, highlight=False, markup=False)


def print_diff(name_a: str, name_b: str, d: dict[str, Any], console: Console) -> None:
    """The environment and package changes (those that can change results in full, the
    others by name), then one row per model."""
    console.print(f"[bold]{escape(name_a)}[/] → [bold]{escape(name_b)}[/]")
    for k, (x, y) in d["env_diff"].items():
        console.print(f"  {k}: {x} → {y}", markup=False)
    relevant, other = split_packages(d["package_diff"])
    for k, (x, y) in relevant.items():
        console.print(f"  package {k}: {x or '(absent)'} → {y or '(absent)'}", markup=False)
    if other:
        names = ", ".join(list(other)[:OTHER_PACKAGES_SHOWN]) + (", …" if len(other) > OTHER_PACKAGES_SHOWN else "")
        console.print(f"  {len(other)} other package(s) changed (none of them computes results): {names}", markup=False)
    if not d["env_diff"] and not d["package_diff"]:
        console.print("  same environment and packages")
    compared = {m: e for m, e in d["models"].items() if "identity_diff" not in e}
    for m, e in d["models"].items():
        if m not in compared:  # other runs (steps, seed, code, ...): a line, no comparison
            console.print(f"{m}: {e['status']}: re-record one with the other's settings to compare them",
                          highlight=False, markup=False)
    if not compared:
        return
    t = Table()
    for col in ("model", "status", "first difference", "max |Δ| (final)", "ULP", "final loss digits"):
        t.add_column(col, overflow="fold")
    for m, e in compared.items():
        where = verdicts.first_difference({"step": e.get("step"), "tensor": e["tensor"]}) if e.get("tensor") else "-"
        t.add_row(m, e["status"], where, f"{e['max_abs']:.3g}" if e.get("max_abs") is not None else "-",
                  str(e.get("max_ulp", "-")), str(e.get("losses_agree_digits", "-")))
    console.print(t)
