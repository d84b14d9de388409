"""A convolution's input read through views (``read_inputs_through_views``, ``Plan -> Plan``, run by
``plan.lower.plan_storage`` before any scope is planned): no kernel for the concat, nearest upsample or pool between
a convolution and the tensors it reads.

A U-Net's decoder convolution reads ``concat(skip, upsample(x))``, its encoder convolution ``maxpool(skip)``; each
of those is a glue kernel that writes a tensor only the convolution reads. Here the convolution reads the sources
itself (``Conv2dWorkload.in_read``): its input's channel blocks come from the concat's parts in order (``X``,
``X1``, ...), each part as is, through a nearest upsample by integer factors (the source pixel at ``h // f``), or
through a max / average pool without padding (the window's max or mean), and the concat, resize and pool steps are
dropped. ``plan_storage`` gives a convolution's parts one scope (its ``input_scope``).

Taken where:

- the tensor is read by one ``conv2d`` template step only (groups 1; its padding, zeros or reflected, is of the
  logical input, read through the view), as its ``X``, and is no model input or output;
- it is made by a ``resize`` (nearest, each output row and column reading source ``o // f`` exactly as
  onnxruntime computes it) or a ``pool`` (max or average, no padding, no fused epilogue, read by a convolution of
  at least ``POOL_OUTPUTS_PER_TAP`` x kh x kw output channels), or by a ``concat`` of up
  to four parts along the channels, every part but the last a multiple of 4 channels, each part as is or itself a
  resize or pool read by the concat only;
- every tensor read is stored in the convolution's dtype;
- with a log, the log does not tune the convolution as it is without tuning the fused workload too.

A ``layer_norm`` over the channels whose input is a concat it alone reads reads the parts in place
(``LayerNormWorkload.in_read``: EdgeNeXt's SDTA split, cascaded and concatenated again), each part a slice of whole
pixels of its source read at its offset (the slice dropped) where every other reader of the slice is an
elementwise kernel, which then reads the source at that offset too (``in_views``).

A classifier's global average pool to (N, C) rows read only by the ``dense`` after it is read in place the same way
(``DenseWorkload.in_pool``: each input feature the mean of its map, computed as the dense reads it) where the maps
have at most ``MAX_POOLED_PIXELS`` pixels and the dense at most ``MAX_POOL_DENSE_BLOCKS`` output blocks -- or more,
its work-groups pooling the maps into local memory (``DenseConfig.pool_stage``), where the log measured that faster
than the dense and the pool apart in one scope (``_staged_pool_pays``).

``Plan.fused`` names each step dropped and the convolution that reads through it. The direct convolution's
alternatives (Winograd) are dropped where the input is read through a view: they read one packed input."""
from __future__ import annotations

import dataclasses

import numpy as np

from tuner.plan.io_views import readers_of
from tuner.plan.tuned_configs import loses_tuned, uniform_scopes
from tuner.plan.types import Plan, Step
from tuner.templates import get_template
from tuner.templates.dense import POOL_ITEM_BLOCKS

MAX_PARTS = 4  # Conv2dWorkload's MAX_IN_PARTS
# a pool is read through a view by a convolution of at least this many output channels per window tap: every
# work-item re-reads the kh x kw window at each filter tap, which costs more than the pool's own kernel where the
# convolution does little arithmetic per input pixel (Intel's CPU runtime, fallback configs, 2026-12-03: a 2x2 max
# pool read by a 3x3 conv of 6 outputs 14.8 us against 3.7 + 2.3 us; of 16 outputs 17.2 against 15.4 + 2.6 us)
POOL_OUTPUTS_PER_TAP = 4
# a global average pool is read in place by the dense after it (``DenseWorkload.in_pool``) when the dense has at most
# this many output blocks of 4 (each work-item of an output block re-reads the whole maps: a classifier of a few
# classes, not ImageNet's 1000) and the maps at most ``MAX_POOLED_PIXELS`` pixels; a wider one (its work-groups
# pooling the maps into local memory once: ``DenseConfig.pool_stage``) only where the log measured it faster than
# the dense and the pool apart (``_staged_pool_pays``)
MAX_POOL_DENSE_BLOCKS = POOL_ITEM_BLOCKS
MAX_POOLED_PIXELS = 1024


