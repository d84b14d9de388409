"""The model pipeline: graph passes, storage planning, task extraction, compile and run against onnxruntime,
the artifact in a fresh process, tuned logs changing the deployed kernels, and the model CLI."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tuner.cli import main
from tuner.zoo import models as zoo
from tuner.compile.compiler import compile_model, load_graph, model_tasks
from tuner.frontend.onnx import from_onnx
from tuner.runtime.module import load_module
from tuner.graph.passes import fold_batch_norm, fuse_epilogues, optimize
from tuner.plan.lower import extract_tasks, lower_graph, plan_storage
from tuner.graph.reference import OPS, random_inputs, run_graph_numpy
from tuner.ir.activations import apply_numpy

TEST_MODELS = zoo.test_models()


@pytest.fixture(scope="module")
def dev(device):
    return device  # PoCL, or TUNER_TEST_DEVICE (e.g. nvidia on the GPU machine)


@pytest.fixture(scope="module")
def small_zoo():
    return {"mobilenet_v2": zoo.mobilenet_v2(num_classes=10, input_size=32, width=0.5),
            "resnet18": zoo.resnet18(num_classes=10, input_size=32)}


def run_fused(graph, inputs):
    """The NumPy reference extended with the fused prologue and epilogue: the input times its gate (``in_scale``),
    op(inputs) + bias, + residual, then activation."""
    env = {k: np.asarray(v, np.float64) for k, v in {**graph.params, **inputs}.items()}
    for n in graph.nodes:
        fused = sum(k in n.attrs for k in ("post", "scale", "residual", "in_scale"))  # appended last, in turn
        ins = [env[t] for t in n.inputs[:len(n.inputs) - fused]]
        if "in_scale" in n.attrs:
            ins[0] = ins[0] * env[n.attrs["in_scale"]]
        out = OPS[n.op](n, *ins)
        if "post" in n.attrs:
            out = OPS[n.attrs["post_op"]](n, out, env[n.attrs["post"]])
        if "scale" in n.attrs:
            out = out * env[n.attrs["scale"]].reshape((1, -1) + (1,) * (out.ndim - 2))
        if "residual" in n.attrs:
            out = out + env[n.attrs["residual"]]
        act = n.attrs.get("activation", "none") if n.op != "clip" else "none"
        env[n.outputs[0]] = apply_numpy(act, out)
        if n.attrs.get("row_sums"):  # a depthwise convolution's row sums, which a squeeze-excite gate pools
            env[n.outputs[1]] = env[n.outputs[0]].sum(axis=3, keepdims=True)
    return {t: env[t] for t in graph.outputs}


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# -- graph passes ---------------------------------------------------------------------------------------
def test_fold_batch_norm_scales_the_convolution_and_keeps_the_result(small_zoo):
    g = from_onnx(small_zoo["resnet18"])
    folded = fold_batch_norm(g)
    assert sum(n.op == "batch_norm" for n in g.nodes) == 20
    assert not any(n.op == "batch_norm" for n in folded.nodes)
    assert sum(n.op == "conv2d" for n in folded.nodes) == 20 and all(len(n.inputs) == 3 for n in folded.nodes
                                                                     if n.op == "conv2d")
    x = random_inputs(g)
    assert rel_err(run_graph_numpy(folded, x)["output"], run_graph_numpy(g, x)["output"]) < 1e-5


def test_batch_norm_without_a_convolution_becomes_a_depthwise_scale():
    g = from_onnx(TEST_MODELS["batch_norm"])
    folded = fold_batch_norm(g)
    x = random_inputs(g)
    assert rel_err(run_graph_numpy(folded, x)[g.outputs[0]], run_graph_numpy(g, x)[g.outputs[0]]) < 1e-5
    standalone = [n for n in folded.nodes if n.op == "conv2d" and n.attrs["groups"] > 1]
    if not any(n.op == "conv2d" for n in g.nodes):  # the test model is a lone BatchNorm
        assert standalone and folded.shapes[standalone[0].inputs[1]][1:] == (1, 1, 1)


@pytest.mark.parametrize("name, residual_adds, activations", [("resnet18", 8, 17), ("mobilenet_v2", 10, 35)])
def test_fuse_epilogues_absorbs_bias_residual_and_activation(small_zoo, name, residual_adds, activations):
    g = from_onnx(small_zoo[name])
    opt = optimize(g)
    assert not any(n.op in ("batch_norm", "relu", "clip", "add") for n in opt.nodes)
    assert sum("residual" in n.attrs for n in opt.nodes) == residual_adds
    assert sum(n.attrs.get("activation", "none") != "none" for n in opt.nodes) == activations
    for n in opt.nodes:  # a residual is computed before the convolution that reads it
        if "residual" in n.attrs:
            p = opt.producer(n.attrs["residual"])
            assert p is None or opt.nodes.index(p) < opt.nodes.index(n)
    x = random_inputs(g)
    assert rel_err(run_fused(opt, x)["output"], run_graph_numpy(g, x)["output"]) < 1e-5


def test_an_add_after_an_activation_is_not_fused_into_the_convolution():
    from tuner.graph.graph import Graph, Node
    rng = np.random.default_rng(0)
    g = Graph([Node("conv2d", "c", ["x", "w"], ["a"], {"stride": (1, 1), "padding": (0, 0, 0, 0),
                                                      "dilation": (1, 1), "groups": 1}),
               Node("relu", "r", ["a"], ["b"]), Node("add", "s", ["b", "x"], ["y"])],
              ["x"], ["y"], {"x": (1, 4, 5, 5), "w": (4, 4, 1, 1), "a": (1, 4, 5, 5), "b": (1, 4, 5, 5),
                             "y": (1, 4, 5, 5)}, {"w": rng.standard_normal((4, 4, 1, 1)).astype(np.float32)})
    opt = fuse_epilogues(g)
    assert [n.op for n in opt.nodes] == ["conv2d", "add"] and opt.nodes[0].attrs == {
        **g.nodes[0].attrs, "activation": "relu"}
    x = random_inputs(g)
    assert rel_err(run_fused(opt, x)["y"], run_graph_numpy(g, x)["y"]) < 1e-6


# -- planning ---------------------------------------------------------------------------------------------
def test_storage_plan_per_scope_mode_and_device_limits(small_zoo, dev):
    plan = lower_graph(load_graph(small_zoo["mobilenet_v2"]))
    tex = plan_storage(plan, dev.info, "texture")
    buf = plan_storage(plan, dev.info, "buffer")
    # (the packed form of the model input and output is gone where the kernels next to them read and write the host
    # buffers in place, tuner.plan.io_views, and the classifier's pooled rows where its dense reads the pool,
    # tuner.plan.input_views)
    packed = [t for t in plan.tensors.values() if t.kind != "plain"]
    kept = lambda p: [t for t in packed if t.name in p.tensors]  # noqa: E731
    assert "input.packed" not in tex.tensors and len(kept(tex)) >= len(packed) - 3
    assert all(tex.tensors[t.name].scope == "texture" for t in kept(tex))
    assert all(buf.tensors[t.name].scope == "buffer" for t in kept(buf))
    assert all(plan.tensors[t].kind == "plain" for t in plan.inputs + plan.outputs)
    # auto with no log follows the templates' own choice: buffers on a CPU (PoCL emulates image reads)
    auto = plan_storage(plan, dev.info, "auto")
    assert {auto.tensors[t.name].scope for t in kept(auto)} == {"texture" if dev.info.type == "GPU" else "buffer"}
    # a device whose images are 8 pixels wide keeps wider tensors in buffers
    narrow = dataclasses.replace(dev.info, image2d_max_width=8)
    lim = plan_storage(plan, narrow, "texture")
    for t in kept(lim):
        want = "texture" if (t.shape[3] if t.kind == "nchw" else -(-t.shape[1] // 4)) <= 8 else "buffer"
        assert lim.tensors[t.name].scope == want, t
    no_images = dataclasses.replace(dev.info, image_support=False)
    none = plan_storage(plan, no_images, "texture")
    assert {none.tensors[t.name].scope for t in kept(none)} == {"buffer"}


def test_auto_scope_follows_the_log(dev, tmp_path):
    from tuner.logs import SCHEMA_VERSION, Record, append_records, apply_history_best
    plan = lower_graph(load_graph(TEST_MODELS["conv_pads"]))
    step = next(s for s in plan.steps if s.tuned)
    t = __import__("tuner.templates", fromlist=["get_template"]).get_template(step.op)
    fb = t.fallback(step.workload, dev.info)

    def rec(scope, median):
        cfg = dataclasses.replace(fb, input_scope=scope, weight_scope=scope, output_scope=scope)
        return Record(version=SCHEMA_VERSION, template=t.name, workload=step.workload.key(),
                      scopes={"input": scope, "weight": scope, "output": scope}, config=dataclasses.asdict(cfg),
                      device=dev.info.fingerprint, costs=[median], median_s=median, gflops=1.0, error_code=0,
                      error_name="NO_ERROR")
    for faster, times in (("texture", (1e-4, 2e-4)), ("buffer", (3e-4, 2e-4))):
        log = str(tmp_path / f"{faster}.jsonl")
        append_records(log, [rec("texture", times[0]), rec("buffer", times[1])])
        planned = plan_storage(plan, dev.info, "auto", apply_history_best(log))
        assert planned.tensors[step.output].scope == faster
        s = next(x for x in planned.steps if x.name == step.name)
        assert s.scopes["output"] == faster


def test_extract_tasks_counts_repeated_layers(small_zoo, dev):
    plan = plan_storage(lower_graph(load_graph(small_zoo["resnet18"])), dev.info, "buffer")
    tasks = extract_tasks(plan, alternatives=False)  # the kernels each node runs without a log
    # 20 conv + 1 dense, which reads the global average pool in place (a 10-way classifier: DenseWorkload.in_pool)
    assert sum(t.count for t in tasks) == sum(s.tuned for s in plan.steps) == 21
    assert len(tasks) == 16 and max(t.count for t in tasks) == 2  # blocks 2 of stages 2-4 repeat block 1
    assert [t.template for t in tasks].count("spatial_reduce") == 0
    assert [t.workload.in_pool for t in tasks if t.template == "dense"] == [(1, 1)]
    assert len({t.key() for t in tasks}) == len(tasks)
    assert [t.weight for t in tasks] == sorted((t.weight for t in tasks), reverse=True)
    assert all(t.fixed == {"act_layout": "nchw4c"} for t in tasks if t.template not in ("dense", "spatial_reduce"))
    # what tuning measures: every alternative too -- the 13 3x3 stride-1 convolutions (8 distinct) also as
    # Winograd F(2x2) and F(4x4)
    every = model_tasks(small_zoo["resnet18"], dev, scope="buffer")
    assert {t.key() for t in tasks} <= {t.key() for t in every} and len({t.key() for t in every}) == len(every)
    extra = [t for t in every if t.template.startswith("winograd")]
    assert len(every) == 16 + len(extra) and len(extra) == 2 * 8 and sum(t.count for t in extra) == 2 * 13
    assert [t.weight for t in every] == sorted((t.weight for t in every), reverse=True)


# -- compile and run ---------------------------------------------------------------------------------------
def _check_against_ort(model, scope, dev, dtype="float32", tol=1e-4, input_shapes=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, device=dev, scope=scope, dtype=dtype, input_shapes=input_shapes)
    feeds = {n: np.random.default_rng(1).standard_normal(mod.spec.entries[n].shape).astype(np.float32)
             for n in mod.spec.inputs}
    outs = mod.run(feeds)
    refs = ort_run(model, feeds)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape
        assert rel_err(o, r) < tol, (scope, dtype)
    return mod


@pytest.mark.parametrize("name", sorted(TEST_MODELS))
def test_every_operator_matches_onnxruntime(name, dev):
    shapes = {"input": (2, 3, 8, 8)} if name == "symbolic_batch" else None
    for scope in ("texture", "buffer", "auto"):
        mod = _check_against_ort(TEST_MODELS[name], scope, dev, input_shapes=shapes)
        scopes = {e.storage_scope for n, e in mod.spec.entries.items() if n not in mod.spec.inputs + mod.spec.outputs
                  and e.layout is not None}  # not a GroupNorm(1)'s statistics: a float32 buffer in every scope
        if scope == "texture":
            assert scopes <= {"texture"} and scopes
        elif scope == "buffer":
            assert scopes == {"global"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
@pytest.mark.parametrize("scope", ["texture", "buffer", "auto"])
def test_zoo_models_match_onnxruntime(small_zoo, dev, name, scope):
    mod = _check_against_ort(small_zoo[name], scope, dev)
    mem = mod.spec.memory  # the planner shares storage: less than one allocation per tensor
    assert all(m["planned"] <= m["naive"] for m in mem.values())
    assert sum(m["planned"] for m in mem.values()) < 0.6 * sum(m["naive"] for m in mem.values())


@pytest.mark.slow
def test_float16_storage_matches_onnxruntime(small_zoo, dev):
    _check_against_ort(small_zoo["mobilenet_v2"], "texture", dev, dtype="float16", tol=2e-2)


def test_artifact_runs_in_a_fresh_process_from_its_directory(dev, tmp_path):
    model = TEST_MODELS["mixed"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, device=dev, scope="texture")
    out = tmp_path / "artifact"
    mod.save(out)
    spec = json.loads((out / "graph.json").read_text())
    assert all({"storage_id", "storage_scope", "shape"} <= set(e) for e in spec["entries"].values())
    assert {e["storage_scope"] for e in spec["entries"].values()} == {"global", "texture"}
    assert spec["device"]["fingerprint"] == dev.info.fingerprint and (out / "params.bin").exists()
    x = np.random.default_rng(3).standard_normal(mod.spec.entries["input"].shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([sys.executable, "-m", "tuner", "run", str(out), "--input", str(tmp_path / "x.npy"),
                        "--output", str(tmp_path / "y.npy"), "--repeat", "3", "--profile", "--device",
                        dev.info.fingerprint],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "median latency" in r.stdout and "end to end" in r.stdout
    y = np.load(tmp_path / "y.npy")
    assert rel_err(y, ort_run(model, {"input": x})[0]) < 1e-4
    from tuner.artifact.cache import profile_path
    prof = json.loads(profile_path(out).read_text())  # the user's cache ($TUNER_CACHE_DIR): never the artifact
    assert len(prof["rows"]) == len(spec["nodes"]) and prof["total_s"] > 0 and not (out / "profile.json").exists()
    assert rel_err(load_module(out, dev).run([x])[0], mod.run([x])[0]) == 0


@pytest.mark.slow
def test_tuning_a_model_changes_the_deployed_kernels(dev, tmp_path):
    from tuner.scheduler.model import tune_model
    from tuner.logs import apply_history_best
    from tuner.measure import MeasureOptions
    model = TEST_MODELS["conv_pads"]
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    log = str(tmp_path / "t.jsonl")
    opts = MeasureOptions(repeats=2, n_parallel=1)
    res = tune_model(path, log=log, trials=8, device=dev, scope="buffer", min_trials=8,
                     storage=f"sqlite:///{tmp_path / 's.db'}", options=opts, progress=False)
    assert res.tasks and res.measured >= 8
    again = tune_model(path, log=log, trials=8, device=dev, scope="buffer", min_trials=8,
                       storage=f"sqlite:///{tmp_path / 's.db'}", options=opts, progress=False)
    assert again.measured == 0  # resumed: the budget is already spent
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every layer is tuned: no fallback warning
        mod = compile_model(path, log=log, device=dev, scope="buffer")
    hist = apply_history_best(log)
    bests = []
    for n in mod.spec.nodes:
        if n.template:
            best = hist.query(n.template, n.workload, dev.info.fingerprint, n.scopes)
            assert n.tuned and n.config == best.config
            bests.append(best.config)
    untuned = compile_model(path, device=dev, scope="buffer")
    assert not any(n.tuned for n in untuned.spec.nodes if n.template)
    tuned_cfgs = [n.config for n in mod.spec.nodes if n.template]
    fallback_cfgs = [n.config for n in untuned.spec.nodes if n.template]
    # the tuned model differs from the untuned one exactly where a measured config beat the fallback (each task
    # measured its fallback first; which of 8 configs wins depends on the machine's load, so not asserted)
    assert [t != f for t, f in zip(tuned_cfgs, fallback_cfgs)] == [b != f for b, f in zip(bests, fallback_cfgs)]
    x = np.random.default_rng(0).standard_normal(mod.spec.entries["input"].shape).astype(np.float32)
    assert rel_err(mod.run([x])[0], ort_run(model, {"input": x})[0]) < 1e-4


# -- CLI ------------------------------------------------------------------------------------------------------
def test_cli_zoo_compile_run(tmp_path, capsys):
    path = str(tmp_path / "r.onnx")
    assert main(["zoo", "resnet18", "-o", path, "--input-size", "32"]) == 0
    onnx.checker.check_model(path)
    assert main(["compile", path, "-o", str(tmp_path / "a"), "--scope", "buffer",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "0 of 22 tuned layers" in out and "planned" in out
    assert main(["run", str(tmp_path / "a"), "--repeat", "2"]) == 0
    assert "median latency" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["zoo", "vgg", "-o", "x.onnx"], "vgg"),
    (["compile", "missing.onnx", "-o", "out"], "no model file 'missing.onnx'"),
    (["run", "nowhere"], "is not a compiled model"),
    (["compile", "m.onnx", "-o", "o", "--input-shape", "input:1,3"], "--input-shape"),
])
def test_cli_bad_input_exits_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    onnx.save(TEST_MODELS["relu"] if "relu" in TEST_MODELS else TEST_MODELS["clip"], "m.onnx")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_unsupported_operator_is_one_clear_error(tmp_path, capsys):
    from onnx import TensorProto, helper
    node = helper.make_node("Hardmax", ["input"], ["output"], name="probs")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])])
    path = str(tmp_path / "s.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    assert main(["compile", path, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "probs" in err and "Hardmax" in err and err.count("error:") == 1


@pytest.mark.slow
def test_demo_runs_the_whole_flow(tmp_path, capsys):
    assert main(["demo", "--dir", str(tmp_path), "--trials", "16", "--input-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "max relative error vs onnxruntime" in out and "layers use tuned configs" in out
    assert "onnxruntime (CPU) latency " in out and "x its speed (ours " in out
    last = out.rstrip().splitlines()[-1]  # what the run stands for: on a CPU, the pipeline, not speed
    assert "pipeline end to end" in last or "the latency above is this device's" in last, last


def test_demo_prints_onnxruntimes_latency_and_the_ratio(tmp_path):
    """Issue 39: the demo reports onnxruntime's latency on the same input beside ours, and the ratio."""
    import re

    from tuner.cli.model import onnxruntime_comparison
    path = str(tmp_path / "m.onnx")
    onnx.save(TEST_MODELS["mixed"], path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = sess.get_inputs()[0]
    feed = {x.name: np.zeros([d if isinstance(d, int) else 1 for d in x.shape], np.float32)}
    pattern = (r"onnxruntime \(CPU\) latency ([0-9.]+) ms \(median of 3, same input\); ours vs onnxruntime: "
               r"([0-9.]+)x its speed \(ours (faster|slower)\)")
    for ours, word in ((1e-7, "faster"), (1e3, "slower")):  # seconds of ours: far below, far above
        line = onnxruntime_comparison(sess, feed, ours, 3)
        m = re.fullmatch(pattern, line)
        assert m and m.group(3) == word and float(m.group(1)) > 0, line
        assert float(m.group(2)) == pytest.approx(float(m.group(1)) * 1e-3 / ours, rel=0.2, abs=0.006), line


def test_tune_registers_model_tasks_for_workers_and_logs_exports(tmp_path, capsys):
    from tuner.search.worker import registered_tasks
    path = str(tmp_path / "m.onnx")
    onnx.save(TEST_MODELS["mixed"], path)
    storage = f"journal:{tmp_path / 'studies.journal'}"
    assert main(["tune", path, "--storage", storage, "--workers", "0", "--trials", "20"]) == 0
    out = capsys.readouterr().out
    prefix = out.split("study prefix ")[1].split()[0]
    tasks = registered_tasks(storage, prefix)
    planned = model_tasks(path, None)
    assert len(tasks) == len(planned) > 0
    assert sorted(t.template for t in tasks.values()) == sorted(t.template for t in planned)
    assert sum(t.trials for t in tasks.values()) >= 20
    assert main(["logs", str(tmp_path / "shared.jsonl"), "--storage", storage, "--study", prefix]) == 2
    assert "0 records" in capsys.readouterr().err  # nothing measured yet: exported nothing, then no records
    assert main(["tune", path, "--workers", "0"]) == 2
    assert "--workers needs --storage" in capsys.readouterr().err


# -- mobile models: new activations, squeeze-excitation, fusion ------------------------------------------------
NEW_OPERATOR_MODELS = ["activations", "binary", "squeeze_excitation", "reduce", "reduce_axes_input", "softmax",
                       "pool_ceil", "shape_subgraph"]


@pytest.mark.parametrize("name", NEW_OPERATOR_MODELS)
def test_new_operators_in_float16_storage(name, dev):
    for scope in ("texture", "buffer"):
        _check_against_ort(TEST_MODELS[name], scope, dev, dtype="float16", tol=2e-2)


def test_activation_patterns_fuse_into_the_convolutions():
    """silu (x * sigmoid(x)), hardswish, the erf GELU both ways and the SE gate's activations end up in the
    convolutions' epilogues; the channel scale is read by the convolution after it (``in_scale``): no kernel; each
    squeeze-excite's pool (a GlobalAveragePool, a ReduceMean) and two 1x1 convolutions are one ``se_gate``."""
    g = from_onnx(TEST_MODELS["squeeze_excitation"])
    opt = optimize(g)
    assert [(n.op, n.attrs.get("activation"), n.attrs.get("in_scale")) for n in opt.nodes] == [
        ("conv2d", "silu", None), ("se_gate", "hardsigmoid(0.1666666716337204)", None),
        ("conv2d", None, "hardsigmoid0"), ("se_gate", "sigmoid", None), ("conv2d", "gelu", "sigmoid2"),
        ("conv2d", "gelu", None)]
    assert [n.attrs["act1"] for n in opt.nodes if n.op == "se_gate"] == ["relu", "silu"]
    x = random_inputs(g)
    assert rel_err(run_fused(opt, x)[g.outputs[0]], run_graph_numpy(g, x)[g.outputs[0]]) < 1e-5


def test_poolformer_block_runs_its_glue_as_one_kernel(dev):
    """PoolFormer's block: the token mixer x + ls1 * (pool(y) - y) is one pooling kernel (the sub, the scale and
    the residual fused into it), the MLP's layer scale folds into its second convolution, which takes the
    residual: GroupNorm, pool, GroupNorm, 1x1 + ReLU, 1x1 + residual. The first norm is read normalized by the
    pool (``passes_layer_norm.norms_read_by_pools``): a statistics kernel is left of it, no normalized tensor."""
    g = from_onnx(TEST_MODELS["poolformer_block"])
    opt = optimize(g)
    assert [n.op for n in opt.nodes] == ["group_norm", "avg_pool", "group_norm", "conv2d", "conv2d"]
    pool = opt.nodes[1]
    assert opt.nodes[0].attrs.get("stats") and pool.attrs["norm_stats"] == opt.nodes[0].outputs[0]
    assert (pool.attrs["post_op"], pool.attrs["post"], pool.attrs["post_normed"]) == ("sub", "input", True)
    assert pool.inputs[0] == "input" and pool.attrs["in_group_norm"][0] == 1
    assert "scale" in pool.attrs and pool.attrs["residual"] == "input" and "residual" in opt.nodes[4].attrs
    x = random_inputs(g)
    # the second norm's statistics feed the 1x1 convolution that normalizes as it reads (passes_layer_norm)
    assert opt.nodes[2].attrs.get("stats") and opt.nodes[3].attrs["norm_stats"] == opt.nodes[2].outputs[0]
    assert rel_err(run_graph_numpy(opt, x)[g.outputs[0]], run_graph_numpy(g, x)[g.outputs[0]]) < 1e-5
    for scope in ("texture", "buffer"):
        _check_against_ort(TEST_MODELS["poolformer_block"], scope, dev)


def test_mobilenet_v3_small_fuses_and_plans_its_kernels(dev):
    model = zoo.mobilenet_v3_small(num_classes=10, input_size=32, width=0.5)
    g = from_onnx(model)
    opt = optimize(g)
    # the head's pool and Flatten are one reduction writing (N, C) rows (passes.flatten_into_reductions); each
    # squeeze-excitation's pool and two 1x1 convolutions one se_gate (passes_se.fuse_squeeze_excite)
    assert {n.op for n in opt.nodes} == {"conv2d", "se_gate", "reduce_mean", "dense"}
    acts = [n.attrs.get("activation") for n in opt.nodes if n.op in ("conv2d", "dense")]
    assert acts.count("hardswish") > 10 and acts.count("relu") >= 2
    se = [n for n in opt.nodes if n.op == "se_gate"]
    assert len(se) == 9 and all((n.attrs["act1"], n.attrs["activation"]) == ("relu", "hardsigmoid(0.1666666716337204)")
                                for n in se)
    assert all(opt.producer(n.inputs[0]).attrs.get("row_sums") for n in se)  # each pool in its depthwise producer
    gated = [n for n in opt.nodes if "in_scale" in n.attrs]  # every squeeze-excitation's scale: read, not run
    assert len(gated) == 9 and all(n.attrs["groups"] == 1 and n.inputs[-1] == n.attrs["in_scale"] for n in gated)
    x = random_inputs(g)
    assert rel_err(run_fused(opt, x)["output"], run_graph_numpy(g, x)["output"]) < 1e-5
    plan = plan_storage(lower_graph(opt), dev.info, "buffer")
    assert not [s for s in plan.steps if s.op == "binary"]
    scaled = [s for s in plan.steps if "S" in s.inputs]
    assert len(scaled) == 9 and all(s.workload.in_scale and plan.tensors[s.inputs["S"]].shape[2:] == (1, 1)
                                    for s in scaled)
    tasks = extract_tasks(plan)  # what `tuner tune` tunes: every convolution, the classifier, the pool, the gates
    # no 3x3 stride-1 conv2d; the final global pool runs the spatial_reduce template, each squeeze-excitation se_gate
    assert {t.template for t in tasks} == {"conv2d", "depthwise_conv2d", "dense", "spatial_reduce", "se_gate"}
    assert sum(t.count for t in tasks) == sum(n.op in ("conv2d", "dense", "se_gate", "reduce_mean")
                                              for n in opt.nodes)
    assert any(t.workload.activation == "hardswish" for t in tasks)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("float16", 2e-2)])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_mobilenet_v3_small_matches_onnxruntime(dev, scope, dtype, tol):
    model = zoo.mobilenet_v3_small(num_classes=10, input_size=32, width=0.5)
    _check_against_ort(model, scope, dev, dtype=dtype, tol=tol)
