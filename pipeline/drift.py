"""Comparing a run with the golden of its image: what changed, and why.

Only runs that passed their own strict checks are compared. The verdict says why the
hashes moved: the image or its packages changed (UPGRADE_CHANGED), the same image on
different hardware or thread count (ENV_CHANGED), nothing recorded changed
(GOLDEN_MISMATCH: nondeterminism across runs or hosts), or the model itself changed
(MODEL_CHANGED: re-record, not an alert).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from . import verdicts
from .compare import first_divergence, tensor_magnitude
from .golden import IDENTITY_KEYS, Golden

# Toolchain fields of the environment fingerprint: a difference is an upgrade.
TOOLCHAIN_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "hip", "python", "numpy")
# Host fields: a difference with the same toolchain is an environment change.
HOST_KEYS = ("gpu.names", "gpu.count", "gpu.driver", "gpu.capability", "threads.intra_op", "threads.inter_op",
             "world_size", "cpu", "machine", "device")


def _get(d: Mapping[str, Any] | None, dotted: str) -> Any:
    cur: Any = d or {}
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def diff_keys(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, list[Any]]:
    return {k: [_get(old, k), _get(new, k)] for k in keys if _get(old, k) != _get(new, k)}


def package_diff(old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> dict[str, list[Any]]:
    old, new = old or {}, new or {}
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


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


def compare(entry: dict[str, Any], record_a: dict[str, Any], final_state: dict[str, Any] | None,
            document: dict[str, Any], golden: Golden | None, *, ci: bool, image_name: str) -> dict[str, Any]:
    """The golden section of one model's entry."""
    name = entry["model"]
    fix = f"`reproci golden update --image {image_name}`"
    file = str(golden.path) if golden else None
    g = golden.models.get(name) if golden else None
    out: dict[str, Any] = {"file": file, "golden_final_sha256": None, "golden_image": None, "package_diff": {},
                           "env_diff": {}, "evidence": None}
    if g is None:
        out["verdict"] = verdicts.NEW
        where = "no golden file" if golden is None else "no golden for this model"
        out["message"] = f"{where} for image {image_name}; record one with {fix}" + (" (CI mode: this fails)" if ci else "")
        return out
    assert golden is not None
    out["golden_final_sha256"] = g.entry.get("final_sha256")
    out["golden_image"] = {k: golden.image.get(k) for k in ("name", "reference", "digest")}
    out["recorded_at"] = g.entry.get("recorded_at")
    current = {"code_sha256": entry.get("code_sha256"), "config_sha256": entry.get("config_sha256"),
               "steps": entry.get("steps"), "seed": entry.get("seed"), "profile": document["options"]["profile"],
               "device": document["options"]["device"]}
    identity = {k: [g.entry.get(k), current[k]] for k in IDENTITY_KEYS if g.entry.get(k) != current[k]}
    if identity:
        out["verdict"] = verdicts.MODEL_CHANGED
        out["identity_diff"] = identity
        out["message"] = (f"the model or its run settings changed ({', '.join(identity)}); "
                          f"not compared with the golden: re-record with {fix}")
        return out
    if g.entry.get("final_sha256") == record_a.get("final_sha256"):
        out["verdict"] = verdicts.PASS
        out["message"] = "matches the golden"
        return out

    env_old, env_new = golden.data.get("environment"), document.get("environment")
    pkgs = package_diff(golden.data.get("packages"), document.get("packages"))
    toolchain = diff_keys(env_old, env_new, TOOLCHAIN_KEYS)
    host = diff_keys(env_old, env_new, HOST_KEYS)
    old_digest, new_digest = golden.image.get("digest"), (document.get("image") or {}).get("digest")
    digest_changed = bool(old_digest and new_digest and old_digest != new_digest)
    out["package_diff"] = pkgs
    out["env_diff"] = {**toolchain, **host}
    if digest_changed:
        out["env_diff"]["image.digest"] = [old_digest, new_digest]

    div = first_divergence(g.as_record(), record_a)
    evidence: dict[str, Any] = {}
    if div is not None:
        evidence = {"step": div.step, "tensor": div.tensor, "kind": div.kind, "cause": div.cause,
                    "differing_tensors": div.differing_tensors, "losses_equal": div.losses_equal}
        # Magnitude of the first differing tensor in the final state, from the golden's sidecar.
        name_t = state_name(div.tensor)
        if final_state and name_t in g.state and name_t in final_state:
            m = tensor_magnitude(g.state[name_t], final_state[name_t])
            evidence.update(max_abs=m["max_abs"], max_ulp=m["max_ulp"], elements_differing=m["elements_differing"],
                            magnitude_source=f"final state of {name_t}")
    losses_old, losses_new = g.entry.get("losses") or [], record_a.get("losses") or []
    evidence["losses_agree_digits"] = agreeing_digits(losses_old[-1] if losses_old else None,
                                                      losses_new[-1] if losses_new else None)
    out["evidence"] = evidence

    where = f"step {evidence.get('step')}" if evidence.get("step") is not None else "the final state"
    first = f", first at {evidence['tensor']}" if evidence.get("tensor") else ""
    mag = ""
    if evidence.get("max_abs") is not None:
        mag = f"; at the end {evidence['magnitude_source'].removeprefix('final state of ')} max |Δ| " \
              f"{evidence['max_abs']:.3g} ({evidence['max_ulp']} ULP)"
    digits = evidence.get("losses_agree_digits")
    if evidence.get("losses_equal"):
        loss = "; losses identical"
    elif digits is not None and digits < 17:
        loss = f"; final loss agrees to {digits} digits"
    else:
        loss = "; final loss identical"
    if digest_changed or pkgs or toolchain:
        out["verdict"] = verdicts.UPGRADE_CHANGED
        changes = [f"{k} {v[0]} → {v[1]}" for k, v in list(toolchain.items())[:3]]
        changes += [f"{k} {v[0]} → {v[1]}" for k, v in pkgs.items() if f"{k} " not in " ".join(changes)][:4]
        if digest_changed and not changes:
            changes = [f"image digest {str(old_digest)[:19]} → {str(new_digest)[:19]}"]
        why = ", ".join(changes[:5])
    elif host:
        out["verdict"] = verdicts.ENV_CHANGED
        why = ", ".join(f"{k} {v[0]} → {v[1]}" for k, v in host.items())
    else:
        out["verdict"] = verdicts.GOLDEN_MISMATCH
        why = "same image, packages and host: nondeterminism across runs or hosts"
    out["message"] = f"differs from the golden from {where}{first}{mag}{loss} ({why})"
    return out
