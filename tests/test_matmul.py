"""The matmul template (issue #27, attention's Q@K^T and P@V): hand-picked configs and a seeded sample of the
search space against NumPy on the test device, with every input padding lane poisoned (NaN) and the output
pre-filled with NaN (its padding lanes must come back zero); the workload's checks, the space and its errors,
the fallback, the graph node rule, Oclgrind, and `tuner op` / `tuner space` / `tuner tune-op`."""
from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.graph.graph import Node
from tuner.op import make_config
from tuner.runtime.opencl.launch import build
from tuner.codegen.packing import pack
from tuner.runtime.opencl.memory import download, upload
from tuner.templates import get_template, templates_for
from tuner.templates.matmul import MatmulConfig, MatmulWorkload, from_storage, storage_shape, to_storage

T = get_template("matmul")


def scopes(a, b, out) -> dict:
    return dict(input_scope=a, weight_scope=b, output_scope=out)


def run_poisoned(device, wl, cfg, seed=0):
    """Build ``cfg`` for ``wl``, run it on random inputs whose padding lanes (and the bias's) hold NaN, with the
    output pre-filled with NaN; returns (max relative error against NumPy, the output's padding lanes)."""
    exe = build(T.build(wl, cfg), device)
    inputs = T.random_inputs(wl, np.random.default_rng(seed))
    arrays = exe.upload_inputs(**inputs)
    for buf in exe.program.params:
        real = pack(buf, np.ones(buf.declared.shape, np.float32)) != 0  # the physical elements of the tensor
        data = pack(buf, inputs[buf.name]) if buf.name in inputs else np.zeros(real.shape)
        upload(exe.device, arrays[buf.name], np.where(real, data, np.nan))
    exe.launch(arrays)
    y = next(b for b in exe.program.params if b.name == "Y")
    physical = download(exe.device, arrays["Y"]).astype(np.float64)
    real = pack(y, np.ones(y.declared.shape, np.float32)) != 0
    got = exe.outputs_of(arrays)
    return T.check(wl, got, inputs), physical[~real]


def assert_matches(device, wl, cfg, seed=0):
    bad = T.space(wl, device).violations(T.config_values(wl, cfg))
    assert not bad, f"not a valid config of the space: {bad}"
    err, padding = run_poisoned(device, wl, cfg, seed)
    assert err <= T.tolerance(wl, cfg), f"{wl}\n{cfg}\nmax relative error {err:.3g}"
    assert np.all(padding == 0), f"output padding lanes not zero: {padding[padding != 0][:8]}\n{wl}\n{cfg}"


TEX, BUF = scopes("texture", "texture", "texture"), scopes("buffer", "buffer", "buffer")
CASES = [
    ("buffer f32, 2x5x13 @ 2x13x15, 2x2 tiles, 2x2 work-group, unroll 2",
     dict(a=(2, 5, 13), b=(2, 13, 15)),
     dict(tile_m=2, tile_n=2, wg_m=2, wg_n=2, unroll_k=2, **BUF)),
    ("texture f32 trans_b, alpha, bias, relu, residual, split_k=2, A and B staged in local memory",
     dict(a=(2, 5, 13), b=(2, 7, 13), trans_b=True, alpha=0.125, bias=True, activation="relu", residual=True),
     dict(tile_m=2, tile_n=1, wg_m=2, wg_n=2, split_k=2, local_a=True, local_b=True, **TEX)),
    ("buffer f16 trans_b, K=7, tile_n=2, split_k=2, hardswish",
     dict(a=(1, 13, 7), b=(1, 5, 7), trans_b=True, dtype="float16", activation="hardswish"),
     dict(tile_m=4, tile_n=2, wg_m=4, split_k=2, **BUF)),
    ("texture f16, batch 3, N=13, bias, leaky_relu(0.1), residual, B staged, tile_m=8 over M=7",
     dict(a=(3, 7, 5), b=(3, 5, 13), dtype="float16", bias=True, activation="leaky_relu(0.1)", residual=True),
     dict(tile_m=4, tile_n=2, wg_m=2, wg_n=2, local_b=True, **TEX)),
    ("A buffer / B texture / Y buffer, scalar A loads (vec_load=1), split_k=4, alpha, sigmoid",
     dict(a=(2, 6, 21), b=(2, 21, 5), alpha=-0.5, activation="sigmoid"),
     dict(tile_m=2, wg_m=2, split_k=4, vec_load=1, **scopes("buffer", "texture", "buffer"))),
    ("A texture / B buffer / Y texture, K=21: a ragged last step (unroll 2 x split 2), both tiles staged",
     dict(a=(1, 9, 21), b=(1, 21, 6), bias=True, residual=True),
     dict(tile_m=2, tile_n=1, wg_m=4, wg_n=2, split_k=2, unroll_k=2, local_a=True, local_b=True,
          **scopes("texture", "buffer", "texture"))),
    ("buffer f32 trans_b, M=N=K=1",
     dict(a=(2, 1, 1), b=(2, 1, 1), trans_b=True, bias=True),
     dict(tile_m=1, tile_n=1, wg_m=1, **BUF)),
]


