"""``compile_model``: ONNX -> graph passes -> steps with planned scopes -> a template per node (the direct conv2d
or Winograd: the log's fastest, ``choose_templates``) -> configs (tuned log or fallback) ->
kernels lowered and compiled -> memory planned -> a ``Module`` that runs.

    module = tuner.compile_model("mobilenet_v2.onnx", log="logs/dev.jsonl", scope="auto")
    y, = module.run([x])
    module.save("build/mobilenet_v2")

For a device that is not attached (the log comes from a phone, the compile runs on a laptop), pass its
profile, the JSON ``tuner devices --json --device D`` prints there: ``compile_model(m, log=L,
target="phone.json")`` plans, picks configs and generates kernels for it without opening any OpenCL device;
the kernels are built when the artifact first loads on the phone.

With no ``log``, the history entered with ``with tuner.apply_history_best(log):`` applies (AutoTVM's
dispatch context).

The pipeline, one named step per hand-off, each a type (``compile_model`` runs them in this order; every step but
the last two needs no device):

    load_graph         model (ONNX path or ModelProto) -> Graph (frontend, then the graph passes)
    plan_graph         Graph -> Plan: steps, storage scopes, one template per node
    choose_configs     Plan -> {step: (config, where it came from)}: the log, transfer, the fallback
    generate_kernels   Plan + configs -> [StepKernel]: each step lowered and emitted as OpenCL C
    bind_operands      [StepKernel] -> Bound: weights packed, tensors' entries and live ranges, the launches
    allocate           Bound -> MemoryPlan: which tensors share a device allocation
    assemble           -> ModuleSpec: the artifact's graph (docs/artifact.md), with its sources and weights
    Module             the artifact on a runtime (built now on an attached device, or where it loads)
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
import tempfile
import warnings
import weakref
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.logs import apply_history_best, current_history
from tuner.logs.best import OTHER_DTYPE, FallbackConfigWarning, Pick
from tuner.logs.record import canonical_json, scope_knobs

import tuner.native as native
import tuner.runtime.module as M
from tuner.artifact import kernel_file
from tuner.codegen.generate import generate
from tuner.codegen.opencl import kernel_signature
from tuner.codegen.packing import pack, physical_shape
from tuner.frontend.onnx import from_onnx
from tuner.graph.graph import Graph
import tuner.graph.passes as passes
from tuner.plan.allocation import Entry as MemEntry
from tuner.plan.allocation import MemoryPlan, check_plan, plan_memory
from tuner.plan.rules import glue_builder
from tuner.plan.lower import choose_templates, extract_tasks, lower_graph, plan_storage
from tuner.plan.types import Plan, Step
from tuner.plan.views import write_views
from tuner.runtime.base import Runtime
from tuner.target import DeviceInfo, load_profile
from tuner.templates import get_template, templates


def load_graph(model, input_shapes: dict | None = None) -> Graph:
    """An ONNX ModelProto or path -> the optimized graph (BatchNorm folded, epilogues fused); a Graph is taken
    as already loaded (``fastest_plan`` plans one graph several ways, parsing the model once)."""
    if isinstance(model, Graph):
        return model
    return passes.optimize(from_onnx(model, input_shapes))  # looked up at call time: tests wrap it


def as_history(log, transfer_from=None):
    """An ApplyHistoryBest, or what ``apply_history_best`` takes (paths, globs, records); None: the history
    entered with ``with apply_history_best(...)`` (``current_history()``), if any -- or, with ``transfer_from``
    named, an empty one, so that the siblings' logs (``logs/<fingerprint>.jsonl``) are read."""
    if log is None:
        found = current_history()
        if found is None and transfer_from:
            return apply_history_best([], transfer_from)
        return found
    return apply_history_best(log, transfer_from) if not hasattr(log, "query") else log


def device_history(history, info, transfer_from=None, dtype: str | None = None):
    """``history`` as seen from the device ``info`` (``ApplyHistoryBest.for_device``: another driver's records,
    then the named siblings', fill what this device lacks) for a model stored in ``dtype`` (``for_dtype``: the
    other storage dtype's records fill the workloads this one has none of); a history without ``for_device``
    as is."""
    if hasattr(history, "for_device"):
        history = history.for_device(info, transfer_from)
        return history.for_dtype(info, dtype) if dtype and hasattr(history, "for_dtype") else history
    if transfer_from:
        raise TunerError("transfer_from needs a log read by apply_history_best (this history cannot say which "
                         "records are a sibling device's)")
    return history


def load_target(target):
    """A device profile -> DeviceInfo: a DeviceInfo, a dict (``DeviceInfo.to_dict()``), or the path of the
    JSON file ``tuner devices --json --device D`` writes on that device; checked by ``tuner.target``."""
    return load_profile(target)


def plan_model(model, device=None, scope: str = "auto", log=None, dtype: str = "float32",
               input_shapes: dict | None = None, transfer_from=None) -> Plan:
    """The planned steps of a model on ``device`` (a Device, DeviceInfo or spec); ``log`` as ``as_history``;
    ``transfer_from`` as ``compile_model``'s."""
    info = getattr(device, "info", device)
    if not isinstance(info, DeviceInfo):
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(info)
    history = device_history(as_history(log, transfer_from), info, transfer_from, dtype)
    return plan_storage(lower_graph(load_graph(model, input_shapes), dtype), info, scope, history)


def plan_graph(graph: Graph, info, scope: str, history, dtype: str = "float32", prefer=None) -> Plan:
    """The graph as the steps that will run on ``info``: lowered to steps (``lower_graph``), a storage scope per
    tensor (``plan_storage``), and one template per node (``choose_templates``)."""
    return choose_templates(plan_storage(lower_graph(graph, dtype), info, scope, history), history, info, prefer)


def logged_se_plan(graph: Graph, info, scope: str, history, dtype: str = "float32", prefer=None) -> Plan:
    """``plan_graph`` for a compile that times no plans (a fixed scope, a ``--target``): where the squeeze-excite
    gates pool their depthwise producers' row sums (``passes_se.pool_rows_in_depthwise``) and the log measured none
    of those gates but every gate pooling its map (a log tuned before the row sums), the plan of the gates pooling
    their maps -- what was tuned is what runs. Otherwise the graph's own plan."""
    from tuner.graph.passes_se import pool_maps_in_se_gates
    from tuner.plan.types import FIXED
    plan = plan_graph(graph, info, scope, history, dtype, prefer)
    maps = pool_maps_in_se_gates(graph)
    if maps is graph or history is None:
        return plan

    def logged(p: Plan) -> list:
        return [history.query(s.op, s.workload, info.fingerprint, s.scopes, FIXED[s.op]) is not None
                for s in p.steps if s.op == "se_gate"]
    if any(logged(plan)):
        return plan
    other = plan_graph(maps, info, scope, history, dtype, prefer)
    return other if all(logged(other)) else plan


