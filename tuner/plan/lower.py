"""From the optimized NCHW graph to the kernels that will run: one ``Step`` per deployed kernel, over tensors
stored NCHW4c (4-D activations) or packed by 4 along the last axis (2-D), each with a storage scope.

- ``lower_graph``: every node becomes a template step (conv2d, depthwise_conv2d, dense: tuned) or a glue
  step (elementwise, pool, concat, relayout); the model's inputs and outputs stay plain row-major buffers
  with relayout steps at the boundaries.
- ``plan_storage`` (the texture RFC's CollectStorageInfo): a scope per tensor -- texture only where the
  device has images (half images for float16), the image fits its limits, and the consumers take it;
  ``scope="auto"`` decides per tuned layer from the log which scope measured faster.
- ``choose_templates`` (beside the scope choice): a node that several templates take (a 3x3 stride-1 conv2d:
  the direct conv2d, Winograd F(2x2) and F(4x4)) runs the one whose best logged record, for the scopes the plan
  chose, is fastest -- the first (the direct conv2d) when the log has none of them.
- ``extract_tasks``: the unique (template, workload, scopes, pinned knobs) that will run, weighted by count
  and FLOPs -- exactly what the model may deploy (every alternative of a node until ``choose_templates``
  picked one), so tuning measures the kernels that ship.
"""
from __future__ import annotations

import dataclasses
import json
import math

from tuner.errors import TunerError

from tuner.graph.graph import Graph
from tuner.task import TuningTask
from tuner.plan.types import FIXED, SCOPE_MODES, Plan, Step, Tensor
from tuner.plan.rules import LowerCtx, rule_for
from tuner.plan.tuned_configs import has_valid, loses_tuned, uniform_scopes
from tuner.search_space import image_fits
from tuner.templates import get_template


def _kind(shape) -> str:
    if len(shape) == 4:
        return "nchw"
    if len(shape) == 2:
        return "rows"
    raise TunerError(f"tensors of rank {len(shape)} ({list(shape)}) are not supported between kernels; "
                     f"activations are NCHW (4-D) or N,K (2-D)")


def lower_graph(g: Graph, dtype: str = "float32", float32=None) -> Plan:
    """The optimized graph (``passes.optimize``) as steps; ``dtype`` is the storage type (float32/float16).
    ``float32``: ``{node or input name: why}`` kept in float32 in a float16 plan (``tuner.plan.precision``'s
    guard): their outputs are stored in float32, their weights too, and cast steps convert at the boundaries."""
    if dtype not in ("float32", "float16"):
        raise TunerError(f"storage dtype {dtype!r}: float32 or float16")
    float32 = dict(g.float32 if float32 is None else float32) if dtype == "float16" else {}
    of = lambda name: "float32" if name in float32 else dtype  # noqa: E731
    tensors: dict = {}
    steps: list = []
    extra: dict = {}  # params made here (per-channel constants of adds)

    def packed(name: str) -> str:
        return name if name in g.params else rename.get(name, name)

    rename = {}
    for x in g.inputs:  # boundary: a plain NCHW (or N,K) host buffer relayouted into the packed form
        tensors[x] = Tensor(x, tuple(g.io_shapes.get(x, g.shapes[x])), "plain", dtype=of(x))  # the model's shape
        rename[x] = f"{x}.packed"
        tensors[rename[x]] = Tensor(rename[x], tuple(g.shapes[x]), _kind(g.shapes[x]), dtype=of(x))
        steps.append(Step(f"{x}.pack", "relayout", {"X": x}, rename[x]))
    out_rename = {y: f"{y}.packed" for y in g.outputs if y not in g.inputs}
    rename.update(out_rename)

    ctx = LowerCtx(g, dtype, steps, extra, packed)
    for node in g.nodes:
        out = out_rename.get(node.outputs[0], node.outputs[0])
        shape = tuple(g.shapes[node.outputs[0]])
        tensors[out] = Tensor(out, shape, _kind(shape), dtype=of(node.name)) if not node.attrs.get("stats") else \
            Tensor(out, shape, "plain", dtype="float32")  # a GroupNorm(1)'s statistics: float32 chunk partials,
        # a buffer its reading convolutions index themselves (``passes_layer_norm.group_norm_into_convs``)
        for side in node.outputs[1:]:  # a second output (a depthwise convolution's row sums): in out's scope;
            # a convolution's GroupNorm(1) statistics (``out_stats``): float32 partials in a buffer, as above
            tensors[side] = Tensor(side, tuple(g.shapes[side]), _kind(g.shapes[side]), dtype=of(node.name)) \
                if not node.attrs.get("out_stats") else Tensor(side, tuple(g.shapes[side]), "plain", dtype="float32")
        ins = [packed(t) for t in node.inputs]
        ctx.dtype = of(node.name)  # a template's workload (and its weights) in the node's storage dtype
        rule_for(node.op, node.name)(ctx, node, ins, out, shape)
        ctx.dtype = dtype
        for t in ins:
            if t not in g.params and t not in tensors:
                raise TunerError(f"node {node.name!r} reads {t!r}, which no earlier step produces")
    for y, packed_y in out_rename.items():
        tensors[y] = Tensor(y, tuple(g.io_shapes.get(y, g.shapes[y])), "plain", dtype=tensors[packed_y].dtype)
        steps.append(Step(f"{y}.unpack", "relayout", {"X": packed_y}, y))
    plan = Plan(steps, tensors, {**g.params, **extra}, list(g.inputs), list(g.outputs), dtype)
    if float32:
        from tuner.plan.precision import insert_casts
        plan = insert_casts(dataclasses.replace(plan, precision=float32))
    return plan



