"""The fallback rules that shape an untuned layer for a GPU (``templates/common.gpu_fill_target``): on a large GPU
the fallback of a convolution, a depthwise or a dense layer gives the device the work-items it keeps in flight,
the way every best config of the H100's and H200's logs does; on a phone GPU of few compute units, and on a CPU,
it keeps its wider tiles (a CPU's convolution takes one column per work-item in a wide work-group instead). Each
pick is a valid config of the template's space. No device: device profiles."""
from __future__ import annotations

import math

import pytest

from conftest import profile
from tuner.templates import get_template
from tuner.templates.common import GPU_ITEMS_PER_UNIT, gpu_fill_target

BIG = profile(name="H100-like")
PHONE = profile(name="Adreno-like", compute_units=2, local_mem_bytes=32768)
CPU = profile(name="CPU", type="CPU", compute_units=2, image_support=False, half_images=False)

DEPTHWISE = [((1, 32, 112, 112), 3, 1), ((1, 144, 56, 56), 3, 2), ((1, 672, 14, 14), 5, 1), ((1, 960, 7, 7), 5, 1),
             ((1, 240, 2, 2), 5, 1)]
DENSE = [((1, 1280), (1000, 1280)), ((1, 512), (1000, 512)), ((1, 576), (1024, 576)), ((4, 128), (256, 128))]