def model_tasks(model, device=None, scope: str = "auto", log=None, dtype: str = "float32",
                input_shapes: dict | None = None, transfer_from=None) -> list:
    return extract_tasks(plan_model(model, device, scope, log, dtype, input_shapes, transfer_from))


UNTESTED = ("history", "fallback")  # where a layer not measured on this device takes its config (choose_configs)


def choose_configs(plan: Plan, info, history=None, untested: str = "history") -> dict:
    """``step name -> (config, source)``, where ``source`` says where the config came from:

    - ``"tuned"``: the log's best for the exact deployed task (another driver's of this device included:
      ``ApplyHistoryBest.for_device``);
    - ``"sibling <fingerprint>"``: the best valid record of the exact task on a sibling device named by
      ``transfer_from`` (``for_device``), checked against this device's space;
    - ``"dtype: tuned in <dtype>[ on <fingerprint>]"``: the best valid record of the same layer in the other
      storage dtype (``ApplyHistoryBest.for_dtype``: a float16 model's layer takes float32's config, and the
      reverse), where this dtype has none (or every layer, in ``fastest_plan``'s plan built from them);
    - ``"transferred from <workload>[ on <fingerprint>]"``: the config of the same shapes with another epilogue,
      or of the nearest tuned workload when no cost model can be trained (``ApplyHistoryBest.suggest``);
    - ``"predicted: config of <workload>[ on <fingerprint>]"``: the logged config the template's cost model
      ranks first for this workload, among those valid for it;
    - ``"fallback"``: a valid fallback, with one warning per workload from apply_history_best.

    ``untested="fallback"``: every layer without a record of this device (a sibling's, transferred or predicted
    config) takes this device's fallback instead -- the plan ``fastest_plan`` times beside the other, so that a
    compile never keeps configs nobody measured here when the fallbacks run faster."""
    if untested not in UNTESTED:
        raise TunerError(f"untested={untested!r}: one of {', '.join(UNTESTED)}")
    out = {}
    origin = getattr(history, "origin", {})
    for s in plan.steps:
        if not s.tuned:
            continue
        t = get_template(s.op)
        rec = history.best_valid(t, s.workload, info, s.scopes, t.model_knobs) if history else None
        pick = None if rec is not None or history is None else _suggest(history, t, s, info)
        if rec is not None:
            sib, dtype = origin.get(rec.task_key), getattr(history, "dtype_origin", {}).get(rec.task_key)
            if dtype is not None:
                out[s.name] = t.config(**rec.config), f"dtype: tuned in {dtype}" + (f" on {sib}" if sib else "")
            else:
                out[s.name] = t.config(**rec.config), "tuned" if sib is None else f"sibling {sib}"
        elif pick is not None:
            where = t.key_label(pick.record.workload) + (f" on {pick.origin}" if pick.origin else "")
            out[s.name] = pick.config, ("predicted: config of " if pick.how == "predicted" else
                                        "transferred from ") + where
        elif history is not None:  # the valid fallback, with apply_history_best's one warning per workload
            out[s.name] = history.pick(t, s.workload, info, s.scopes, t.model_knobs), "fallback"
        else:
            out[s.name] = t.fallback_with(s.workload, info, **scope_knobs(s.scopes), **t.model_knobs), "fallback"
        if untested == "fallback" and source_kind(out[s.name][1]) not in ("tuned", "fallback"):
            out[s.name] = t.fallback_with(s.workload, info, **scope_knobs(s.scopes), **t.model_knobs), "fallback"
    return out


def _suggest(history, template, step: Step, info):
    """``history.suggest``'s Pick (a history of another kind answers with ``transfer``: no origin)."""
    if hasattr(history, "suggest"):
        from tuner.search.samplers import CostModel  # the ranking model: search code, handed to the log's history
        return history.suggest(template, step.workload, info, step.scopes, template.model_knobs, fit=CostModel.fit)
    moved = history.transfer(template, step.workload, info, step.scopes, template.model_knobs)
    if moved is None:
        return None
    return Pick(moved[0], moved[1], "transferred")


CONFIG_SOURCES = ("tuned", "sibling", "dtype", "transferred", "predicted", "fallback")


def source_kind(config_source: str | None) -> str | None:
    """The kind of a layer's ``config_source`` (one of ``CONFIG_SOURCES``), or None for glue."""
    if not config_source:
        return None
    head = config_source.split(" ", 1)[0].rstrip(":")
    return head if head in CONFIG_SOURCES else config_source


def source_counts(nodes) -> dict:
    """``kind -> layers`` over a module's nodes (``source_kind`` of each tuned layer's config_source)."""
    out: dict = {}
    for n in nodes:
        k = source_kind(getattr(n, "config_source", None))
        if k is not None:
            out[k] = out.get(k, 0) + 1
    return out


@functools.lru_cache(maxsize=256)
def _tuned_kernel(build, workload, config) -> tuple:
    """``(lowered Program, OpenCL source)`` of a template's kernel, generated once per (template build,
    workload, config): ``fastest_plan`` compiles three plans that share most kernels, and lowering is most of
    a compile."""
    return generate(build(workload, config))


def _glue_kernel(s: Step, plan: Plan, max_wg: int):
    # a glue kernel stores in its output's dtype: in a mixed plan (tuner.plan.precision) not always the plan's
    dtype = plan.dtype_of(s.output)
    return glue_builder(s.op, s.name)(s, plan if dtype == plan.dtype else dataclasses.replace(plan, dtype=dtype),
                                      max_wg)