def _texture_ok(t: Tensor, info, dtype: str) -> bool:
    return (t.kind != "plain" and bool(info.image_support) and (dtype == "float32" or bool(info.half_images))
            and image_fits(t.texture_layout, t.shape, info))


def _measured(history, step: Step, info, scope: str):
    """The log's best all-``scope`` median of the node, over its candidate templates; None when none has one. A
    kernel reading the model input (writing its output) row-major in place (``io_views``) has that side in a
    buffer whatever the plan's scope: its all-``scope`` record has that one side a buffer."""
    found = [r.median_s for c in step.candidates()
             if (r := history.query(c.op, c.workload, info.fingerprint, _uniform_for(c, scope), FIXED[c.op]))
             is not None]
    return min(found, default=None)


def _uniform_for(step: Step, scope: str) -> dict:
    out = uniform_scopes(scope)
    if getattr(step.workload, "plain_input", False):
        out["input"] = "buffer"
    if getattr(step.workload, "plain_output", False):
        out["output"] = "buffer"
    return out


def _decide(step: Step, info, mode: str, history) -> str:
    """The scope a tuned layer wants for its activations: forced by the mode, else (auto) the faster of the
    log's best all-texture and all-buffer records (of any of its candidate templates), else the template's
    own choice for the device."""
    if mode != "auto":
        return mode
    if history is not None:
        tex, buf = _measured(history, step, info, "texture"), _measured(history, step, info, "buffer")
        if tex is not None or buf is not None:
            return "texture" if buf is None or (tex is not None and tex <= buf) else "buffer"
    return get_template(step.op).fallback(step.workload, info).input_scope


FUSIONS = ("input_views", "io_in_place")  # what ``plan_storage`` folds into neighbouring kernels by default


