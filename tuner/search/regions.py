"""Where a device class's fast configs usually lie, as data: per device type (``DeviceInfo.type``) and template,
the knob values of the region a search measures first, beside the template's fallback config (``tune(...,
device_region=True)``). The region's configs are ordinary trials: the sampler learns from their measurements
as from any other. They do steer: when they are the best of the first trials, the model's local search and the
xgb sampler's TPE share (the density of the good configs) start around them, and on a layer whose best configs
lie elsewhere the search can stay near them (the report set's 12x12 conv3x3 on Intel's CPU runtime, whose best
configs are narrow: bench/notes/tuning.md, 2026-11-27).

Why these regions:
- CPU, conv2d, two modes. OpenCL CPU compilers vectorize across the work-items of dimension 0. On Intel's CPU
  runtime, of the 9 convolutions of the tuning benchmark's CPU sets (HELD_OUT, REPORT, REPORT_2), 5 are fastest
  with one output column per work-item in a work-group 16 or 32 wide (the first mode), and 4 with narrow groups
  (1 to 4 wide) of 2-D tiles, most with the reduction split in two (the second): REPORT_2's two 10x10 outputs,
  where a 16-wide group leaves 6 of its 16 work-items idle, and REPORT's conv3x3s2. 8 of the 9 take 4 output
  channels a work-item and 4-wide loads. With the wide mode alone, the search stayed near it on the narrow
  layers (bench/notes/tuning.md, 2026-11-28, fourth). Depthwise and dense layers' best configs there are
  narrow: no CPU region for them.
- GPU: occupancy, the shapes of the best configs in the committed H100 log (logs/nvidia-gpu-d4a6eca0.jsonl) and
  of the H200's tuning benchmark sets (bench/results/tuning_h200_report2/, tuning_h200_report3/).
  - Convolutions, two modes: one output (or a column of two) a work-item, over the whole channel range, with the
    reduction split over work-items (H100: tile_ow 1 in 91 of 91 best configs, tile_oc 1 in 81, tile_oh 1 or 2
    in 85, split_c 1 in 68, split_k >= 4 in 75; H200: 1x1x1 tiles with split_k 4 to 16 in 7 of 7). The work-
    group is either 8 or 16 wide (H100 45 of 91, H200 4 of 7: 16x2, 16x4, 16x1), or 1 to 4 wide, 1 to 4 high
    with the reduction split 8 to 32 ways (H100 45, most 1x1 with split_k 32; H200 3: 2x2, 4x2). Before the
    modes (``GPU_ONE_MODE``) the region named only the wide groups, and the tiles were random: the H200's misses
    on REPORT_3 were a 16x2 group and small groups (bench/notes/tuning.md, 2026-11-28, fourth).
  - Depthwise layers: one output (or two) a work-item in 8 or 16 wide groups of 1 to 4 rows (H100: 1x1 tiles
    in 25 of 36, wg_w 8 or 16 in 25; H200: 1x1 tiles in 16x2, 8x2, 16x4, 16x1 groups, the four within 95% of
    REPORT_3's dw3x3).
  - Dense layers split the reduction 8 or 16 ways (3 of 3).

A template's entry is one region (a dict of knob values) or several modes of it (a list of such dicts): each
mode gets its own ``REGION_SEEDS`` draws, the first mode's drawn with the run's seed as a single region's are.
``ONE_MODE`` is the table before the CPU's second mode (2026-11-27), ``BEFORE_GPU_MODES`` the table before the
GPU's (2026-11-28), kept for ``bench/tuning.py``'s comparisons.

A template or device type without an entry has no region (the fallback alone is measured first)."""
from __future__ import annotations

import numpy as np

