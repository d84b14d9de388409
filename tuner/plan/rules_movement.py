"""Lowering and glue-kernel rules of the data-movement and layout operators (registered on import through
``lowering.RULE_MODULES``): transpose -> ``permute``, slice, pad, resize, upsample_zeros, depth_to_space glue steps
(LayerNormalization runs the ``layer_norm`` template).
``conv_transpose`` and 5-D channel shuffles are rewritten by ``passes_movement`` first."""
from __future__ import annotations


import tuner.ops.kernels_movement as KM
from tuner.errors import TunerError
from tuner.ir.gather import channel_map
from tuner.ops.token_views import token_logical

from tuner.plan.rules import LowerCtx, glue, lower_template, lowers
from tuner.plan.types import Step


def _step(*args, **kwargs):
    return Step(*args, **kwargs)


def _scope(plan, name: str) -> str:
    t = plan.tensors[name]
    return "buffer" if t.kind == "plain" else t.scope


# -- rules ------------------------------------------------------------------------------------------------
@lowers("transpose")
def lower_transpose(ctx: LowerCtx, node, ins, out, shape):
    perm = tuple(node.attrs["perm"])
    if perm == tuple(range(len(perm))):
        ctx.add(_step(node.name, "relayout", {"X": ins[0]}, out))
        return
    ctx.add(_step(node.name, "permute", {"X": ins[0]}, out, {"perm": perm}))