@pytest.mark.parametrize("label,fields,knobs", CASES, ids=[c[0].split(",")[0] for c in CASES])
def test_matches_numpy_with_poisoned_padding(device, label, fields, knobs):
    wl = MatmulWorkload(**fields)
    cfg = dataclasses.replace(MatmulConfig(), **knobs)
    assert_matches(device, wl, cfg)



# (src, groups, c_off, c_group, r_off): operand element (b, r, c) is src[b // groups, c_off + b % groups * c_group +
# c, (r_off + r) // W, (r_off + r) % W] -- attention's q, k, v as slices of an NCHW projection, heads as channels
VIEW_CASES = [
    ("A: channels 8..15 of an NCHW tensor, its 3x5 pixels the rows, texture",
     dict(a=(2, 15, 8), b=(2, 8, 7), a_view=((2, 24, 3, 5), 1, 8, 0, 0)), dict(tile_m=2, wg_m=4, **TEX)),
    ("B^T: 4 heads as channel groups of one token tensor, a batched addend, split_k and B staged, buffer",
     dict(a=(4, 6, 8), b=(4, 6, 8), trans_b=True, b_view=((1, 32, 1, 6), 4, 0, 8, 0), addend="batched"),
     dict(tile_m=2, wg_m=2, split_k=2, local_b=True, **BUF)),
    ("Y written as NCHW (rows -> 3x5 pixels), a shared addend and a bias, texture",
     dict(a=(2, 15, 6), b=(2, 6, 8), y_view=((2, 8, 3, 5), 1, 0, 0, 0), addend="shared", bias=True),
     dict(tile_m=4, tile_n=2, wg_m=4, **TEX)),
    ("A from rows 2..6 at channel 4, B (K, N) from NCHW, scalar A loads, buffer",
     dict(a=(2, 5, 15), b=(2, 15, 12), a_view=((2, 20, 1, 7), 1, 4, 0, 2), b_view=((2, 12, 3, 5), 1, 0, 0, 0)),
     dict(tile_m=1, wg_m=4, vec_load=1, **BUF)),
    ("Y as 4 heads' channel groups of one NCHW tensor, relu, A staged, texture",
     dict(a=(4, 6, 5), b=(4, 5, 8), y_view=((1, 32, 2, 3), 4, 0, 8, 0), activation="relu"),
     dict(tile_m=2, wg_m=2, wg_n=2, local_a=True, **TEX)),
    ("Y and its residual through 2 heads' channel groups of an NCHW tensor, split_k, texture",
     dict(a=(2, 6, 9), b=(2, 9, 8), residual=True, y_view=((1, 16, 2, 3), 2, 0, 8, 0)),
     dict(tile_m=2, wg_m=2, split_k=2, **TEX)),
    ("Y of N=5 filling a 5-channel NCHW tensor (its padding lanes), buffer",
     dict(a=(2, 6, 7), b=(2, 7, 5), y_view=((2, 5, 2, 3), 1, 0, 0, 0)), dict(wg_m=2, **BUF)),
]


@pytest.mark.parametrize("label,fields,knobs", VIEW_CASES, ids=[c[0].split(":")[0] for c in VIEW_CASES])
def test_views_and_addend_match_numpy(device, label, fields, knobs):
    """Operands read and the output written through views, against NumPy gathering (scattering) them."""
    wl = MatmulWorkload(**fields)
    assert_matches(device, wl, dataclasses.replace(MatmulConfig(), **knobs))
    assert wl.key() == {**wl.plain().key(), **({"addend": wl.addend} if wl.addend != "none" else {})}