def plan_storage(plan: Plan, info, scope: str = "auto", history=None, fusions=FUSIONS) -> Plan:
    """A scope per tensor and per tuned step's operands. ``history``: an ApplyHistoryBest for ``auto``.

    ``auto`` with a log prices the whole plan, boundaries included: the per-layer choice (each layer's faster
    uniform scope, with mixed-scope kernels where neighbours disagree), all-texture and all-buffer are each
    estimated from the log (``estimate_plan``) and the cheapest is taken, so ``auto`` is never estimated
    slower than the best uniform plan.

    ``fusions``: ``input_views`` -- before the scopes, a convolution reads the concat, nearest upsample or pool before
    it through views, with no kernel for them (``tuner.plan.input_views``); ``io_in_place`` -- once the scopes are
    decided, the model inputs' and outputs' relayouts are taken by the kernels next to them
    (``tuner.plan.io_views``; for a node several templates take, a 3x3 stride-1 convolution, once
    ``choose_templates`` picked the direct conv2d, so that tuning still measures its alternatives). Neither gives up
    a tuned config: with a log, a kernel the log has a record of is fused only where the log has one of the fused
    kernel too."""
    if scope not in SCOPE_MODES:
        raise TunerError(f"scope {scope!r}: one of {', '.join(SCOPE_MODES)}")
    unknown = set(fusions) - set(FUSIONS)
    if unknown:
        raise TunerError(f"fusions {sorted(unknown)}: known are {', '.join(FUSIONS)}")
    if "input_views" in fusions:
        from tuner.plan.input_views import read_inputs_through_views
        plan = read_inputs_through_views(plan, info, history)
    io = "io_in_place" in fusions
    plan = dataclasses.replace(plan, fusions=tuple(fusions))
    per_layer = _plan_storage(plan, info, scope, history, io)
    if scope != "auto" or history is None:
        return per_layer
    candidates = [per_layer]
    for uniform in ("texture", "buffer"):
        try:
            candidates.append(_plan_storage(plan, info, uniform, history, io))
        except TunerError:  # e.g. a layer with no valid all-texture config on this device
            continue
    costs = [estimate_plan(c, info, history) for c in candidates]
    return candidates[min(range(len(candidates)), key=lambda i: (costs[i], i))]


def _step_cost(step: Step, info, history) -> float:
    """The log's best median of the exact deployed task (the fastest of the node's candidate templates); a
    kernel the log lacks (a mixed-scope boundary kernel nobody tuned) is priced at the slower of its layer's
    uniform measurements. A layer the log has no record of in either scope is unknown alike in every candidate
    plan: 0, so that the layers measured decide (with +inf every plan would tie)."""
    exact = [r.median_s for c in step.candidates()
             if (r := history.query(c.op, c.workload, info.fingerprint, c.scopes, FIXED[c.op])) is not None]
    if exact:
        return min(exact)
    known = [m for m in (_measured(history, step, info, sc) for sc in ("texture", "buffer")) if m is not None]
    return max(known) if known else 0.0


def estimate_plan(plan: Plan, info, history) -> float:
    """Seconds of the plan's tuned kernels by the log (``_step_cost`` each); glue kernels are not priced."""
    return sum(_step_cost(s, info, history) for s in plan.steps if s.tuned)