def _depthwise(data, k, stride):
    t = get_template("depthwise_conv2d")
    return t, t.workload(data=data, kernel=(data[1], 1, k, k), stride=stride, padding=k // 2)


def _valid(t, wl, info):
    cfg = t.fallback(wl, info)
    t.space(wl, info).check(t.config_values(wl, cfg))  # raises on a config the space rejects
    return cfg


def test_the_fill_target_is_per_compute_unit_on_a_gpu_only():
    assert gpu_fill_target(BIG) == 132 * GPU_ITEMS_PER_UNIT
    assert gpu_fill_target(PHONE) == 2 * GPU_ITEMS_PER_UNIT
    assert gpu_fill_target(CPU) == 0


@pytest.mark.parametrize("data,k,stride", DEPTHWISE)
def test_depthwise_fallback_narrows_its_tiles_until_the_gpu_is_full(data, k, stride):
    t, wl = _depthwise(data, k, stride)
    big, phone, cpu = (_valid(t, wl, i) for i in (BIG, PHONE, CPU))
    v = t.space_vars(wl)
    items = lambda c: v["N"] * v["CB"] * v["OH"] * math.ceil(v["OW"] / c.tile_ow)  # noqa: E731
    # a wider tile is taken only while the work still fills the device
    assert big.tile_ow == 1 or items(big) >= gpu_fill_target(BIG)
    assert big.tile_ow <= phone.tile_ow <= cpu.tile_ow
    if data[2] >= 56:  # a large early layer fills a 2-unit phone GPU with 4 columns per work-item
        assert phone.tile_ow == cpu.tile_ow == 4
    # __local staging: on a GPU at stride 1 where a work-group shares the tile; never on the CPU
    assert big.local_input == (stride == 1 and big.wg_w * big.wg_h > 1)
    assert not cpu.local_input


def test_depthwise_fallback_on_a_big_gpu_is_one_column_per_work_item():
    t, wl = _depthwise((1, 672, 14, 14), 5, 1)  # 168 x 14 x 14 = 32,928 items at one column: < 135,168
    assert _valid(t, wl, BIG).tile_ow == 1


@pytest.mark.parametrize("data,weight", DENSE)
def test_dense_fallback_splits_the_reduction_and_keeps_a_work_group_per_compute_unit(data, weight):
    t = get_template("dense")
    wl = t.workload(data=data, weight=weight)
    big, phone, cpu = (_valid(t, wl, i) for i in (BIG, PHONE, CPU))
    v = t.space_vars(wl)
    if data[0] == 1:
        assert big.split_k == 16  # every best dense config in the H100's and H200's logs
        assert math.ceil(v["MB"] / big.wg_m) >= BIG.compute_units
        assert cpu.split_k == 8 and cpu.wg_m == 64  # unchanged on a CPU
    else:
        assert big.split_k == cpu.split_k == 1  # a batch is already parallel
    assert phone.wg_m * phone.split_k <= PHONE.max_work_group_size


def test_conv2d_fallback_fills_a_big_gpu_and_leaves_a_cpu_alone():
    t = get_template("conv2d")
    wl = t.workload(data=(1, 512, 7, 7), kernel=(512, 512, 3, 3), padding=1)
    big, cpu = _valid(t, wl, BIG), _valid(t, wl, CPU)
    assert big.split_k > 1 and (big.tile_ow, big.tile_oc) < (cpu.tile_ow, cpu.tile_oc)
    assert cpu.split_k == 1


@pytest.mark.parametrize("data,kernel,groups", [
    ((1, 64, 56, 56), (64, 64, 3, 3), 1), ((1, 24, 20, 20), (48, 24, 3, 3), 1), ((1, 512, 7, 7), (512, 512, 3, 3), 1),
    ((1, 32, 14, 14), (32, 8, 3, 3), 4), ((1, 8, 9, 9), (4, 8, 1, 1), 1)])
def test_conv2d_fallback_on_a_cpu_is_one_column_per_work_item_in_a_wide_group(data, kernel, groups):
    """CPU compilers vectorize across the work-items of dimension 0 (2026-11-26, Intel's CPU runtime: this rule's
    fallbacks take 0.47x the old ones' kernel time on ResNet-18 at 224, bench/notes/config-transfer.md)."""
    t = get_template("conv2d")
    wl = t.workload(data=data, kernel=kernel, padding=kernel[2] // 2, groups=groups)
    cpu, v = _valid(t, wl, CPU), t.space_vars(wl)
    assert cpu.tile_ow == 1 and cpu.wg_w == min(32, 1 << (v["OW"] - 1).bit_length()) and cpu.wg_h <= 2
    assert cpu.tile_oc == (4 if v["OBG"] >= 4 and (groups == 1 or v["OBG"] % 4 == 0) else cpu.tile_oc)
    assert cpu.vec_load == 4 and cpu.split_c == cpu.split_k == 1


NORMS = [((1, 128, 28, 28), 32), ((1, 256, 14, 14), 32), ((1, 128, 32, 32), 128), ((1, 64, 64, 64), 64),
         ((1, 64, 56, 56), 32), ((1, 128, 4, 16), 1), ((1, 32, 128, 128), 32), ((1, 64, 112, 112), 32),
         ((1, 64, 56, 56), 1), ((2, 3, 5, 5), 3)]


@pytest.mark.parametrize("data,groups", NORMS)
def test_a_gpu_norm_is_one_launch_until_its_unit_is_long(data, groups):
    """On a GPU a norm runs in one launch (work-groups of up to 512) while a unit is at most 8 texels a
    work-item, else in chunks of about 4 texels a work-item -- the H200's best configs of the held-out models'
    norms (``reduction.norm_schedule``). A CPU keeps the reductions' common rule."""
    from tuner.templates.reduction import fallback_schedule
    t = get_template("group_norm")
    wl = t.workload(data=data, groups=groups)
    E = t.space_vars(wl)["E"]
    big, phone, cpu = (_valid(t, wl, i) for i in (BIG, PHONE, CPU))
    for cfg in (big, phone):
        assert cfg.wg_reduce * cfg.units_per_wg <= 1024
        if E <= 8 * 512:
            assert cfg.split == 1 and cfg.wg_reduce == min(512, 1 << (E - 1).bit_length())
        else:
            assert cfg.split > 1 and math.ceil(E / cfg.split) <= 4 * 512 < math.ceil(E / (cfg.split // 2))
            assert cfg.wg_reduce == 512
    v = t.space_vars(wl)
    assert (cpu.wg_reduce, cpu.units_per_wg, cpu.split) == tuple(fallback_schedule(v["U"], E, CPU).values())


def test_a_norm_on_a_gpu_of_small_work_groups_splits_sooner():
    small = profile(name="Mali-like", compute_units=10, max_work_group_size=256, max_work_item_sizes=[256, 256, 256],
                    local_mem_bytes=32768)
    t = get_template("group_norm")
    wl = t.workload(data=(1, 64, 64, 64), groups=64)  # 4096 texels a unit: 8 a work-item at 512, 16 at 256
    assert _valid(t, wl, BIG).split == 1
    cfg = _valid(t, wl, small)
    assert cfg.wg_reduce == 256 and cfg.split == 4
