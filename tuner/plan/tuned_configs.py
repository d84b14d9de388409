"""What a fusion would give up: whether a step has any valid config with given scopes on a device, and whether
running it as another workload would lose a config the log tuned for it. ``tuner.plan.lower`` and the fusions it
runs (``tuner.plan.io_views``, ``tuner.plan.input_views``) ask these; they sit below all three."""
from __future__ import annotations

from tuner.logs.record import scope_knobs
from tuner.plan.types import FIXED, Step
from tuner.templates import get_template


def uniform_scopes(scope: str) -> dict:
    return {"input": scope, "weight": scope, "output": scope}


def has_valid(step: Step, info, scopes: dict) -> bool:
    return get_template(step.op).space(step.workload, info, **FIXED[step.op], **scope_knobs(scopes)).exists()


def loses_tuned(history, info, step: Step, workload, scopes: dict | None) -> bool:
    """Whether running ``step`` as ``workload`` with ``scopes`` (None: either uniform scope) would give up a config
    the log tuned for it: the log has a record of the step as it is (of any of its candidate templates: a tuned
    Winograd alternative counts) and no valid one of the fused kernel."""
    if history is None or not hasattr(history, "query"):
        return False
    from tuner.logs.best import invalid_config
    t = get_template(step.op)
    uniform = [uniform_scopes(sc) for sc in ("texture", "buffer")]
    after = [scopes] if scopes is not None else uniform
    if not any(history.query(c.op, c.workload, info.fingerprint, sc, FIXED[c.op]) is not None  # any template of it
               for c in step.candidates() for sc in ([c.scopes] if scopes is not None else uniform)):
        return False
    for sc in after:
        rec = history.query(t.name, workload, info.fingerprint, sc, t.model_knobs)
        if rec is not None and invalid_config(t, workload, info, rec.config) is None:
            return False
    return True