def test_views_stay_out_of_the_key_and_are_checked():
    plain = MatmulWorkload(a=(2, 15, 8), b=(2, 8, 7))
    viewed = dataclasses.replace(plain, a_view=((2, 24, 3, 5), 1, 8, 0, 0), y_view=((2, 7, 3, 5), 1, 0, 0, 0))
    assert viewed.key() == plain.key() and viewed.plain() == plain and viewed != plain
    assert T.space_vars(viewed)["a_view"] == (2, 24, 3, 5)  # what the kernel binds: the source
    bad = [(dict(a_view=((2, 24, 3, 5), 1, 6, 0, 0)), "multiples of 4"),
           (dict(a_view=((2, 12, 3, 5), 1, 8, 0, 0)), "channels up to 16 within the source's 12"),
           (dict(a_view=((2, 24, 3, 4), 1, 8, 0, 0)), r"rows 0..15 within the source's 3x4"),
           (dict(a_view=((1, 24, 3, 5), 1, 8, 0, 0)), "batch 2 in 1 groups"),
           (dict(y_view=((2, 8, 3, 5), 1, 0, 0, 0)), "fills its"),
           (dict(a_view=(1, 2)), "source shape N,C,H,W")]
    for fields, match in bad:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(plain, **fields)
    with pytest.raises(ValueError, match="addend 'some'"):
        MatmulWorkload(a=(1, 2, 3), b=(1, 3, 4), addend="some")


def test_half_arithmetic(fp16_device):
    """compute=half / half_acc (cl_khr_fp16): half products, float or half sums."""
    wl = MatmulWorkload(a=(1, 6, 13), b=(1, 6, 13), trans_b=True, dtype="float16", bias=True)
    for compute in ("half", "half_acc"):
        assert_matches(fp16_device, wl, MatmulConfig(tile_m=2, wg_m=2, split_k=2, compute=compute, **BUF))
    wl = MatmulWorkload(a=(2, 5, 9), b=(2, 9, 7), dtype="float16", residual=True)
    assert_matches(fp16_device, wl, MatmulConfig(tile_m=2, tile_n=1, wg_m=2, wg_n=2, local_a=True, compute="half",
                                                 **TEX))


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_seeded_sample_of_the_space_matches_numpy(device, scope):
    """Random workloads (odd sizes, batch 1-2, both storage dtypes, random epilogue) with a random valid config
    each, drawn with a fixed seed: the knob combinations nobody picked by hand."""
    rng = np.random.default_rng({"texture": 11, "buffer": 12}[scope])
    for _ in range(3):
        (M, K, N), batch = (int(x) for x in rng.integers(1, 14, 3)), int(rng.integers(1, 3))
        trans = bool(rng.integers(2))
        wl = MatmulWorkload(a=(batch, M, K), b=(batch, N, K) if trans else (batch, K, N), trans_b=trans,
                            dtype=str(rng.choice(["float32", "float16"])), alpha=float(rng.choice([1.0, 0.25])),
                            bias=bool(rng.integers(2)), residual=bool(rng.integers(2)),
                            activation=str(rng.choice(["none", "relu", "relu6"])))
        space = T.space(wl, device, **scopes(scope, scope, scope))
        assert space.size() > 0
        assert_matches(device, wl, T.make_config(space.sample(rng)), seed=int(rng.integers(1 << 30)))


def test_storage_views():
    """(b, r, c) is stored as the NCHW4c tensor (b, c, 1, r): packed by 4 along c."""
    x = np.arange(2 * 3 * 5).reshape(2, 3, 5)
    v = to_storage(x)
    assert v.shape == storage_shape(x.shape) == (2, 5, 1, 3)
    assert v[1, 4, 0, 2] == x[1, 2, 4]
    assert np.array_equal(from_storage(v), x)
    k = T.build(MatmulWorkload(a=(2, 3, 5), b=(2, 6, 5), trans_b=True, bias=True, residual=True),
                MatmulConfig(**scopes("texture", "buffer", "texture")))
    shapes = {p.name: (p.shape, p.scope, p.layout.name) for p in k.params}
    assert shapes == {"A": ((2, 5, 1, 3), "texture", "nchw4c"), "Bm": ((2, 5, 1, 6), "global", "nchw4c_buffer"),
                      "B": ((6,), "global", "bias4_buffer"), "Res": ((2, 6, 1, 3), "texture", "nchw4c"),
                      "Y": ((2, 6, 1, 3), "texture", "nchw4c")}