def compile_model(model, log=None, device=None, scope: str = "auto", dtype: str = "float32",
                  input_shapes: dict | None = None, progress: bool = False, target=None,
                  measure_plans: bool | None = None, prefer=None, transfer_from=None,
                  plan_timer: str = "python", precision: str = "mixed", calibration=None,
                  keep: bool = False) -> M.Module:
    """Compile an ONNX model (path or ModelProto) for ``device`` with the best configs of ``log`` (path,
    glob, list, or an ApplyHistoryBest; None: the active ``with apply_history_best(...)``, if any);
    ``scope``: auto (per layer, from the log), texture or buffer.

    ``measure_plans`` (default: with ``scope="auto"``, an attached device and a log): the per-layer plan and
    both uniform plans are compiled and run whole on the device, and the fastest is kept (``fastest_plan``),
    so that ``auto`` is never slower than the best uniform plan: the log prices each kernel alone, not the
    mixed-scope kernels, conversions and glue a plan implies, nor how kernels run back to back.
    ``plan_timer``: what times them, ``python`` (this process's executor) or ``native`` (``tuner-run``, the
    runtime a deployed artifact runs in; ``fastest_plan`` says why they can disagree).

    ``prefer``: which template runs a node several templates take (a 3x3 stride-1 conv2d: direct or Winograd);
    None: the one the log measured fastest; see ``plan.choose_templates``.

    ``target`` (instead of ``device``): a device profile (``load_target``) of a device that need not be
    attached. Nothing is opened or built here; the Module can be saved, and builds on its first load.

    ``transfer_from``: fingerprints of sibling devices (a list, a comma-separated string, or ``"auto"`` for
    every device of this one's family the logs hold) whose records fill the layers this device has none of,
    ranked below this device's own and another driver's, each config checked against this device's space;
    their layers say ``sibling <fingerprint>`` (``choose_configs``). A sibling's records the logs lack are read
    from ``<fingerprint>.jsonl`` beside the logs or in ``logs/``. Unnamed, a sibling's records never apply.

    ``precision`` (float16 only): ``mixed`` runs the precision guard (``tuner.plan.precision``) on
    ``calibration`` inputs (a folder of ``.npy`` files; None: random normal ones of the inputs' shapes) and keeps
    the nodes whose float16 output overflows, flushes to zero or drifts in float32 (a mixed plan; the module's
    ``precision`` says which and why); ``strict`` refuses such a model (PrecisionError); ``off`` stores every
    tensor in float16 unchecked.

    ``keep`` (``tuner compile`` and ``tuner demo`` set it: they save the module): its programs, and the candidate
    plans', are built one by one, as the binary cache keeps them, so that ``Module.save`` keeps them for both
    runtimes (``tuner.artifact.cache.keep_programs``) without building them again and the first run of the artifact
    builds nothing (a program this process built together before is still handed out shared: correct, and saved
    alone all the same). Without it the programs of the generator's one-kernel sources are built as one program
    (``Runtime.build_together``: on PoCL about half the build time), and ``Module.save`` builds each alone to keep
    it."""
    from tuner.plan.precision import PRECISIONS, guard_graph
    if precision not in PRECISIONS:
        raise TunerError(f"--precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if dtype != "float16" and (calibration is not None or precision != "mixed"):
        raise TunerError("--calibration and --precision choose what a float16 compile keeps in float32; with "
                         f"--dtype {dtype} every tensor is float32: add --dtype float16, or leave them out")
    dev, info = _open(device, target)
    _check_prefer(prefer)
    if plan_timer not in PLAN_TIMERS:
        raise TunerError(f"plan_timer={plan_timer!r}: give one of {', '.join(PLAN_TIMERS)}")
    if plan_timer != "python" and (scope != "auto" or dev is None):
        raise TunerError(f"--plan-timer {plan_timer} times the candidate plans of --scope auto on an attached device; "
                         f"with " + (f"--scope {scope}" if scope != "auto" else "--target") + " nothing is timed: "
                         f"leave --plan-timer out")
    # another driver's records of this device, then the named siblings', then the other dtype's fill what this one
    # lacks
    history = device_history(as_history(log, transfer_from), info, transfer_from, dtype)
    graph = load_graph(model, input_shapes)
    guard = None
    if dtype == "float16" and precision != "off":
        graph, guard = guard_graph(graph, precision, calibration)
    if measure_plans is None:
        measure_plans = scope == "auto" and dev is not None and history is not None
    if plan_timer != "python" and not measure_plans:
        if history is not None:  # measure_plans=False, asked for
            raise TunerError(f"plan_timer={plan_timer!r} with measure_plans=False: nothing is timed; leave "
                             f"plan_timer out")
        # a first compile, before any tuning: compiled as with the default timer, which times nothing either
        warnings.warn(f"--plan-timer {plan_timer}: no log holds records for this device, so --scope auto timed no "
                      f"plans (the per-layer plan is kept, on fallback configs); pass --log to time them",
                      RuntimeWarning, stacklevel=2)
    if measure_plans and scope == "auto" and dev is not None:
        mod = fastest_plan(graph, history, dev, dtype, progress=progress, timer=plan_timer, together=not keep,
                           float32_plan=guard is not None and precision == "mixed")
    else:
        plan = logged_se_plan(graph, info, scope, history, dtype, prefer)
        mod = module_of(compile_plan(plan, info, history, progress), dev, progress, together=not keep)
    mod.precision = guard  # the precision guard's finding (float16), printed by `tuner compile`
    return mod


def _open(device, target) -> tuple:
    """``(runtime or None, DeviceInfo)``: the device to compile for, or a target profile's (nothing opened)."""
    if target is not None:
        if device is not None:
            raise TunerError("compile for a device or for a target profile, not both")
        return None, load_target(target)
    if isinstance(device, Runtime):  # any device behind the seam: local OpenCL, an agent, ...
        return device, device.info
    from tuner.runtime.opencl.device import Device, open_device
    dev = device if isinstance(device, Device) else open_device(device)
    return dev, dev.info


@dataclasses.dataclass
class Compiled:
    """A compiled plan before any device: the artifact's graph, kernel sources and packed weights."""
    spec: M.ModuleSpec
    sources: dict  # kernels/kNNN.cl -> OpenCL C
    params: dict  # weight key -> packed array


def module_of(compiled: Compiled, dev, progress: bool = False, together: bool = True) -> M.Module:
    """The artifact on ``dev`` (its programs built now; ``together``: see ``Module``), or deferred to its first
    load (``dev`` None)."""
    return M.Module(compiled.spec, compiled.sources, compiled.params, dev, defer=dev is None, progress=progress,
                    together=together)


def compile_plan(plan: Plan, info, history=None, progress: bool = False, untested: str = "history") -> Compiled:
    """The steps after planning, in order, with no device (``untested``: see ``choose_configs``); concats whose
    parts can be written in place are (``write_views``)."""
    configs = choose_configs(plan, info, history, untested)
    plan = write_views(plan)
    kernels = generate_kernels(plan, configs, info, progress)
    bound = bind_operands(plan, kernels)
    memory = allocate(plan, bound)
    return assemble(plan, info, bound, memory)


@dataclasses.dataclass
class StepKernel:
    """One step's generated code: the lowered program and its OpenCL source; for a tuned step its config and
    where that came from (``choose_configs``)."""
    step: Step
    program: object
    source: str
    config: object = None
    config_source: str | None = None


def generate_kernels(plan: Plan, configs: dict, info, progress: bool = False) -> list:
    """``[StepKernel]``, one per step: a template's kernel with its config, or the step's glue kernel."""
    out = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(plan.steps), desc="compile", unit="kernel", dynamic_ncols=True)
    for s in plan.steps:
        if s.tuned:
            cfg, config_source = configs[s.name]
            try:
                prog, source = _tuned_kernel(get_template(s.op).build, s.workload, cfg)
            except TypeError:  # a user template's workload or config that cannot be hashed: not cached
                prog, source = generate(get_template(s.op).build(s.workload, cfg))
            out.append(StepKernel(s, prog, source, cfg, config_source))
        else:
            out.append(StepKernel(s, *generate(_glue_kernel(s, plan, info.max_work_group_size))))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


