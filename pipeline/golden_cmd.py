"""``reproci golden``: update, show and diff the golden hashes of images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from . import drift, golden
from .compare import first_divergence, tensor_magnitude
from .errors import UsageError

GOLDENS_DIR = click.option("--goldens-dir", type=click.Path(path_type=Path), default=Path("goldens"), show_default=True,
                           help="Where golden files live.")


@click.group("golden")
def golden_group() -> None:
    """Golden hashes per image: record, inspect, compare."""


@golden_group.command("update", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def update_cmd(ctx: click.Context) -> None:
    """Run the strict stage and record its hashes as the golden for --image.

    Takes every option of `reproci run`. Refuses to record from a run that is not
    reproducible by itself (NONDETERMINISTIC, RESUME_BROKEN, ERROR) and says why.
    """
    from .cli import run_cmd

    run_cmd.main(args=[*ctx.args, "--update-golden"], prog_name="reproci golden update", standalone_mode=False)


def _require(goldens_dir: Path, name: str) -> golden.Golden:
    g = golden.load(goldens_dir, name)
    if g is None:
        known = sorted(p.stem for p in goldens_dir.glob("*.yaml")) if goldens_dir.is_dir() else []
        hint = f"known: {', '.join(known)}" if known else f"record one with `reproci golden update --image {name}`"
        raise UsageError(f"no golden for image {name!r} in {goldens_dir}/ ({hint})")
    return g


@golden_group.command("show")
@click.argument("name")
@GOLDENS_DIR
def show_cmd(name: str, goldens_dir: Path) -> None:
    """Show the golden of image NAME: identity, environment, hashes per model."""
    g = _require(goldens_dir, name)
    console = Console(highlight=False)
    img, rec, env = g.image, g.data.get("recorded") or {}, g.data.get("environment") or {}
    console.print(f"[bold]{g.path}[/]  image {img.get('name')} {img.get('reference') or ''} {img.get('digest') or '(local)'}")
    console.print(f"recorded {rec.get('at')} from commit {rec.get('project_commit') or '-'} (reproci {rec.get('reproci_version')})")
    gpu = env.get("gpu") or {}
    console.print(f"torch {env.get('torch')} · CUDA {env.get('cuda')} · cuDNN {env.get('cudnn')} · NCCL {env.get('nccl')} · "
                  f"GPU {', '.join(gpu.get('names') or []) or 'none'} · driver {gpu.get('driver')} · "
                  f"threads {(env.get('threads') or {}).get('intra_op')} · Python {env.get('python')}")
    t = Table()
    for col in ("model", "final sha256", "steps", "seed", "final loss", "recorded"):
        t.add_column(col)
    for m, mg in g.models.items():
        e = mg.entry
        losses = e.get("losses") or []
        t.add_row(m, str(e.get("final_sha256"))[:16], str(e.get("steps")), str(e.get("seed")),
                  f"{losses[-1]:.6g}" if losses and isinstance(losses[-1], float) else "-", str(e.get("recorded_at")))
    console.print(t)


def diff_goldens(a: golden.Golden, b: golden.Golden) -> dict[str, Any]:
    """What differs between two images' goldens: environment, packages, and per model."""
    env_a, env_b = a.data.get("environment"), b.data.get("environment")
    out: dict[str, Any] = {
        "images": [a.image, b.image],
        "env_diff": drift.diff_keys(env_a, env_b, drift.TOOLCHAIN_KEYS + drift.HOST_KEYS),
        "package_diff": drift.package_diff(a.data.get("packages"), b.data.get("packages")),
        "models": {},
    }
    for name in sorted(set(a.models) | set(b.models)):
        ma, mb = a.models.get(name), b.models.get(name)
        if ma is None or mb is None:
            out["models"][name] = {"status": f"only in {a.path.stem if mb is None else b.path.stem}"}
            continue
        same_identity = all(ma.entry.get(k) == mb.entry.get(k) for k in golden.IDENTITY_KEYS)
        if ma.entry.get("final_sha256") == mb.entry.get("final_sha256"):
            out["models"][name] = {"status": "identical"}
            continue
        entry: dict[str, Any] = {"status": "differs" if same_identity else "not comparable (model or settings differ)"}
        div = first_divergence(ma.as_record(), mb.as_record()) if same_identity else None
        if div is not None:
            entry.update(step=div.step, tensor=div.tensor, losses_equal=div.losses_equal)
            t = drift.state_name(div.tensor)
            if t in ma.state and t in mb.state:
                entry.update(tensor_magnitude(ma.state[t], mb.state[t]))
        la, lb = ma.entry.get("losses") or [None], mb.entry.get("losses") or [None]
        entry["losses_agree_digits"] = drift.agreeing_digits(la[-1], lb[-1])
        out["models"][name] = entry
    return out


@golden_group.command("diff")
@click.argument("name_a")
@click.argument("name_b")
@GOLDENS_DIR
def diff_cmd(name_a: str, name_b: str, goldens_dir: Path) -> None:
    """What differs between the goldens of two images, per model, with the package diff."""
    d = diff_goldens(_require(goldens_dir, name_a), _require(goldens_dir, name_b))
    console = Console(highlight=False)
    console.print(f"[bold]{name_a}[/] → [bold]{name_b}[/]")
    for k, (x, y) in d["env_diff"].items():
        console.print(f"  {k}: {x} → {y}")
    for k, (x, y) in d["package_diff"].items():
        console.print(f"  package {k}: {x or '(absent)'} → {y or '(absent)'}")
    if not d["env_diff"] and not d["package_diff"]:
        console.print("  same environment and packages")
    t = Table()
    for col in ("model", "status", "first difference", "max |Δ| (final)", "ULP", "final loss digits"):
        t.add_column(col)
    for m, e in d["models"].items():
        where = "-"
        if e.get("tensor"):
            where = f"step {e.get('step')} {e['tensor']}" if e.get("step") is not None else f"final {e['tensor']}"
        t.add_row(m, e["status"], where, f"{e['max_abs']:.3g}" if e.get("max_abs") is not None else "-",
                  str(e.get("max_ulp", "-")), str(e.get("losses_agree_digits", "-")))
    console.print(t)
