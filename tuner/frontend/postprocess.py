"""Where a detector's post-processing starts: the compiled graph stops before it.

NonMaxSuppression, TopK and the like have outputs whose shape depends on the data, or integer indices; box
decoding after them gathers by those indices. None of it runs as RGBA texture kernels, and a phone app runs it on
the CPU anyway (TFLite's and MNN's detection examples do the same). ``find_cut`` takes every node of
``POSTPROCESS_OPS`` and everything that reads what they make; the compiled model returns the activations those
nodes read (the caller's post-processing inputs) instead of the model outputs they make.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# ops whose outputs are data-dependent in shape or integer indices: the post-processing of a detector or segmenter
POSTPROCESS_OPS = ("NonMaxSuppression", "TopK", "NonZero", "ArgMax", "ArgMin", "Unique", "Compress", "RoiAlign")
# what a refused (ambiguous) cut tells the user to do
EXPORT_HINT = ("export the model without its post-processing (NonMaxSuppression, TopK, box decoding), ending at the "
               "head's boxes and scores")


@dataclass
class Cut:
    """``nodes``: indices of the ONNX nodes left to the caller; ``reads``: the tensors they read from the rest of the
    model (in order of first use); ``made``: the model outputs they produce; ``first``: the (name, op) of each
    post-processing op the cut starts at."""
    nodes: set = field(default_factory=set)
    reads: list = field(default_factory=list)
    made: list = field(default_factory=list)
    first: list = field(default_factory=list)
    feeders: set = field(default_factory=set)  # nodes outside whose outputs only the post-processing reads

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def starts(self) -> str:
        """The post-processing ops the cut starts at, as messages name them: ``NonMaxSuppression 'nms', ...``."""
        return ", ".join(f"{op} {name!r}" for name, op in self.first)

    def describe(self, outputs: list, origins: list) -> str:
        """What the compile says: where it cut, why, the outputs it added and, per tensor the post-processing
        reads, where the caller finds it (``origins``: (tensor, where))."""
        starts = self.starts()
        made = f" to make the model's {', '.join(repr(t) for t in self.made)}" if self.made else ""
        added = f"; compiled outputs added: {', '.join(repr(t) for t in outputs)}" if outputs else ""
        reads = "; ".join(f"{t!r} ({where})" for t, where in origins)
        return (f"compiled up to the post-processing: {len(self.nodes)} node(s) from {starts} on stay outside (their "
                f"outputs are data-dependent in shape or integer indices){added}; the caller post-processes{made} "
                f"from {reads}")


def find_cut(graph) -> Cut:
    """The post-processing part of ``graph`` (an ``onnx.GraphProto``): ``POSTPROCESS_OPS`` nodes and every node
    that reads, directly or not, one of their outputs."""
    cut, made = Cut(), set()
    for i, node in enumerate(graph.node):
        seed = node.op_type in POSTPROCESS_OPS and node.domain in ("", "ai.onnx")
        if seed or any(t in made for t in node.input if t):
            cut.nodes.add(i)
            made.update(t for t in node.output if t)
            if seed:
                cut.first.append((node.name or f"{node.op_type}_{i}", node.op_type))
    if not cut:
        return cut
    for i in sorted(cut.nodes):
        for t in graph.node[i].input:
            if t and t not in made and t not in cut.reads:
                cut.reads.append(t)
    cut.made = [o.name for o in graph.output if o.name in made]
    readers: dict = {}
    for i, node in enumerate(graph.node):
        for t in node.input:
            readers.setdefault(t, set()).add(i)
    outputs = {o.name for o in graph.output}
    for i, node in enumerate(graph.node):
        outs = [t for t in node.output if t]
        if i not in cut.nodes and outs and not outputs.intersection(outs) and \
                all(readers.get(t) and readers[t] <= cut.nodes for t in outs):
            cut.feeders.add(i)
    return cut
