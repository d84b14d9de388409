"""``DenseConfig.pool_stage``: a dense reading a global average pool's maps (``in_pool``) whose work-group pools
them into local memory once, before its reduction loop -- a classifier of many classes (ImageNet's 1000), where
each work-item pooling the blocks it reads would read the maps once an output block. Against NumPy, and the plan
that fuses a wide classifier's pool into its dense only where the log measured that faster."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import onnx
import pytest
from test_templates import scopes
from tuner.compile.compiler import compile_model, load_graph
from tuner.logs import SCHEMA_VERSION, Record, apply_history_best
from tuner.plan.lower import lower_graph, plan_storage
from tuner.templates import get_template
from tuner.templates.dense import POOL_ITEM_BLOCKS
from tuner.zoo.builder import _Builder

# a classifier's (1280 features of 7x7 maps, 1000 classes: EfficientNet-B0's); several rows of a partial last block
# with the rows tiled; rows layer-normalized as read too; 4i weights
WORKLOADS = [dict(data=(1, 1280), weight=(1000, 1280), bias=True, in_pool=(7, 7)),
             dict(data=(3, 42), weight=(22, 42), bias=True, activation="relu", in_pool=(3, 5)),
             dict(data=(2, 36), weight=(30, 36), bias=True, in_pool=(2, 2), in_norm=1e-5)]


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_staged_pools_match_numpy(device, scope):
    """Random configs of the space with ``pool_stage``, and some of its shapes forced (the rows tiled, 4i weights,
    a split), against NumPy (on PoCL built with its optimizer, specialized to the local size)."""
    from conftest import check_random_configs
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    checks = [("dense", f, "float32", seed, dict(pool_stage=True, **scopes(scope)))
              for f in WORKLOADS for seed in (0, 1)]
    checks += [("dense", WORKLOADS[1], "float32", 2, dict(pool_stage=True, tile_n=2, split_k=2, **scopes(scope))),
               ("dense", WORKLOADS[0], "float32", 3, dict(pool_stage=True, weight_pack="4i", **scopes(scope)))]
    check_random_configs(device, checks)


def test_the_space_and_the_fallback():
    """``pool_stage`` needs ``in_pool`` (the template names it otherwise); the GPU fallback stages a wide
    classifier's pool in work-groups as wide as it can, and a narrow one's work-items pool as before; each
    fallback lies in the space."""
    from conftest import profile
    t = get_template("dense")
    plain = t.workload(data=(1, 1280), weight=(1000, 1280), bias=True)
    assert t.space(plain, profile(), pool_stage=True).size() == 0
    with pytest.raises(ValueError, match="pool_stage"):
        t.build(plain, t.config(pool_stage=True, **scopes("buffer")))
    for info in (profile(), profile(local_mem_bytes=16384), profile(type="CPU", compute_units=4)):
        for f in (WORKLOADS[0], dict(data=(1, 96), weight=(4 * POOL_ITEM_BLOCKS, 96), in_pool=(4, 4))):
            wl = t.workload(**f)
            cfg = t.fallback(wl, info)
            assert not t.space(wl, info).violations(t.config_values(wl, cfg)), (info.name, f, cfg)
            assert cfg.pool_stage == (wl.weight[0] > 4 * POOL_ITEM_BLOCKS), (info.name, f, cfg)
    assert t.fallback(t.workload(**WORKLOADS[0]), profile()).wg_m == 64
    # 40x40 maps: a staged work-group would pool more than 1,280 texels a work-item, so the fallback does not stage,
    # and its work-groups are the plain dense's (a work-group a compute unit), not the staged ones' widest
    big_maps = t.workload(data=(1, 96), weight=(80, 96), in_pool=(40, 40))
    plain = t.fallback(t.workload(data=(1, 96), weight=(80, 96)), profile())
    assert (t.fallback(big_maps, profile()).pool_stage, t.fallback(big_maps, profile()).wg_m) == (False, plain.wg_m)


def test_the_space_counts_the_means_local_memory(device):
    """Every sampled config declares no more local memory than ``pool_stage_local`` counts: on a device with one
    byte less than it declares, the space refuses it."""
    from test_norm_stats_in_producers import _local_memory_refusals
    for fields in WORKLOADS:
        for cfg, _, used, refused in _local_memory_refusals(device, "dense", fields, 0, 6, pool_stage=True):
            assert "pool_stage_local" in refused, (fields, cfg, used, refused)


def _classifier(classes: int) -> onnx.ModelProto:
    """A convolution, its global average pool, Flatten and a Gemm of ``classes`` outputs."""
    b = _Builder(seed=3, opset=17)
    x = b.input("input", (1, 8, 6, 6))
    y = b.node("Flatten", [b.node("GlobalAveragePool", [b.node("Relu", [b.conv(x, 8, 24, 3, bias=True)])])])
    b.node("Gemm", [y, b.const("fc_w", b.rng.normal(0, 0.3, (classes, 24))),
                    b.const("fc_b", b.rng.normal(0, 1, classes))], output="output", transB=1)
    return b.model({"output": [1, classes]}, "classifier")


def _record(op, workload, step_scopes, info, median):
    t = get_template(op)
    cfg = t.fallback_with(workload, info, **{f"{k}_scope": v for k, v in step_scopes.items()}, **t.model_knobs)
    return Record(version=SCHEMA_VERSION, template=t.name, workload=workload.key(), scopes=dict(step_scopes),
                  config=dataclasses.asdict(cfg), device=info.fingerprint, costs=[median], median_s=median,
                  gflops=1.0, error_code=0, error_name="NO_ERROR")


@pytest.mark.parametrize("fused_us,pool_us,expect", [(None, 5.0, False), (14.0, 5.0, True), (16.0, 5.0, False),
                                                     (14.0, None, False)])
def test_a_wide_classifier_reads_its_pool_where_the_log_measured_it_faster(device, tmp_path, fused_us, pool_us,
                                                                            expect):
    """40 classes (10 output blocks, more than ``POOL_ITEM_BLOCKS``): the dense reads the pool's maps itself only
    where the log has records of it faster than the dense (10 us) and the pool (5 us) apart -- none, 14 us, 16 us;
    and 14 us with no record of the pool: not measured against it, not fused. Either way the model matches
    onnxruntime."""
    import onnxruntime as ort
    info, model = device.info, _classifier(40)
    plan = plan_storage(lower_graph(load_graph(model)), info, "buffer")
    dense = next(s for s in plan.steps if s.op == "dense")
    pool = next(s for s in plan.steps if s.op == "spatial_reduce")
    records = [_record("dense", dense.workload, dense.scopes, info, 10e-6)]
    if pool_us is not None:
        records.append(_record("spatial_reduce", pool.workload, pool.scopes, info, pool_us * 1e-6))
    if fused_us is not None:
        fused = dataclasses.replace(dense.workload, in_pool=(6, 6))
        records.append(_record("dense", fused, dense.scopes, info, fused_us * 1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, log=apply_history_best(records), device=device, scope="buffer")
    kernels = [n.template or n.op for n in mod.spec.nodes]
    head = next(n for n in mod.spec.nodes if n.template == "dense")
    assert bool(head.workload.get("in_pool")) == expect and ("spatial_reduce" in kernels) != expect, kernels
    assert bool(head.config.get("pool_stage")) == expect
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    assert np.abs(mod.run([x])[0] - want).max() <= 1e-4 * np.abs(want).max()
