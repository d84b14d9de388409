"""Concats and interleaves as write views (``write_views``, ``Plan -> Plan``, run by ``compiler.compile_plan`` before
code generation).

A DCR ``depth_to_space`` (a ConvTranspose's phases, or a PixelShuffle the graph passes turned into DCR order) whose
input a ``conv2d`` template step writes and nothing else reads runs no kernel: the convolution stores each output
pixel at its place in the interleave, cropped (``Conv2dWorkload.shuffle_view``; the loop nest and the tuned config
are the plain convolution's). It stays a kernel when a phase's channels are not whole RGBA pixels (not a multiple
of 4, nor 1 or 2), when another kernel reads its input, when that is a model input or output, when the two
tensors' storage differs, or when the producer is not a direct conv2d (Winograd, depthwise, glue) or already writes
a view. Interleaves are decided first, so that the convolution that writes one can also write it into a concat.

Concats: where every part of a channel concat is written by a kernel that can write at a channel offset -- a
``conv2d`` template step or a ``slice`` (channel gather) -- and read by nothing else, each of those kernels writes
its part straight into the concat's tensor and the concat kernel does not run. ShuffleNetV2's units become their
gather of the passed-through half and their branch's convolutions, writing one tensor.

A part keeps its copy when it does not start an RGBA pixel (an offset that is not a multiple of 4: two kernels
would write one pixel), when another kernel reads it too, when it is a model input or output, when its storage
differs from the concat's, or when its producer cannot write at an offset; then the whole concat stays one kernel.
``Plan.views`` says, per concat, which it fused and why the rest are copies.

A gather part whose concat a convolution also writes in place then runs in the convolution's launch
(``side_copy``): the convolution's work-items copy its pixels too, so ShuffleNetV2's stride-1 units launch only
their branch's convolutions. This needs a plain channel gather (no window) of a tensor of the convolution's N, H
and W that exists before the convolution runs."""
from __future__ import annotations

import dataclasses

from tuner.plan.types import Plan, Step

VIEW_WRITERS = ("conv2d", "slice")  # the step ops whose kernels take an ``out_view``
SHUFFLE_WRITERS = ("conv2d",)  # the template steps whose workloads take a ``shuffle_view``


def _readers(plan: Plan) -> dict:
    """Tensor name -> how many steps read it."""
    readers: dict = {}
    for s in plan.steps:
        for x in set(s.inputs.values()):
            readers[x] = readers.get(x, 0) + 1
    return readers


def _writes_view(step: Step) -> bool:
    """Whether ``step`` already writes into another tensor (a concat's channels, or an interleave)."""
    return bool(step.attrs.get("out_view") or any(getattr(step.workload, k, ()) for k in
                                                    ("out_view", "side_copy", "shuffle_view")))


def _not_only_read_here(plan: Plan, tensor: str, producer: Step | None, readers: dict) -> str | None:
    """Why ``tensor`` cannot become a view of the one kernel that reads it: a model input or output, or another
    reader; None if a kernel makes it and only that one reads it."""
    if producer is None or tensor in plan.inputs:
        return "a model input"
    if tensor in plan.outputs:
        return "a model output"
    if readers.get(tensor, 0) != 1:
        return "read by another kernel too"
    return None


def _shuffle_why_not(plan: Plan, d2s: Step, producer: Step | None, readers: dict) -> str | None:
    """Why ``d2s``'s input cannot be written as its interleave by its producer; None if it can."""
    src = d2s.inputs["X"]
    t, out = plan.tensors[src], plan.tensors[d2s.output]
    if why := _not_only_read_here(plan, src, producer, readers):
        return why
    if d2s.attrs["mode"] != "DCR":
        return "CRD order (a grouped convolution's, or a producer the graph passes could not permute)"
    if producer.alternatives:
        return f"its producer's template is not chosen yet ({', '.join(c.op for c in producer.candidates())})"
    if producer.op not in SHUFFLE_WRITERS:
        return f"its producer ({producer.op}) writes no interleave"
    if _writes_view(producer):
        return f"its producer ({producer.name}) already writes a view"
    if (t.kind, t.scope) != (out.kind, out.scope) or t.kind != "nchw":
        return f"stored as {t.scope} {t.kind}, the interleave as {out.scope} {out.kind}"
    c = out.shape[1]
    if c % 4 and 4 % c:
        return f"{c} channels a phase: an output pixel's channels would span two RGBA pixels of the convolution's"
    return None