@dataclasses.dataclass
class Bound:
    """The kernels bound to the plan's tensors and weights: the artifact's nodes (launches and arguments), the
    kernel sources by file, the weights packed by the layouts the configs chose, the tensors' entries and each
    tensor's live range ``[first step, last step]``."""
    nodes: list
    sources: dict
    params: dict
    blobs: list
    workspaces: list
    entries: dict
    uses: dict


def bind_operands(plan: Plan, kernels: list) -> Bound:
    """Each kernel parameter bound to a weight (packed here, once), a tensor (an entry, with its live range) or a
    workspace; each kernel's launches with their argument references (``p:``, ``t:``, ``w:``)."""
    b = Bound([], {}, {}, [], [], {}, {})
    for i, k in enumerate(kernels):
        s, prog = k.step, k.program
        binding = {**s.inputs, "Y": s.output, **s.side_outputs}
        refs = {}
        for buf in prog.params:
            name = binding.get(buf.name)
            if name is None:
                raise TunerError(f"step {s.name!r}: kernel parameter {buf.name!r} is not bound")
            phys = tuple(physical_shape(buf))
            if name in plan.params:  # a weight: packed once, here, by the layout the config chose
                key = f"{s.name}.{buf.name}"
                b.params[key] = pack(buf, np.asarray(plan.params[name], np.float32)).astype(buf.dtype.numpy)
                b.blobs.append(M.Blob(key, buf.scope, phys, np.dtype(buf.dtype.numpy).name))
                refs[buf.name] = f"p:{key}"
                continue
            t_ = plan.tensors[name]
            e = M.Entry(name, tuple(t_.shape), phys, buf.scope, np.dtype(buf.dtype.numpy).name, t_.layout, -1)
            if name in b.entries and (b.entries[name].physical_shape, b.entries[name].storage_scope,
                                      b.entries[name].dtype) != (phys, buf.scope, e.dtype):
                raise TunerError(f"tensor {name!r}: step {s.name!r} sees it as {buf.scope} {phys} {e.dtype}, an "
                                 f"earlier step as {b.entries[name].storage_scope} {b.entries[name].physical_shape} "
                                 f"{b.entries[name].dtype}")
            b.entries.setdefault(name, e)
            u = b.uses.setdefault(name, [i, i])
            u[1] = i
            refs[buf.name] = f"t:{name}"
        for w in prog.workspaces:
            key = f"{s.name}.{w.name}"
            b.workspaces.append(M.Blob(key, w.scope, tuple(physical_shape(w)), np.dtype(w.dtype.numpy).name))
            refs[w.name] = f"w:{key}"
        calls = []
        for kern in prog.kernels:
            g, l = kern.launch()
            calls.append(M.Call(kern.name, tuple(g), tuple(l), [refs[p.name] for p in kern.params],
                                [M.Param(**p) for p in kernel_signature(kern)]))
        src = kernel_file(i)
        b.sources[src] = k.source
        b.nodes.append(M.Node(s.name, s.op, src, calls, s.workload.flops if s.tuned else 0,
                              s.op if s.tuned else None, s.workload.key() if s.tuned else None, s.scopes,
                              dataclasses.asdict(k.config) if k.config is not None else None,
                              k.config_source == "tuned", k.config_source))
    n = len(kernels)
    for x in plan.inputs:
        b.uses[x][0] = 0
    for y in plan.outputs:
        b.uses[y][1] = n  # outputs are read after the last step: never reused
    return b


def allocate(plan: Plan, bound: Bound) -> MemoryPlan:
    """The memory plan of the bound tensors (``tuner.plan.allocation``), checked; each entry gets its storage."""
    mem_entries = [MemEntry(name, e.storage_scope, e.dtype, e.physical_shape, *bound.uses[name])
                   for name, e in bound.entries.items()]
    mp = plan_memory(mem_entries)
    check_plan(mem_entries, mp)
    for name, e in bound.entries.items():
        e.storage_id = mp.storage_id[name]
    return mp


def _float32_refs(plan: Plan, bound: Bound) -> list:
    """A float16 plan's float32 tensors, weights and workspaces as argument references (docs/artifact.md:
    ``float32``): a mixed plan's; none in a float32 or an all-float16 plan."""
    if plan.dtype != "float16":
        return []
    return ([f"t:{n}" for n, e in bound.entries.items() if e.dtype == "float32"]
            + [f"p:{b.key}" for b in bound.blobs if b.dtype == "float32"]
            + [f"w:{w.key}" for w in bound.workspaces if w.dtype == "float32"])


def assemble(plan: Plan, info, bound: Bound, memory: MemoryPlan) -> Compiled:
    """The artifact's graph (``ModuleSpec``: the device it was compiled for, the nodes, the entries, the pools)
    with the kernel sources and the packed weights."""
    pools = [M.Pool(p.id, p.scope, p.dtype, tuple(p.shape)) for p in memory.pools]
    spec = M.ModuleSpec({**info.fingerprint_fields(), "fingerprint": info.fingerprint, "name": info.name,
                         "profile": info.to_dict()},
                        plan.dtype, list(plan.inputs), list(plan.outputs), bound.nodes, bound.entries, pools,
                        bound.blobs, bound.workspaces, memory.totals(), _float32_refs(plan, bound),
                        {"kept": [{"node": k, "reason": v} for k, v in plan.precision.items()]}
                        if plan.precision else {})
    return Compiled(spec, bound.sources, bound.params)


def _check_prefer(prefer) -> None:
    """``prefer`` of ``compile_model``: None, "first", or {node name: registered template name}."""
    if prefer is None or prefer == "first":
        return
    if not isinstance(prefer, dict):
        raise TunerError(f"prefer={prefer!r}: give None, 'first' or a dict {{node name: template name}}")
    unknown = sorted({str(t) for t in prefer.values()} - set(templates()))
    if unknown:
        raise TunerError(f"prefer names templates that are not registered: {', '.join(unknown)} "
                         f"(registered: {', '.join(sorted(templates()))})")


PLAN_ROUNDS = 3  # alternating rounds in which fastest_plan times its candidate plans
EXTRA_ROUNDS = 2  # more rounds where a challenger faster by its median lost one round to the incumbent