def test_reference_epilogue_order():
    """act(alpha * a @ b + bias) + residual: the residual is added last, after the activation."""
    a, b = np.ones((1, 1, 2)), np.ones((1, 2, 1))
    wl = MatmulWorkload(a=(1, 1, 2), b=(1, 2, 1), alpha=-2.0, bias=True, activation="relu", residual=True)
    ref = T.reference(wl, {"A": to_storage(a), "Bm": to_storage(b), "B": np.array([1.0]),
                           "Res": to_storage(np.full((1, 1, 1), -3.0))})
    assert ref.shape == (1, 1, 1, 1) and ref.item() == -3.0  # relu(-2 * 2 + 1) + (-3)


def test_workload_key_flops_and_label():
    wl = MatmulWorkload(a=[2, 64, 32], b=[2, 64, 32], trans_b=True, alpha=0.125, bias=True, activation="clip(0,6)")
    assert wl.out_shape == (2, 64, 64) and wl.flops == 2 * 2 * 64 * 64 * 32
    key = wl.key()
    assert key == {"op": "matmul", "a": [2, 64, 32], "b": [2, 64, 32], "trans_b": True, "dtype": "float32",
                   "alpha": 0.125, "bias": True, "activation": "relu6", "residual": False}
    assert MatmulWorkload(**{k: v for k, v in json.loads(json.dumps(key)).items() if k != "op"}) == wl
    assert MatmulWorkload(a=(1, 2, 3), b=(1, 3, 4), alpha=1) == MatmulWorkload(a=(1, 2, 3), b=(1, 3, 4))
    assert T.label(wl) == "2x64x32 @ 2x64x32^T *0.125 +bias +relu6"


@pytest.mark.parametrize("fields,match", [
    (dict(a=(1, 4, 8), b=(1, 4, 8)), r"K=8 but b \[1, 4, 8\].*has K=4; set trans_b"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), trans_b=True), r"K=8 but b .*trans_b\) has K=4"),
    (dict(a=(2, 4, 8), b=(1, 8, 4)), r"batch of a \(2\) and b \(1\) must be equal"),
    (dict(a=(4, 8), b=(8, 4)), r"a B,M,K and b B,K,N \(3 axes each\)"),
    (dict(a=(1, 0, 8), b=(1, 8, 4)), "must be positive"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), alpha="x"), "alpha must be a number"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), alpha=float("inf")), "alpha must be finite"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), trans_b="yes"), "trans_b is true or false"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), dtype="int8"), "float32 or float16"),
    (dict(a=(1, 4, 8), b=(1, 8, 4), activation="swish2"), "swish2"),
])
def test_workload_errors_name_the_problem(fields, match):
    with pytest.raises(ValueError, match=match):
        MatmulWorkload(**fields)


def test_space_constraints_and_errors(device):
    wl = MatmulWorkload(a=(1, 5, 13), b=(1, 13, 7))
    with pytest.raises(TunerError, match="local_a_shared"):
        make_config(T, wl, device, {"local_a": True, "wg_n": 1})
    with pytest.raises(TunerError, match="vec_load_buffer"):
        make_config(T, wl, device, {"vec_load": 1}, input_scope="texture")
    with pytest.raises(TunerError, match="tile_n_fits"):
        make_config(T, wl, device, {"tile_n": 4})  # N=7: 2 blocks
    with pytest.raises(TunerError, match="unknown knob 'a_scope'.*input_scope"):
        make_config(T, wl, device, {"a_scope": "buffer"})
    trans = MatmulWorkload(a=(1, 16, 13), b=(1, 16, 13), trans_b=True)
    with pytest.raises(TunerError, match="registers"):
        make_config(T, trans, device, {"tile_m": 8, "tile_n": 2})
    with pytest.raises(ValueError, match="vec_load=1 .* needs input_scope=buffer"):
        T.build(wl, MatmulConfig(vec_load=1, **TEX))
    with pytest.raises(ValueError, match="input_scope='disk': texture or buffer"):
        T.build(wl, MatmulConfig(input_scope="disk"))
    # the split's and the staged tiles' local memory is counted against the device's
    small = dataclasses.replace(device.info, local_mem_bytes=1024)
    big = {"tile_m": 4, "tile_n": 2, "wg_m": 2, "wg_n": 2, "split_k": 4}
    assert any(v.startswith("local_memory") for v in T.space(MatmulWorkload(a=(1, 16, 64), b=(1, 64, 16)), small)
               .violations({**T.config_values(wl, MatmulConfig(**BUF)), **big}))
    cfg = make_config(T, wl, device, {"local_b": True, "wg_m": 2})
    assert cfg.local_b and cfg.a_scope == cfg.input_scope and cfg.b_scope == cfg.weight_scope