def _plan_storage(plan: Plan, info, scope: str, history, io_in_place: bool = False) -> Plan:
    copy = lambda s: dataclasses.replace(s, alternatives=[dataclasses.replace(a) for a in s.alternatives])  # noqa: E731
    plan = dataclasses.replace(plan, steps=[copy(s) for s in plan.steps], notes=list(plan.notes),
                               tensors={k: dataclasses.replace(t) for k, t in plan.tensors.items()})
    want = {s.name: _decide(s, info, scope, history) for s in plan.steps if s.tuned}
    readers: dict = {}
    for s in plan.steps:
        for t in s.inputs.values():
            readers.setdefault(t, []).append(s)
    siblings = _input_parts(plan)  # a convolution's input parts (in_read): one scope, its input_scope
    decided: set = set()
    for s in plan.steps:  # in order, so a glue step's inputs are decided before its output
        t = plan.tensors[s.output]
        if t.kind == "plain":
            continue
        decided.add(s.output)
        gated = [r for r in readers.get(s.output, []) if r.inputs.get("S") == s.output]
        same = [plan.tensors[x].scope for x in siblings.get(s.output, ()) if x in decided and x != s.output]
        if "Res" in s.inputs:  # the kernel reads the residual in its output's scope and layout
            choice = plan.tensors[s.inputs["Res"]].scope
        elif same:  # another part of a convolution's input, decided first
            choice = same[0]
        elif gated:  # a convolution reads its input's gate in the input's scope (decided: it is computed first)
            choice = plan.tensors[gated[0].inputs["X"]].scope
        elif s.name in want:
            choice = want[s.name]
        else:
            tuned_readers = [r for r in readers.get(s.output, []) if r.name in want]
            first_in = next((plan.tensors[x] for x in s.inputs.values() if x in plan.tensors
                             and plan.tensors[x].kind != "plain"), None)
            choice = (want[tuned_readers[0].name] if tuned_readers else first_in.scope if first_in is not None
                      else "buffer" if scope == "buffer" else "texture")
        sides = [plan.tensors[x] for x in s.side_outputs.values()  # written in the output's scope and layout
                 if plan.tensors[x].kind != "plain"]  # (statistics: a buffer of their own)
        t.scope = choice if choice == "buffer" or all(_texture_ok(x, info, plan.dtype_of(x.name))
                                                      for x in (t, *sides)) else "buffer"
        if s.tuned and not ("Res" in s.inputs or gated) and _served(s, info, _io(plan, s), want[s.name]) is None:
            other = "buffer" if t.scope == "texture" else "texture"
            io = _io(plan, s)
            if (other == "buffer" or _texture_ok(t, info, plan.dtype_of(t.name))) \
                    and _served(s, info, {**io, "output": other}, want[s.name]) is not None:
                plan.notes.append(f"{s.name}: output in {other}, not {t.scope}: {s.op} has no valid config on "
                                  f"{info.name} with input {io['input']} and output {t.scope}")
                t.scope = other
        for x in sides:
            x.scope = t.scope
            decided.add(x.name)
    for parts in {tuple(v) for v in siblings.values()}:  # parts that other rules stored apart: all in buffers
        if len({plan.tensors[x].scope for x in parts}) > 1:
            plan.notes.append(f"{', '.join(parts)}: in buffers: one convolution reads them as its input's parts "
                              f"(in_read) in one scope")
            for x in parts:
                plan.tensors[x].scope = "buffer"
    for s in plan.steps:
        if not s.tuned:
            continue
        io = _io(plan, s)
        s.scopes = _served(s, info, io, want[s.name])
        if s.scopes is None:
            raise TunerError(f"node {s.name!r} ({s.op} {json.dumps(s.workload.key())}): no valid config on "
                             f"{info.name} with input {io['input']} and output {io['output']}; try --scope buffer")
        kept = []  # an alternative takes the step's activation scopes, or is no alternative in this plan
        for a in s.alternatives:
            for w in dict.fromkeys([s.scopes["weight"], "buffer"]):
                if has_valid(a, info, {**io, "weight": w}):
                    a.scopes = {"input": io["input"], "weight": w, "output": io["output"]}
                    kept.append(a)
                    break
        s.alternatives = kept
    if io_in_place:
        from tuner.plan.io_views import read_io_in_place
        plan = read_io_in_place(plan, info, history)
    return plan


def _input_parts(plan: Plan) -> dict:
    """``{tensor: (every part tensor of its convolution's input)}`` for the tensors a convolution reads in parts
    (``Conv2dWorkload.in_read``, ``tuner.plan.input_views``)."""
    from tuner.plan.input_views import part_tensors
    out: dict = {}
    for s in plan.steps:
        if s.tuned and len(getattr(s.workload, "in_read", ()) or ()) > 1:
            parts = tuple(part_tensors(s))
            for x in parts:
                out[x] = tuple(sorted(set(out.get(x, ())) | set(parts)))
    return out


def _io(plan: Plan, step: Step) -> dict:
    """A tuned step's activation scopes as its tensors have them: each scope role's input, and the output."""
    io = {role: plan.tensors[step.inputs[key]].scope for role, key in get_template(step.op).scope_inputs.items()}
    io["output"] = plan.tensors[step.output].scope
    return io