@dataclasses.dataclass
class PlanStep:
    """One step of ``fastest_plan``'s choice (``scope``: the per-layer and uniform plans; ``templates``: the kept
    plan against its direct-conv2d and per-node variants; ``dtype``: against the plan of the other storage dtype's
    configs; ``fallback``: against this device's fallback configs; ``float32``: a mixed float16 plan against
    its scope's plan in float32 throughout):
    its finalists timed together in ``PLAN_ROUNDS`` alternating rounds. ``times``: each one's median of its rounds,
    ``spreads``: IQR/median of all its timings (``tuner.timing``), ``same``: a plan identical to another (timed
    once, as that one), ``kept``: the incumbent (the first finalist) unless a challenger ran faster in every round
    (all but one of ``PLAN_ROUNDS + EXTRA_ROUNDS`` where the call was close: ``_alternating``), ``rounds``: each
    finalist's time in each round. Every number is from this step's rounds."""
    name: str
    times: dict
    spreads: dict
    kept: str
    same: dict = dataclasses.field(default_factory=dict)
    rounds: dict = dataclasses.field(default_factory=dict)

    @property
    def incumbent(self) -> str:
        """The plan kept so far, which the others challenged: the first finalist."""
        return next(iter(self.times))

    def lost(self, plan: str) -> int:
        """The rounds in which ``plan`` did not run faster than the incumbent."""
        return _rounds_lost(self.rounds.get(plan, ()), self.rounds.get(self.incumbent, ()))

    def runner_up(self) -> str | None:
        """The fastest finalist but the kept one (not an alias of it); None when there is none."""
        others = [m for m in self.times if m != self.kept and self.same.get(m) != self.kept and m not in self.same]
        return min(others, key=lambda m: self.times[m]) if others else None

    def margin(self) -> float:
        """How much slower the runner-up ran than the kept plan (0.05: 5%); below 0 where the incumbent was kept
        against a challenger faster by the median but not in every round."""
        other = self.runner_up()
        t = self.times[self.kept]
        return (self.times[other] - t) / t if other is not None and t > 0 else float("inf")

    def noise(self) -> float:
        """The larger spread of the kept plan and the runner-up."""
        other = self.runner_up()
        return max(self.spreads[self.kept], self.spreads[other] if other is not None else 0.0)

    def close(self) -> bool:
        """Whether the spread is larger than the difference: another round could have chosen the runner-up."""
        return self.runner_up() is not None and self.noise() > self.margin()

    def to_json(self) -> dict:
        return {"step": self.name, "kept": self.kept, "times_s": self.times, "spreads": self.spreads,
                "same_as": self.same, "runner_up": self.runner_up(), "close": self.close(),
                "rounds_s": self.rounds}


PLAN_TIMERS = ("python", "native")  # what times the candidate plans (compile_model's plan_timer)


def fastest_plan(model, history, device, dtype: str = "float32", input_shapes: dict | None = None,
                 progress: bool = False, repeats: int = 10, timer: str = "python",
                 float32_plan: bool = False, together: bool = True) -> M.Module:
    """The per-layer (``auto``) plan and the all-texture and all-buffer plans compiled for ``device`` and timed
    whole (median of ``repeats`` runs after a warm-up, in ``PLAN_ROUNDS`` alternating rounds, the median of the
    rounds; a plan identical to another is timed once); the fastest module is returned (a challenger takes the
    incumbent's place only by running faster in every round: ``_alternating``), with ``plan_steps`` (each
    step's ``PlanStep``: its finalists timed together in alternating rounds, times and spreads), ``plan_times``
    (plan -> seconds, of the last step: the rounds that made the final choice), ``plan_kept`` and ``plan_timer``
    set. A step's later finalists are always timed beside the plan they challenge, never against a time of an
    earlier step's rounds.

    ``timer``: ``python``, this process's executor (``Module.time``: kernels only, on random inputs), or
    ``native``, the native runtime (``tuner-run --bench`` on each plan saved as an artifact, a fresh process per
    timing: whole runs with transfers). They can disagree: the Python executor enqueues each kernel from Python
    (about 10 us a kernel), so on a fast GPU it times the host as much as the device. On an H100,
    EfficientNet-B0's texture plan ran 1.162 ms and the per-layer plan 1.246 in tuner-run (6 of 6 processes),
    while the Python executor timed them 1.640 and 1.507 (``bench/plan_noise.py``). Time with the runtime that
    will run the artifact.

    A plan that runs squeeze-excite blocks fused (``se_gate``: one launch a block) is timed beside the same plan
    with them unfused (a pool and two 1x1 convolutions), with only those unfused whose fused kernel measured
    slower inside the model, and with the gates pooling their maps rather than their depthwise producers' row
    sums (``_refine_squeeze_excite``, step ``squeeze_excite``): on the H200 the fused blocks' fallback kernels
    took as long as the three kernels they replace.

    Where norms could run inside convolutions -- applied by those that read them (``norms_applied_as_read``: fewer
    launches, more work in the readers) or computed in the epilogue of the one that writes them
    (``norms_into_convs``: no launch, a work-group a plane), or a GroupNorm(1)'s statistics computed there
    (``norm_statistics_into_producers``) -- the kept plan is timed beside those graphs' plans (``_refine_norms``,
    step ``norms``), and the faster is kept.

    Then the template choice of the kept plan is checked inside the model (``_refine_templates``): the log
    times each kernel alone, with its weights warm in the cache from the previous run, and a Winograd kernel
    reads 16/9 (F(2x2)) or 4x (F(4x4)) the direct kernel's weights, which in a model come cold from memory.

    ``float32_plan`` (a float16 compile the precision guard mixes): the kept plan is timed last beside the same
    scope's plan with every tensor in float32, named ``<scope>+all-float32``, and the faster is kept -- a plan
    the guard kept mostly in float32 pays a cast at every boundary, and can run slower than float32 throughout
    (on the H200, an uncalibrated MobileNetV2 kept 45 of 54 nodes: 0.446 ms mixed, 0.357 ms in float32), so that
    ``--dtype float16`` is never slower than ``--dtype float32`` by more than the timing's noise.

    ``together``: each candidate's programs are built together where the runtime can (``Module``); False (a
    compile that keeps its programs, ``compile_model(keep=True)``), or the native timer (which saves each
    candidate, keeping its programs: ``Module.save``), builds each alone, once."""
    if timer not in PLAN_TIMERS:
        raise TunerError(f"plan_timer={timer!r}: give one of {', '.join(PLAN_TIMERS)}")
    if timer == "native" and not getattr(device, "runs_here", not isinstance(device, Runtime)):
        raise TunerError(f"--plan-timer native times the plans with tuner-run on this machine, and "
                         f"{device.info.name} is reached through an agent: run the compile on the device's host, "
                         f"or use --plan-timer python")
    together = together and timer == "python"
    if timer == "native":
        exe = native.build()["tuner_run"]  # before any plan is compiled: a missing toolchain fails now
        paths = weakref.WeakKeyDictionary()  # module -> its artifact; a loser's device memory still goes
        with tempfile.TemporaryDirectory(prefix="tuner-plans-") as saved:
            return _fastest_plan(model, history, device, dtype, input_shapes, progress, repeats, timer,
                                 lambda mod: _native_time(mod, paths, Path(saved), device, exe, repeats),
                                 float32_plan, together)
    return _fastest_plan(model, history, device, dtype, input_shapes, progress, repeats, timer,
                         lambda mod: _random_inputs(mod).time(repeats), float32_plan, together)  # every run: its spread