def test_fallback_is_valid_everywhere(device):
    """The untuned config is in the space for attention-like and odd shapes, any scope the task fixes."""
    shapes = [((1, 64, 64), (1, 64, 64), True), ((12, 197, 64), (12, 197, 64), True),
              ((12, 197, 197), (12, 197, 64), False), ((1, 1, 1), (1, 1, 1), False), ((3, 5, 300), (3, 300, 7), False),
              ((1, 1, 4096), (1, 4096, 2), False)]
    for a, b, trans in shapes:
        for dtype in ("float32", "float16"):
            wl = MatmulWorkload(a=a, b=b, trans_b=trans, dtype=dtype)
            cfg = T.fallback(wl, device.info)
            assert not T.space(wl, device).violations(T.config_values(wl, cfg)), (wl, cfg)
            assert T.fallback_with(wl, device, **TEX).input_scope == "texture"
            f = T.features(T.space_vars(wl), T.config_values(wl, cfg))
            assert f and all(math.isfinite(x) for x in f.values())
    long = T.fallback(MatmulWorkload(a=(1, 4, 512), b=(1, 512, 8)), device.info)
    assert long.split_k > 1  # few outputs, a long reduction: the reduction is shared


def test_fallback_runs_an_attention_product(device):
    wl = MatmulWorkload(a=(2, 24, 16), b=(2, 24, 16), trans_b=True, alpha=0.25)
    assert_matches(device, wl, T.fallback(wl, device.info))


def _ctx(shapes, params=(), dtype="float32"):
    from tuner.plan.rules import LowerCtx
    graph = SimpleNamespace(shapes=dict(shapes), params={p: np.arange(math.prod(shapes[p]), dtype=np.float32)
                                                          .reshape(shapes[p]) for p in params})
    return LowerCtx(graph, dtype, [], packed=lambda name: f"{name}.packed" if name == "x" else name)


def test_graph_node_lowers_to_the_template():
    """A node of op "matmul": inputs [a, b, (bias), (residual)], attrs trans_b, alpha, activation, residual."""
    from tuner.plan.rules import lower_template
    assert T in templates_for("matmul") and T.graph_ops == ("matmul",)
    ctx = _ctx({"q": (2, 10, 8), "k": (2, 12, 8), "bias": (1, 12), "r": (2, 10, 12)}, params=["bias"])
    node = Node("matmul", "attn", ["q", "k", "bias", "r"], ["y"],
                {"trans_b": True, "alpha": 0.5, "activation": "relu", "residual": True})
    lower_template(ctx, node, ["q", "k", "bias", "r"], "y", (2, 10, 12))
    (step,) = ctx.steps
    assert step.op == "matmul" and step.output == "y"
    assert step.workload == MatmulWorkload(a=(2, 10, 8), b=(2, 12, 8), trans_b=True, alpha=0.5, bias=True,
                                           activation="relu", residual=True)
    assert step.inputs == {"A": "q", "Bm": "k", "B": "attn.bias", "Res": "r"}
    assert ctx.extra["attn.bias"].shape == (12,)  # a (1, N) constant, reshaped for the bias buffer
    ctx = _ctx({"p": (1, 10, 12), "v": (1, 12, 8)})
    wl, inputs, extra = T.lower(ctx, SimpleNamespace(name="pv", op="matmul", inputs=["p", "v"], attrs={}), ["p", "v"])
    assert wl == MatmulWorkload(a=(1, 10, 12), b=(1, 12, 8)) and inputs == {"A": "p", "Bm": "v"} and extra == {}


