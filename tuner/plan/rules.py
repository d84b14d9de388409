"""Per-operator rules, one owner per graph operator: how a graph node becomes a ``Step`` (``plan.lower_graph``)
and how a glue step becomes an IR kernel (``compiler``). Add an operator by registering its two rules here or in
a module listed in ``RULE_MODULES``, not by editing the loops that use them.

- ``@lowers("op", ...)``: ``rule(ctx, node, ins, out, shape)`` appends the node's step(s) with ``ctx.add``;
  ``ins`` are the node's inputs as packed tensor or param names, ``out``/``shape`` its output tensor.
- ``@glue("step_op")``: ``build(step, plan, max_work_group) -> Kernel`` for a step that is not a tuned template.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import tuner.ops.kernels as K
from tuner.errors import TunerError
from tuner.plan.types import Step
from tuner.templates import templates_for

LOWER: dict[str, Callable] = {}
GLUE: dict[str, Callable] = {}
# Modules whose import registers more rules (kept separate so operator families stay in their own files).
RULE_MODULES: list[str] = ["tuner.plan.rules_movement", "tuner.plan.precision"]


def lowers(*ops: str):
    def deco(fn):
        for op in ops:
            LOWER[op] = fn
        return fn
    return deco


def glue(op: str):
    def deco(fn):
        GLUE[op] = fn
        return fn
    return deco


def load_rules() -> None:
    for mod in RULE_MODULES:
        importlib.import_module(mod)


@dataclass
class LowerCtx:
    """What a rule sees of the graph being lowered."""
    graph: object  # Graph
    dtype: str
    steps: list
    extra: dict = field(default_factory=dict)  # params made while lowering (name -> array)
    packed: Callable = lambda name: name  # a graph tensor's name in the plan (inputs/outputs get ".packed")

    def add(self, step) -> None:
        self.steps.append(step)

    def shape(self, name: str) -> tuple:
        return tuple(self.graph.shapes[name])

    def is_param(self, name: str) -> bool:
        return name in self.graph.params


def rule_for(op: str, node_name: str) -> Callable:
    load_rules()
    rule = LOWER.get(op)
    if rule is None:
        raise TunerError(f"node {node_name!r}: operator {op!r} has no kernel; run passes.optimize first "
                         f"(BatchNorm is folded there); lowered operators: {', '.join(sorted(LOWER))}")
    return rule


def glue_builder(op: str, step_name: str) -> Callable:
    load_rules()
    build = GLUE.get(op)
    if build is None:
        raise TunerError(f"step {step_name!r}: no kernel for {op!r}")
    return build


# -- tuned templates ------------------------------------------------------------------------------------------

def template_step(ctx: LowerCtx, node, ins, out) -> bool:
    """Append the node's template step when a template takes it (``templates_for``: registered ones, then the
    built-in ones): the first one is the step (its op is that template's name), the others its
    ``alternatives`` -- a 3x3 stride-1 conv2d can run the direct conv2d or Winograd F(2x2) or F(4x4), and
    ``plan.choose_templates`` deploys the one the log measured fastest (the first without measurements). Every
    alternative's new params (e.g. transformed weights) join ``ctx.extra``; the ones of alternatives not
    chosen are dropped then. False when no template takes the node."""
    taken = []
    side = [ctx.packed(x) for x in node.outputs[1:]]  # a node's further outputs
    for t in templates_for(node.op):
        if len(side) > len(t.side_outputs):  # a node's further outputs: only a template that writes them
            continue
        try:
            lowered = t.lower(ctx, node, ins)
        except ValueError as e:
            raise TunerError(f"node {node.name!r} ({t.name}): {e}") from None
        if lowered is not None:
            wl, inputs, extra = lowered
            ctx.extra.update(extra)
            taken.append(Step(node.name, t.name, dict(inputs), out, workload=wl,
                              side_outputs=dict(zip(t.side_outputs, side))))
    if taken:
        ctx.add(dataclasses.replace(taken[0], alternatives=taken[1:]))
    return bool(taken)


@lowers("conv2d", "dense", "group_norm", "layer_norm", "softmax", "se_gate")
def lower_template(ctx: LowerCtx, node, ins, out, shape):
    """The node runs one of the templates whose ``lower`` takes it (``template_step``); no other kernel runs
    these operators."""
    if template_step(ctx, node, ins, out):
        return
    shapes = " by ".join("x".join(map(str, ctx.shape(x))) for x in node.inputs[:2])
    attrs = {k: v for k, v in node.attrs.items() if k != "residual"}
    raise TunerError(f"node {node.name!r}: no template takes this {node.op} ({shapes}, {attrs}); templates asked: "
                     f"{', '.join(t.name for t in templates_for(node.op)) or 'none'}")


# -- glue: elementwise ----------------------------------------------------------------------------------------

@lowers("add", "relu", "clip")
def lower_elementwise(ctx: LowerCtx, node, ins, out, shape):
    """Attr ``channel_offsets`` (``passes_movement.slices_read_in_place``): per input None or the channel at
    which the input reads its tensor, a channel slice of it read in place (the kernel's ``in_views``)."""
    g, a = ctx.graph, node.attrs
    offsets = a.get("channel_offsets") or (None,) * len(node.inputs)
    if node.op == "add" and any(t not in g.params and at is None and tuple(g.shapes[t]) != tuple(shape)
                                for t, at in zip(node.inputs, offsets)):
        return lower_binary(ctx, node, ins, out, shape)  # a gate broadcast over H, W
    acts = [t for t in ins if t not in g.params]
    const = [t for t in ins if t in g.params]
    attrs = {"op": node.op, "activation": a.get("activation", "none")}
    if node.op == "clip":
        attrs["clip"] = (float(a.get("min", -np.inf)), float(a.get("max", np.inf)))
    if node.op == "add" and const:  # the frontend's constants broadcast per channel
        c = shape[1]
        v = np.broadcast_to(g.params[const[0]], shape)
        per_channel = v.reshape(shape[0], c, -1)[0, :, 0] if len(shape) == 4 else v[0]
        if not np.array_equal(np.broadcast_to(per_channel.reshape((1, c) + (1,) * (len(shape) - 2)), shape), v):
            return lower_binary(ctx, node, ins, out, shape)  # a whole constant tensor: the binary kernel
        ctx.extra[f"{node.name}.bias"] = np.ascontiguousarray(per_channel, np.float32)
        inputs = {"X": acts[0], "B": f"{node.name}.bias"}
        attrs["op"] = "bias_add"
    elif node.op == "add":
        inputs = {"X0": acts[0], "X1": acts[1]}
    else:
        inputs = {"X": acts[0]}
    if any(at is not None for at in offsets):
        attrs["in_views"] = tuple(() if at is None else (ctx.shape(t)[1], int(at))
                                  for t, at in zip(node.inputs, offsets) if t not in g.params)
    ctx.add(Step(node.name, "elementwise", inputs, out, attrs))


@glue("elementwise")
def build_elementwise(s, plan, max_wg):
    out, acts = plan.tensors[s.output], [x for k, x in s.inputs.items() if k != "B"]
    in_scopes = [plan.tensors[x].scope for x in acts] + ([plan.tensors[acts[0]].scope] if "B" in s.inputs else [])
    return K.elementwise_kernel(out.shape, s.attrs["op"], plan.dtype, in_scopes, out.scope,
                                activation=s.attrs["activation"], clip=s.attrs.get("clip", (0.0, 6.0)),
                                max_work_group=max_wg, in_views=s.attrs.get("in_views", ()))


# -- glue: activations and broadcasting binary ops ------------------------------------------------------------

@lowers("activation", "erf", "unary")
def lower_unary(ctx: LowerCtx, node, ins, out, shape):
    ctx.add(Step(node.name, "unary", {"X": ins[0]}, out, {"fn": node.attrs.get("fn", "erf")}))


@glue("unary")
def build_unary(s, plan, max_wg):
    x, out = plan.tensors[s.inputs["X"]], plan.tensors[s.output]
    return K.unary_kernel(out.shape, s.attrs["fn"], plan.dtype, x.scope, out.scope, max_wg)


def _fused_epilogue(ctx: LowerCtx, node, inputs: dict) -> None:
    """A glue node's fused epilogue (``passes.fuse_epilogues``) as kernel inputs: ``S``, its layer scale as a
    (C,) param, and ``R``, its residual."""
    if node.attrs.get("scale") is not None:
        name = f"{node.name}.scale"
        scale = np.asarray(ctx.graph.params[node.attrs["scale"]], np.float32)
        ctx.extra[name] = np.ascontiguousarray(scale.reshape(-1))
        inputs["S"] = name
    if node.attrs.get("residual") is not None:
        inputs["R"] = ctx.packed(node.attrs["residual"])
    if node.attrs.get("residual_scale") is not None:  # passes._scaled_residual: R times a (C,) param
        name = f"{node.name}.residual_scale"
        ctx.extra[name] = np.ascontiguousarray(np.asarray(ctx.graph.params[node.attrs["residual_scale"]],
                                                          np.float32).reshape(-1))
        inputs["RS"] = name


@lowers("sub", "mul", "div", "prelu")
def lower_binary(ctx: LowerCtx, node, ins, out, shape):
    """Either operand may be a per-channel constant ((1, C, 1, 1) / (1, C) param: passed as (C,)) or an
    (N or 1, C, 1, 1) gate; the step keeps the operands' shapes for the kernel."""
    g = ctx.graph
    inputs, operands = {}, []
    for k, (t, packed) in enumerate(zip(node.inputs[:2], ins[:2])):  # then the fused scale and residual
        if t in g.params and len(shape) in (2, 4) and (np.ndim(g.params[t]) > len(shape) or any(
                d != 1 and not (axis == 1 and d == shape[1]) for axis, d in
                enumerate((1,) * (len(shape) - np.ndim(g.params[t])) + np.shape(g.params[t])))):
            try:  # a whole constant tensor (a position embedding, an attention bias): read like an activation
                v = np.broadcast_to(np.asarray(g.params[t], np.float32), tuple(shape))
            except ValueError:
                raise TunerError(f"node {node.name!r} ({node.op}): a constant of shape {np.shape(g.params[t])} "
                                 f"does not broadcast to the tensor's {tuple(shape)}") from None
            name = f"{node.name}.full{k}"
            ctx.extra[name] = np.ascontiguousarray(v)
            inputs[f"X{k}"], operands = name, operands + [tuple(shape)]
        elif t in g.params:
            v = np.broadcast_to(np.asarray(g.params[t], np.float32), (1, shape[1]) + (1,) * (len(shape) - 2))
            name = f"{node.name}.c{k}"
            ctx.extra[name] = np.ascontiguousarray(v.reshape(-1))
            inputs[f"X{k}"], operands = name, operands + [(shape[1],)]
        else:
            inputs[f"X{k}"], operands = packed, operands + [tuple(g.shapes[t])]
    for k, o in enumerate(operands):
        try:
            K._operand_kind(tuple(shape), o, k)
        except ValueError as e:
            raise TunerError(f"node {node.name!r} ({node.op}): {e}") from None
    _fused_epilogue(ctx, node, inputs)
    ctx.add(Step(node.name, "binary", inputs, out, {"op": node.op, "operands": operands,
                                                    "activation": node.attrs.get("activation", "none"),
                                                    "scale": "S" in inputs, "residual": "R" in inputs}))


@glue("binary")
def build_binary(s, plan, max_wg):
    out = plan.tensors[s.output]
    xs = [s.inputs[f"X{k}"] for k in range(2)]
    acts = [plan.tensors[x] for x in xs if x in plan.tensors]
    scopes = [plan.tensors[x].scope if x in plan.tensors else acts[0].scope for x in xs]
    res = plan.tensors[s.inputs["R"]].scope if s.attrs.get("residual") else None
    return K.binary_kernel(out.shape, s.attrs["op"], s.attrs["operands"], plan.dtype, scopes, out.scope,
                           s.attrs["activation"], max_wg, s.attrs.get("scale", False), res)


# -- glue: reductions over the channels -----------------------------------------------------------------------

@lowers("reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")
def lower_reduce(ctx: LowerCtx, node, ins, out, shape):
    """A reduction over H, W (or one of them) runs the ``spatial_reduce`` template; over the channels, glue."""
    if template_step(ctx, node, ins, out):
        return
    x_shape = ctx.shape(node.inputs[0])
    axes, keepdims = tuple(node.attrs.get("axes", (2, 3))), bool(node.attrs.get("keepdims", 1))
    mode = K.REDUCE_AXES.get((len(x_shape), axes))
    if mode is None or (not keepdims and (mode == "channels" or len(axes) == 1)):
        raise TunerError(f"node {node.name!r} ({node.op}): a reduction over axes {list(axes)} of a "
                         f"{len(x_shape)}-D tensor {x_shape} with keepdims={int(keepdims)} has no kernel; supported "
                         "are NCHW over [2, 3] (H, W), over [2] or [3] (keepdims=1), over [1] or [1, 2, 3] "
                         "(keepdims=1) and (N, K) over [1] (keepdims=1)")
    kind = node.op[len("reduce_"):]
    count = int(np.prod([x_shape[a] for a in axes]))
    ctx.add(Step(node.name, "reduce", {"X": ins[0]}, out, {"kind": "mean" if kind == "sum" else kind,
                                                           "keepdims": keepdims, "axes": axes,
                                                           "scale": float(count) if kind == "sum" else 1.0}))


@glue("reduce")
def build_reduce(s, plan, max_wg):
    x, out = plan.tensors[s.inputs["X"]], plan.tensors[s.output]
    return K.reduce_kernel(x.shape, s.attrs["kind"], s.attrs["keepdims"], plan.dtype, x.scope, out.scope, max_wg,
                           axes=s.attrs.get("axes", (2, 3)), scale=s.attrs.get("scale", 1.0))


# -- glue: pooling --------------------------------------------------------------------------------------------

@lowers("global_avg_pool", "global_max_pool", "avg_pool", "max_pool")
def lower_pool(ctx: LowerCtx, node, ins, out, shape):
    """Global pools (and a pool whose one window is the whole input) run the ``spatial_reduce`` template;
    windowed pools, glue."""
    if template_step(ctx, node, ins, out):
        return
    a = node.attrs
    h, w = ctx.shape(node.inputs[0])[2:]
    attrs = ({"kind": node.op[7:10], "kernel": (h, w), "stride": (1, 1), "padding": (0, 0, 0, 0),
              "count_include_pad": False} if node.op.startswith("global_") else
             {"kind": node.op[:3], "kernel": tuple(a["kernel"]), "stride": tuple(a["stride"]),
              "padding": tuple(a["padding"]), "count_include_pad": bool(a.get("count_include_pad", False)),
              "ceil_mode": bool(a.get("ceil_mode", 0))})
    inputs = {"X": ins[0]}
    if a.get("post") is not None:  # the fused epilogue (passes.fuse_epilogues): a binary op, a scale, a residual
        inputs["P"], attrs["post_op"] = ctx.packed(a["post"]), a["post_op"]
    _fused_epilogue(ctx, node, inputs)
    if a.get("in_group_norm"):  # passes_layer_norm.norms_read_by_pools: the input read normalized
        from tuner.templates.reduction import read_norm_operands
        attrs["in_norm"], inputs["Q"], affine = read_norm_operands(ctx, node, ctx.shape(node.inputs[0])[1])
        attrs["post_normed"] = bool(a.get("post_normed"))
        inputs["A"] = f"{node.name}.norm_affine"
        ctx.extra[inputs["A"]] = affine
    sides = {}
    if a.get("out_stats"):  # passes_layer_norm.norm_statistics_into_producers: a GroupNorm(1)'s statistics too
        attrs["out_stats"], sides["St"] = True, ctx.packed(node.outputs[1])
    ctx.add(Step(node.name, "pool", inputs, out, attrs, side_outputs=sides))


@glue("pool")
def build_pool(s, plan, max_wg):
    a, x, out = s.attrs, plan.tensors[s.inputs["X"]], plan.tensors[s.output]
    post = (a["post_op"], plan.tensors[s.inputs["P"]].scope) if "P" in s.inputs else None
    res = plan.tensors[s.inputs["R"]].scope if "R" in s.inputs else None
    return K.pool_kernel(x.shape, a["kind"], a["kernel"], a["stride"], a["padding"], a["count_include_pad"],
                         plan.dtype, x.scope, out.scope, max_wg, ceil_mode=a.get("ceil_mode", False), post=post,
                         scale="S" in s.inputs, residual_scope=res, residual_scale="RS" in s.inputs,
                         in_norm=a.get("in_norm"),
                         post_normed=a.get("post_normed", False), out_stats=a.get("out_stats", False))


# -- glue: data movement --------------------------------------------------------------------------------------

@lowers("flatten", "reshape")
def lower_relayout(ctx: LowerCtx, node, ins, out, shape):
    ctx.add(Step(node.name, "relayout", {"X": ins[0]}, out))


@glue("relayout")
def build_relayout(s, plan, max_wg):
    src, out = plan.tensors[s.inputs["X"]], plan.tensors[s.output]
    # a plain host buffer is its row-major elements: read or written in the packed side's shape (a model input or
    # output in its own shape of another rank, ``passes_io``), no index arithmetic between the two
    in_shape = out.shape if src.kind == "plain" and out.kind != "plain" else src.shape
    out_shape = src.shape if out.kind == "plain" and src.kind != "plain" else out.shape
    return K.relayout_kernel(in_shape, out_shape, plan.dtype, "buffer" if src.kind == "plain" else src.scope,
                             src.layout, "buffer" if out.kind == "plain" else out.scope, out.layout, max_wg)


@lowers("concat")
def lower_concat(ctx: LowerCtx, node, ins, out, shape):
    parts = node.inputs[:-1] if node.attrs.get("addend") else node.inputs  # (``addend``: the last input)
    consts = [t for t in parts if ctx.is_param(t)]
    if node.attrs.get("axis", 1) not in (1, -3) or len(shape) != 4 or consts:  # H, W (Swin's roll), 2-D, params
        axis = int(node.attrs.get("axis", 1)) % len(shape)
        if axis == 0:
            raise TunerError(f"node {node.name!r}: concat along the batch axis has no kernel; concatenate along "
                             f"channels, H or W")
        ctx.add(Step(node.name, "concat_view", {f"X{i}": t for i, t in enumerate(ins)}, out,
                     {"axis": axis, "shapes": tuple(ctx.shape(t) for t in node.inputs)}))
        return
    act = node.attrs.get("activation", "none")
    if act != "none":  # passes_movement.fuse_concat_activations: its own step, which plan.views never writes in place
        ctx.add(Step(node.name, "concat_act", {f"X{i}": t for i, t in enumerate(ins)}, out, {"activation": act}))
        return
    attrs, inputs = {}, {f"X{i}": t for i, t in enumerate(ins)}
    if node.attrs.get("channel_offsets") or node.attrs.get("flat"):  # passes_movement: parts read in place at a
        # channel offset of their source (``parts``: each part's channels), the output written as tokens, a constant
        # added
        offsets = node.attrs.get("channel_offsets") or (None,) * len(parts)
        channels = node.attrs.get("parts") or tuple(ctx.shape(t)[1] for t in parts)
        attrs = {"part_shapes": tuple((ctx.shape(t)[0], c, *ctx.shape(t)[2:]) for t, c in zip(parts, channels)),
                 "in_views": tuple(() if at is None else (ctx.shape(t)[1], int(at)) for t, at in zip(parts, offsets)),
                 "flat": bool(node.attrs.get("flat"))}
        inputs = {f"X{i}": t for i, t in enumerate(ins[:len(parts)])}
        if node.attrs.get("addend"):
            inputs["R"] = f"{node.name}.addend"
            ctx.extra[inputs["R"]] = np.ascontiguousarray(
                np.broadcast_to(np.asarray(ctx.graph.params[node.inputs[-1]], np.float32), tuple(shape)))
    ctx.add(Step(node.name, "concat", inputs, out, attrs))


@glue("concat")
def build_concat(s, plan, max_wg):
    acts = [x for k, x in s.inputs.items() if k != "R"]
    shapes = s.attrs.get("part_shapes") or [plan.tensors[x].shape for x in acts]
    return K.concat_kernel(shapes, plan.dtype, [plan.tensors[x].scope for x in acts],
                           plan.tensors[s.output].scope, max_work_group=max_wg,
                           activation=s.attrs.get("activation", "none"), in_views=s.attrs.get("in_views", ()),
                           flat=s.attrs.get("flat", False), addend="R" in s.inputs)


GLUE["concat_act"] = build_concat  # a concat and the activation after it, in one kernel
