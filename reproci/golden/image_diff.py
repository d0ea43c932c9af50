"""What differs between the goldens of two images (``reproci golden diff``): environment,
packages, and per model the first differing step and tensor with its magnitude; or, where
the two recorded other runs (other steps, seed, code, ...), which settings differ."""

from __future__ import annotations

from typing import Any, TypedDict

from . import drift
from .divergence import first_divergence, presence_text, tensor_magnitude
from .environment import TOOLCHAIN_KEYS, diff_keys, host_diff, package_diff
from .store import Golden


class ModelDiff(TypedDict, total=False):
    """One model in ``reproci golden diff``: whether it differs, and where first (in this order)."""

    status: str  # "identical", "differs", "only in NAME", "not comparable: ..."
    identity_diff: dict[str, list[Any]]  # not comparable: the settings that make the runs other runs
    step: int | None  # differs: the first differing step, tensor, and whether the losses agree
    tensor: str | None
    losses_equal: bool | None
    only_in: str  # the golden whose run has the first differing tensor at that step (the other has none)
    presence: str
    max_abs: float | None  # the final state's magnitude (``divergence.Magnitude``)
    max_ulp: int | None
    elements_differing: int | None
    shape_mismatch: list[list[int]]
    losses_agree_digits: int | None


def diff_goldens(a: Golden, b: Golden) -> dict[str, Any]:
    """What differs between two images' goldens: environment, packages, and per model."""
    env_a, env_b = a.environment, b.environment
    out: dict[str, Any] = {
        "images": [a.image, b.image],
        "env_diff": {**diff_keys(env_a, env_b, TOOLCHAIN_KEYS),
                     **host_diff(env_a, env_b, (env_b.get("device") if env_b else None) or (env_a.get("device") if env_a else None))},
        "package_diff": package_diff(a.file.packages, b.file.packages),
        "models": {},
    }
    for name in sorted(set(a.models) | set(b.models)):
        ma, mb = a.models.get(name), b.models.get(name)
        if ma is None or mb is None:
            out["models"][name] = {"status": f"only in {a.path.stem if mb is None else b.path.stem}"}
            continue
        if ma.view.final_sha256 == mb.view.final_sha256:
            out["models"][name] = {"status": "identical"}
            continue
        unlike = ma.identity.diff(mb.identity)
        if unlike:  # other runs: nothing to compare, step by step or by loss
            out["models"][name] = {"status": f"not comparable: {settings_text(unlike)}", "identity_diff": unlike}
            continue
        entry: ModelDiff = {"status": "differs"}
        div = first_divergence(ma.as_record(), mb.as_record())
        if div is not None:
            entry.update({"step": div.step, "tensor": div.tensor, "losses_equal": div.losses_equal})
            if div.only_in:  # a gradient one golden has at that step and the other has not
                sides = (a.path.stem, b.path.stem) if div.only_in == "a" else (b.path.stem, a.path.stem)
                entry.update({"only_in": sides[0], "presence": presence_text(div.tensor or "?", div.step, *sides)})
            t = drift.state_name(div.tensor)
            if t in ma.state and t in mb.state:
                entry.update(tensor_magnitude(ma.state[t], mb.state[t]))
        la, lb = ma.view.losses or [None], mb.view.losses or [None]
        entry["losses_agree_digits"] = drift.agreeing_digits(la[-1], lb[-1])
        out["models"][name] = entry
    return out


def settings_text(unlike: dict[str, list[Any]]) -> str:
    """'steps 30 vs 4, seed 0 vs 1, the model's code': what makes two goldens' runs of a model
    different runs, each setting with both values."""
    said = []
    for key, (x, y) in unlike.items():
        if key in ("code_sha256", "config_sha256"):
            said.append(f"the model's {'code' if key == 'code_sha256' else 'config'} "
                        f"({str(x)[:12] if x else '-'} vs {str(y)[:12] if y else '-'})")
        elif key == "execution":
            said.append(f"{drift.execution_text(x)} vs {drift.execution_text(y)}")
        else:
            said.append(f"{key} {x} vs {y}")
    return ", ".join(said)
