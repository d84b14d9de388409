"""Memory planning: hand-made lifetimes with known answers, check_plan on broken plans, a property test on random
lifetimes, and a MobileNetV2-like model."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from tuner.plan.allocation import Entry, MemoryPlan, Pool, check_plan, live_ranges, plan_memory


def tex(name, h, w, first, last, dtype="float32", scope="texture"):
    return Entry(name, scope, dtype, (h, w, 4), first, last)


def buf(name, n, first, last, dtype="float32"):
    return Entry(name, "global", dtype, n, first, last)


def planned(entries) -> MemoryPlan:
    plan = plan_memory(entries)
    check_plan(entries, plan)
    return plan


def ids(plan, *names):
    return [plan.storage_id[n] for n in names]


@pytest.mark.parametrize("make", [lambda n, f, l: buf(n, 1000, f, l), lambda n, f, l: tex(n, 16, 16, f, l)])
def test_chain_reuses_two_storages(make):
    # A -> B -> C -> D: steps 0, 1, 2; B (output of step 0) may not take A's storage, C may.
    entries = [make("A", 0, 0), make("B", 0, 1), make("C", 1, 2), make("D", 2, 2)]
    plan = planned(entries)
    assert ids(plan, "A", "B", "C", "D") == [0, 1, 0, 1]
    assert len(plan.pools) == 2 and plan.planned_bytes() * 2 == plan.naive_bytes()
    # the model input kept by the caller (last = n_steps) is never reused
    kept = planned([make("A", 0, 3)] + entries[1:])
    assert ids(kept, "A", "B", "C", "D") == [0, 1, 2, 1]


def test_output_never_takes_an_input_of_its_own_node():
    plan = planned([buf("x", 100, 0, 1), buf("y", 100, 1, 1)])  # y produced by the node that last reads x
    assert plan.storage_id["x"] != plan.storage_id["y"]


def test_residual_block_keeps_the_skip_tensor():
    # in -> x; x -> y1 -> y2; z = x + y2 (x read again at step 3)
    steps = [(["in"], ["x"]), (["x"], ["y1"]), (["y1"], ["y2"]), (["x", "y2"], ["z"])]
    ranges = live_ranges(steps, keep=["z"])
    assert ranges == {"in": (0, 0), "x": (0, 3), "y1": (1, 2), "y2": (2, 3), "z": (3, 4)}
    plan = planned([tex(t, 64, 32, f, l) for t, (f, l) in ranges.items()])
    assert ids(plan, "in", "x", "y1", "y2", "z") == [0, 1, 0, 2, 0]
    assert [t for t, s in plan.storage_id.items() if s == plan.storage_id["x"]] == ["x"]


def test_texture_grows_the_pool_needing_least_added_area():
    # idle pools (10 x 100) and (50 x 20); a (40 x 30) request adds 3000 pixels to the first, 500 to the second
    plan = planned([tex("a", 10, 100, 0, 0), tex("b", 50, 20, 0, 0), tex("c", 40, 30, 1, 1)])
    assert plan.storage_id["c"] == plan.storage_id["b"] == 1
    assert [p.shape for p in plan.pools] == [(10, 100, 4), (50, 30, 4)]


def test_texture_fitting_pool_with_least_waste_wins():
    plan = planned([tex("big", 20, 20, 0, 0), tex("tall", 12, 9, 0, 0), tex("snug", 10, 10, 0, 0),
                    tex("r", 9, 9, 1, 1)])
    assert plan.storage_id["r"] == plan.storage_id["snug"] == 2
    assert plan.pools[2].shape == (10, 10, 4)  # a fitting pool does not grow


def test_texture_growth_costlier_than_a_new_texture_makes_a_new_pool():
    # growing (10 x 50) to hold (20 x 10) adds 500 pixels; a new texture costs 200
    plan = planned([tex("a", 10, 50, 0, 0), tex("b", 20, 10, 1, 1)])
    assert ids(plan, "a", "b") == [0, 1] and plan.planned_bytes() == plan.naive_bytes()


def test_textures_share_only_within_scope_and_dtype():
    plan = planned([tex("t32", 8, 8, 0, 0), tex("t16", 8, 8, 1, 1, dtype="float16"),
                    tex("w", 8, 8, 1, 1, scope="texture:weight"), buf("g", 256, 1, 1), tex("x", 8, 8, 1, 1)])
    assert ids(plan, "t32", "t16", "w", "g", "x") == [0, 1, 2, 3, 0]
    assert [(p.scope, p.dtype) for p in plan.pools] == [("texture", "float32"), ("texture", "float16"),
                                                         ("texture:weight", "float32"), ("global", "uint8")]
    assert plan.scope_of("w") == "texture:weight" and plan.scope_of("g") == "global"


def test_buffers_of_any_dtype_share_by_bytes():
    plan = planned([buf("a", 100, 0, 0), buf("b", 200, 1, 1, dtype="float16"), buf("c", 300, 2, 2, "float16")])
    assert ids(plan, "a", "b", "c") == [0, 0, 0]
    assert plan.pools == [Pool(0, "global", "uint8", (600,))]  # grown from 400 bytes to c's 600


def test_buffer_takes_smallest_fitting_pool_and_skips_far_sizes():
    plan = planned([buf("big", 1000, 0, 0), buf("mid", 100, 0, 0), buf("tiny", 4, 0, 0),
                    buf("r", 90, 1, 1), buf("huge", 1 << 20, 1, 1)])
    assert plan.storage_id["r"] == plan.storage_id["mid"]
    assert plan.storage_id["huge"] == 3  # big (1000 x 4 bytes) is over 16 times smaller: a new pool


def test_bytes_per_scope_family_and_summary():
    plan = planned([buf("a", 100, 0, 1), buf("b", 100, 1, 1), tex("t", 4, 4, 0, 0),
                    tex("u", 4, 4, 1, 1, scope="texture:weight")])
    assert (plan.planned_bytes("buffer"), plan.naive_bytes("buffer")) == (800, 800)
    assert (plan.planned_bytes("texture"), plan.naive_bytes("texture:weight")) == (512, 256)
    assert plan.planned_bytes() == plan.naive_bytes() == 1312
    lines = plan.summary().splitlines()
    assert lines[0].split() == ["scope", "pools", "planned", "bytes", "naive", "bytes", "saving"]
    assert [ln.split()[0] for ln in lines[1:]] == ["global", "texture", "texture:weight", "total"]
    assert lines[-1].split() == ["total", "4", "1,312", "1,312", "0.0%"]


@pytest.mark.parametrize("storage_id, pools, message", [
    ({"a": 0, "b": 0}, [Pool(0, "global", "uint8", (400,))], r"'a' \(steps 0..1\) and 'b' \(steps 1..1\)"),
    ({"a": 0, "b": 1}, [Pool(0, "global", "uint8", (400,)), Pool(1, "global", "uint8", (300,))], "'b'.*400 bytes"),
    ({"a": 0, "b": 1}, [Pool(0, "global", "uint8", (400,)), Pool(1, "texture", "float32", (10, 10, 4))], "'b'"),
    ({"a": 0}, [Pool(0, "global", "uint8", (400,))], "'b' has no storage id"),
])
def test_check_plan_rejects_broken_buffer_plans(storage_id, pools, message):
    entries = [buf("a", 100, 0, 1), buf("b", 100, 1, 1)]
    with pytest.raises(ValueError, match=message):
        check_plan(entries, MemoryPlan(storage_id, pools, entries))


@pytest.mark.parametrize("pool, message", [(Pool(0, "texture", "float32", (8, 7, 4)), "does not fit"),
                                           (Pool(0, "texture", "float16", (8, 8, 4)), "same scope and dtype"),
                                           (Pool(0, "texture:weight", "float32", (8, 8, 4)), "same scope")])
def test_check_plan_rejects_broken_texture_plans(pool, message):
    entries = [tex("t", 8, 8, 0, 0)]
    with pytest.raises(ValueError, match=message):
        check_plan(entries, MemoryPlan({"t": 0}, [pool], entries))


@pytest.mark.parametrize("make, message", [
    (lambda: Entry("x", "local", "float32", 4, 0, 0), "scope 'local' cannot be planned"),
    (lambda: Entry("x", "global", "floaty", 4, 0, 0), "unknown dtype 'floaty'"),
    (lambda: Entry("x", "texture", "float32", (4, 4), 0, 0), r"\(height, width, 4\)"),
    (lambda: Entry("x", "global", "float32", (4, 0), 0, 0), "positive extents"),
    (lambda: Entry("x", "global", "float32", 4, 2, 1), "first=2, last=1"),
    (lambda: plan_memory([buf("x", 4, 0, 0), buf("x", 4, 1, 1)]), "'x' appears twice"),
    (lambda: live_ranges([(["a"], ["b"])], keep=["c"]), "'c' is neither read nor produced"),
])
def test_bad_input_is_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


entry_specs = st.lists(st.tuples(st.sampled_from(["global", "texture", "texture:weight"]),
                                 st.sampled_from(["float32", "float16"]), st.integers(1, 40), st.integers(1, 40),
                                 st.integers(0, 12), st.integers(0, 6)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(entry_specs)
def test_random_lifetimes_plan_validly_and_never_exceed_naive(specs):
    entries = [tex(f"e{i}", h, w, f, f + n, dt, sc) if sc != "global" else buf(f"e{i}", h * w, f, f + n, dt)
               for i, (sc, dt, h, w, f, n) in enumerate(specs)]
    plan = planned(entries)
    for family in (None, "buffer", "texture"):
        assert plan.planned_bytes(family) <= plan.naive_bytes(family)
    # at least as many pools as entries live at the busiest step of each scope and dtype
    for scope, dtype in {(e.scope, e.dtype) for e in entries if e.texture}:
        live = max(sum(e.first <= s <= e.last for e in entries if (e.scope, e.dtype) == (scope, dtype))
                   for s in range(20))
        assert sum((p.scope, p.dtype) == (scope, dtype) for p in plan.pools) >= live
    assert plan_memory(entries) == plan  # deterministic


def test_equal_layers_chain_needs_exactly_two_storages():
    steps = [([f"t{i}"], [f"t{i + 1}"]) for i in range(20)]
    plan = planned([tex(t, 256, 56, f, l) for t, (f, l) in live_ranges(steps).items()])
    assert sorted(set(plan.storage_id.values())) == [0, 1] and plan.planned_bytes() * 21 == plan.naive_bytes() * 2


def mobilenet_v2(size=224):
    """The activations of MobileNetV2 as (inputs, outputs) steps and NCHW shapes; residual adds fused into the
    projection conv, which reads the block input as a second operand."""
    shapes, steps = {"input": (1, 3, size, size)}, []

    def node(inputs, out, shape):
        steps.append((inputs, [out]))
        shapes[out] = shape
        return out

    h = size // 2
    x, c = node(["input"], "stem", (1, 32, h, h)), 32
    for t, cout, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                          (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride, k = (s if i == 0 else 1), len(steps)
            y = x if t == 1 else node([x], f"expand{k}", (1, c * t, h, h))
            h //= stride
            y = node([y], f"dw{k}", (1, c * t, h, h))
            x, c = node([y] + ([x] if stride == 1 and c == cout else []), f"project{k}", (1, cout, h, h)), cout
    node([node([node([x], "head", (1, 1280, h, h))], "pool", (1, 1280, 1, 1))], "fc", (1, 1000))
    return steps, shapes


@pytest.mark.parametrize("textures", [True, False])
def test_mobilenet_v2_plans_far_below_naive(textures):
    steps, shapes = mobilenet_v2()
    entries = []
    for t, (f, l) in live_ranges(steps, keep=["input", "fc"]).items():
        n, ch, hh, ww = shapes[t] if len(shapes[t]) == 4 else (0, 0, 0, 0)
        entries.append(tex(t, n * math.ceil(ch / 4) * hh, ww, f, l, "float16") if textures and n  # NCHW4c, C0
                       else buf(t, math.prod(shapes[t]), f, l, "float16"))
    plan = planned(entries)
    peak = max(sum(e.nbytes for e in entries if e.first <= s <= e.last) for s in range(len(steps) + 1))
    ratio = plan.planned_bytes() / plan.naive_bytes()
    print(f"\n{plan.summary()}\nplanned / naive = {ratio:.3f}, planned / peak live = {plan.planned_bytes() / peak:.2f}")
    assert len(entries) == len(steps) + 1 == 55
    assert ratio < 0.45 and plan.planned_bytes() < 1.7 * peak
    assert len(plan.pools) <= 12