def _shuffle_view(d2s: Step, out_shape: tuple) -> tuple:
    """The ``shuffle_view`` of a ``depth_to_space`` step: (bh, bw, top, left, out_h, out_w)."""
    a = d2s.attrs
    return (*a["block"], *a.get("crop", (0, 0)), *out_shape[2:])


def shuffle_views(plan: Plan) -> Plan:
    """Each DCR ``depth_to_space`` whose producing convolution can write it (``_shuffle_why_not``) dropped, the
    convolution writing its output; ``Plan.views`` gains a note per interleave."""
    producer, readers = {s.output: s for s in plan.steps}, _readers(plan)
    fused, notes = {}, []  # convolution name -> the depth_to_space step it writes
    for s in plan.steps:
        if s.op != "depth_to_space":
            continue
        src = s.inputs["X"]
        p = producer.get(src)
        why = _shuffle_why_not(plan, s, p, readers)
        if why is None:
            try:
                dataclasses.replace(p.workload, shuffle_view=_shuffle_view(s, plan.tensors[s.output].shape))
            except ValueError as e:  # what the workload refuses that the checks above missed
                why = str(e)
        if why:
            notes.append(f"{s.name}: a kernel: {src} ({why})")
            continue
        fused[p.name] = s
        a = s.attrs
        notes.append(f"{s.name}: no kernel; {p.name} writes the interleave (block {a['block'][0]}x{a['block'][1]}"
                     + (f", crop {tuple(a['crop'])}" if any(a.get("crop", (0, 0))) else "") + ")")
    if not fused:
        return dataclasses.replace(plan, views=plan.views + notes)
    dropped = {d.name for d in fused.values()}
    steps = []
    for s in plan.steps:
        if s.name in dropped:
            continue
        if s.name in fused:
            d = fused[s.name]
            s = dataclasses.replace(s, output=d.output, workload=dataclasses.replace(
                s.workload, shuffle_view=_shuffle_view(d, plan.tensors[d.output].shape)))
        steps.append(s)
    gone = {d.inputs["X"] for d in fused.values()}
    tensors = {k: v for k, v in plan.tensors.items() if k not in gone}
    return dataclasses.replace(plan, steps=steps, tensors=tensors, views=plan.views + notes)


def _parts(step: Step) -> list:
    """The concat's inputs in order (``X0``, ``X1``, ...)."""
    return [step.inputs[f"X{i}"] for i in range(sum(k.startswith("X") for k in step.inputs))]


def _why_not(plan: Plan, concat: Step, part: str, offset: int, last: bool, producer: Step | None,
             readers: dict) -> str | None:
    """Why ``part`` (at channel ``offset`` of the concat) cannot be written in place; None if it can."""
    t, out = plan.tensors[part], plan.tensors[concat.output]
    if why := _not_only_read_here(plan, part, producer, readers):
        return why
    if producer.op not in VIEW_WRITERS or producer.alternatives or producer.attrs.get("out_view") \
            or getattr(producer.workload, "out_view", ()):
        return f"its producer ({producer.op}) writes no offset"
    if (t.kind, t.scope) != (out.kind, out.scope) or len(t.shape) != 4:
        return f"stored as {t.scope} {t.kind}, the concat as {out.scope} {out.kind}"
    if offset % 4 or (not last and t.shape[1] % 4):
        return f"channels {offset}..{offset + t.shape[1]} share an RGBA pixel with another part"
    return None


def _side_copies(plan: Plan, parts: list, offsets: list, producer: dict, taken: set) -> dict:
    """``{conv step name: (gather step, offset)}``: the concat's gather parts that its convolution parts copy in
    their own launch (one each; a convolution in ``taken`` already has one)."""
    order = {s.name: i for i, s in enumerate(plan.steps)}
    convs = [producer[p] for p in parts if producer[p].op == "conv2d" and producer[p].tuned]
    out = {}
    for p, o in zip(parts, offsets):
        g = producer[p]
        if g.op != "slice":
            continue
        src = plan.tensors[g.inputs["X"]]
        if len(src.shape) != 4 or any(tuple(g.attrs.get(k, (0, 1, None)))[:2] != (0, 1) or
                                      g.attrs.get(k, (0, 1, None))[2] not in (None, src.shape[a])
                                      for k, a in (("rows", 2), ("cols", 3))):
            continue  # a window of rows or columns
        before = producer.get(src.name)
        for c in convs:
            nhw = (c.workload.out_shape[0], *c.workload.out_shape[2:])
            if c.name in taken or c.workload.shuffle_view or src.kind != "nchw" \
                    or (src.shape[0], *src.shape[2:]) != nhw \
                    or (before is not None and order[before.name] > order[c.name]):
                continue  # taken, writing an interleave (its pixels are not the concat's), or another grid
            out[c.name] = (g, o)
            taken.add(c.name)
            break
    return out


