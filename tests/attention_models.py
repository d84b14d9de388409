"""Small ONNX attention blocks built with onnx.helper (random weights), as timm exports them: NCHW -> tokens,
LayerNorm, a qkv projection, the 5-D head reshape / transpose / split, scaled ``Q @ K^T``, softmax, ``@ V``, back
to tokens, a projection, a residual and back to NCHW."""
import numpy as np, onnx
from onnx import helper as h, TensorProto as TP, numpy_helper as nh

def attention_model(n=1, c=16, hw=(4, 6), heads=2, seed=0, path=None, scale_after=False, bias=False, pos=False):
    """The block on an (n, c, *hw) input with ``heads`` heads of c / heads features; saved to ``path`` if given.
    ``scale_after``: the scores scaled after ``Q @ K^T`` (EfficientFormer), not q before; ``bias``: a constant
    attention bias (heads, T, T) added to the scores (LeViT, EfficientFormer); ``pos``: a position embedding
    (1, T, C) added to the tokens (ViTs)."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W; d = c // heads
    inits, nodes = [], []
    def init(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name)); return name
    def node(op, ins, outs, **kw):
        nodes.append(h.make_node(op, ins, outs, name=outs[0], **kw)); return outs[0]
    x = "input"
    t = node("Reshape", [x, init("s1", np.array([n, c, T], np.int64))], ["flat"])
    t = node("Transpose", [t], ["tok"], perm=[0, 2, 1])
    if pos:
        t = node("Add", [t, init("pos", rng.standard_normal((1, T, c)).astype(np.float32))], ["tok_pos"])
    ln = node("LayerNormalization", [t, init("g", rng.standard_normal(c).astype(np.float32)),
                                     init("b", rng.standard_normal(c).astype(np.float32))], ["ln"], axis=-1)
    qkv = node("MatMul", [ln, init("wqkv", rng.standard_normal((c, 3 * c)).astype(np.float32) / 4)], ["qkv"])
    r5 = node("Reshape", [qkv, init("s5", np.array([n, T, 3, heads, d], np.int64))], ["r5"])
    tr = node("Transpose", [r5], ["tr5"], perm=[2, 0, 3, 1, 4])
    nodes.append(h.make_node("Split", [tr, init("sp", np.array([1, 1, 1], np.int64))], ["q5", "k5", "v5"], axis=0, name="split"))
    q = node("Reshape", ["q5", init("s4", np.array([n, heads, T, d], np.int64))], ["q"])
    k = node("Reshape", ["k5", "s4"], ["k"])
    v = node("Reshape", ["v5", "s4"], ["v"])
    kt = node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2])
    if scale_after:
        s = node("MatMul", [q, kt], ["raw_scores"])
        s = node("Mul", [s, init("scale", np.array(d ** -0.5, np.float32))], ["scores"])
    else:
        qs = node("Mul", [q, init("scale", np.array(d ** -0.5, np.float32))], ["qs"])
        s = node("MatMul", [qs, kt], ["scores"])
    if bias:
        s = node("Add", [s, init("attn_bias", rng.standard_normal((heads, T, T)).astype(np.float32))], ["biased"])
    p = node("Softmax", [s], ["probs"], axis=-1)
    o = node("MatMul", [p, v], ["attn"])
    o = node("Transpose", [o], ["attn_t"], perm=[0, 2, 1, 3])
    o = node("Reshape", [o, init("s3", np.array([n, T, c], np.int64))], ["attn_tok"])
    o = node("MatMul", [o, init("wp", rng.standard_normal((c, c)).astype(np.float32) / 4)], ["proj"])
    o = node("Add", [o, t], ["res"])
    o = node("Transpose", [o], ["back"], perm=[0, 2, 1])
    o = node("Reshape", [o, init("s6", np.array([n, c, H, W], np.int64))], ["output"])
    g = h.make_graph(nodes, "attn", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, c, H, W])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    onnx.checker.check_model(m)
    if path: onnx.save(m, path)
    return m


def class_token_model(n=1, c=12, hw=(3, 4), seed=0, path=None):
    """A ViT's ends: NCHW patches -> tokens, a class token (1, 1, C) concatenated in front (``Expand`` of a
    parameter), a position embedding, LayerNorm, and the class token's features picked out (``Gather`` 0):
    output (n, c)."""
    rng = np.random.default_rng(seed)
    H, W = hw
    T = H * W
    inits, nodes = [], []

    def init(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, outs, **kw):
        nodes.append(h.make_node(op, ins, outs, name=outs[0], **kw))
        return outs[0]
    t = node("Reshape", ["input", init("s1", np.array([n, c, T], np.int64))], ["flat"])
    t = node("Transpose", [t], ["tok"], perm=[0, 2, 1])
    cls = node("Expand", [init("cls", rng.standard_normal((1, 1, c)).astype(np.float32)),
                          init("es", np.array([n, 1, c], np.int64))], ["cls_n"])
    t = node("Concat", [cls, t], ["with_cls"], axis=1)
    t = node("Add", [t, init("pos", rng.standard_normal((1, T + 1, c)).astype(np.float32))], ["pos_added"])
    t = node("LayerNormalization", [t, init("g", rng.standard_normal(c).astype(np.float32)),
                                    init("b", rng.standard_normal(c).astype(np.float32))], ["ln"], axis=-1)
    node("Gather", [t, init("zero", np.array(0, np.int64))], ["output"], axis=1)
    g = h.make_graph(nodes, "cls", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, c])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    if path:
        onnx.save(m, path)
    return m
