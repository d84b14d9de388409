"""Operator templates: conv2d, depthwise conv2d, dense, Winograd conv2d (winograd2, winograd4) and matmul (a
batched product of two activations: attention's Q@K^T and P@V).

Each template is one loop nest written with the IR builder over logical tensors (NCHW activations, OIHW
weights; matmul's 3-D operands as their NCHW storage views (b, c, 1, r)); the config's scopes and layouts are
buffer declarations, so one definition yields texture and buffer kernels. ``TEMPLATES[name]`` bundles what
the tuner needs:

    t = get_template("conv2d")
    wl = t.workload(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1)
    cfg = t.fallback(wl, device.info)          # good without tuning, from the device's capabilities
    exe = build(t.build(wl, cfg), device)
    inputs = t.random_inputs(wl, rng)
    y = exe(**inputs)[t.output]                # compare with t.reference(wl, inputs)

A template owns everything template-specific: its search space, cost-model ``features``, command-line
``workload_args``, the ``model_knobs`` a model pins, and ``lower``, the rule that turns a graph node of its
``graph_ops`` into its workload and kernel inputs. A template defined elsewhere, named
``"package.module:ATTRIBUTE"``, is tuned, logged, planned into models and compiled after
``register_template(t)`` with no edit to this package (tests/user_templates.py is one).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tuner.errors import TunerError


@dataclass(frozen=True)
class WorkloadArg:
    """One workload field as a command-line option ``--<name>`` (``tuner op / tune-op / space``): ``kind`` says
    how its text parses -- ``shape`` (comma-separated integers), ``ints`` (1 or ``lengths`` integers; one stays an
    int), ``int``, ``flag``, ``activation`` (a fused activation spec), ``dtype`` (the storage dtype)."""
    name: str
    kind: str
    metavar: str = ""
    help: str = ""
    required: bool = False
    lengths: tuple = (1, 2)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text):
        """The field's value from the option's text (argparse already parsed flags, activations, dtypes)."""
        if self.kind not in ("shape", "ints", "int"):
            return text
        try:
            values = tuple(int(x) for x in str(text).split(","))
        except ValueError:
            raise TunerError(f"{self.flag} must be comma-separated integers, e.g. 1,64,56,56; got {text!r}") from None
        if self.kind == "int" or (self.kind == "ints" and len(values) == 1):
            if len(values) != 1:
                raise TunerError(f"{self.flag} takes one integer; got {text!r}")
            return values[0]
        if self.kind == "ints" and len(values) not in self.lengths:
            counts = ", ".join(map(str, self.lengths[:-1])) + f" or {self.lengths[-1]}"
            raise TunerError(f"{self.flag} takes {counts} integers; got {text!r}")
        return values


# the fused epilogue and storage type: every template's workload has these fields
EPILOGUE_ARGS = (
    WorkloadArg("bias", "flag", help="fuse a bias add"),
    WorkloadArg("activation", "activation", "ACT", "fused activation: none, relu, relu6, hardswish, sigmoid, silu, "
                "leaky_relu(0.1), ... (default none)"),
    WorkloadArg("dtype", "dtype", help="storage dtype (accumulation is float32)"))
# a 2-D window's geometry: convolution-like templates share these fields
WINDOW_ARGS = (
    WorkloadArg("stride", "ints", "S[,S]"),
    WorkloadArg("padding", "ints", "P[,P[,P,P]]", "all, (h,w) or (top,left,bottom,right)", lengths=(1, 2, 4)),
    WorkloadArg("dilation", "ints", "D[,D]"))


@dataclass(frozen=True)
class Template:
    name: str
    workload: type  # frozen dataclass: the canonical key (``.key()``, ``.flops``, ``.out_shape``)
    config: type  # frozen dataclass: one value per knob of the search space
    build: Callable  # (workload, config) -> Kernel | Program
    reference: Callable  # (workload, inputs: dict) -> float64 ndarray of the output
    random_inputs: Callable  # (workload, rng) -> {param name: array} (random, never zeros)
    fallback: Callable  # (workload, DeviceInfo) -> config
    space_vars: Callable  # (workload) -> {name: value} the search space's constraints may use
    variables: dict  # name -> meaning, of what space_vars returns (documents the constraints' vocabulary)
    output: str = "Y"
    space_file: str | None = None  # search-space name or path when not the template's own name
    features: Callable | None = None  # (space_vars, knob values) -> {name: number}: what a config implies, for
    # the cost model (work per work-item, work-group size, bytes read per multiply-add, registers, ...)
    describe: Callable | None = None  # (workload) -> short text for labels where the generic label of the
    # workload's fields (workload_label: "64->64 3x3 p1 @56x56 +relu") does not read well (matmul)
    model_knobs: dict = field(default_factory=dict)  # knobs a model pins so that neighbouring kernels agree
    workload_args: tuple = ()  # WorkloadArg per workload field the command line sets
    graph_ops: tuple = ()  # the graph operators (``Node.op``: "conv2d", "dense") whose nodes ``lower`` may take
    scope_inputs: dict = field(default_factory=lambda: {"input": "X"})  # scope role -> the kernel input whose
    # activation's scope the role takes in a model (plan.plan_storage); a role not named (conv2d's weights) is
    # the template's to choose. matmul: {"input": "A", "weight": "Bm"}, both activations
    lower: Callable | None = None  # (LowerCtx, node, ins) -> (workload, {kernel param: tensor or param name},
    # {new param name: array}), or None when the template does not take this node (another one is asked);
    # a ValueError names what is wrong with a node it takes (the planner adds the node's name)

    def label(self, workload) -> str:
        """The workload in a few words (``64->128 3x3 s2 p1 @56x56 +bias+relu``): the template's ``describe``,
        else the generic label of its fields (``workload_label``). The one label of a workload, in task names,
        compile summaries, ``tuner logs`` and reports."""
        if self.describe is not None:
            return self.describe(workload)
        return workload_label(self.name, workload.key()).split(" ", 1)[-1]

    def key_label(self, key: dict) -> str:
        """``label`` of a logged workload key; a key this template cannot rebuild gets the generic label."""
        try:
            return self.label(self.workload(**{k: v for k, v in key.items() if k != "op"}))
        except (TypeError, ValueError):
            return workload_label(self.name, key).split(" ", 1)[-1]

    def space(self, workload=None, device=None, **fixed):
        """The declarative search space (``search_space/<name>.toml``); given a workload and a device
        (DeviceInfo), the bound space of its valid configs, with the storage dtype fixed to the workload's
        and any other knobs given in ``fixed`` (e.g. ``input_scope="texture"``)."""
        from tuner.search_space import load_space
        space = load_space(self.space_file or self.name, {f.name for f in dataclasses.fields(self.config)}, set(self.variables))
        if workload is None:
            return space
        info = getattr(device, "info", device)
        return space.bind(self.space_vars(workload), info, {"dtype": workload.dtype, **fixed})

    def fallback_with(self, workload, device, **fixed):
        """The fallback config for ``device`` with ``fixed`` knobs applied (scopes, a model's pinned layout);
        if that breaks a constraint of the space, a valid config drawn with seed 0 instead."""
        cfg = dataclasses.replace(self.fallback(workload, getattr(device, "info", device)), **fixed)
        space = self.space(workload, device, **fixed)
        if not space.violations(self.config_values(workload, cfg)):
            return cfg
        return self.make_config(space.sample(np.random.default_rng(0)))

    def make_config(self, values: dict):
        """A config from a search-space assignment (the task knob ``dtype`` belongs to the workload)."""
        return self.config(**{k: v for k, v in values.items() if k != "dtype"})

    def config_values(self, workload, config) -> dict:
        return {"dtype": workload.dtype, **dataclasses.asdict(config)}

    def tolerance(self, workload) -> float:
        """Max relative error accepted against the reference: float32 1e-4, float16 storage 1e-2."""
        return 1e-2 if workload.dtype == "float16" else 1e-4

    def check(self, workload, outputs: dict, inputs: dict) -> float:
        """Max error relative to the reference's largest magnitude."""
        ref = self.reference(workload, inputs)
        got = np.asarray(outputs[self.output], dtype=np.float64)
        if got.shape != ref.shape:
            raise TunerError(f"{self.name}: output shape {got.shape}, reference {ref.shape}")
        return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def shape_text(shape) -> str:
    return "x".join(map(str, shape))


def epilogue_text(wl) -> str:
    """`` +bias +relu +res f16``: what a workload fuses, and its storage type when not float32."""
    parts = [" +bias" if wl.bias else "", f" +{wl.activation}" if wl.activation != "none" else "",
             " +res" if getattr(wl, "residual", False) else "", " f16" if wl.dtype == "float16" else ""]
    return "".join(parts)



# ---- the one workload label: tasks, compile summaries, logs, reports ----

def _dims(xs) -> str:
    return "x".join(str(x) for x in xs)


def _pair(p, default) -> str | None:
    """``s2`` for (2, 2), ``s(2,1)`` for (2, 1), None for the default."""
    p = tuple(p) if isinstance(p, (list, tuple)) else (p, p)
    if all(v == default for v in p):
        return None
    return str(p[0]) if len(set(p)) == 1 else "(" + ",".join(map(str, p)) + ")"


def _padding(p) -> str | None:
    p = tuple(p) if isinstance(p, (list, tuple)) else (p,) * 4
    if not any(p):
        return None
    if len(set(p)) == 1:
        return str(p[0])
    if len(p) == 4 and p[:2] == p[2:]:
        return f"({p[0]},{p[1]})"  # symmetric: height, width
    return "(" + ",".join(map(str, p)) + ")"


_KNOWN = {"op", "data", "kernel", "weight", "stride", "padding", "dilation", "groups", "dtype", "bias",
          "activation", "residual"}


def workload_label(template: str, wl: dict) -> str:
    """A short readable workload name that still tells workloads apart, defaults left out:
    ``conv2d 64->128 3x3 s2 p1 @56x56``, ``depthwise_conv2d 32 3x3 p1 @112x112 +bias+relu6``,
    ``dense 512->1000``. Fields this function does not know are appended as ``name=value``."""
    parts = [template]
    data = wl.get("data")
    if "kernel" in wl and data and len(data) == 4 and len(wl["kernel"]) == 4:
        n, c, h, w = data
        o, _, r, s = wl["kernel"]
        parts.append(str(c) if template.startswith("depthwise") and o == c else f"{c}->{o}")
        parts.append(f"{r}x{s}")
        for prefix, key, default in (("s", "stride", 1), ("d", "dilation", 1)):
            v = _pair(wl.get(key, default), default)
            if v:
                parts.append(prefix + v)
        pad = _padding(wl.get("padding", 0))
        if pad:
            parts.append("p" + pad)
        if wl.get("groups", 1) != 1:
            parts.append(f"g{wl['groups']}")
        parts.append(f"@{h}x{w}")
    elif "weight" in wl and data and len(data) == 2:
        n, k = data
        parts.append(f"{k}->{wl['weight'][0]}")
    else:
        n = None
        if data is not None:
            parts.append(_dims(data))
    if n not in (None, 1):
        parts.append(f"n{n}")
    if wl.get("dtype", "float32") != "float32":
        parts.append(str(wl["dtype"]).replace("float", "fp"))
    epilogue = [e for e, on in (("bias", wl.get("bias")), ("res", wl.get("residual"))) if on]
    if wl.get("activation", "none") not in ("none", None):
        epilogue.append(str(wl["activation"]))
    if epilogue:
        parts.append("+" + "+".join(epilogue))
    parts += [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in wl.items() if k not in _KNOWN]
    return " ".join(parts)


def node_epilogue(ctx, node) -> tuple:
    """What a graph node fuses, for a template's ``lower``: ``(fields, inputs)`` -- the workload fields every
    template has (``dtype`` of the plan, ``bias``, ``activation``) and the kernel inputs they bring (``B``: the
    bias param; ``Res``: the residual's tensor in the plan, when the node adds one: ``node.attrs["residual"]``)."""
    g, a = ctx.graph, node.attrs
    bias = next((t for t in node.inputs[2:] if t in g.params), None)
    fields = dict(dtype=ctx.dtype, bias=bias is not None, activation=a.get("activation", "none"))
    inputs = {}
    if bias is not None:
        inputs["B"] = bias
    if a.get("residual") is not None:
        inputs["Res"] = ctx.packed(a["residual"])
    return fields, inputs


def _registry() -> dict:
    from . import conv2d_nchw4c, conv2d_winograd, dense, depthwise_conv2d_nchw4c, matmul
    return {t.name: t for t in (conv2d_nchw4c.TEMPLATE, depthwise_conv2d_nchw4c.TEMPLATE, dense.TEMPLATE,
                                conv2d_winograd.TEMPLATE2, conv2d_winograd.TEMPLATE4, matmul.TEMPLATE)}


TEMPLATES: dict = {}
_USER: dict = {}  # name -> Template registered with ``register_template``, in registration order


def get_template(name: str) -> Template:
    """A registered template by name, or ``"package.module:ATTRIBUTE"`` for one defined elsewhere (worker
    processes find user templates this way)."""
    if name in _USER:
        return _USER[name]
    if ":" in name:
        import importlib
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise TunerError(f"cannot load template {name!r}: {e}") from None
    if name not in templates():
        raise TunerError(f"unknown template {name!r}; templates: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


def templates() -> dict:
    """The registered templates: name -> Template (the built-in ones, then those of ``register_template``)."""
    if not TEMPLATES:
        TEMPLATES.update(_registry())
        TEMPLATES.update(_USER)
    return TEMPLATES


def register_template(template: Template) -> Template:
    """Make a template defined outside this package part of every model: its steps are tuned
    (``Step.tuned``), ``extract_tasks`` returns them, and ``lower_graph`` asks its ``lower`` for every node
    of its ``graph_ops`` before the built-in templates (the latest registered first). Its name must be
    ``"package.module:ATTRIBUTE"`` naming the template itself, because measuring processes and workers, which
    start fresh, look it up by name with ``get_template``. Registering a name again replaces the template.
    Returns the template (usable as ``TEMPLATE = register_template(Template(...))``)."""
    if not isinstance(template, Template):
        raise TunerError(f"register_template takes a Template, not {type(template).__name__}")
    name = template.name
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise TunerError(f"template name {name!r}: a registered template is named \"package.module:ATTRIBUTE\" "
                         f"(where it is defined), so that measuring processes can import it")
    if (template.lower is None) != (not template.graph_ops):
        raise TunerError(f"template {name!r}: graph_ops {tuple(template.graph_ops)} and lower go together")
    old = _USER.pop(name, None)  # so that get_template imports the module rather than answering from _USER
    if get_template(name) != template:  # imports the module: a process that starts fresh finds the same
        if old is not None:
            _USER[name] = old  # a refused re-registration leaves the registered template as it was
        raise TunerError(f"template {name!r}: {attr} in {module} is not the template being registered; name it "
                         f"after the attribute that holds it")
    _USER[name] = template
    templates()[name] = template
    return template


def unregister_template(template) -> None:
    """Undo ``register_template`` (a Template or its name); a name never registered is ignored."""
    name = template if isinstance(template, str) else template.name
    if _USER.pop(name, None) is not None:
        TEMPLATES.pop(name, None)


def templates_for(graph_op: str) -> list:
    """The templates whose ``lower`` may take a graph node of ``graph_op``, in the order they are asked:
    registered ones (latest first), then the built-in ones."""
    user = [t for t in reversed(_USER.values()) if graph_op in t.graph_ops]
    return user + [t for n, t in templates().items() if n not in _USER and graph_op in t.graph_ops]