def _weight_scopes(io: dict, want: str) -> list:
    """The weight scopes a tuned step may take, in order: a kernel with weights reads them in its own layer's
    wanted scope (texture, else buffer); a kernel without (a pool, a norm) has its "weight" tied to its input's
    scope by its space (``no_weights``), whatever its layer wanted."""
    if "weight" in io:
        return [io["weight"]]
    return list(dict.fromkeys([io["input"], *(["texture", "buffer"] if want == "texture" else ["buffer"])]))


def _served(step: Step, info, io: dict, want: str) -> dict | None:
    """The step's scopes for activation scopes ``io`` (its input's and output's, decided by the tensors) with the
    first weight scope it has a valid config for; None when it has none."""
    for w in _weight_scopes(io, want):
        scopes = {"input": io["input"], "weight": w, "output": io["output"]}
        if has_valid(step, info, scopes):
            return scopes
    return None


def choose_templates(plan: Plan, history, info, prefer=None) -> Plan:
    """Per node with alternatives (several templates take it), the one to deploy: the candidate whose best
    valid logged record on ``info``'s device, for the scopes the plan chose, is fastest; the first (the
    template ``lower_graph`` asks first: the direct conv2d before Winograd) when the log measured none of them,
    or there is no log. ``prefer`` overrides the log: ``"first"`` deploys every node's first candidate; a dict
    {node name: template name} deploys that template where it is one of the node's candidates (the choice
    ``compiler.fastest_plan`` makes from per-node times measured inside the model). The params only unchosen
    alternatives read (e.g. Winograd-transformed weights) are dropped, so they are never uploaded. Run it after
    ``plan_storage``; ``extract_tasks`` after it lists only the chosen kernels."""
    steps = []
    for s in plan.steps:
        chosen = s
        wanted = s.op if prefer == "first" else (prefer or {}).get(s.name)
        if s.alternatives and any(c.op == wanted for c in s.candidates()):
            chosen = next(c for c in s.candidates() if c.op == wanted)
        elif s.alternatives and history is not None:
            best = math.inf
            for c in s.candidates():
                t = get_template(c.op)
                rec = history.best_valid(t, c.workload, info, c.scopes, t.model_knobs)
                if rec is not None and rec.median_s < best:
                    chosen, best = c, rec.median_s
        steps.append(dataclasses.replace(chosen, alternatives=[]))
    used = {x for s in steps for x in s.inputs.values()}
    dropped = {x for s in plan.steps for a in s.candidates() for x in a.inputs.values()} - used
    params = {k: v for k, v in plan.params.items() if k not in dropped}
    out = dataclasses.replace(plan, steps=steps, params=params)
    if "io_in_place" in plan.fusions:  # the boundary kernels whose template is chosen now (plan_storage's)
        from tuner.plan.io_views import read_io_in_place
        out = read_io_in_place(out, info, history)
    return out


def extract_tasks(plan: Plan, alternatives: bool = True) -> list:
    """The unique tuned kernels of a planned model as TuningTasks (their ``count`` in the model carried
    along, ``weight`` count x FLOPs), heaviest first: every candidate template of a node (the direct conv2d and
    Winograd of a 3x3 stride-1 conv2d: tuning measures them all, so that ``choose_templates`` can pick), or
    with ``alternatives=False`` only the step each node runs now."""
    return sorted((t for t, _ in task_nodes(plan, alternatives).values()), key=lambda t: -t.weight)


def task_nodes(plan: Plan, alternatives: bool = True) -> dict:
    """``{task key: (TuningTask, [node names])}``: each unique tuned kernel of the plan (``count`` the nodes it
    may serve, ``weight`` count x FLOPs) and the names of those nodes, one per occurrence -- the pools a model's
    task scheduler measures by node (``tuner.scheduler``)."""
    found: dict = {}
    for s in plan.steps:
        if s.tuned:
            for c in s.candidates() if alternatives else [s]:
                t = TuningTask(c.op, c.workload, dict(c.scopes), FIXED[c.op])
                found.setdefault(t.key(), [t, []])[1].append(s.name)
    return {k: (dataclasses.replace(t, count=len(nodes), weight=None), nodes) for k, (t, nodes) in found.items()}
