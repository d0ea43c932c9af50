"""What two runs are compared on beyond their fingerprinted tensors: the plugin's extra
state (``get_extra_state``, hashed at the end of every run) and its held-out metrics
(``eval_fn``, evaluated at the end of every run of the strict stage).

Both see state the tensor fingerprints may not: an EMA or a teacher that the plugin keeps
outside the model and did not declare as a state module, a cache, a counter. Runs whose
every tensor agrees but whose extra state or held-out metrics differ are not reproducible:
between A and B it is nondeterminism outside the hashed tensors; between A and C it is state
the checkpoint misses.
"""

from __future__ import annotations

from ...golden.divergence import Divergence
from ...worker.run_record import RunRecord


def divergence(x: RunRecord, y: RunRecord) -> Divergence | None:
    """The first difference in extra state or held-out metrics between two runs, or None."""
    ex, ey = (x.extra_state_sha256 or {}).get("end"), (y.extra_state_sha256 or {}).get("end")
    if ex is not None and ey is not None and ex != ey:
        return Divergence(step=None, tensor="extra_state", kind="extra", cause="extra",
                          detail={"x": ex[:12], "y": ey[:12]})
    sx, sy = x.scaler_state, y.scaler_state
    if sx is not None and sy is not None and sx != sy:
        return Divergence(step=None, tensor="scaler", kind="extra", cause="scaler", detail={"x": sx, "y": sy})
    mx, my = x.eval or {}, y.eval or {}
    for name in mx:
        if name in my and mx[name] != my[name]:
            return Divergence(step=None, tensor=f"eval:{name}", kind="eval", cause="eval",
                              detail={"metric": name, "x": mx[name], "y": my[name]})
    return None


def describe(div: Divergence, pair: tuple[str, str]) -> str:
    """'A = C in every fingerprinted tensor, but held-out metric ema_loss differs ...: ...'."""
    x, y = pair
    resumed = y == "C"
    d = div.detail or {}
    if div.cause == "scaler":
        what = f"the GradScaler's state differs at the end ({x} {d.get('x')}, {y} {d.get('y')})"
        why = ("the checkpoint does not restore the scaler (give TrainSetup.scaler your GradScaler)" if resumed
               else "an inf/NaN gradient in one run only skipped a step and moved the scale")
    elif div.cause == "extra":
        what = f"the extra state (get_extra_state) differs at the end ({x} {d.get('x')}…, {y} {d.get('y')}…)"
        why = ("set_extra_state does not put back all that get_extra_state returns, or the state changes in "
               "ways the checkpoint misses" if resumed else "the extra state is not reproducible")
    else:
        what = f"held-out metric {d.get('metric')} differs ({x} {d.get('x')!r}, {y} {d.get('y')!r})"
        why = ("eval_fn reads state the checkpoint misses (an EMA, a teacher, a cache?): declare such modules in "
               "TrainSetup.state_modules, other state with get_extra_state/set_extra_state" if resumed else
               "eval_fn reads state that is neither reproducible nor hashed (an EMA, a teacher?): declare such "
               "modules in TrainSetup.state_modules so that they are fingerprinted")
    return f"{x} = {y} in every fingerprinted tensor, but {what}: {why}"