def _native_time(mod, paths: dict, saved: Path, device, exe, repeats: int) -> float:
    """``mod``'s whole-run median by tuner-run: saved as an artifact under ``saved`` on first use (``paths``:
    module -> its artifact), its binaries built by an untimed run. tuner-run takes the first device of the
    fingerprint: of two identical cards, the first."""
    if mod not in paths:
        paths[mod] = saved / f"plan{len(list(saved.iterdir()))}"
        mod.save(paths[mod])
        native.bench_artifact(paths[mod], device.info.fingerprint, repeats=1, warmup=0, exe=exe)
    return native.bench_artifact(paths[mod], device.info.fingerprint, repeats=repeats, exe=exe)


def _fastest_plan(model, history, device, dtype, input_shapes, progress, repeats, timer, whole,
                  float32_plan: bool = False, together: bool = True) -> M.Module:
    timed, modules, caught = {}, {}, []
    # parsed once, planned several ways; the squeeze_excite step may replace it by the graph with blocks unfused
    current = {"graph": load_graph(model, input_shapes)}

    def compile_(mode, prefer=None, untested="history", hist=history, as_dtype=dtype, graph=None):
        graph = current["graph"] if graph is None else graph
        with warnings.catch_warnings(record=True) as notes:  # a candidate's fallbacks matter only if it is kept
            warnings.simplefilter("always")
            mod = module_of(compile_plan(plan_graph(graph, device.info, mode, hist, as_dtype, prefer), device.info,
                                         hist, progress, untested), device, progress, together)
        caught.extend(notes)
        return mod

    alias, plans = {}, ("auto", "texture", "buffer")
    for mode in plans:
        mod = compile_(mode)
        same = next((m for m, other in modules.items() if _same_plan(other, mod)), None)
        if same is not None:
            alias[mode] = same
            continue
        modules[mode] = mod
    steps = [_alternating(whole, modules, "scope", alias)]  # the per-layer plan (first) is the incumbent
    kept = steps[-1].kept
    mod = modules[kept]
    modules.clear()  # the losers' device memory goes now, before more plans are compiled
    unfused = _refine_squeeze_excite(mod, kept, current["graph"], compile_, repeats, device.info)
    if unfused:  # the plan with its squeeze-excite blocks fused, against them unfused (all, or where slower)
        candidates = {kept: mod, **{name: m for name, m, _ in unfused}}
        steps.append(_alternating(whole, candidates, "squeeze_excite"))
        if steps[-1].kept != kept:
            kept, mod = steps[-1].kept, candidates[steps[-1].kept]
            current["graph"] = next(g for name, _, g in unfused if name == kept)
        candidates.clear()
        unfused.clear()
    others = _refine_norms(kept, current["graph"], compile_)
    if others:  # the plan with its norms whole, against the norms in their convolutions in each scope mode
        candidates = {kept: mod, **{name: m for name, (m, _) in others.items()}}
        steps.append(_alternating(whole, candidates, "norms"))
        if steps[-1].kept != kept:
            kept, mod, current["graph"] = steps[-1].kept, candidates[steps[-1].kept], others[steps[-1].kept][1]
        candidates.clear()
        others.clear()
    refined = _refine_templates(mod, kept, compile_, repeats)
    if refined:  # the kept plan timed again, beside its challengers, in the same rounds
        candidates = {kept: mod, **dict(refined)}
        steps.append(_alternating(whole, candidates, "templates"))
        kept, mod = steps[-1].kept, candidates[steps[-1].kept]
        candidates.clear()
    transfers = history.for_dtype(device.info, dtype, replace=True) \
        if dtype == "float16" and hasattr(history, "for_dtype") else None
    if transfers is not None and transfers.dtype_origin:
        # the plan built from float32's configs: every layer float32 measured takes its config, scopes and
        # template, so that a float16 model, which moves half the bytes, is never slower than what float32's
        # tuning gives it, however few float16 records there are (a float32 model's own records are trusted)
        mode = kept.split("+")[0]
        other = compile_(mode, prefer="first" if kept.endswith("+direct") else None, hist=transfers)
        if not _same_plan(other, mod):
            name = f"{kept}+{OTHER_DTYPE[dtype]}"
            steps.append(_alternating(whole, {kept: mod, name: other}, "dtype"))
            if steps[-1].kept == name:
                kept, mod = name, other
    if any(source_kind(n.config_source) in ("sibling", "dtype", "transferred", "predicted") for n in mod.spec.nodes):
        # configs nobody measured on this device: the same plan with this device's fallbacks is a candidate too
        # (on an H100, EfficientNet-B0 with only the H200's log ran 1.69 ms, with no log at all 1.21 ms)
        mode = kept.split("+")[0]
        other = compile_(mode, prefer="first" if kept.endswith("+direct") else None, untested="fallback")
        if not _same_plan(other, mod):
            name = f"{kept}+fallback"
            steps.append(_alternating(whole, {kept: mod, name: other}, "fallback"))
            if steps[-1].kept == name:
                kept, mod = name, other
    if float32_plan and dtype == "float16":
        mode = kept.split("+")[0]  # the kept plan's choices (squeeze-excite, templates, fallbacks), in float32
        other = compile_(mode, prefer="first" if "+direct" in kept else None, as_dtype="float32",
                         untested="fallback" if kept.endswith("+fallback") else "history")
        name = f"{mode}+all-float32"
        steps.append(_alternating(whole, {kept: mod, name: other}, "float32"))
        if steps[-1].kept == name:
            kept, mod = name, other
    mod.plan_steps, mod.plan_kept, mod.plan_timer = steps, kept, timer
    mod.plan_times = dict(steps[-1].times)  # the rounds that made the final choice
    untuned = [canonical_json(n.workload) for n in mod.spec.nodes if n.template and not n.tuned and n.workload]
    seen = set()
    for w in caught:  # the kept plan's warnings (a fallback config it deploys), once each
        text = str(w.message)
        if text in seen or (issubclass(w.category, FallbackConfigWarning) and not any(k in text for k in untuned)):
            continue
        seen.add(text)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return mod


def _rounds_lost(mine, incumbents) -> int:
    """The rounds (paired times) in which a challenger did not run faster than the incumbent."""
    return sum(a >= b for a, b in zip(mine, incumbents))


