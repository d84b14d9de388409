"""The plan's types, the hand-off from planning to code generation: ``Tensor`` (an activation: its shape, its
kind, NCHW4c or row-packed or plain, and its storage scope), ``Step`` (one deployed kernel) and ``Plan`` (the
steps in order, the tensors and the parameters). They import nothing of the planner (``lower``) or of the
lowering rules (``rules``), which both build on them."""
from __future__ import annotations

from dataclasses import dataclass, field
from tuner.templates import get_template, templates


class _ModelKnobs:
    """``FIXED[op]``: the knobs a model pins for a template (``Template.model_knobs``) so that neighbouring
    kernels agree on the activation layout."""

    def __getitem__(self, op: str) -> dict:
        return dict(get_template(op).model_knobs)


FIXED = _ModelKnobs()
SCOPE_MODES = ("auto", "texture", "buffer")


@dataclass
class Tensor:
    name: str
    shape: tuple
    kind: str  # "nchw" (NCHW4c), "rows" (2-D packed by 4 along the last axis), "plain" (row-major, host side)
    scope: str = "buffer"  # texture | buffer
    dtype: str | None = None  # storage dtype; None: the plan's (``Plan.dtype``). A mixed plan
    # (``tuner.plan.precision``) keeps some tensors in float32 in a float16 plan

    @property
    def layout(self) -> str | None:
        if self.kind == "plain":
            return None
        base = "nchw4c" if self.kind == "nchw" else "row4"
        return base if self.scope == "texture" else f"{base}_buffer"

    @property
    def texture_layout(self) -> str | None:
        return {"nchw": "nchw4c", "rows": "row4"}.get(self.kind)


@dataclass
class Step:
    """One deployed kernel. ``inputs`` maps the kernel's parameter names to tensor or param names."""
    name: str
    op: str  # conv2d | depthwise_conv2d | dense | elementwise | pool | concat | relayout
    inputs: dict
    output: str
    attrs: dict = field(default_factory=dict)
    workload: object = None  # template steps
    scopes: dict | None = None  # template steps: input/weight/output
    config: object = None  # template steps, once chosen
    alternatives: list = field(default_factory=list)  # template steps: other templates' Steps for the same node
    # (same name, inputs but the weights, output), until ``choose_templates`` keeps the fastest
    side_outputs: dict = field(default_factory=dict)  # kernel parameter -> tensor it writes beside ``output``
    # (a depthwise convolution's row sums: ``Template.side_outputs``), in ``output``'s scope

    def candidates(self) -> list:
        """This step and its alternatives: the kernels that may run the node."""
        return [self, *self.alternatives]

    @property
    def tuned(self) -> bool:
        """A template step (tuned), not glue."""
        return self.op in templates()


@dataclass
class Plan:
    steps: list
    tensors: dict  # name -> Tensor (activations only)
    params: dict  # name -> logical float32 array
    inputs: list
    outputs: list
    dtype: str = "float32"
    views: list = field(default_factory=list)  # per concat and depth_to_space (``plan.views``): the kernels that
    # write it in place, or why it stays a kernel
    precision: dict = field(default_factory=dict)  # a mixed plan's nodes kept in float32: name -> why
    # (``tuner.plan.precision``)
    copies: list = field(default_factory=list)  # every data-movement kernel left after ``plan.views``, with why it
    # is a kernel and not a view (``plan.views.copy_notes``)
    fusions: tuple = ()  # what ``plan.lower.plan_storage`` was asked to fold (``FUSIONS``); ``choose_templates``
    # finishes ``io_in_place`` for the nodes whose template it picks
    fused: list = field(default_factory=list)  # data-movement kernels the lowering folded into a neighbour, each
    # with the kernel that reads or writes its tensor in place instead (``tuner.plan.io_views``)
    notes: list = field(default_factory=list)  # why a tensor's scope differs from what its layer wanted (``plan_storage``:
    # a scope boundary no valid config of the kernel serves on the device is not offered)

    def dtype_of(self, tensor: str) -> str:
        """The storage dtype of activation ``tensor``: its own, else the plan's."""
        return self.tensors[tensor].dtype or self.dtype

    def scope_counts(self) -> dict:
        out: dict = {}
        for t in self.tensors.values():
            if t.kind != "plain":
                out[t.scope] = out.get(t.scope, 0) + 1
        return out
