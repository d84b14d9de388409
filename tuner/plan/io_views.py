"""The model's inputs and outputs read and written in place (``read_io_in_place``, ``Plan -> Plan``, run by
``plan.lower.plan_storage`` once the scopes are decided).

A model input is a row-major host buffer (``Tensor.kind == "plain"``); ``lower_graph`` relayouts it into the
packed form (NCHW4c or row4) the kernels read, and relayouts each model output back. Those two kernels run on
every model. Here they are dropped where the kernel next to them takes the row-major buffer itself:

- the input's relayout, when its packed tensor is read by one ``conv2d`` template step only, as its ``X``, whose
  window reads each input pixel at most ``MAX_PLAIN_TAPS`` times: the convolution reads the row-major buffer
  (``Conv2dWorkload.plain_input``: each tap a gather of the channels' planes);
- an output's relayout, when the packed tensor is written by a ``conv2d`` or ``dense`` template step and read by
  nothing but the relayout: the kernel scatters its pixels into the row-major buffer (``plain_output``).

The kernel's scope for that side becomes ``buffer`` (the spaces tie ``plain_input`` to ``input_scope = buffer`` and
``plain_output`` to ``output_scope = buffer``), where it has a valid config so; tuning tasks, plan estimates and
configs all see the kernel that will run. With a log, a kernel the log has tuned keeps its relayout unless the log
has a valid record for the fused kernel too (``plain_input`` / ``plain_output`` are not in the key: a record of the
same convolution with a buffer input applies), so no tuned config is given up for a launch. A node other templates
may run (a 3x3 stride-1 convolution: Winograd) keeps its relayout until ``plan.lower.choose_templates`` picked the
direct conv2d, which then reads or writes the buffer (this pass again): tuning still measures every template of
it. ``Plan.fused`` says, per relayout, which kernel took it; a relayout kept is named with its reason in
``Plan.copies`` (``plan.views.copy_notes``) like any other copy."""
from __future__ import annotations

import dataclasses

from tuner.plan.tuned_configs import has_valid, loses_tuned
from tuner.plan.types import Plan, Step

READERS = ("conv2d",)  # template steps whose workload reads a row-major input (``plain_input``)
# the most times (R x S x OH x OW / (H x W): filter taps per input pixel) a convolution reading the row-major input
# gathers each input pixel's channels from their planes: beyond it the gathers cost more than the relayout (which
# reads each pixel once) saves. Intel's CPU runtime on an AMD EPYC, fallback configs, 2026-12-03, 3 input channels,
# conv alone against the packed conv + the relayout: 4x4 stride 4 (1 tap a pixel) 3.3 against 3.2 + 3 us; 3x3 stride
# 2 (2.25) 5.2 against 3.8 + 3; 3x3 (9) 11.4 against 10.3 + 3; 7x7 stride 2 (12.25) 76.6 against 55.9 + 5;
# 5x5 (25) 29.2 against 17.3 + 3; 9x9 (81) 89 against 75 + 4.5
MAX_PLAIN_TAPS = 9
WRITERS = ("conv2d", "dense")  # template steps whose workload writes a row-major output (``plain_output``)


def readers_of(plan: Plan) -> dict:
    """Tensor name -> the (step, input key) pairs that read it, in plan order."""
    out: dict = {}
    for s in plan.steps:
        for k, x in s.inputs.items():
            out.setdefault(x, []).append((s, k))
    return out


def _same_form(plan: Plan, plain: str, packed: str, step: Step) -> str | None:
    """Why the row-major tensor cannot stand for the packed one in ``step``'s kernel; None if it can."""
    a, b = plan.tensors[plain], plan.tensors[packed]
    if tuple(a.shape) != tuple(b.shape):
        return f"the model's shape {list(a.shape)} is not the kernel's {list(b.shape)}"
    if (a.dtype or plan.dtype) != step.workload.dtype:
        return f"stored in {a.dtype or plan.dtype}, the kernel in {step.workload.dtype}"
    return None


def _input_why_not(plan: Plan, x: str, packed: str, readers: dict):
    """``(step, workload)`` of the one convolution that can read model input ``x`` in place, or the reason why none
    can (a string)."""
    rs = readers.get(packed, [])
    if packed in plan.outputs:
        return "the packed input is a model output too"
    if len(rs) != 1:
        return f"read by {len(rs)} kernels"
    s, key = rs[0]
    if s.op not in READERS or key != "X":
        return f"read by {s.op} ({key}), which reads no row-major input"
    (R, S), (H, W), (OH, OW) = s.workload.kernel[2:], s.workload.data[2:], s.workload.out_shape[2:]
    if R * S * OH * OW > MAX_PLAIN_TAPS * H * W:
        return (f"a {R}x{S} window reads each input pixel {R * S * OH * OW / (H * W):.3g} times: gathering its "
                f"channels from their planes that often costs more than the relayout")
    if why := _same_form(plan, x, packed, s):
        return why
    return _flagged(s, plain_input=True)