GPU_REGIONS: dict = {
    "conv2d": [{"tile_oc": [1], "tile_oh": [1, 2], "tile_ow": [1], "split_c": [1], "wg_w": [8, 16], "wg_h": [1, 2, 4],
                "split_k": [4, 8, 16]},
               {"tile_oc": [1], "tile_oh": [1, 2], "tile_ow": [1], "split_c": [1], "wg_w": [1, 2, 4],
                "wg_h": [1, 2, 4], "split_k": [8, 16, 32]}],
    "depthwise_conv2d": {"tile_cb": [1], "tile_oh": [1], "tile_ow": [1, 2], "wg_w": [8, 16], "wg_h": [1, 2, 4]},
    "dense": {"split_k": [8, 16]},
}
GPU_ONE_MODE: dict = {  # the GPU regions before their modes (2026-11-28, fifth)
    "conv2d": {"wg_w": [8, 16], "wg_h": [1, 4], "split_k": [4, 8, 16]},
    "depthwise_conv2d": {"wg_w": [8, 16], "wg_h": [2, 4]},
    "dense": {"split_k": [8, 16]},
}
REGIONS: dict = {
    "CPU": {
        "conv2d": [{"tile_ow": [1], "wg_w": [16, 32], "tile_oc": [4], "vec_load": [4]},
                   {"wg_w": [1, 2, 4], "wg_h": [1], "tile_oc": [4], "tile_oh": [2, 4], "tile_ow": [1, 2],
                    "vec_load": [4], "split_k": [2], "unroll_rs": [False], "local_input": [False],
                    "cache_input": [False]}],
    },
    "GPU": GPU_REGIONS,
}
ONE_MODE: dict = {"CPU": {"conv2d": {"tile_ow": [1], "wg_w": [16, 32]}}, "GPU": GPU_ONE_MODE}
BEFORE_GPU_MODES: dict = {"CPU": REGIONS["CPU"], "GPU": GPU_ONE_MODE}  # the table of 2026-11-28, fourth
REGION_SEEDS = 2  # configs drawn from the region (from each of its modes) and measured first, after the fallback


def region_of(device_type: str, template: str, table: dict | bool | None = None) -> list:
    """The region's modes for a device type and template: a list of knob-value dicts (empty: none), from
    ``table`` (``REGIONS``' shape; None or True: ``REGIONS``; False: no region, as ``tune(device_region=...)``
    takes it)."""
    if table is False:
        return []
    table = REGIONS if table is None or table is True else table
    entry = table.get(str(device_type).upper(), {}).get(template, [])
    return [dict(m) for m in (entry if isinstance(entry, list) else [entry]) if m]


def bound_mode(space, mode: dict) -> dict:
    """``mode`` (knob values) restricted to ``space``'s knobs and the values they offer; knobs left with no value
    are dropped (empty: the mode says nothing about this space)."""
    out = {k: [v for v in vals if v in space.choices[k]] for k, vals in mode.items() if k in space.choices}
    return {k: v for k, v in out.items() if v}


def in_mode(mode: dict, values: dict) -> bool:
    """Whether ``values`` (a config's knobs) lie in ``mode`` (``bound_mode``'s output): each knob the mode names
    takes one of its values."""
    return bool(mode) and all(values.get(k) in vals for k, vals in mode.items())


def region_configs(space, region, count: int, seed, exclude=(), tries: int = 400) -> list:
    """Up to ``count`` distinct valid configs of ``space`` (a bound space) whose knobs named in ``region`` take
    one of its values: random valid configs with those knobs redrawn from the region, kept where the space's
    constraints accept them. ``exclude``: config keys (tuples in the space's knob order) to skip. A region
    naming a knob the space does not have, or values the knob does not offer, is ignored for that knob.
    ``region`` a list of modes (``region_of``): up to ``count`` configs of each, all distinct, the first mode's
    drawn with ``seed`` and mode i's with ``(seed, i)``."""
    names = list(space.choices)
    if isinstance(region, list):
        out, keys = [], set(exclude)
        for i, mode in enumerate(region):
            got = region_configs(space, mode, count, seed if i == 0 or seed is None else (seed, i), keys, tries)
            keys |= {tuple(v[n] for n in names) for v in got}
            out += got
        return out
    region = bound_mode(space, region)
    if not region or count <= 0:
        return []
    rng = np.random.default_rng(seed)
    out, keys = [], set(exclude)
    for _ in range(tries):
        values = space.sample(rng)
        for k, vals in region.items():
            values[k] = vals[int(rng.integers(len(vals)))]
        key = tuple(values[n] for n in names)
        if key in keys or space.violations(values):
            continue
        keys.add(key)
        out.append(values)
        if len(out) >= count:
            break
    return out