def write_views(plan: Plan) -> Plan:
    """Interleaves (``shuffle_views``), then concats (``concat_views``) written in place; then every other
    data-movement kernel that remains named with its reason in ``Plan.copies`` (``copy_notes``)."""
    return copy_notes(concat_views(shuffle_views(dataclasses.replace(plan, views=[]))))


# the glue steps that only move data: each one left after the passes and write_views is a copy kernel
MOVEMENT = ("relayout", "permute", "slice", "strided_copy", "pad", "resize", "depth_to_space", "concat",
            "concat_view", "upsample_zeros")


def _copy_reason(plan: Plan, s: Step, producer: dict, readers: dict) -> str:
    """Why movement step ``s`` is a kernel rather than a view its neighbours read or write in place."""
    src = plan.tensors.get(next(iter(s.inputs.values()), ""), None)
    out = plan.tensors[s.output]
    by = sorted({r.op for r in readers.get(s.output, [])})
    made = producer.get(src.name).op if src is not None and src.name in producer else "the model input"
    if s.op == "relayout":
        from tuner.plan.io_views import io_why_not
        why = io_why_not(plan).get(s.name)
        if src is not None and src.name in plan.inputs:
            return "the model input: host row-major to the packed layout" + (f" ({why})" if why else "")
        if s.output in plan.outputs:
            return "the model output: the packed layout to host row-major" + (f" ({why})" if why else "")
        if src is not None and src.shape != out.shape:
            return f"a reshape {src.shape} -> {out.shape} across the packed channel axis ({src.kind} to {out.kind})"
        return f"a change of storage ({src.scope if src else '?'} {src.kind if src else ''} to {out.scope} {out.kind})"
    if s.op == "slice":
        ch = tuple(s.attrs.get("channels", ()))
        win = src is not None and len(src.shape) == 4 and any(
            tuple(s.attrs.get(k, (0, 1, None)))[:2] != (0, 1) or s.attrs.get(k, (0, 1, None))[2] not in (None, src.shape[a])
            for k, a in (("rows", 2), ("cols", 3)))
        if win:
            return "a window of rows or columns (only channel slices are read in place)"
        if ch and ch != tuple(range(ch[0], ch[0] + len(ch))):
            return "a channel shuffle, not a contiguous slice (folded only into a 1x1 convolution's weights)"
        if ch and ch[0] % 4:
            return f"channels {ch[0]}..{ch[0] + len(ch)} start inside an RGBA pixel (offset {ch[0]} is not a multiple of 4)"
        if s.output in plan.outputs:
            return "a model output"
        return f"read by {', '.join(by) or 'nothing'}, which read no channel offset"
    if s.op in ("strided_copy", "permute"):
        divides = ""
        if "D" in s.inputs:
            divides = " (dividing each element by its source channel's D as it reads: a division folded in, its " \
                "norms read off the channels in place)" if s.attrs.get("divisor_index") else \
                " (dividing each row by D as it reads: a division folded in)"
        return (f"moves {src.shape if src else '?'} ({src.kind if src else '?'}) to {out.shape} ({out.kind}){divides} "
                f"between {made} and {', '.join(by) or 'the model output'}: neither side reads or writes this view in "
                f"place")
    if s.op == "pad":
        return f"a {s.attrs.get('mode', 'constant')} pad read by {', '.join(by) or 'the model output'} (only " \
               "convolutions read padding in place, depthwise ones zeros only)"
    if s.op == "resize":
        return f"a {s.attrs.get('mode', '')} resize read by {', '.join(by) or 'the model output'} (no kernel reads " \
               "it in place)"
    return f"{s.op} between {made} and {', '.join(by) or 'the model output'}"


