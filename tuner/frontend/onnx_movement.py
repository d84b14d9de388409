"""ONNX handlers of the data-movement and layout operators (Transpose, Split, Slice, Pad, Resize, ConvTranspose,
LayerNormalization, MatMul on 3-D/4-D, ...): a mixin of ``frontend._Converter``, which inherits ``_op_<Type>``
methods from here. Handlers use the converter's helpers (``act``, ``const``, ``param``, ``emit``, ``fail``).

What is emitted (graph ops; ``graph.py`` conventions, shapes exactly onnxruntime's):

- Transpose -> ``transpose`` (``perm``). A 5-D channel shuffle ``Reshape -> Transpose -> Reshape`` and NHWC
  blocks are rewritten by ``passes_movement`` before lowering.
- Split (axis 1, 2 or 3; sizes from the attribute, the input or an even split) -> one ``slice`` per output;
  Slice (constant starts / ends / axes / steps, on C, H or W) -> ``slice``. ``slice`` attrs: ``channels`` (the
  source channel of every output channel), ``rows`` / ``cols`` (start, step, count) on 4-D tensors.
- Pad (constant / reflect / edge, pads on H and W, as an input or attribute) -> ``pad`` (``pads`` (top, left,
  bottom, right), ``mode``, ``value``).
- Resize (opset 10+) / Upsample -> ``resize`` (``mode``, ``coord``, ``nearest``, ``scales`` (sh, sw), ``size``).
- ConvTranspose -> ``conv_transpose`` (x, w (C, O/group, R, S), [b]; ``stride``, ``padding``, ``dilation``,
  ``output_padding``, ``groups``).
- DepthToSpace (DCR, CRD) -> ``depth_to_space`` (``block`` (b, b), ``mode``); SpaceToDepth -> a 6-D reshape,
  transpose and reshape, one strided copy after ``passes_tokens.movement_views``.
- LayerNormalization over the last axis -> ``layer_norm`` (x, scale, bias; ``axis``, ``epsilon``).
- ``_matmul_nd``: MatMul of a 3-D / 4-D activation by a constant (K, M) -> ``dense`` on that rank (frontend's
  ``_op_MatMul`` delegates to it for ranks other than 2); by another activation of the same rank and batch
  axes (attention's ``Q @ K^T``, ``P @ V``) -> ``matmul`` (``alpha`` 1).
- Split / Slice of a tensor of rank other than 2 and 4 (the 5-D qkv of attention) -> ``slice_nd`` (``starts``,
  ``steps``, ``counts`` per axis), a strided view that ``passes_tokens.movement_views`` folds into copies.
"""
from __future__ import annotations

import math

import numpy as np

from tuner.graph.graph import Node