def _alternating(whole, modules: dict, step: str = "scope", same: dict | None = None) -> PlanStep:
    """The ``PlanStep`` of timing ``modules`` (name -> Module, the incumbent first) by ``whole``: ``PLAN_ROUNDS``
    rounds, the modules alternating, each one's time the median of its rounds -- a slow spell of the device (on an
    H100 one plan timed 3.866 ms in one process and 1.406 ms in the next) hits every plan alike. ``whole`` returns
    seconds, or a list of runs' seconds (their median is the round's); the spread is over every run (over the
    rounds where ``whole`` gives one number).

    The incumbent (the first of ``modules``) is kept unless a challenger ran faster than it in every round; of
    those that did, the fastest by its median is kept. A challenger faster only by the median, or in some rounds,
    is within the noise: on the H200 the Python executor timed one MobileViTv2 plan 0.777 ms in one job and
    1.686 ms in the next, and a plain minimum of the medians kept a plan 16-20% slower in tuner-run for two
    models of that job. Where a challenger faster by its median lost exactly one round, ``EXTRA_ROUNDS`` more
    are timed, and a challenger then wins by beating the incumbent in all rounds but one. ``same``: plan -> the
    plan of ``modules`` it is identical to (reported with its times)."""
    from tuner.timing import spread
    runs = {m: [] for m in modules}
    rounds = {m: [] for m in modules}
    incumbent, *challengers = modules

    def time_rounds(first: int, count: int) -> None:
        for r in range(first, first + count):
            for m in (list(modules) if r % 2 == 0 else list(modules)[::-1]):
                t = whole(modules[m])
                got = [float(x) for x in t] if isinstance(t, (list, tuple)) else [float(t)]
                runs[m].extend(got)
                rounds[m].append(statistics.median(got))

    def lost(m) -> int:
        return _rounds_lost(rounds[m], rounds[incumbent])

    def faster(m) -> bool:
        return statistics.median(rounds[m]) < statistics.median(rounds[incumbent])

    time_rounds(0, PLAN_ROUNDS)
    if any(faster(m) and lost(m) == 1 for m in challengers):  # a close call: more evidence before deciding
        time_rounds(PLAN_ROUNDS, EXTRA_ROUNDS)
    allowed = 1 if len(rounds[incumbent]) > PLAN_ROUNDS else 0
    times = {m: statistics.median(v) for m, v in rounds.items()}
    spreads = {m: spread(runs[m]) for m in modules}
    won = [m for m in challengers if faster(m) and lost(m) <= allowed]
    kept = min(won, key=lambda m: (times[m], challengers.index(m))) if won else incumbent
    same = dict(same or {})
    for alias, target in same.items():
        times[alias], spreads[alias], rounds[alias] = times[target], spreads[target], rounds[target]
    order = [m for m in (*modules, *same)]  # the order plans were compiled in, aliases after
    return PlanStep(step, {m: times[m] for m in order}, {m: spreads[m] for m in order}, kept, same,
                    {m: list(rounds[m]) for m in order})


# Platforms whose compilers build the gate computed in a depthwise convolution's last work-group wrongly: PoCL
# 3.0-rc2 (LLVM 14), optimizing, drops the squeeze's stores in some configs (data (3, 6, 7, 5), S = 2, 4
# work-items); the same source gives the right gate built with -cl-opt-disable, by Intel's CPU runtime and by
# Oclgrind. A measured tuning rejects such a config (its output is checked); a plan's untuned configs are not.
GATES_IN_PRODUCERS_MISCOMPILED = ("pocl",)


def _refine_squeeze_excite(mod: M.Module, mode: str, graph, compile_, repeats: int, info) -> list:
    """``[(plan name, Module, graph)]`` to time against ``mod`` (compiled with ``--scope mode`` from ``graph``)
    where it runs ``se_gate`` kernels (issue 55, item 2: a squeeze-excite block's pool and both 1x1 convolutions in
    one launch): the same plan with every block unfused (``passes_se.split_squeeze_excite``: the pool and two
    convolutions), ``<mode>+unfused-se``; and, where the kernel times measured inside the two models (profiling
    events) find some blocks faster unfused and some fused, the plan unfusing only those, ``<mode>+per-block-se``.
    The kernel times leave out what a launch costs between kernels; the whole plans' timings include it. Where
    the gates pool their depthwise producers' row sums (``passes_se.pool_rows_in_depthwise``), the plan with the
    gates pooling the maps again, ``<mode>+map-se``, is timed too, and the plan with each of those gates computed
    by the last work-group of its depthwise producer (``passes_se.gates_in_depthwise``: no launch of its own),
    ``<mode>+gates-in-producers`` -- and, where the kernel times find some of those depthwise convolutions faster
    than the convolution and gate apart and some slower, the plan with only the faster ones,
    ``<mode>+some-gates-in-producers`` (on the H200 one work-group squeezing and exciting EfficientNet-B0's
    1152-channel gate alone took 51 us, against 20 apart); not on ``GATES_IN_PRODUCERS_MISCOMPILED``'s
    platforms (``info``: the device's). The same for the gates computed by the convolutions that read them
    (``passes_se.gates_in_readers``: every work-group computes its gate first), ``<mode>+gates-in-readers`` and
    ``<mode>+some-gates-in-readers``; and where some gates are faster in their producers and some in their readers,
    each in the faster of the two, ``<mode>+gates-in-producers-and-readers``. Empty when ``mod`` runs no se_gate."""
    from tuner.graph.passes_se import gates_in_depthwise, gates_in_readers, pool_maps_in_se_gates, split_squeeze_excite
    fused = [n.name for n in mod.spec.nodes if n.template == "se_gate"]
    if not fused:
        return []
    every = split_squeeze_excite(graph)
    first = compile_(mode, graph=every)
    out = [(f"{mode}+unfused-se", first, every)]
    maps = pool_maps_in_se_gates(graph)
    if maps is not graph:
        out.append((f"{mode}+map-se", compile_(mode, graph=maps), maps))
    rows = [{r["node"]: r["median_s"] for r in _random_inputs(m).profile(repeats)["rows"]} for m in (mod, first)]
    def attempt(name: str, g):  # the plan, or None where this device cannot run it (a gate its local memory
        try:  # cannot hold, in its readers)
            m = compile_(mode, graph=g)
        except (TunerError, ValueError):
            return None
        out.append((name, m, g))
        return m

    saved = {}  # where a gate goes -> {gate: the kernel time saved there, as profiled}
    for where, rewrite, attr in (("producers", gates_in_depthwise, "gate"), ("readers", gates_in_readers, "in_gate")):
        gated = rewrite(graph) if where == "readers" or info.platform_tag not in GATES_IN_PRODUCERS_MISCOMPILED \
            else graph
        if gated is graph:
            continue
        inside = attempt(f"{mode}+gates-in-{where}", gated)
        if inside is None:
            continue
        times = {r["node"]: r["median_s"] for r in _random_inputs(inside).profile(repeats)["rows"]}
        hosts = {}  # gate -> the nodes that compute it now
        for n in gated.nodes:
            if n.attrs.get(attr):
                hosts.setdefault(n.attrs["gate_node"], []).append(n.name)
        saved[where] = {gate: rows[0].get(gate, 0.0) + sum(rows[0].get(h, 0.0) - times[h] for h in names)
                        for gate, names in hosts.items() if all(h in times for h in names)}
        faster = {gate for gate, s in saved[where].items() if s > 0}
        if faster and len(faster) < len(hosts):
            attempt(f"{mode}+some-gates-in-{where}", rewrite(graph, faster))
    if len(saved) == 2:  # each gate where it saves the more, where both places save some
        best = {}
        for where, gates in saved.items():
            for gate, s in gates.items():
                if s > 0 and s > best.get(gate, ("", 0.0))[1]:
                    best[gate] = (where, s)
        split = {where: {g for g, (w, _) in best.items() if w == where} for where in saved}
        if split["producers"] and split["readers"]:
            attempt(f"{mode}+gates-in-producers-and-readers",
                    gates_in_depthwise(gates_in_readers(graph, split["readers"]), split["producers"]))
    slower = {n for n in fused
              if rows[0].get(n, 0.0) > sum(rows[1].get(k, 0.0) for k in (n, f"{n}.squeeze", f"{n}.excite"))}
    if slower and len(slower) < len(fused):
        some = split_squeeze_excite(graph, slower)
        out.append((f"{mode}+per-block-se", compile_(mode, graph=some), some))
    return out


