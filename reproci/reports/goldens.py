"""``reproci golden show`` and ``golden diff`` as text: a golden's identity, environment and
hashes per model; and what differs between two images' goldens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import verdicts
from ..golden.environment import split_packages
from ..golden.store import Golden

if TYPE_CHECKING:
    from ..stages.base import Stages

OTHER_PACKAGES_SHOWN = 8


def environment_line(env: dict[str, Any]) -> str:
    """'torch 2.13.0+cpu · Python 3.11.2 · threads 1 · no GPU': only what was recorded."""
    gpu = env.get("gpu") or {}
    parts = [f"{label} {env[key]}" for key, label in (("torch", "torch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"),
                                                       ("nccl", "NCCL"), ("hip", "ROCm")) if env.get(key) is not None]
    names = ", ".join(gpu.get("names") or [])
    parts.append(f"GPU {names}" + (f" (driver {gpu['driver']})" if gpu.get("driver") else "") if names else "no GPU")
    threads = (env.get("threads") or {}).get("intra_op")
    if threads is not None:
        parts.append(f"threads {threads}")
    if env.get("python"):
        parts.append(f"Python {env['python']}")
    return " · ".join(parts)


def kernels_line(env: dict[str, Any]) -> str | None:
    """'CPU AMD EPYC (AuthenticAMD family 25 model 17 stepping 1), ATen AVX2, oneDNN 3.12.0, MKL
    2024.2, OpenMP · kernel variables ATEN_CPU_CAPABILITY=avx2 ...': what selects the kernels."""
    cpu_id, build = env.get("cpu_id") or {}, env.get("torch_build") or {}
    if not cpu_id and not env.get("cpu_capability"):
        return None
    ident = " ".join(f"{k} {cpu_id[k]}" for k in ("family", "model", "stepping") if cpu_id.get(k) is not None)
    parts = [f"CPU {env.get('cpu')} ({cpu_id.get('vendor')} {ident})".replace(" )", ")"),
             f"ATen {env.get('cpu_capability')}"]
    parts += [f"{label} {build[k]}" for k, label in (("onednn", "oneDNN"), ("mkl", "MKL")) if build.get(k)]
    parts += [str(build["parallel"])] if build.get("parallel") else []
    line = ", ".join(parts)
    if cpu_id.get("isa"):
        line += f" · ISA {' '.join(cpu_id['isa'])}"
    kernel_env = env.get("kernel_env") or {}
    line += " · kernel variables " + (" ".join(f"{k}={v}" for k, v in kernel_env.items()) or "none set")
    return line


def print_golden(g: Golden, console: Console, stages: Stages) -> None:
    """A golden's image, recording and environment, its models' hashes, then each model's lines of
    each stage (``Stage.golden_lines``: the variance stage's spread over the seeds)."""
    img, rec, env = g.image, g.data.get("recorded") or {}, g.data.get("environment") or {}
    console.print(f"[bold]{escape(str(g.path))}[/]  image {img.get('name')} {img.get('reference') or ''} "
                  f"{img.get('digest') or '(local)'}")
    console.print(f"recorded {rec.get('at')} from commit {rec.get('project_commit') or '-'} "
                  f"(reproci {rec.get('reproci_version')})")
    console.print(environment_line(env))
    kernels = kernels_line(env)
    if kernels:
        console.print(kernels, highlight=False, markup=False)
    t = Table()
    for col in ("model", "final sha256", "steps", "seed", "final loss", "recorded"):
        t.add_column(col, overflow="fold")
    for m, mg in g.models.items():
        e = mg.entry
        losses = e.get("losses") or []
        t.add_row(m, str(e.get("final_sha256"))[:16], str(e.get("steps")), str(e.get("seed")),
                  f"{losses[-1]:.6g}" if losses and isinstance(losses[-1], float) else "-", str(e.get("recorded_at")))
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