def _decode(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class MovementOps:
    """``_op_<ONNX type>(self, ctx)`` handlers; see frontend.py for the protocol."""

    # -- helpers ----------------------------------------------------------------------------------------------

    def _emit_to(self, ctx, out: str, name: str, op: str, inputs: list, out_shape: tuple, **attrs):
        """``emit`` for an output other than the first (Split)."""
        if any(d <= 0 for d in out_shape):
            ctx.fail(f"the output {out!r} shape {tuple(out_shape)} is empty",
                     "operators whose outputs have at least one element")
        self.shapes[out] = tuple(int(d) for d in out_shape)
        self.nodes.append(Node(op, name, inputs, [out], attrs))

    def _ints(self, ctx, name: str, what: str) -> list:
        v = self.const(ctx, name, what)
        if v.dtype.kind not in "iu" or v.ndim > 1:
            ctx.fail(f"{what} of dtype {v.dtype} and shape {v.shape}", f"a 1-D integer {what}")
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def _slice_node(self, ctx, x: str, out: str, name: str, ranges: dict):
        """``ranges``: axis -> Python range of source indices along it (other axes whole)."""
        shape = self.shapes[x]
        rank = len(shape)
        if rank not in (2, 4):  # tokens, 5-D heads: a strided view (passes_tokens.movement_views folds it)
            full = [ranges.get(axis, range(d)) for axis, d in enumerate(shape)]
            if any(len(r) == 0 for r in full):
                ctx.fail(f"an empty slice of an input of shape {shape}", "non-empty slices")
            self._emit_to(ctx, out, name, "slice_nd", [x], tuple(len(r) for r in full),
                          starts=tuple(r.start for r in full), steps=tuple(r.step for r in full),
                          counts=tuple(len(r) for r in full))
            return
        if 0 in ranges and list(ranges[0]) != list(range(shape[0])):
            ctx.fail("a slice of the batch axis", "slices along C, H or W")
        if rank == 2 and any(a > 1 for a in ranges):
            ctx.fail("a slice of axis > 1 of a 2-D input", "slices along axis 1 of (N, K)")
        channels = tuple(ranges.get(1, range(shape[1])))
        out_shape = [shape[0], len(channels)]
        attrs = {"channels": channels}
        if rank == 4:
            for axis, key in ((2, "rows"), (3, "cols")):
                r = ranges.get(axis, range(shape[axis]))
                if len(r) == 0:
                    ctx.fail(f"an empty slice along axis {axis}", "non-empty slices")
                attrs[key] = (r.start, r.step, len(r))
                out_shape.append(len(r))
        if any(d == 0 for d in out_shape):
            ctx.fail(f"the output shape {tuple(out_shape)} is empty", "non-empty slices")
        self._emit_to(ctx, out, name, "slice", [x], tuple(out_shape), **attrs)

    # -- Transpose --------------------------------------------------------------------------------------------

    def _op_Transpose(self, ctx):
        ctx.check_attrs(("perm",))
        x = self.act(ctx, ctx.proto.input[0])
        shape = self.shapes[x]
        perm = [int(p) for p in ctx.attrs.get("perm", range(len(shape) - 1, -1, -1))]
        if sorted(perm) != list(range(len(shape))):
            ctx.fail(f"perm={perm} for a {len(shape)}-D input", "a permutation of the input's axes")
        self.emit(ctx, "transpose", [x], tuple(shape[p] for p in perm), perm=tuple(perm))

    # -- Split / Slice ----------------------------------------------------------------------------------------

    def _op_Split(self, ctx):
        ctx.check_attrs(("axis", "split", "num_outputs"))
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        axis = int(ctx.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= axis < len(shape):
            ctx.fail(f"axis={ctx.attrs.get('axis', 0)} for a {len(shape)}-D input", "an axis of the input")
        outs = list(ctx.proto.output)
        if len(names) > 1 and names[1]:
            sizes = self._ints(ctx, names[1], "split")
        elif "split" in ctx.attrs:
            sizes = [int(s) for s in ctx.attrs["split"]]
        else:
            k = len(outs)
            size = -(-shape[axis] // k)
            sizes = [size] * (k - 1) + [shape[axis] - size * (k - 1)]
        if len(sizes) != len(outs) or sum(sizes) != shape[axis] or min(sizes) < 1:
            ctx.fail(f"split {sizes} of axis {axis} (extent {shape[axis]}) into {len(outs)} outputs",
                     "positive sizes summing to the axis extent, one per output")
        start = 0
        for k, (out, size) in enumerate(zip(outs, sizes)):
            if out:
                self._slice_node(ctx, x, out, ctx.name if k == 0 else f"{ctx.name}:{k}",
                                 {axis: range(start, start + size)})
            start += size

    def _op_Gather(self, ctx):
        """Gather of an activation at constant indices along one axis (a ViT's class token, ``x[:, 0]``): a
        slice of each index run; a scalar index drops the axis (a reshape). Constant Gathers are folded before."""
        ctx.check_attrs(("axis",))
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        axis = int(ctx.attrs.get("axis", 0))
        axis = axis + len(shape) if axis < 0 else axis
        idx = self.const(ctx, names[1], "indices")
        batch_ok = len(shape) not in (2, 4)  # a 5-D qkv's leading axis is no batch (CaiT's unbind)
        if idx.dtype.kind not in "iu" or idx.ndim > 1 or not (0 < axis < len(shape) or (axis == 0 and batch_ok)):
            ctx.fail(f"indices of dtype {idx.dtype} and shape {idx.shape} along axis {ctx.attrs.get('axis', 0)} "
                     f"of a {len(shape)}-D input", "a constant integer index or 1-D run of consecutive indices "
                     "along an axis other than the batch")
        flat = [int(i) + shape[axis] if int(i) < 0 else int(i) for i in np.asarray(idx).reshape(-1)]
        if not flat or any(not 0 <= i < shape[axis] for i in flat) or flat != list(range(flat[0], flat[0] + len(flat))):
            ctx.fail(f"indices {np.asarray(idx).tolist()} along axis {axis} (extent {shape[axis]})",
                     "in-range, consecutive, increasing indices")
        out = ctx.proto.output[0]
        if idx.ndim == 1:
            self._slice_node(ctx, x, out, ctx.name, {axis: range(flat[0], flat[0] + len(flat))})
            return
        mid = f"{out}.slice"
        self._slice_node(ctx, x, mid, f"{ctx.name}.slice", {axis: range(flat[0], flat[0] + 1)})
        dropped = shape[:axis] + shape[axis + 1:]
        self._emit_to(ctx, out, ctx.name, "reshape", [mid], dropped, shape=dropped)

    def _op_Tile(self, ctx):
        """Tile of an activation that repeats only axes of extent 1 (GC ViT's global query over its windows): a
        broadcast view (``expand_nd``, stride 0), copied out where a kernel reads it."""
        ctx.check_attrs(())
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        reps = self._ints(ctx, names[1], "repeats")
        if len(reps) != len(shape) or min(reps) < 1 or any(r > 1 and d != 1 for r, d in zip(reps, shape)):
            ctx.fail(f"repeats {reps} of an input of shape {shape}", "repeats of axes of extent 1 only (a "
                     "broadcast), one per axis")
        out = tuple(d * r for d, r in zip(shape, reps))
        self.emit(ctx, "expand_nd", [x], out, shape=out)

    def _op_Slice(self, ctx):
        names = ctx.inputs()
        if self.opset >= 10:
            ctx.check_attrs(())
            starts, ends = self._ints(ctx, names[1], "starts"), self._ints(ctx, names[2], "ends")
            axes = self._ints(ctx, names[3], "axes") if len(names) > 3 and names[3] else None
            steps = self._ints(ctx, names[4], "steps") if len(names) > 4 and names[4] else None
        else:
            ctx.check_attrs(("starts", "ends", "axes"))
            starts, ends = list(ctx.attrs.get("starts", [])), list(ctx.attrs.get("ends", []))
            axes, steps = ctx.attrs.get("axes"), None
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
        steps = [1] * len(starts) if steps is None else steps
        if not len(starts) == len(ends) == len(axes) == len(steps):
            ctx.fail(f"starts {starts}, ends {ends}, axes {axes}, steps {steps}", "lists of one length")
        ranges = {}
        for start, end, axis, step in zip(starts, ends, axes, steps):
            axis = axis + len(shape) if axis < 0 else axis
            if not 0 <= axis < len(shape) or axis in ranges or step == 0:
                ctx.fail(f"axes {axes} / steps {steps} for a {len(shape)}-D input", "distinct axes, steps != 0")
            ranges[axis] = range(shape[axis])[slice(start, end, step)]
            if len(ranges[axis]) == 0:
                ctx.fail(f"an empty slice [{start}:{end}:{step}] of axis {axis} (extent {shape[axis]})",
                         "non-empty slices")
        self._slice_node(ctx, x, ctx.proto.output[0], ctx.name, ranges)

    # -- Pad --------------------------------------------------------------------------------------------------

    def _op_Pad(self, ctx):
        names = ctx.inputs()
        x = self.act(ctx, names[0], rank=(4,))
        shape = self.shapes[x]
        if self.opset >= 11:
            ctx.check_attrs(("mode",))
            pads = self._ints(ctx, names[1], "pads")
            value = 0.0
            if len(names) > 2 and names[2]:
                v = self.const(ctx, names[2], "constant_value")
                if v.size != 1:
                    ctx.fail(f"constant_value of shape {v.shape}", "a scalar constant_value")
                value = float(np.asarray(v).reshape(-1)[0])
            if len(names) > 3 and names[3]:
                axes = [a + 4 if a < 0 else a for a in self._ints(ctx, names[3], "axes")]
                full = [0] * 8
                for k, a in enumerate(axes):
                    full[a], full[a + 4] = pads[k], pads[k + len(axes)]
                pads = full
        else:
            ctx.check_attrs(("mode", "pads", "paddings", "value"))
            pads = [int(p) for p in ctx.attrs.get("pads", ctx.attrs.get("paddings", []))]
            value = float(ctx.attrs.get("value", 0.0))
        mode = _decode(ctx.attrs.get("mode", b"constant"))
        if mode not in ("constant", "reflect", "edge"):
            ctx.fail(f"mode={mode!r}", "mode constant, reflect or edge")
        if len(pads) != 8 or any(pads[a] or pads[a + 4] for a in (0, 1)) or min(pads) < 0:
            ctx.fail(f"pads={pads}", "8 non-negative pads that pad only H and W of an NCHW input")
        top, left, bottom, right = pads[2], pads[3], pads[6], pads[7]
        n, c, h, w = shape
        if mode == "reflect" and (max(top, bottom) >= h or max(left, right) >= w):
            ctx.fail(f"reflect pads {pads} on a {h}x{w} input", "reflect pads smaller than the input")
        self.emit(ctx, "pad", [x], (n, c, h + top + bottom, w + left + right), pads=(top, left, bottom, right),
                  mode=mode, value=value)

    # -- Resize -----------------------------------------------------------------------------------------------

    def _op_Resize(self, ctx):
        ctx.check_attrs(("coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                         "extrapolation_value", "mode", "nearest_mode", "antialias", "axes",
                         "keep_aspect_ratio_policy"))
        names = ctx.inputs()
        scales = sizes = None
        if self.opset < 11:  # Resize-10: X, scales; asymmetric coordinates
            scales = self.const(ctx, names[1], "scales")
            coord, nearest = "asymmetric", "floor"
        else:
            coord = _decode(ctx.attrs.get("coordinate_transformation_mode", b"half_pixel"))
            nearest = _decode(ctx.attrs.get("nearest_mode", b"round_prefer_floor"))
            if len(names) > 2 and names[2]:
                scales = self.const(ctx, names[2], "scales")
            if len(names) > 3 and names[3]:
                sizes = self._ints(ctx, names[3], "sizes")
            if scales is not None and scales.size == 0:
                scales = None
            if (scales is None) == (sizes is None):
                ctx.fail("both or neither of scales and sizes", "exactly one of scales and sizes")
        if ctx.attrs.get("antialias", 0) or "axes" in ctx.attrs or ctx.attrs.get("exclude_outside", 0):
            ctx.fail("antialias, axes or exclude_outside", "Resize without them")
        if _decode(ctx.attrs.get("keep_aspect_ratio_policy", b"stretch")) != "stretch":
            ctx.fail(f"keep_aspect_ratio_policy={ctx.attrs['keep_aspect_ratio_policy']!r}", "stretch")
        self._resize(ctx, names[0], _decode(ctx.attrs.get("mode", b"nearest")), coord, nearest, scales, sizes)

    def _op_Upsample(self, ctx):
        ctx.check_attrs(("mode", "scales"))
        names = ctx.inputs()
        scales = (np.asarray(ctx.attrs["scales"], np.float32) if "scales" in ctx.attrs
                  else self.const(ctx, names[1], "scales"))
        self._resize(ctx, names[0], _decode(ctx.attrs.get("mode", b"nearest")), "asymmetric", "floor", scales, None)

    def _resize(self, ctx, x_name, mode, coord, nearest, scales, sizes):
        x = self.act(ctx, x_name, rank=(4,))
        n, c, h, w = self.shapes[x]
        mode = {"bilinear": "linear"}.get(mode, mode)
        if mode not in ("nearest", "linear"):
            ctx.fail(f"mode={mode!r}", "mode nearest or linear")
        if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
            ctx.fail(f"coordinate_transformation_mode={coord!r}",
                     "half_pixel, pytorch_half_pixel, align_corners or asymmetric")
        if nearest not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            ctx.fail(f"nearest_mode={nearest!r}", "round_prefer_floor, round_prefer_ceil, floor or ceil")
        if sizes is not None:
            if len(sizes) != 4 or sizes[:2] != [n, c] or min(sizes) < 1:
                ctx.fail(f"sizes {sizes} for an input of shape {(n, c, h, w)}", "sizes (N, C, OH, OW) resizing H, W")
            oh, ow = sizes[2:]
            sc = (float(np.float32(oh) / np.float32(h)), float(np.float32(ow) / np.float32(w)))
        else:
            s = np.asarray(scales, np.float32).reshape(-1)
            if s.size != 4 or s[0] != 1 or s[1] != 1 or min(s) <= 0:
                ctx.fail(f"scales {s.tolist()}", "scales (1, 1, sh, sw) with positive sh, sw")
            sc = (float(s[2]), float(s[3]))
            oh, ow = int(math.floor(h * float(s[2]))), int(math.floor(w * float(s[3])))
        self.emit(ctx, "resize", [x], (n, c, oh, ow), mode=mode, coord=coord, nearest=nearest, scales=sc,
                  size=(oh, ow))

    # -- DepthToSpace / SpaceToDepth --------------------------------------------------------------------------

    def _block(self, ctx, x: str) -> int:
        ctx.check_attrs(("blocksize", "mode"))
        if "blocksize" not in ctx.attrs:
            ctx.fail("no blocksize", "a blocksize attribute")
        b = int(ctx.attrs["blocksize"])
        if b < 1:
            ctx.fail(f"blocksize={b}", "a blocksize of 1 or more")
        if len(self.shapes[x]) != 4:
            ctx.fail(f"a {len(self.shapes[x])}-D input", "a 4-D (N, C, H, W) input")
        return b

    def _op_DepthToSpace(self, ctx):
        x = self.act(ctx, ctx.proto.input[0])
        b = self._block(ctx, x)
        mode = _decode(ctx.attrs.get("mode", "DCR"))
        n, c, h, w = self.shapes[x]
        if mode not in ("DCR", "CRD"):
            ctx.fail(f"mode={mode!r}", "mode DCR or CRD")
        if c % (b * b):
            ctx.fail(f"{c} channels with blocksize {b}", "channels divisible by blocksize**2")
        self.emit(ctx, "depth_to_space", [x], (n, c // (b * b), h * b, w * b), block=(b, b), mode=mode)

    def _op_SpaceToDepth(self, ctx):
        """-> the (N, C, H/b, b, W/b, b) reshape, its transpose (0, 3, 5, 1, 2, 4) and the reshape back to 4-D:
        ``passes_tokens.movement_views`` folds the three into one strided copy."""
        x = self.act(ctx, ctx.proto.input[0])
        b = self._block(ctx, x)
        n, c, h, w = self.shapes[x]
        if h % b or w % b:
            ctx.fail(f"a {h}x{w} input with blocksize {b}", "height and width divisible by blocksize")
        six = (n, c, h // b, b, w // b, b)
        moved = (n, b, b, c, h // b, w // b)
        split, perm = self.new_tensor(f"{ctx.name}.blocks", six), self.new_tensor(f"{ctx.name}.moved", moved)
        self.nodes.append(Node("reshape", f"{ctx.name}.blocks", [x], [split], {"shape": six}))
        self.nodes.append(Node("transpose", f"{ctx.name}.moved", [split], [perm], {"perm": (0, 3, 5, 1, 2, 4)}))
        out = (n, c * b * b, h // b, w // b)
        self.emit(ctx, "reshape", [perm], out, shape=out)

    # -- ConvTranspose ----------------------------------------------------------------------------------------

    def _op_ConvTranspose(self, ctx):
        ctx.check_attrs(("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape",
                         "pads", "strides"))
        names = ctx.inputs()
        x = self.act(ctx, names[0], rank=(4,))
        n, c, h, w_in = self.shapes[x]
        weight = self.const(ctx, names[1], "weight W")
        if weight.ndim != 4:
            ctx.fail(f"weight of shape {weight.shape}", "a 2-D transposed convolution (C, O/group, R, S)")
        group = int(ctx.attrs.get("group", 1))
        ci, og, r, s = weight.shape
        if ci != c or group < 1 or c % group:
            ctx.fail(f"weight {weight.shape} with group={group} for {c} input channels",
                     f"weights ({c}, O/group, R, S) with group dividing {c}")
        if "kernel_shape" in ctx.attrs and tuple(ctx.attrs["kernel_shape"]) != (r, s):
            ctx.fail(f"kernel_shape={ctx.attrs['kernel_shape']} but the weight is {weight.shape}",
                     "kernel_shape equal to the weight's spatial dims")
        if "output_shape" in ctx.attrs:
            ctx.fail("output_shape", "pads and output_padding (output_shape is not supported)")
        stride, dilation = self.pair(ctx, "strides"), self.pair(ctx, "dilations")
        out_pad = tuple(int(p) for p in ctx.attrs.get("output_padding", [0, 0]))
        if len(out_pad) != 2 or min(out_pad) < 0 or any(p >= max(st, d) for p, st, d in zip(out_pad, stride,
                                                                                             dilation)):
            ctx.fail(f"output_padding={list(out_pad)}", "2 output_padding smaller than the stride or dilation")
        auto_pad = _decode(ctx.attrs.get("auto_pad", b"NOTSET"))
        if auto_pad == "NOTSET":
            pads = tuple(int(p) for p in ctx.attrs.get("pads", [0, 0, 0, 0]))
            if len(pads) != 4 or min(pads) < 0:
                ctx.fail(f"pads={list(pads)}", "4 non-negative pads [top, left, bottom, right]")
        elif auto_pad == "VALID":
            pads = (0, 0, 0, 0)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for size, k, st, d, op in zip((h, w_in), (r, s), stride, dilation, out_pad):
                total = max(st * (size - 1) + op + (k - 1) * d + 1 - size * st, 0)
                small, big = total // 2, total - total // 2
                begin.append(small if auto_pad == "SAME_UPPER" else big)
                end.append(big if auto_pad == "SAME_UPPER" else small)
            pads = (*begin, *end)
        else:
            ctx.fail(f"auto_pad={auto_pad!r}", "NOTSET, SAME_UPPER, SAME_LOWER or VALID")
        o = og * group
        oh, ow = ((size - 1) * st - pb - pe + d * (k - 1) + op + 1 for size, st, pb, pe, d, k, op in
                  zip((h, w_in), stride, pads[:2], pads[2:], dilation, (r, s), out_pad))
        inputs = [x, self.param(ctx, names[1], "weight W", weight.shape)]
        if len(names) > 2 and names[2]:
            inputs.append(self.param(ctx, names[2], "bias B", (o,)))
        self.emit(ctx, "conv_transpose", inputs, (n, o, oh, ow), stride=stride, padding=pads, dilation=dilation,
                  output_padding=out_pad, groups=group)

    # -- LayerNormalization -----------------------------------------------------------------------------------

    def _op_LayerNormalization(self, ctx):
        ctx.check_attrs(("axis", "epsilon", "stash_type"))
        self.single_output(ctx)
        names = ctx.inputs()
        x = self.act(ctx, names[0])
        shape = self.shapes[x]
        axis = int(ctx.attrs.get("axis", -1))
        axis = axis + len(shape) if axis < 0 else axis
        if axis != len(shape) - 1 or len(shape) < 2:
            ctx.fail(f"axis={ctx.attrs.get('axis', -1)} on a {len(shape)}-D input",
                     "normalization over the last axis only (axis=-1)")
        k = shape[-1]
        scale = self.const(ctx, names[1], "Scale")
        if scale.size != k:
            ctx.fail(f"Scale of shape {scale.shape}", f"a Scale of {k} elements")
        g = self.new_param(f"{self.resolve(names[1])}_{ctx.name}", scale.reshape(k))
        if len(names) > 2 and names[2]:
            bias = self.const(ctx, names[2], "B")
            if bias.size != k:
                ctx.fail(f"B of shape {bias.shape}", f"a B of {k} elements")
            bt = self.new_param(f"{self.resolve(names[2])}_{ctx.name}", bias.reshape(k))
        else:
            bt = self.new_param(f"{ctx.name}_zero_bias", np.zeros(k, np.float32))
        self.emit(ctx, "layer_norm", [x, g, bt], shape, axis=axis, epsilon=float(ctx.attrs.get("epsilon", 1e-5)))

    # -- MatMul on 3-D / 4-D activations (called by frontend._op_MatMul) ----------------------------------------

    def _matmul_nd(self, ctx):
        ctx.check_attrs(())
        names = ctx.inputs()
        a = self.act(ctx, names[0])
        shape = self.shapes[a]
        if len(shape) < 3:
            ctx.fail(f"input {names[0]!r} has shape {shape}", "a 2-D, 3-D or 4-D activation")
        if self.resolve(names[1]) not in self.consts:  # attention: activation @ activation, batched
            b = self.act(ctx, names[1])
            bs = self.shapes[b]
            mqa = len(shape) == 4 and len(bs) == 4 and bs[0] == shape[0] and bs[1] == 1  # one K, V for all heads
            if len(bs) != len(shape) or (bs[:-2] != shape[:-2] and not mqa) or bs[-2] != shape[-1]:
                ctx.fail(f"A {shape} times B {bs}", "activations (..., M, K) and (..., K, N) of one rank with "
                         "the same batch axes, or (B, heads, M, K) times (B, 1, K, N)")
            self.emit(ctx, "matmul", [a, b], shape[:-1] + (bs[-1],), alpha=1.0)
            return
        b = self.const(ctx, names[1], "right operand B")
        if len(shape) > 4 and b.ndim == 2 and b.shape[0] == shape[-1]:  # Twins' windows: (..., K) as 3-D rows
            rows = (1, math.prod(shape[:-1]), shape[-1])
            out = ctx.proto.output[0]
            self._emit_to(ctx, f"{out}.rows", f"{ctx.name}.rows", "reshape", [a], rows, shape=rows)
            w = self.new_param(f"{self.resolve(names[1])}_T", b.T)
            self._emit_to(ctx, f"{out}.dense", ctx.name, "dense", [f"{out}.rows", w], rows[:2] + (b.shape[1],))
            full = shape[:-1] + (b.shape[1],)
            self._emit_to(ctx, out, f"{ctx.name}.back", "reshape", [f"{out}.dense"], full, shape=full)
            return
        if b.ndim != 2 or b.dtype.kind != "f" or b.shape[0] != shape[-1]:
            ctx.fail(f"A {shape} times B {b.shape} ({b.dtype})", "an activation (..., K) times a float32 (K, M) "
                     "constant")
        w = self.new_param(f"{self.resolve(names[1])}_T", b.T)
        self.emit(ctx, "dense", [a, w], shape[:-1] + (b.shape[1],))