def _nearest_factors(step: Step, src: tuple, out: tuple) -> tuple | None:
    """(fh, fw) when the resize is a nearest upsample whose every output row and column reads source ``o // f``
    (onnxruntime's coordinates for its mode), else None."""
    from tuner.ops.kernels_movement import resize_reference
    a = step.attrs
    if a.get("mode") != "nearest" or len(src) != 4:
        return None
    (H, W), (OH, OW) = src[2:], out[2:]
    if OH % H or OW % W:
        return None
    fh, fw = OH // H, OW // W
    idx = np.arange(H * W, dtype=np.float64).reshape(1, 1, H, W)
    try:
        got = resize_reference(idx, (OH, OW), "nearest", a["coord"], a["nearest"], tuple(a["scales"]))
    except (KeyError, ValueError):
        return None
    want = idx[:, :, np.arange(OH) // fh][:, :, :, np.arange(OW) // fw]
    return (fh, fw) if np.array_equal(got, want) else None


def _view(plan: Plan, conv: Step, step: Step | None, tensor: str, readers: dict):
    """``(source tensor, part)`` where ``tensor`` is read through ``step`` (a resize or pool read only there), or
    ``(tensor, part)`` read as is; ``part`` the ``in_read`` entry without its channel count."""
    t = plan.tensors[tensor]
    as_is = (tensor, (t.shape[2], t.shape[3], "copy", 1, 1, 1, 1))
    if step is None or len(readers.get(tensor, [])) != 1 or tensor in plan.outputs or len(t.shape) != 4:
        return as_is
    src = step.inputs.get("X")
    if src is None or src not in plan.tensors or plan.tensors[src].kind != "nchw" or set(step.inputs) != {"X"}:
        return as_is
    s_shape = plan.tensors[src].shape
    if step.op == "resize":
        f = _nearest_factors(step, s_shape, t.shape)
        return (src, (s_shape[2], s_shape[3], "nearest", f[0], f[1], 1, 1)) if f else as_is
    if step.op == "pool":
        a = step.attrs
        if a.get("kind") not in ("max", "avg") or any(a.get("padding", (0,))) or a.get("post_op"):
            return as_is
        (kh, kw), (sh, sw) = a["kernel"], a["stride"]
        if ((s_shape[2] - kh) // sh + 1, (s_shape[3] - kw) // sw + 1) != tuple(t.shape[2:]):
            return as_is  # ceil_mode adding a row or column
        if conv.workload.kernel[0] < POOL_OUTPUTS_PER_TAP * kh * kw:
            return as_is
        return (src, (s_shape[2], s_shape[3], a["kind"], kh, kw, sh, sw))
    return as_is


def _parts(plan: Plan, conv: Step, producer: dict, readers: dict):
    """``([(source tensor, in_read part)], [dropped steps])`` for ``conv``'s input, or None when it reads it as is."""
    x = conv.inputs.get("X")
    p = producer.get(x)
    if p is None or x in plan.outputs or len(readers.get(x, [])) != 1:
        return None
    if p.op == "concat" and p.attrs.get("part_shapes"):  # it reads its parts in place, or writes tokens
        return None
    if p.op == "concat":
        tensors = [p.inputs[f"X{i}"] for i in range(len(p.inputs))]
        if len(tensors) > MAX_PARTS or len(set(tensors)) != len(tensors) or any(
                plan.tensors[t].kind != "nchw" or t in plan.inputs for t in tensors):
            return None
        if any(plan.tensors[t].shape[1] % 4 for t in tensors[:-1]):
            return None  # a part's channels would share an RGBA pixel with the next part's
        parts, dropped = [], [p]
        for t in tensors:
            q = producer.get(t)
            src, part = _view(plan, conv, q if q is not None and q.op in ("resize", "pool") else None, t, readers)
            parts.append((src, (plan.tensors[t].shape[1], *part)))
            if src != t:
                dropped.append(q)
        return parts, dropped
    if p.op in ("resize", "pool"):
        src, part = _view(plan, conv, p, x, readers)
        if src == x:
            return None
        return [(src, (plan.tensors[x].shape[1], *part))], [p]
    return None


def _pooled_rows(plan: Plan, dense: Step, producer: dict, readers: dict):
    """``(maps tensor, pool step)`` when ``dense``'s input rows are a plain global average pool (spatial_reduce: a
    mean over H, W to (N, C) rows, nothing fused) of a tensor it alone reads; else None."""
    x = dense.inputs.get("X")
    p = producer.get(x)
    if p is None or p.op != "spatial_reduce" or x in plan.outputs or len(readers.get(x, [])) != 1:
        return None
    wl = p.workload
    if (wl.kind, wl.axes, wl.keepdims, wl.scale, wl.activation, wl.weight, wl.in_view) != \
            ("mean", (2, 3), False, 1.0, "none", "none", ()) or set(p.inputs) != {"X"}:
        return None
    src = plan.tensors[p.inputs["X"]]
    N, C, H, W = wl.data
    if src.kind != "nchw" or H * W > MAX_POOLED_PIXELS:
        return None
    return src.name, p


def pooled_dense(plan: Plan, dense: Step, producer: dict, readers: dict):
    """``(workload, maps tensor, pool step)``: ``dense`` as the kernel that reads its global pool's maps itself
    (``DenseWorkload.in_pool``), where it is a tuned dense not doing so yet whose input rows are such a pool of its
    dtype (``_pooled_rows``); else None. Whether it pays is its caller's to decide."""
    if dense.op != "dense" or not dense.tuned or dense.workload.in_pool:
        return None
    found = _pooled_rows(plan, dense, producer, readers)
    if found is None or (plan.tensors[found[0]].dtype or plan.dtype) != dense.workload.dtype:
        return None
    return dataclasses.replace(dense.workload, in_pool=tuple(plan.tensors[found[0]].shape[2:])), *found


def _staged_pool_pays(history, info, dense: Step, pool: Step, workload) -> bool:
    """Whether the log holds valid records of ``dense`` as ``workload`` (reading the pool's maps), of the dense and
    of the pool, all three in one set of scopes (either uniform one, or the fused kernel's best record's), where the
    fused kernel ran faster than the two apart: each kernel's time profiled, one launch's overhead in each. Without
    all three, a wide classifier keeps its pool's launch."""
    if history is None or info is None or not hasattr(history, "best_valid"):
        return False

    def best(step, wl, scopes):
        t = get_template(step.op)
        return history.best_valid(t, wl, info, scopes, t.model_knobs)
    anywhere = best(dense, workload, None)
    for scopes in [uniform_scopes("texture"), uniform_scopes("buffer")] + ([anywhere.scopes] if anywhere else []):
        records = [best(dense, workload, scopes), best(dense, dense.workload, scopes),
                   best(pool, pool.workload, scopes)]
        if None not in records and records[0].median_s < records[1].median_s + records[2].median_s:
            return True
    return False


def _slice_source(plan: Plan, step: Step | None):
    """``(source tensor, at)`` when ``step`` is a slice of whole RGBA pixels of channels [at, at + k) of a 4-D
    tensor (no window of rows or columns), else None."""
    if step is None or step.op != "slice" or set(step.inputs) != {"X"}:
        return None
    src = plan.tensors.get(step.inputs["X"])
    ch = tuple(step.attrs.get("channels", ()))
    if src is None or src.kind != "nchw" or not ch or ch != tuple(range(ch[0], ch[0] + len(ch))) or ch[0] % 4:
        return None
    if any(tuple(step.attrs.get(k, (0, 1, None)))[:2] != (0, 1) or step.attrs.get(k, (0, 1, None))[2]
           not in (None, src.shape[a]) for k, a in (("rows", 2), ("cols", 3))):
        return None
    return src.name, ch[0]


def _reads_in_place(step: Step, tensor: str) -> bool:
    """Whether ``step`` can read ``tensor`` at a channel offset of another one instead: an elementwise kernel
    (``in_views``) reading it as an activation."""
    return step.op == "elementwise" and tensor in [x for k, x in step.inputs.items() if k != "B"]


def _read_at(plan: Plan, step: Step, tensor: str, src: str, at: int) -> Step:
    """``step`` (elementwise) reading ``tensor``'s channels as channels [at, ...) of ``src`` in place."""
    acts = [k for k in step.inputs if k != "B"]
    views = list(step.attrs.get("in_views") or [()] * len(acts))
    inputs = dict(step.inputs)
    for i, k in enumerate(acts):
        if inputs[k] == tensor:
            inputs[k], views[i] = src, (plan.tensors[src].shape[1], at)
    return dataclasses.replace(step, inputs=inputs, attrs={**step.attrs, "in_views": tuple(views)})


def _norm_parts(plan: Plan, norm: Step, producer: dict, readers: dict):
    """``([(tensor, (channels, at, of))], [dropped steps], {step name: rewritten step})`` for a layer_norm whose NCHW
    input is a concat it alone reads: each part read in place -- a slice of whole pixels read at its offset of its
    source where every other reader of the slice can read it so too -- or None."""
    x = norm.inputs.get("X")
    p = producer.get(x)
    if p is None or p.op != "concat" or p.attrs.get("part_shapes") or x in plan.outputs \
            or len(readers.get(x, [])) != 1 or len(norm.workload.data) != 4:
        return None
    tensors = [p.inputs[f"X{i}"] for i in range(len(p.inputs))]
    if len(tensors) > MAX_PARTS or len(set(tensors)) != len(tensors) or any(
            plan.tensors[t].kind != "nchw" or t in plan.inputs or t in plan.outputs for t in tensors) \
            or any(plan.tensors[t].shape[1] % 4 for t in tensors[:-1]):
        return None
    parts, dropped, rewritten = [], [p], {}
    for t in tensors:
        c, q = plan.tensors[t].shape[1], producer.get(t)
        found = _slice_source(plan, q)
        others = [r for r, _ in readers.get(t, []) if r is not p]
        if found is not None and all(_reads_in_place(r, t) for r in others):
            src, at = found
            parts.append((src, (c, at, plan.tensors[src].shape[1])))
            dropped.append(q)
            for r in others:
                rewritten[r.name] = _read_at(plan, rewritten.get(r.name, r), t, src, at)
        else:
            parts.append((t, (c, 0, c)))
    return parts, dropped, rewritten


def read_inputs_through_views(plan: Plan, info=None, history=None) -> Plan:
    """Each convolution whose input is a concat, nearest upsample or pool that it alone reads, reading the sources
    through views instead (module doc); ``Plan.fused`` names each step dropped. With a log (``history``, on the
    device ``info``), a convolution it has a record of is fused only where it has one of the fused workload too
    (``in_read`` is in the key): no tuned config is given up for the launches."""
    producer, readers = {s.output: s for s in plan.steps}, readers_of(plan)
    new, dropped, notes = {}, {}, []
    for s in plan.steps:
        if s.op == "layer_norm" and not getattr(s.workload, "in_read", ()):  # a norm reading a concat's parts
            found = _norm_parts(plan, s, producer, readers)
            if found is None or any((plan.tensors[t].dtype or plan.dtype) != s.workload.dtype for t, _ in found[0]):
                continue
            parts, steps, rewritten = found
            wl = dataclasses.replace(s.workload, in_read=tuple(part for _, part in parts))
            if info is not None and loses_tuned(history, info, s, wl, None):
                continue
            inputs = {k: v for k, v in s.inputs.items() if k != "X"}
            inputs.update({("X" if i == 0 else f"X{i}"): t for i, (t, _) in enumerate(parts)})
            new[s.name] = dataclasses.replace(s, workload=wl, inputs=inputs)
            new.update(rewritten)
            for d in steps:
                dropped[d.name] = d
                notes.append(f"{d.name}: no kernel; {s.name} reads {d.output} in place (" +
                             ("its parts read as they are" if d.op == "concat" else
                              f"channels {d.attrs['channels'][0]}.. of {d.inputs['X']}") + ")")
            continue
        if s.op == "dense":  # a classifier reading its global pool
            found = pooled_dense(plan, s, producer, readers)
            if found is None:
                continue
            wl, maps, pool = found
            if info is not None and loses_tuned(history, info, s, wl, None):
                continue
            if -(-wl.weight[0] // 4) > MAX_POOL_DENSE_BLOCKS and not _staged_pool_pays(history, info, s, pool, wl):
                continue
            new[s.name] = dataclasses.replace(s, workload=wl, inputs={**s.inputs, "X": maps}, alternatives=[])
            dropped[pool.name] = pool
            notes.append(f"{pool.name}: no kernel; {s.name} reads {pool.output} through a view (the mean of "
                         f"each map of {maps})")
            continue
        if s.op != "conv2d" or not s.tuned or s.workload.groups != 1 or s.workload.plain_input \
                or s.workload.in_read or "S" in s.inputs:
            continue
        found = _parts(plan, s, producer, readers)
        if found is None:
            continue
        parts, steps = found
        if any((plan.tensors[src].dtype or plan.dtype) != s.workload.dtype for src, _ in parts):
            continue
        try:
            wl = dataclasses.replace(s.workload, in_read=tuple(part for _, part in parts))
        except ValueError:
            continue
        if info is not None and loses_tuned(history, info, s, wl, None):
            continue
        inputs = {k: v for k, v in s.inputs.items() if k != "X"}
        inputs.update({("X" if i == 0 else f"X{i}"): src for i, (src, _) in enumerate(parts)})
        new[s.name] = dataclasses.replace(s, workload=wl, inputs=inputs, alternatives=[])
        for d in steps:
            dropped[d.name] = d
            how = "its parts read in place" if d.op == "concat" else \
                f"read as a nearest upsample of {d.inputs['X']}" if d.op == "resize" else \
                f"read as a {d.attrs['kind']} pool of {d.inputs['X']}"
            notes.append(f"{d.name}: no kernel; {s.name} reads {d.output} through a view ({how})")
    if not new:
        return plan
    gone = {d.output for d in dropped.values()}
    steps = [new.get(s.name, s) for s in plan.steps if s.name not in dropped]
    tensors = {k: v for k, v in plan.tensors.items() if k not in gone}
    return dataclasses.replace(plan, steps=steps, tensors=tensors, fused=plan.fused + notes)


def part_tensors(step: Step) -> list:
    """The tensors a convolution or norm reads as its input's parts (``X``, ``X1``, ...): one without
    ``in_read``."""
    n = len(getattr(step.workload, "in_read", ()) or ()) or 1
    return [step.inputs["X" if i == 0 else f"X{i}"] for i in range(n)]