@lowers("slice")
def lower_slice(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    if channel_map(a["channels"]) is None:
        raise TunerError(f"node {node.name!r}: a channel gather {list(a['channels'])[:16]} that is not a slice or a "
                         f"shuffle ((c % m) * a + (c // m) * b + off) has no kernel")
    ctx.add(_step(node.name, "slice", {"X": ins[0]}, out, {"channels": tuple(a["channels"]),
                                                          "rows": tuple(a.get("rows", (0, 1, None))),
                                                          "cols": tuple(a.get("cols", (0, 1, None)))}))


@lowers("pad")
def lower_pad(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    ctx.add(_step(node.name, "pad", {"X": ins[0]}, out, {"pads": tuple(a["pads"]), "mode": a["mode"],
                                                        "value": float(a.get("value", 0.0))}))


@lowers("resize")
def lower_resize(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    ctx.add(_step(node.name, "resize", {"X": ins[0]}, out, {"mode": a["mode"], "coord": a["coord"],
                                                           "nearest": a["nearest"], "scales": tuple(a["scales"])}))


@lowers("upsample_zeros")
def lower_upsample_zeros(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    ctx.add(_step(node.name, "upsample_zeros", {"X": ins[0]}, out, {"stride": tuple(a["stride"]),
                                                                   "shift": tuple(a["shift"])}))


@lowers("conv_transpose")
def lower_conv_transpose(ctx: LowerCtx, node, ins, out, shape):
    raise TunerError(f"node {node.name!r}: conv_transpose is lowered onto conv2d by "
                     f"passes_movement.lower_conv_transpose; run passes.optimize first")


# -- glue kernels -----------------------------------------------------------------------------------------
@glue("permute")
def build_permute(s, plan, max_wg):
    x = plan.tensors[s.inputs["X"]]
    return KM.permute_kernel(x.shape, s.attrs["perm"], plan.dtype, _scope(plan, x.name),
                             _scope(plan, s.output), max_wg)


@glue("slice")
def build_slice(s, plan, max_wg):
    x, a = plan.tensors[s.inputs["X"]], s.attrs
    return KM.slice_kernel(x.shape, a["channels"], a["rows"], a["cols"], plan.dtype, _scope(plan, x.name),
                           _scope(plan, s.output), max_wg, a.get("out_view", ()))


@glue("pad")
def build_pad(s, plan, max_wg):
    x, a = plan.tensors[s.inputs["X"]], s.attrs
    return KM.pad_kernel(x.shape, a["pads"], a["mode"], a["value"], plan.dtype, _scope(plan, x.name),
                         _scope(plan, s.output), max_wg)


@glue("resize")
def build_resize(s, plan, max_wg):
    x, a, out = plan.tensors[s.inputs["X"]], s.attrs, plan.tensors[s.output]
    return KM.resize_kernel(x.shape, out.shape[2:], a["mode"], a["coord"], a["nearest"], a["scales"], plan.dtype,
                            _scope(plan, x.name), _scope(plan, s.output), max_wg)


@glue("upsample_zeros")
def build_upsample_zeros(s, plan, max_wg):
    x, a, out = plan.tensors[s.inputs["X"]], s.attrs, plan.tensors[s.output]
    return KM.upsample_zeros_kernel(x.shape, out.shape[2:], a["stride"], a["shift"], plan.dtype,
                                    _scope(plan, x.name), _scope(plan, s.output), max_wg)



@lowers("depth_to_space")
def lower_depth_to_space(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    ctx.add(_step(node.name, "depth_to_space", {"X": ins[0]}, out,
                  {"block": tuple(a["block"]), "mode": a["mode"], "crop": tuple(a.get("crop", (0, 0))),
                   "size": tuple(shape[2:])}))


@glue("depth_to_space")
def build_depth_to_space(s, plan, max_wg):
    a = s.attrs
    return KM.depth_to_space_kernel(plan.tensors[s.inputs["X"]].shape, a["block"], a["mode"], a["crop"], a["size"],
                                    plan.dtype, _scope(plan, s.inputs["X"]), _scope(plan, s.output), max_wg)


@lowers("strided_copy")
def lower_strided_copy(ctx: LowerCtx, node, ins, out, shape):
    a = node.attrs
    inputs = {"X": ins[0], **({"D": ins[1]} if a.get("divisor") else {})}  # D: a row divisor (divisions_into_copies)
    ctx.add(_step(node.name, "strided_copy", inputs, out, {"src_shape": tuple(a["src_shape"]),
                                                                 "offset": int(a["offset"]),
                                                                 "strides": tuple(a["strides"]),
                                                                 "shape": tuple(a["shape"]),
                                                                 "out_shape": tuple(a["out_shape"]),
                                                                 **({"divisor_index": a["divisor_index"]}
                                                                    if a.get("divisor_index") else {})}))


@glue("strided_copy")
def build_strided_copy(s, plan, max_wg):
    a = s.attrs
    return KM.strided_copy_kernel(a["src_shape"], a["offset"], a["shape"], a["strides"], plan.dtype,
                                  _scope(plan, s.inputs["X"]), _scope(plan, s.output), max_wg,
                                  out_shape=a["out_shape"],
                                  divisor_scope=_scope(plan, s.inputs["D"]) if "D" in s.inputs else None,
                                  divisor_index=a.get("divisor_index"))


@lowers("concat_view")
def lower_concat_view(ctx: LowerCtx, node, ins, out, shape):
    ctx.add(_step(node.name, "concat_view", {f"X{k}": t for k, t in enumerate(ins)}, out,
                  {"axis": int(node.attrs["axis"]), "shapes": tuple(tuple(s) for s in node.attrs["shapes"])}))


@glue("concat_view")
def build_concat_view(s, plan, max_wg):
    out = _scope(plan, s.output)
    scopes = [_scope(plan, x) if x in plan.tensors else out for x in s.inputs.values()]  # a param: as the output
    return KM.concat_view_kernel(s.attrs["shapes"], s.attrs["axis"], plan.dtype, scopes, out, max_wg)


@lowers("matmul")
def lower_matmul(ctx: LowerCtx, node, ins, out, shape):
    if not node.attrs.get("tokens"):
        raise TunerError(f"node {node.name!r}: matmul of {len(shape)}-D tensors reaches lowering before "
                         f"passes_tokens.tokens_to_nchw; run passes.optimize first")
    lower_template(_Logical(ctx, node), node, ins, out, shape)


class _Logical:
    """``ctx`` as a template sees it: the token tensors of a matmul node by their logical (B, T, C) shapes, not
    their stored (B, C, 1, T) views (``passes_tokens.token_view``); the template stores them so."""

    def __init__(self, ctx: LowerCtx, node):
        self._ctx = ctx
        acts = [t for t in node.inputs + node.outputs if t not in ctx.graph.params]
        self._logical = {t: token_logical(s) for t in acts for s in [ctx.shape(t)] if len(s) == 4 and s[2] == 1}

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def shape(self, name: str) -> tuple:
        return self._logical.get(name) or self._ctx.shape(name)