def copy_notes(plan: Plan) -> Plan:
    """``Plan.copies``: a note for each data-movement kernel that ``Plan.views`` does not already name (concats
    and interleaves are, by ``concat_views`` and ``shuffle_views``): ``<step>: a copy kernel (<op>): <reason>``."""
    named = {v.split(":", 1)[0] for v in plan.views}
    producer = {t.output: t for t in plan.steps}
    readers: dict = {}
    for t in plan.steps:
        for x in set(t.inputs.values()):
            readers.setdefault(x, []).append(t)
    notes = [f"{s.name}: a copy kernel ({s.op}): {_copy_reason(plan, s, producer, readers)}"
             for s in plan.steps if s.op in MOVEMENT and s.name not in named]
    return dataclasses.replace(plan, copies=notes)


def concat_views(plan: Plan) -> Plan:
    """Each concat whose parts can all be written in place (``_why_not``) dropped, its parts' producers writing
    its channels (and a gather part in a convolution's launch: ``_side_copies``); a note per concat."""
    producer, readers = {s.output: s for s in plan.steps}, _readers(plan)
    moved: dict = {}  # producer name -> (concat output, offset, total)
    side: dict = {}  # convolution name -> (the gather step it runs too, the gather's offset)
    dropped, notes = set(), []
    for s in plan.steps:
        if s.op != "concat" or plan.tensors[s.output].kind != "nchw":
            continue
        if s.attrs.get("part_shapes"):  # rules.lower_concat: parts read at a channel offset, or written as tokens
            notes.append(f"{s.name}: a copy kernel: reads " + ", ".join(
                f"{t} (channels {v[1]}..{v[1] + c[1]})" if v else t
                for t, v, c in zip(_parts(s), s.attrs["in_views"], s.attrs["part_shapes"])) +
                (" in place" if any(s.attrs["in_views"]) else "") +
                (", written as the token tensor its reshape reads" if s.attrs["flat"] else "") +
                " (parts that start inside an RGBA pixel, or slices of other tensors)")
            continue
        parts, total = _parts(s), plan.tensors[s.output].shape[1]
        offsets = [sum(plan.tensors[p].shape[1] for p in parts[:i]) for i in range(len(parts))]
        why = [_why_not(plan, s, p, o, i == len(parts) - 1, producer.get(p), readers)
               for i, (p, o) in enumerate(zip(parts, offsets))]
        if len(set(parts)) != len(parts):
            why = ["the same tensor twice"] * len(parts)
        if any(why):
            notes.append(f"{s.name}: a copy kernel: " + "; ".join(f"{p} ({w})" for p, w in zip(parts, why) if w))
            continue
        for p, o in zip(parts, offsets):
            moved[producer[p].name] = (s.output, o, total)
        dropped.add(s.name)
        copies = _side_copies(plan, parts, offsets, producer, set(side))
        side.update(copies)
        dropped.update(g.name for g, _ in copies.values())
        notes.append(f"{s.name}: no kernel; written in place by " +
                     ", ".join(f"{producer[p].name} (channels {o}..{o + plan.tensors[p].shape[1]})"
                               for p, o in zip(parts, offsets)) +
                     "".join(f"; {c} runs {g.name}'s gather in its own launch" for c, (g, _) in copies.items()))
    notes = plan.views + notes
    if not dropped:
        return dataclasses.replace(plan, views=notes)
    steps, gone = [], set()
    for s in plan.steps:
        if s.name in dropped:
            continue
        if s.name in moved:
            out, offset, total = moved[s.name]
            gone.add(s.output)
            if s.tuned and s.name in side:
                g, at = side[s.name]
                src = plan.tensors[g.inputs["X"]]
                s = dataclasses.replace(s, output=out, inputs={**s.inputs, "Xs": src.name},
                                        workload=dataclasses.replace(s.workload, out_view=(offset, total), side_copy=(
                                            src.shape, tuple(g.attrs["channels"]), at, src.scope)))
            elif s.tuned:
                s = dataclasses.replace(s, output=out, workload=dataclasses.replace(s.workload,
                                                                                    out_view=(offset, total)))
            else:
                s = dataclasses.replace(s, output=out, attrs={**s.attrs, "out_view": (offset, total)})
        steps.append(s)
    tensors = {k: v for k, v in plan.tensors.items() if k not in gone}
    return dataclasses.replace(plan, steps=steps, tensors=tensors, views=notes)