def _refine_norms(mode: str, graph, compile_) -> dict:
    """``{plan name: (Module, graph)}`` to time against the kept plan (compiled with ``--scope mode`` from
    ``graph``) where ``graph`` has norms that could run inside their convolutions, each graph planned per layer and
    in each uniform scope (one plan of those that are identical) -- the scope step's choice made again for it:

    - ``<scope>+norms-as-read`` (``passes_layer_norm.norms_applied_as_read``): one statistics kernel a norm, no
      apply kernel, no normalized tensor; each reader normalizes every value it reads, once a window tap (on the
      H200 the style-transfer net's and a GroupNorm ResNet's 3x3 convolutions took more time than the apply
      kernels saved: 5% and 9% slower whole runs);
    - ``<scope>+norms-in-convs`` (``norms_into_convs``): a norm of a small plane computed in its producing
      convolution's epilogue, no launch of its own; ``auto+norms-in-convs-as-read``: both, the second where the
      first does not apply.
    - ``auto+stats-in-producers`` (``norm_statistics_into_producers``): a GroupNorm(1)'s statistics, which its
      readers normalize with, computed in the epilogue of the convolution that writes its input (each work-group's
      partials merged by the last one to finish): no statistics launch; ``auto+norms-as-read+stats-in-producers``:
      the norms as read, each one's statistics (an InstanceNorm's, a GroupNorm's) in its producer -- no launch is
      left for the norm. Both are planned per layer and in buffer scope (``buffer+...``): on the H200 the
      per-layer plan gave gn32_resnet's producers texture configs without ``split_k`` (2.9 ms a run, 0.77 in
      buffer scope, 0.67 for the plan kept).

    A candidate that cannot be planned on this device (no work-group of it holds a plane) is left out. Empty when no
    norm qualifies."""
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers, norms_applied_as_read, norms_into_convs
    graphs = {}
    read = lambda g: sum(bool(n.attrs.get("in_group_norm") or n.attrs.get("in_layer_norm"))  # noqa: E731
                         for n in g.nodes)  # readers normalizing
    as_read = norms_applied_as_read(graph)  # (the pools' norms are read so by the pipeline: norms_read_by_pools)
    if read(as_read) > read(graph):
        graphs["norms-as-read"] = (as_read, ("auto", "texture", "buffer"))
    in_convs = norms_into_convs(graph)
    if in_convs is not graph:
        graphs["norms-in-convs"] = (in_convs, ("auto", "texture", "buffer"))
        both = norms_applied_as_read(in_convs)
        if read(both) > read(in_convs):
            graphs["norms-in-convs-as-read"] = (both, ("auto",))
    in_producers = norm_statistics_into_producers(graph)
    if in_producers is not graph:
        graphs["stats-in-producers"] = (in_producers, ("auto", "buffer"))
    no_launch = norm_statistics_into_producers(as_read) if "norms-as-read" in graphs else as_read
    if no_launch is not as_read:
        graphs["norms-as-read+stats-in-producers"] = (no_launch, ("auto", "buffer"))
    others = {}
    for name, (g, scopes) in graphs.items():
        for scope in scopes:
            try:
                other = compile_(scope, graph=g)
            except (TunerError, ValueError):  # a norm this device's work-groups cannot hold: the candidate goes
                continue
            if not any(_same_plan(other, m) for m, _ in others.values()):
                others[f"{scope}+{name}"] = other, g
    return others


def _refine_templates(mod: M.Module, mode: str, compile_, repeats: int) -> list:
    """``[(plan name, Module)]`` to time against ``mod`` (compiled with ``--scope mode``) where it runs a
    node's alternative template (Winograd): the same plan with every node's first template (the direct conv2d),
    named ``<mode>+direct``, and, where the per-node kernel times measured inside the two models (profiling
    events) favour neither everywhere, the plan taking each node's faster one, ``<mode>+per-node``. Empty when
    ``mod`` runs no alternative."""
    first = compile_(mode.split("+")[0], prefer="first")  # a name (auto+unfused-se) past its scope mode
    if _same_plan(first, mod):
        return []
    out = [(f"{mode}+direct", first)]
    rows = [{r["node"]: r for r in _random_inputs(m).profile(repeats)["rows"]} for m in (mod, first)]
    prefer = {node: min((r, rows[1][node]), key=lambda x: x["median_s"])["template"]
              for node, r in rows[0].items() if node in rows[1] and r["template"] != rows[1][node]["template"]}
    if len(set(prefer.values())) > 1:  # some nodes faster each way: a third plan
        out.append((f"{mode}+per-node", compile_(mode.split("+")[0], prefer=prefer)))
    return out


def _random_inputs(mod: M.Module) -> M.Module:
    """``mod`` with its inputs set to the same standard-normal draws for every plan compared."""
    rng = np.random.default_rng(0)
    mod.set_inputs([rng.standard_normal(mod.spec.entries[n].shape).astype(np.float32) for n in mod.spec.inputs])
    return mod


def _same_plan(a: M.Module, b: M.Module) -> bool:
    """Two modules that run the same kernels on the same storage."""
    sig = lambda m: [(n.name, m.node_storage(n), m.sources.get(n.source)) for n in m.spec.nodes]  # noqa: E731
    return sig(a) == sig(b)