def _output_why_not(plan: Plan, packed: str, y: str, producer: dict, readers: dict):
    """``(step, workload)`` of the kernel that can write model output ``y`` in place, or why none can."""
    p = producer.get(packed)
    if p is None or packed in plan.inputs:
        return "a model input"
    if len(readers.get(packed, [])) != 1:
        return "read by another kernel too"
    if p.op not in WRITERS:
        return f"written by {p.op}, which writes no row-major output"
    if why := _same_form(plan, y, packed, p):
        return why
    return _flagged(p, plain_output=True)


def _flagged(step: Step, **flag):
    """``(step, its workload with flag set)``, or why the workload cannot take it (its own check's words)."""
    try:
        return step, dataclasses.replace(step.workload, **flag)
    except ValueError as e:
        return str(e)


def _taken(step: Step, flag: str, role: str, info, history, **io):
    """``step`` reading or writing the row-major tensor (``flag``: ``plain_input`` or ``plain_output``; ``io``: its
    new ``X`` input or its ``output``) in buffer scope for ``role``; or why not (a string): other templates may still
    run the node (``choose_templates`` runs this again once it picked one), no valid config with those scopes on
    ``info``, or a tuned config given up."""
    if step.alternatives:  # Winograd may run the node: tuning measures it, choose_templates decides, then this
        return f"{step.name}'s template is not chosen yet ({', '.join(c.op for c in step.candidates())})"

    def moved(a: Step) -> Step:
        scopes = None if a.scopes is None else {**a.scopes, role: "buffer"}
        return dataclasses.replace(a, workload=dataclasses.replace(a.workload, **{flag: True}), scopes=scopes,
                                   inputs={**a.inputs, **io.get("inputs", {})}, output=io.get("output", a.output))
    out = moved(step)
    if info is not None and out.scopes is not None and not has_valid(out, info, out.scopes):
        return f"{step.op} has no valid config on {info.name} with {role} buffer"
    if info is not None and loses_tuned(history, info, step, out.workload, out.scopes):
        return f"the log tunes {step.name} with a packed {role}, and no {flag} config of it"
    return out


def read_io_in_place(plan: Plan, info=None, history=None) -> Plan:
    """Each model input's relayout read in place by the convolution that reads it, and each model output's written
    in place by the kernel that makes it, where they can (module doc); ``Plan.fused`` names each. Run after the
    scopes are decided (``plan.lower._plan_storage``): the kernel's input (output) becomes a buffer, which needs a
    valid config on ``info``; with a log (``history``) a kernel it has a record of is taken only where it has a
    valid one of the kernel reading (writing) the row-major buffer too. Run again by ``choose_templates`` for the
    nodes it decided."""
    producer = {s.output: s for s in plan.steps}
    readers = readers_of(plan)
    new, dropped, gone, notes = {}, set(), set(), []
    for s in plan.steps:
        if s.op != "relayout":
            continue
        src = s.inputs["X"]
        if src in plan.inputs and plan.tensors[src].kind == "plain":  # the input's pack
            found = _input_why_not(plan, src, s.output, readers)
            if isinstance(found, str):
                continue  # the relayout stays: plan.views.copy_notes names it
            reader = new.get(found[0].name, found[0])
            taken = _taken(reader, "plain_input", "input", info, history, inputs={"X": src})
            if isinstance(taken, str):
                continue
            new[reader.name] = taken
            notes.append(f"{s.name}: no kernel; {reader.name} reads the model input {src} row-major in place")
        elif s.output in plan.outputs and plan.tensors[s.output].kind == "plain":  # an output's unpack
            found = _output_why_not(plan, src, s.output, producer, readers)
            if isinstance(found, str):
                continue
            writer = new.get(found[0].name, found[0])
            taken = _taken(writer, "plain_output", "output", info, history, output=s.output)
            if isinstance(taken, str):
                continue
            new[writer.name] = taken
            notes.append(f"{s.name}: no kernel; {writer.name} writes the model output {s.output} row-major in place")
        else:
            continue
        dropped.add(s.name)
        gone.add(s.output if src in plan.inputs else src)
    if not dropped:
        return plan
    steps = [new.get(s.name, s) for s in plan.steps if s.name not in dropped]
    tensors = {k: v for k, v in plan.tensors.items() if k not in gone}
    return dataclasses.replace(plan, steps=steps, tensors=tensors, fused=plan.fused + notes)


def io_why_not(plan: Plan, info=None, history=None) -> dict:
    """``{relayout step: why it is a kernel}`` for each model-boundary relayout left in ``plan`` (``copy_notes``)."""
    producer, readers, out = {s.output: s for s in plan.steps}, readers_of(plan), {}
    for s in plan.steps:
        if s.op != "relayout":
            continue
        src = s.inputs["X"]
        if src in plan.inputs and plan.tensors[src].kind == "plain":
            found = _input_why_not(plan, src, s.output, readers)
        elif s.output in plan.outputs and plan.tensors[s.output].kind == "plain":
            found = _output_why_not(plan, src, s.output, producer, readers)
        else:
            continue
        if isinstance(found, str):
            out[s.name] = found
        else:  # the checks that need the step as it is planned (its alternatives; with info, configs and the log)
            step = found[0]
            taken = _taken(step, "plain_input" if src in plan.inputs else "plain_output",
                           "input" if src in plan.inputs else "output", info, history)
            if isinstance(taken, str):
                out[s.name] = taken
    return out
