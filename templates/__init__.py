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

from tuner.errors import TunerError
# the package's public names (``from tuner.templates import Template, register_template``); they live in common.py,
# which the templates import, so that the registry below imports the templates and nothing imports it back
from tuner.templates.common import (EPILOGUE_ARGS, WINDOW_ARGS, Template, WorkloadArg,  # noqa: F401
                                    epilogue_text, node_epilogue, shape_text, workload_label)


def _registry() -> dict:
    from . import (channel_reduce, conv2d_nchw4c, conv2d_winograd, dense, depthwise_conv2d_nchw4c, group_norm, matmul,
                   se_gate, spatial_reduce)
    return {t.name: t for t in (conv2d_nchw4c.TEMPLATE, depthwise_conv2d_nchw4c.TEMPLATE, dense.TEMPLATE,
                                conv2d_winograd.TEMPLATE2, conv2d_winograd.TEMPLATE4, matmul.TEMPLATE,
                                spatial_reduce.TEMPLATE, group_norm.TEMPLATE, channel_reduce.LAYER_NORM,
                                channel_reduce.SOFTMAX, se_gate.TEMPLATE)}


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