@pytest.mark.parametrize("shapes,params,inputs,attrs,match", [
    ({"a": (1, 4, 8), "b": (1, 4, 8)}, [], ["a", "b"], {}, r"K=8 but b .*; set trans_b"),
    ({"a": (1, 4, 8), "b": (1, 8, 5), "c": (5,)}, [], ["a", "b", "c"], {}, "must be a constant of 5 values"),
    ({"a": (1, 4, 8), "b": (1, 8, 5), "c": (6,)}, ["c"], ["a", "b", "c"], {}, r"shape \[6\]: it must hold N=5"),
    ({"a": (1, 4, 8), "b": (1, 8, 5)}, [], ["a", "b"], {"residual": True}, "no residual input"),
    ({"a": (1, 4, 8), "b": (1, 8, 5), "r": (1, 5, 4)}, [], ["a", "b", "r"], {"residual": True},
     r"residual 'r' has shape \[1, 5, 4\]; the output is \[1, 4, 5\]"),
])
def test_graph_node_errors_name_the_problem(shapes, params, inputs, attrs, match):
    from tuner.plan.rules import lower_template
    ctx = _ctx(shapes, params)
    node = Node("matmul", "mm", inputs, ["y"], attrs)
    with pytest.raises(TunerError, match=f"node 'mm' \\(matmul\\): .*{match}"):
        lower_template(ctx, node, inputs, "y", None)


def test_clean_under_oclgrind():
    """Out-of-bounds accesses, races on the local tiles and split sums, uninitialized reads (buffer scopes)."""
    from test_oclgrind import problems_of, run_oclgrind
    cases = [
        {"label": "matmul buffer, K=21 ragged, both tiles staged, split_k=2, bias, residual",
         "template": "matmul", "workload": dict(a=(1, 9, 21), b=(1, 21, 6), bias=True, residual=True),
         "config": dataclasses.asdict(MatmulConfig(tile_m=2, wg_m=4, wg_n=2, split_k=2, unroll_k=2, local_a=True,
                                                   local_b=True, **BUF))},
        {"label": "matmul texture trans_b, batch 2, M=5 N=7 K=13, staged tiles, split_k=2",
         "template": "matmul", "workload": dict(a=(2, 5, 13), b=(2, 7, 13), trans_b=True, alpha=0.5),
         "config": dataclasses.asdict(MatmulConfig(tile_m=2, tile_n=2, wg_m=2, wg_n=2, split_k=2, local_a=True,
                                                   local_b=True, **TEX))},
        {"label": "matmul buffer trans_b, scalar tiles, 2 work-groups each way",
         "template": "matmul", "workload": dict(a=(1, 7, 6), b=(1, 9, 6), trans_b=True, residual=True),
         "config": dataclasses.asdict(MatmulConfig(tile_m=2, wg_m=2, wg_n=1, **BUF))},
    ]
    problems = problems_of(*run_oclgrind(cases))
    assert not problems, "\n\n".join(problems)


def _tuner(capsys, *args):
    """``tuner ARGS`` in this process (``tuner.cli.main``): the exit status and what it printed. The entry point
    in a fresh process (``python -m tuner``, its exit status) is tests/test_cli.py's."""
    from tuner.cli import main
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_cli_op_space_and_tune_op(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    r = _tuner(capsys, "op", "matmul", "--a", "1,64,32", "--b", "1,32,64", "--check", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["workload"]["a"] == [1, 64, 32] and out["max_rel_error"] <= 1e-4
    r = _tuner(capsys, "op", "matmul", "--a", "2,13,7", "--b", "2,5,7", "--trans-b", "--alpha", "0.125", "--bias",
               "--residual", "--activation", "relu", "--scope", "texture", "--dtype", "float16",
               "--config", '{"split_k": 2, "local_b": true, "wg_m": 2}', "--check")
    assert r.returncode == 0, r.stderr
    assert '"alpha": 0.125' in r.stdout and "ok" in r.stdout
    r = _tuner(capsys, "op", "matmul", "--a", "1,4,8", "--b", "1,4,8", "--check")
    assert r.returncode == 2 and "set trans_b" in r.stderr
    r = _tuner(capsys, "space", "matmul", "--a", "1,64,32", "--b", "1,64,32", "--trans-b")
    assert r.returncode == 0, r.stderr
    count = int(r.stdout.rsplit(":", 1)[1].replace(",", ""))
    assert 0 < count < 1_935_360 and '"trans_b": true' in r.stdout
    log = tmp_path / "log.jsonl"
    r = _tuner(capsys, "tune-op", "matmul", "--a", "2,9,12", "--b", "2,12,6", "--bias", "--trials", "3",
               "--sampler", "random", "--log", str(log), "--storage", f"sqlite:///{tmp_path / 's.db'}",
               "--no-progress", "--scope", "buffer")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 measured" in r.stdout and "best:" in r.stdout
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 3 and all(rec["template"] == "matmul" and rec["error_code"] == 0 for rec in records)
    assert records[0]["scopes"] == {"input": "buffer", "weight": "buffer", "output": "buffer"}
