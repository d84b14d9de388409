"""Small ONNX attention blocks built with onnx.helper (random weights), as timm exports them: NCHW -> tokens,
LayerNorm, a qkv projection, the 5-D head reshape / transpose / split, scaled ``Q @ K^T``, softmax, ``@ V``, back
to tokens, a projection, a residual and back to NCHW."""
import numpy as np, onnx
from onnx import helper as h, TensorProto as TP, numpy_helper as nh


def graph_builder():
    """``(inits, nodes, init, node)``: the lists an ONNX graph is built into, ``init(name, array)`` adding an
    initializer and ``node(op, inputs, outputs, **attrs)`` a node named after its first output, each returning the
    name it made."""
    inits, nodes = [], []

    def init(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, outs, **kw):
        nodes.append(h.make_node(op, ins, outs, name=outs[0], **kw))
        return outs[0]
    return inits, nodes, init, node

def attention_model(n=1, c=16, hw=(4, 6), heads=2, seed=0, path=None, scale_after=False, bias=False, pos=False):
    """The block on an (n, c, *hw) input with ``heads`` heads of c / heads features; saved to ``path`` if given.
    ``scale_after``: the scores scaled after ``Q @ K^T`` (EfficientFormer), not q before; ``bias``: a constant
    attention bias (heads, T, T) added to the scores (LeViT, EfficientFormer); ``pos``: a position embedding
    (1, T, C) added to the tokens (ViTs)."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W; d = c // heads
    inits, nodes, init, node = graph_builder()
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
    inits, nodes, init, node = graph_builder()
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


def cascaded_attention_model(n=2, heads=2, kd=4, hw=(3, 4), seed=0, path=None):
    """EfficientViT-M's cascaded group attention as timm exports it, small: the input's channel chunks feed the
    heads in turn (head i reads its chunk plus head i-1's output); per head a 1x1 qkv convolution, an identity
    ``view(B, -1, H, W)``, the split into q, k (``kd`` channels each) and v (the chunk's width), a depthwise 3x3 on
    q, ``q.flatten(2) * scale`` (a (1, 1, T) constant), ``q^T @ k`` plus an attention bias (1, T, T), softmax,
    ``v @ attn^T`` viewed back as NCHW; the heads' outputs concatenated, ReLU and a 1x1 projection. With ``kd`` a
    multiple of 4, q, k and v start RGBA pixels of the qkv output (the matmuls read them in place)."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W; d = 8; c = heads * d
    inits, nodes, init, node = graph_builder()
    def conv(x, cin, cout, k, name, groups=1):
        w = init(f"{name}_w", (rng.standard_normal((cout, cin // groups, k, k)) / np.sqrt(cin * k * k / groups))
                 .astype(np.float32))
        b = init(f"{name}_b", rng.standard_normal(cout).astype(np.float32) * 0.1)
        return node("Conv", [x, w, b], [name], pads=[k // 2] * 4, group=groups)
    chunks = [f"chunk{i}" for i in range(heads)]
    nodes.append(h.make_node("Split", ["input", init("chunks", np.full(heads, d, np.int64))], chunks, axis=1,
                             name="chunks"))
    outs, feat = [], chunks[0]
    for i in range(heads):
        if i:
            feat = node("Add", [outs[-1], chunks[i]], [f"feat{i}"])
        qkv = conv(feat, d, 2 * kd + d, 1, f"qkv{i}")
        qkv = node("Reshape", [qkv, init(f"same{i}", np.array([n, -1, H, W], np.int64))], [f"view{i}"])
        nodes.append(h.make_node("Split", [qkv, init(f"qkv_split{i}", np.array([kd, kd, d], np.int64))],
                                 [f"q{i}", f"k{i}", f"v{i}"], axis=1, name=f"split{i}"))
        q = conv(f"q{i}", kd, kd, 3, f"dw{i}", groups=kd)
        flat = lambda t, ch: node("Reshape", [t, init(f"{t}_s", np.array([n, ch, T], np.int64))], [f"{t}_flat"])  # noqa: E731
        q, k, v = flat(q, kd), flat(f"k{i}", kd), flat(f"v{i}", d)
        q = node("Mul", [q, init(f"scale{i}", np.full((1, 1, T), kd ** -0.5, np.float32))], [f"qs{i}"])
        s = node("MatMul", [node("Transpose", [q], [f"qt{i}"], perm=[0, 2, 1]), k], [f"s{i}"])
        s = node("Add", [s, init(f"ab{i}", rng.standard_normal((1, T, T)).astype(np.float32))], [f"sb{i}"])
        p = node("Softmax", [s], [f"p{i}"], axis=-1)
        o = node("MatMul", [v, node("Transpose", [p], [f"pt{i}"], perm=[0, 2, 1])], [f"o{i}"])
        outs.append(node("Reshape", [o, init(f"back{i}", np.array([n, d, H, W], np.int64))], [f"head{i}"]))
    x = node("Relu", [node("Concat", outs, ["cat"], axis=1)], ["cat_relu"])
    conv(x, c, c, 1, "output")
    g = h.make_graph(nodes, "cascaded", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, c, H, W])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    onnx.checker.check_model(m)
    if path: onnx.save(m, path)
    return m


def matmul_epilogue_model(n=2, c=8, hw=(2, 3), seed=0, path=None):
    """Products of two token activations and what follows them: ``tok @ tok^T`` (T x T), a per-column bias,
    ReLU and an add of a second product (``passes.fuse_epilogues``: the matmul's bias, activation and residual);
    the scores scaled by a scalar after the product (its alpha); back to NCHW (c = T channels)."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W
    inits, nodes, init, node = graph_builder()
    t = node("Transpose", [node("Reshape", ["input", init("s1", np.array([n, c, T], np.int64))], ["flat"])],
             ["tok"], perm=[0, 2, 1])
    u = node("MatMul", [t, init("w", rng.standard_normal((c, c)).astype(np.float32) / 3)], ["u"])
    s = node("MatMul", [t, node("Transpose", [t], ["tok_t"], perm=[0, 2, 1])], ["s"])
    s = node("Mul", [s, init("half", np.array(0.5, np.float32))], ["s_half"])
    s = node("Add", [s, init("col_bias", rng.standard_normal(T).astype(np.float32))], ["s_bias"])
    s = node("Relu", [s], ["s_relu"])
    r = node("MatMul", [u, node("Transpose", [t], ["tok_t2"], perm=[0, 2, 1])], ["r"])
    s = node("Add", [s, r], ["s_res"])
    node("Reshape", [s, init("back", np.array([n, T, H, W], np.int64))], ["output"])
    g = h.make_graph(nodes, "epilogue", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, T, H, W])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    onnx.checker.check_model(m)
    if path: onnx.save(m, path)
    return m


def levit_attention_model(n=1, c=16, hw=(3, 4), heads=2, kd=4, dv=8, seed=0, path=None):
    """LeViT's attention block as timm exports it: Linear + BatchNorm1d over the flattened tokens
    (``bn(x.flatten(0, 1)).reshape_as(x)``), the qkv viewed as (B, T, heads, 2kd + dv) and split along its last
    axis, q / k / v transposed per head, ``q @ k^T * scale + bias``, softmax, ``@ v``, the heads back to tokens,
    hardswish, the projection (Linear + BatchNorm1d) and a residual add."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W; width = heads * (2 * kd + dv)
    inits, nodes, init, node = graph_builder()
    def linear_bn(x, cin, cout, name):
        y = node("MatMul", [x, init(f"{name}_w", (rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(np.float32))],
                 [f"{name}_mm"])
        y = node("Flatten", [y], [f"{name}_rows"], axis=2)
        bn = [init(f"{name}_{k}", v.astype(np.float32)) for k, v in (
            ("g", rng.uniform(0.5, 1.5, cout)), ("b", rng.normal(0, 0.1, cout)), ("m", rng.normal(0, 0.1, cout)),
            ("v", rng.uniform(0.5, 1.5, cout)))]
        y = node("BatchNormalization", [y] + bn, [f"{name}_bn"])
        return node("Reshape", [y, init(f"{name}_s", np.array([n, T, cout], np.int64))], [f"{name}_tok"])
    tok = node("Transpose", [node("Reshape", ["input", init("s1", np.array([n, c, T], np.int64))], ["flat"])],
               ["tok"], perm=[0, 2, 1])
    qkv = linear_bn(tok, c, width, "qkv")
    qkv = node("Reshape", [qkv, init("s4", np.array([n, T, heads, 2 * kd + dv], np.int64))], ["qkv4"])
    nodes.append(h.make_node("Split", [qkv, init("sp", np.array([kd, kd, dv], np.int64))], ["q", "k", "v"], axis=3,
                             name="split"))
    q = node("Transpose", ["q"], ["qh"], perm=[0, 2, 1, 3])
    k = node("Transpose", ["k"], ["kh"], perm=[0, 2, 3, 1])
    v = node("Transpose", ["v"], ["vh"], perm=[0, 2, 1, 3])
    s = node("Mul", [node("MatMul", [q, k], ["qk"]), init("scale", np.array(kd ** -0.5, np.float32))], ["qks"])
    s = node("Add", [s, init("ab", rng.standard_normal((heads, T, T)).astype(np.float32))], ["biased"])
    o = node("MatMul", [node("Softmax", [s], ["p"], axis=-1), v], ["o"])
    o = node("Reshape", [node("Transpose", [o], ["ot"], perm=[0, 2, 1, 3]),
                         init("s3", np.array([n, T, heads * dv], np.int64))], ["o_tok"])
    o = linear_bn(node("HardSwish", [o], ["o_act"]), heads * dv, c, "proj")
    o = node("Transpose", [node("Add", [o, tok], ["res"])], ["back"], perm=[0, 2, 1])
    node("Reshape", [o, init("s6", np.array([n, c, H, W], np.int64))], ["output"])
    g = h.make_graph(nodes, "levit", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, c, H, W])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    onnx.checker.check_model(m)
    if path: onnx.save(m, path)
    return m


def nchw_attention_model(n=1, c=16, hw=(3, 4), heads=2, d=4, dv=8, seed=0, path=None):
    """EfficientFormerV2's Attention4D, without its talking heads: q, k, v from 1x1 convolutions of an NCHW input
    viewed 4-D (``conv(x).reshape(B, heads, d, N)``, q and v transposed), ``q @ k * scale + bias``, softmax,
    ``@ v``, the heads back to NCHW (transpose, reshape), plus a depthwise 3x3 of v's convolution (``v_local``),
    then a 1x1 projection."""
    rng = np.random.default_rng(seed)
    H, W = hw; T = H * W
    inits, nodes, init, node = graph_builder()
    def conv(x, cin, cout, k, name, groups=1):
        w = init(f"{name}_w", (rng.standard_normal((cout, cin // groups, k, k)) / np.sqrt(cin * k * k / groups))
                 .astype(np.float32))
        return node("Conv", [x, w, init(f"{name}_b", rng.normal(0, 0.1, cout).astype(np.float32))], [name],
                    pads=[k // 2] * 4, group=groups)
    def heads_of(t, width, name):
        return node("Reshape", [t, init(f"{name}_s", np.array([n, heads, width, T], np.int64))], [name])
    q = node("Transpose", [heads_of(conv("input", c, heads * d, 1, "qc"), d, "q4")], ["q"], perm=[0, 1, 3, 2])
    k = heads_of(conv("input", c, heads * d, 1, "kc"), d, "k")
    vc = conv("input", c, heads * dv, 1, "vc")
    v = node("Transpose", [heads_of(vc, dv, "v4")], ["v"], perm=[0, 1, 3, 2])
    s = node("Mul", [node("MatMul", [q, k], ["qk"]), init("scale", np.array(d ** -0.5, np.float32))], ["qks"])
    s = node("Add", [s, init("ab", rng.standard_normal((heads, T, T)).astype(np.float32))], ["biased"])
    o = node("MatMul", [node("Softmax", [s], ["p"], axis=-1), v], ["o"])
    o = node("Reshape", [node("Transpose", [o], ["ot"], perm=[0, 1, 3, 2]),
                         init("back", np.array([n, heads * dv, H, W], np.int64))], ["o_nchw"])
    o = node("Add", [o, conv(vc, heads * dv, heads * dv, 3, "v_local", groups=heads * dv)], ["o_local"])
    conv(o, heads * dv, c, 1, "output")
    g = h.make_graph(nodes, "nchw_attn", [h.make_tensor_value_info("input", TP.FLOAT, [n, c, H, W])],
                     [h.make_tensor_value_info("output", TP.FLOAT, [n, c, H, W])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    onnx.checker.check_model(m)
    if path: onnx.save(m, path)
    return m
