"""``compile_model``: ONNX -> graph passes -> steps with planned scopes -> configs (tuned log or fallback) ->
kernels lowered and compiled -> memory planned -> a ``Module`` that runs.

    module = tuner.compile_model("mobilenet_v2.onnx", log="logs/dev.jsonl", scope="auto")
    y, = module.run([x])
    module.save("build/mobilenet_v2")
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from tuner.errors import TunerError

from . import module as M
from .plan import FIXED, Plan, Step, extract_tasks, lower_graph, plan_storage


def load_graph(model, input_shapes: dict | None = None):
    """An ONNX ModelProto or path -> the optimized graph (BatchNorm folded, epilogues fused)."""
    from .frontend import from_onnx
    from .passes import optimize
    return optimize(from_onnx(model, input_shapes))


def as_history(log):
    """None, an ApplyHistoryBest, or what ``apply_history_best`` takes (paths, globs, records)."""
    from tuner.logs import apply_history_best
    return apply_history_best(log) if log is not None and not hasattr(log, "query") else log


def plan_model(model, device=None, scope: str = "auto", log=None, dtype: str = "float32",
               input_shapes: dict | None = None) -> Plan:
    """The planned steps of a model on ``device`` (a Device, DeviceInfo or spec); ``log`` as ``as_history``."""
    from tuner.runtime.device import DeviceInfo, choose_device
    info = getattr(device, "info", device)
    info = info if isinstance(info, DeviceInfo) else choose_device(info)
    return plan_storage(lower_graph(load_graph(model, input_shapes), dtype), info, scope, as_history(log))


def model_tasks(model, device=None, scope: str = "auto", log=None, dtype: str = "float32",
                input_shapes: dict | None = None) -> list:
    return extract_tasks(plan_model(model, device, scope, log, dtype, input_shapes))


def choose_configs(plan: Plan, info, history=None) -> dict:
    """``step name -> (config, tuned)``: the log's best for the exact deployed task, else a valid fallback
    (with one warning per workload from apply_history_best)."""
    from tuner.templates import get_template
    out = {}
    for s in plan.steps:
        if not s.tuned:
            continue
        t = get_template(s.op)
        rec = history.query(t.name, s.workload, info.fingerprint, s.scopes, FIXED[s.op]) if history else None
        if rec is not None:
            out[s.name] = (t.config(**rec.config), True)
        elif history is not None:  # the valid fallback, with apply_history_best's one warning per workload
            out[s.name] = (history.pick(t, s.workload, info, s.scopes, FIXED[s.op]), False)
        else:
            out[s.name] = (t.fallback_with(s.workload, info, **{f"{k}_scope": v for k, v in s.scopes.items()},
                                           **FIXED[s.op]), False)
    return out


def _glue_kernel(s: Step, plan: Plan, max_wg: int):
    from . import kernels as K
    scope = lambda name: plan.tensors[name].scope  # noqa: E731
    out = plan.tensors[s.output]
    acts = [x for k, x in s.inputs.items() if k != "B"]
    if s.op == "relayout":
        src = plan.tensors[s.inputs["X"]]
        return K.relayout_kernel(src.shape, out.shape, plan.dtype, "buffer" if src.kind == "plain" else src.scope,
                                 src.layout, "buffer" if out.kind == "plain" else out.scope, out.layout, max_wg)
    if s.op == "elementwise":
        a = s.attrs
        in_scopes = [scope(x) for x in acts] + ([scope(acts[0])] if "B" in s.inputs else [])  # B beside X
        return K.elementwise_kernel(out.shape, a["op"], plan.dtype, in_scopes, out.scope,
                                    activation=a["activation"], clip=a.get("clip", (0.0, 6.0)), max_work_group=max_wg)
    if s.op == "pool":
        a = s.attrs
        return K.pool_kernel(plan.tensors[acts[0]].shape, a["kind"], a["kernel"], a["stride"], a["padding"],
                             a["count_include_pad"], plan.dtype, scope(acts[0]), out.scope, max_wg)
    if s.op == "concat":
        return K.concat_kernel([plan.tensors[x].shape for x in acts], plan.dtype, [scope(x) for x in acts],
                               out.scope, max_work_group=max_wg)
    raise TunerError(f"step {s.name!r}: no kernel for {s.op!r}")


def compile_model(model, log=None, device=None, scope: str = "auto", dtype: str = "float32",
                  input_shapes: dict | None = None, progress: bool = False) -> M.Module:
    """Compile an ONNX model (path or ModelProto) for ``device`` with the best configs of ``log`` (path,
    glob, list, or an ApplyHistoryBest); ``scope``: auto (per layer, from the log), texture or buffer."""
    from tuner.runtime.device import Device, open_device
    from tuner.runtime.launch import build, pack, physical_shape
    from tuner.templates import get_template

    from .memory import Entry as MemEntry
    from .memory import check_plan, plan_memory
    dev = device if isinstance(device, Device) else open_device(device)
    info = dev.info
    history = as_history(log)
    plan = plan_model(model, info, scope, history, dtype, input_shapes)
    configs = choose_configs(plan, info, history)

    nodes, sources, params, blobs, workspaces = [], {}, {}, [], []
    entries: dict = {}
    uses: dict = {}  # tensor -> [first step, last step]
    steps = plan.steps
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(steps), desc="compile", unit="kernel", dynamic_ncols=True)
    for i, s in enumerate(steps):
        if s.tuned:
            t = get_template(s.op)
            cfg, tuned = configs[s.name]
            kernel = t.build(s.workload, cfg)
        else:
            cfg, tuned = None, False
            kernel = _glue_kernel(s, plan, info.max_work_group_size)
        exe = build(kernel, dev)
        prog = exe.program
        binding = {**s.inputs, "Y": s.output}
        refs = {}
        for buf in prog.params:
            name = binding.get(buf.name)
            if name is None:
                raise TunerError(f"step {s.name!r}: kernel parameter {buf.name!r} is not bound")
            phys = tuple(physical_shape(buf))
            if name in plan.params:  # a weight: packed once, here, by the layout the config chose
                key = f"{s.name}.{buf.name}"
                params[key] = pack(buf, np.asarray(plan.params[name], np.float32)).astype(buf.dtype.numpy)
                blobs.append(M.Blob(key, buf.scope, phys, np.dtype(buf.dtype.numpy).name))
                refs[buf.name] = f"p:{key}"
                continue
            t_ = plan.tensors[name]
            e = M.Entry(name, tuple(t_.shape), phys, buf.scope, np.dtype(buf.dtype.numpy).name, t_.layout, -1)
            if name in entries and (entries[name].physical_shape, entries[name].storage_scope) != (phys, buf.scope):
                raise TunerError(f"tensor {name!r}: step {s.name!r} sees it as {buf.scope} {phys}, an earlier step "
                                 f"as {entries[name].storage_scope} {entries[name].physical_shape}")
            entries.setdefault(name, e)
            u = uses.setdefault(name, [i, i])
            u[1] = i
            refs[buf.name] = f"t:{name}"
        for w in prog.workspaces:
            key = f"{s.name}.{w.name}"
            workspaces.append(M.Blob(key, w.scope, tuple(physical_shape(w)), np.dtype(w.dtype.numpy).name))
            refs[w.name] = f"w:{key}"
        calls = []
        for k in prog.kernels:
            g, l = k.launch()
            calls.append(M.Call(k.name, tuple(g), tuple(l), [refs[b.name] for b in k.params]))
        src = f"{i:03d}_{s.name.replace('/', '_').replace(':', '_')}.cl"
        sources[src] = exe.source
        nodes.append(M.Node(s.name, s.op, src, calls, s.workload.flops if s.tuned else 0,
                            s.op if s.tuned else None, s.workload.key() if s.tuned else None, s.scopes,
                            dataclasses.asdict(cfg) if cfg is not None else None, tuned))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    n = len(steps)
    for x in plan.inputs:
        uses[x][0] = 0
    for y in plan.outputs:
        uses[y][1] = n  # outputs are read after the last step: never reused
    mem_entries = [MemEntry(name, e.storage_scope, e.dtype, e.physical_shape, *uses[name])
                   for name, e in entries.items()]
    mp = plan_memory(mem_entries)
    check_plan(mem_entries, mp)
    for name, e in entries.items():
        e.storage_id = mp.storage_id[name]
    pools = [M.Pool(p.id, p.scope, p.dtype, tuple(p.shape)) for p in mp.pools]
    spec = M.ModuleSpec({**info.fingerprint_fields(), "fingerprint": info.fingerprint, "name": info.name},
                        dtype, list(plan.inputs), list(plan.outputs), nodes, entries, pools, blobs, workspaces,
                        mp.totals())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compiled for this very device
        return M.Module(spec, sources, params, dev)
