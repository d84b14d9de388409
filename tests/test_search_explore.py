"""The xgb sampler's exploration and transfer weighting (issue 37), on synthetic objectives without a device: the
transfer's weight follows how well the corpus ranks this task's measurements, the model-free share follows how
well the model ranks fresh ones, and tune() measures the fallback and the device class's region first."""
import hashlib
import math

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from conftest import profile
from tuner.errors import TunerError
from tuner.logs import load_records
from tuner.measure import MeasureResult
from tuner.measure.runner import Runner
from tuner.search import XGBSampler, make_sampler, tune
from tuner.search.regions import BEFORE_GPU_MODES, ONE_MODE, REGION_SEEDS, region_configs, region_of
from tuner.search.samplers import rank_correlation, trust
from tuner.templates import get_template

BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}
CPU = profile(name="CPU", type="CPU", compute_units=2, image_support=False, half_images=False, image2d_max_width=0,
              image2d_max_height=0, max_work_item_sizes=[1024, 1024, 1024], local_mem_bytes=32768, fp16=False)
T = get_template("conv2d")
WL = T.workload(data=(1, 16, 16, 16), kernel=(16, 16, 3, 3), padding=1)
OTHERS = [T.workload(data=(1, 8, 12, 12), kernel=(16, 8, 3, 3), padding=1),
          T.workload(data=(1, 16, 10, 10), kernel=(8, 16, 1, 1))]


def space_of(wl):
    from tuner.logs.record import scope_knobs
    return T.space(wl, CPU, **scope_knobs(BUFFERS))


def smooth(v: dict) -> float:
    """A synthetic GFLOP/s: wide work-groups over one column each are fast, the rest by tile and split."""
    wide = v["wg_w"] >= 16 and v["tile_ow"] == 1
    return 10.0 * (3.0 if wide else 1.0) * (1 + 0.3 * math.log2(v["tile_oc"])) / (1 + 0.2 * math.log2(v["split_c"]))


def noise(v: dict) -> float:
    """A GFLOP/s no model can learn: a hash of the config (sha1: the same in every process)."""
    digest = hashlib.sha1(repr(sorted((k, str(x)) for k, x in v.items())).encode()).hexdigest()
    return 1.0 + int(digest[:8], 16) % 1000 / 100.0


def corpus(score, n: int = 24) -> list:
    """``(vars, values, GFLOP/s)`` of ``n`` random configs of each other workload, scored by ``score``."""
    rng = np.random.default_rng(7)
    rows = []
    for wl in OTHERS:
        sp = space_of(wl)
        for _ in range(n):
            v = sp.sample(rng)
            rows.append((T.space_vars(wl), v, score(v)))
    return rows


def drive(sampler, objective, trials: int) -> optuna.Study:
    """``trials`` proposals of ``sampler`` told ``objective``'s value, one at a time."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = {n: CategoricalDistribution(c) for n, c in sampler.space.choices.items()}
    for _ in range(trials):
        tr = study.ask(dists)
        study.tell(tr, objective(tr.params))
    return study


def xgb(transfer=None, seed=0, **kw) -> XGBSampler:
    return XGBSampler(space_of(WL), "conv2d", T.space_vars(WL), seed=seed, transfer=transfer, **kw)


def test_rank_correlation_and_trust():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 1, 2, 2], [0, 0, 5, 5]) == pytest.approx(1.0)  # ties share their rank
    assert rank_correlation([1, 1, 1], [1, 2, 3]) == 0.0 and rank_correlation([1, 2], [1, 2]) == 0.0
    assert trust(-1.0, 3, 0.3) == 1.0  # too few measurements to judge
    assert trust(0.5, 24, 0.3) == 1.0  # as good as the reference: full weight
    assert trust(-0.3, 24, 0.3) == 0.0  # the wrong way: none
    chance = [trust(0.0, n, 0.3) for n in (8, 24, 48)]
    assert chance == sorted(chance, reverse=True) and chance[0] == 1.0 and 0.3 < chance[2] < 0.6  # slowly


def test_a_misleading_corpus_loses_its_weight_and_a_helpful_one_keeps_it():
    bad = xgb(corpus(lambda v: 1.0 / smooth(v)))  # the corpus ranks the other way round
    drive(bad, smooth, 24)
    good = xgb(corpus(smooth))
    drive(good, smooth, 24)
    assert bad.transfer_weight == 0.0 and good.transfer_weight == 1.0
    fixed = xgb(corpus(lambda v: 1.0 / smooth(v)), weigh_transfer=False)
    drive(fixed, smooth, 24)
    assert fixed.transfer_weight == 1.0  # weighing off: the corpus counts in full


def test_the_model_free_share_follows_the_models_rank_correlation_on_fresh_measurements():
    lo, hi = 0.1, 0.5
    learnable = xgb(share=(lo, hi))
    study = drive(learnable, smooth, 40)
    unlearnable = xgb(share=(lo, hi))
    drive(unlearnable, noise, 40)
    assert learnable.fresh_rho > 0.5 and unlearnable.fresh_rho < 0.3
    assert lo <= learnable.share < unlearnable.share <= hi
    by = [tr.user_attrs.get("search", {}).get("by") for tr in study.trials]
    assert "tpe" in by and "model" in by  # both kinds of proposal, each noted on its trial
    none = xgb(explore="none", far=(0.0, 0.0))
    none_study = drive(none, smooth, 24)
    assert {tr.user_attrs.get("search", {}).get("by") for tr in none_study.trials} <= {None, "model"}


def test_model_free_proposals_find_the_region_a_misleading_corpus_hides():
    """With the corpus at full weight saying wide work-groups are slow, a model-only search (the xgb of
    2026-11-26) measures few wide configs; the model-free share measures them and finds the best region."""
    misleading = corpus(lambda v: 1.0 / smooth(v))
    wide = lambda study: sum(tr.params["wg_w"] >= 16 and tr.params["tile_ow"] == 1 for tr in study.trials)  # noqa: E731
    old = [wide(drive(xgb(misleading, seed=s, explore="none", weigh_transfer=False, far=(0.0, 0.0)), smooth, 32)) for s in (0, 1)]
    new = [wide(drive(xgb(misleading, seed=s), smooth, 32)) for s in (0, 1)]
    assert sum(new) > sum(old) + 4, (old, new)


def test_sampler_options_are_checked():
    with pytest.raises(TunerError, match="explore='bogus': one of tpe, bonus, none"):
        xgb(explore="bogus")
    with pytest.raises(TunerError, match="XGBSampler's; sampler 'tpe' takes none"):
        make_sampler("tpe", space_of(WL), "conv2d", T.space_vars(WL), options={"explore": "none"})
    with pytest.raises(TunerError, match="xgb sampler options"):
        make_sampler("xgb", space_of(WL), "conv2d", T.space_vars(WL), options={"nope": 1})


def test_an_uncertainty_bonus_ranks_with_an_ensemble():
    s = xgb(corpus(smooth), explore="bonus", ensemble=3)
    study = drive(s, smooth, 12)
    assert s.model_fits >= 3 * 2  # three models a fit
    assert max(tr.value for tr in study.trials) == max(smooth(v) for v in [tr.params for tr in study.trials])


def test_region_configs_lie_in_the_region_and_the_space():
    sp = space_of(WL)
    modes = region_of("CPU", "conv2d")
    assert modes and region_of("cpu", "conv2d") == modes and region_of("CPU", "nope") == []
    assert region_of("CPU", "conv2d", True) == modes and region_of("CPU", "conv2d", False) == []  # as tune() takes it
    region = modes[0]
    got = region_configs(sp, region, 5, seed=0)
    assert len(got) == 5 and len({tuple(v.values()) for v in got}) == 5
    assert all(not sp.violations(v) and all(v[k] in vals for k, vals in region.items()) for v in got)
    assert region_configs(sp, region, 5, seed=0) == got  # seeded
    key = tuple(got[0][n] for n in sp.choices)
    assert all(tuple(v[n] for n in sp.choices) != key for v in region_configs(sp, region, 5, seed=0, exclude={key}))
    assert region_configs(sp, {"no_such_knob": [1]}, 3, seed=0) == []
    one = region_of("CPU", "conv2d", ONE_MODE)
    assert len(one) == 1 and region_configs(sp, one, 5, seed=0) == region_configs(sp, one[0], 5, seed=0)


def test_each_mode_of_a_region_gets_its_own_seeds():
    sp = space_of(WL)
    modes = region_of("CPU", "conv2d")
    assert len(modes) == 2 and len(region_of("GPU", "conv2d")) == 2
    assert region_of("GPU", "conv2d", BEFORE_GPU_MODES) == region_of("GPU", "conv2d", ONE_MODE) == [
        {"wg_w": [8, 16], "wg_h": [1, 4], "split_k": [4, 8, 16]}]  # the GPU's region of one mode, kept
    assert region_of("CPU", "conv2d", BEFORE_GPU_MODES) == modes
    got = region_configs(sp, modes, 2, seed=4)
    assert got[:2] == region_configs(sp, modes[0], 2, seed=4)  # the first mode drawn as a single region
    assert len(got) == 4 and len({tuple(v.values()) for v in got}) == 4
    for mode, pair in ((modes[0], got[:2]), (modes[1], got[2:])):
        assert all(not sp.violations(v) and all(v[k] in vals for k, vals in mode.items() if k in sp.choices)
                   for v in pair)
    assert region_configs(sp, modes, 2, seed=4) == got  # seeded
    key = lambda v: tuple(v[n] for n in sp.choices)  # noqa: E731
    assert got[2:] == region_configs(sp, modes[1], 2, seed=(4, 1), exclude={key(v) for v in got[:2]})
    assert all(key(v) != key(got[0]) for v in region_configs(sp, modes, 2, seed=4, exclude={key(got[0])}))


class Synthetic(Runner):
    """A device without a device: each config takes the time ``smooth`` says."""

    def __init__(self):
        self.info, self.seen = CPU, []

    def measure(self, inputs):
        out = []
        for i in inputs:
            v = T.config_values(WL, i.config)
            self.seen.append(v)
            out.append(MeasureResult(costs=[WL.flops / (smooth(v) * 1e9)] * 2))
        return out


def test_tune_measures_the_fallback_then_the_device_region_first(tmp_path):
    dev = Synthetic()
    log = str(tmp_path / "log.jsonl")
    res = tune("conv2d", WL, CPU, trials=6, log=log, scopes=BUFFERS, measurer=dev, progress=False, seed=3,
               storage=f"sqlite:///{tmp_path / 'a.db'}")
    assert res.measured == 6
    names = list(space_of(WL).choices)
    fallback = T.config_values(WL, T.fallback_with(WL, CPU, **{f"{k}_scope": v for k, v in BUFFERS.items()}))
    first_six = [r.config for r in load_records(log)]
    first = first_six[:1 + REGION_SEEDS]
    assert {k: first[0][k] for k in names if k in first[0]} == {k: fallback[k] for k in names if k in first[0]}
    region = region_of("CPU", "conv2d")[0]
    assert all(all(c[k] in vals for k, vals in region.items()) for c in first[1:])
    again = tune("conv2d", WL, CPU, trials=2, log=log, scopes=BUFFERS, measurer=dev, progress=False, seed=3,
                 storage=f"sqlite:///{tmp_path / 'a.db'}")  # the log knows the task: no region again
    assert again.measured == 2 and len(dev.seen) == 8
    plain = tune("conv2d", WL, CPU, trials=3, log=str(tmp_path / "b.jsonl"), scopes=BUFFERS, measurer=Synthetic(),
                 progress=False, seed=3, storage=f"sqlite:///{tmp_path / 'b.db'}", fallback_first=False,
                 device_region=False, sampler="random")
    assert [r.config for r in load_records(str(tmp_path / "b.jsonl"))][0] != first[0]
    assert plain.measured == 3
    modes = region_of("CPU", "conv2d")  # each mode of the region measured after the fallback
    started = first_six[1:1 + 2 * REGION_SEEDS]
    for mode, pair in ((modes[0], started[:REGION_SEEDS]), (modes[1], started[REGION_SEEDS:])):
        assert all(all(c[k] in vals for k, vals in mode.items() if k in c) for c in pair)
    tune("conv2d", WL, CPU, trials=3, log=str(tmp_path / "c.jsonl"), scopes=BUFFERS, measurer=Synthetic(),
         progress=False, seed=3, storage=f"sqlite:///{tmp_path / 'c.db'}", device_region=ONE_MODE)
    one = [r.config for r in load_records(str(tmp_path / "c.jsonl"))]  # another table: its one mode's seeds
    sp = space_of(WL)
    want = region_configs(sp, region_of("CPU", "conv2d", ONE_MODE), REGION_SEEDS, 3,
                          exclude={tuple(fallback[n] for n in sp.choices)})
    assert len(one) == 3 and sum(n in want[0] for n in one[1]) >= 8
    assert all({n: c[n] for n in c if n in w} == {n: w[n] for n in c if n in w}
               for c, w in zip(one[1:], want))
    assert want != region_configs(sp, region_of("CPU", "conv2d"), REGION_SEEDS, 3,
                                  exclude={tuple(fallback[n] for n in sp.choices)})


def test_far_configs_are_unlike_every_incumbent_and_unseen():
    s = xgb(seed=1)
    sp = space_of(WL)
    rng = np.random.default_rng(3)
    own = [(sp.sample(rng), float(i)) for i in range(10)]
    incumbents = [v for v, _ in sorted(own, key=lambda r: -r[1])[:s.incumbents]]
    seen = {tuple(v[n] for n in s.names) for v, _ in own}
    far = s.far_configs(own, seen, count=200)
    assert far and all(tuple(v[n] for n in s.names) not in seen and not sp.violations(v) for v in far)
    near = [sp.sample(rng) for _ in range(200)]  # random configs: the far ones are the farthest quarter of them
    d_far = np.mean([min(s._distance(v, b) for b in incumbents) for v in far])
    d_any = np.mean([min(s._distance(v, b) for b in incumbents) for v in near])
    assert d_far > d_any
    assert s._distance(incumbents[0], incumbents[0]) == 0.0
    wider = {**incumbents[0], "wg_w": max(sp.choices["wg_w"])}
    if wider["wg_w"] != incumbents[0]["wg_w"]:  # an ordered knob: its difference in position over its range
        steps = abs(sorted(sp.choices["wg_w"]).index(wider["wg_w"]) - sorted(sp.choices["wg_w"]).index(incumbents[0]["wg_w"]))
        assert s._distance(incumbents[0], wider) == pytest.approx(steps / (len(sp.choices["wg_w"]) - 1))


def test_far_proposals_start_when_the_search_stalls():
    s = xgb(corpus(smooth), far=(0.0, 1.0), patience=4)
    assert s.stale([({}, 1.0), ({}, 2.0), ({}, 2.01), ({}, 1.5)]) == 2  # 2.01 is no 1% gain on 2.0
    flat = lambda v: 1.0  # noqa: E731 - nothing ever improves: every proposal after the patience is far
    study = drive(s, flat, 14)
    by = [tr.user_attrs.get("search", {}).get("by") for tr in study.trials]
    assert "far" in by and "far" not in by[:4], by
    still = xgb(corpus(smooth), far=(0.0, 0.0))
    assert "far" not in [tr.user_attrs.get("search", {}).get("by") for tr in drive(still, flat, 14).trials]


def test_far_pick_random_proposes_far_configs_the_model_would_not_pick():
    """``far_pick="random"``: the far proposal is any far config, model-free; with ``"model"`` it is the model's best
    of them, so a model that the corpus misleads picks the corpus's favourites among the far configs too."""
    flat = lambda v: 1.0  # noqa: E731 - the search stalls at once: after the patience every proposal is far
    picks = {}
    for pick in ("model", "random"):
        s = xgb(corpus(smooth), far=(0.0, 1.0), patience=2, far_pick=pick, seed=3)
        study = drive(s, flat, 12)
        picks[pick] = [tr.params for tr in study.trials if tr.user_attrs.get("search", {}).get("by") == "far"]
        assert picks[pick], pick
    wide = lambda v: v["wg_w"] >= 16 and v["tile_ow"] == 1  # noqa: E731 - the corpus's fast region (smooth)
    assert sum(map(wide, picks["model"])) > sum(map(wide, picks["random"]))
    with pytest.raises(TunerError, match="far_pick"):
        xgb(far_pick="best")


def test_two_knob_neighbours_join_the_candidates_with_pair_moves():
    sp = space_of(WL)
    best = sp.sample(np.random.default_rng(1))
    names = [n for n, cs in sp.choices.items() if len(cs) > 1]
    key = lambda v: tuple(v[n] for n in sp.choices)  # noqa: E731
    s = xgb(corpus(smooth), pair_moves=1)
    one, two = s.neighbours(best), s.neighbours(best, knobs=2)
    assert one and two and len(two) > len(one)
    assert all(sum(v[n] != best[n] for n in names) == 1 for v in one)
    assert all(sum(v[n] != best[n] for n in names) == 2 and not sp.violations(v) for v in two)
    assert len({key(v) for v in two}) == len(two)  # each pair of knobs counted once
    own = [(best, 1.0)]
    with_pairs = {key(v) for v in s._candidates(own, {key(best)})}
    without = {key(v) for v in xgb(corpus(smooth))._candidates(own, {key(best)})}
    assert {key(v) for v in two} <= with_pairs and not {key(v) for v in two} <= without
    assert {key(v) for v in one} <= without  # the single-knob local search is there either way


def test_workers_measure_the_fallback_and_the_device_region_first_once_per_study(tmp_path):
    from tuner.search.worker import run_worker
    from tuner.task import TuningTask
    task = TuningTask("conv2d", WL, BUFFERS, {}, trials=8)
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = run_worker(url, Synthetic(), tasks=[task], max_trials=4, log=str(tmp_path / "a.jsonl"),
                       sampler="random", seed=5, progress=False)
    names = list(space_of(WL).choices)
    fallback = T.config_values(WL, T.fallback_with(WL, CPU, **{f"{k}_scope": v for k, v in BUFFERS.items()}))
    configs = [r.config for r in first.records]
    assert {k: configs[0][k] for k in names if k in configs[0]} == {k: fallback[k] for k in names if k in configs[0]}
    region = region_of("CPU", "conv2d")[0]
    assert all(all(c[k] in vals for k, vals in region.items()) for c in configs[1:1 + REGION_SEEDS])
    second = run_worker(url, Synthetic(), tasks=[task], max_trials=4, log=str(tmp_path / "b.jsonl"),
                        sampler="random", seed=5, progress=False)  # the study has them: none again
    again = [r.config for r in second.records]
    assert len(again) == 4 and not any(c in configs for c in again)


def test_each_mode_without_the_best_gets_turns_of_the_model_until_it_holds_mode_min_configs():
    """``modes``: every other model proposal is the model's best config inside a mode that does not hold the best
    measured config, until that mode holds ``mode_min`` measured configs."""
    from tuner.search.regions import bound_mode, in_mode
    sp = space_of(WL)
    modes = region_of("CPU", "conv2d")
    wide, narrow = (bound_mode(sp, m) for m in modes)
    score = lambda v: 10.0 if in_mode(narrow, v) else 1.0  # noqa: E731 - the corpus's wide favourites are slow here
    s = xgb(corpus(smooth), modes=modes, mode_min=5, far=(0.0, 0.0), explore="none", epsilon=0.0, seed=2)
    study = drive(s, score, 24)
    trials = [(tr.params, tr.user_attrs.get("search", {}).get("by")) for tr in study.trials]
    first = next(i for i, (v, _) in enumerate(trials) if in_mode(narrow, v))  # from here the narrow mode leads
    turns = [v for v, by in trials[first + 1:] if by == "mode"]
    assert turns and all(in_mode(wide, v) for v in turns)  # the mode without the best: here the wide one
    assert not any(a == b == "mode" for (_, a), (_, b) in zip(trials, trials[1:]))  # they alternate with the model's
    held = 0
    for v, by in trials:  # no turn once the wide mode holds mode_min measured configs
        assert by != "mode" or held < 5
        held += in_mode(wide, v)
    assert held >= 5
    plain = drive(xgb(corpus(smooth), far=(0.0, 0.0), explore="none", epsilon=0.0, seed=2), score, 24)
    assert "mode" not in [tr.user_attrs.get("search", {}).get("by") for tr in plain.trials]
    assert not in_mode({}, {"wg_w": 16}) and in_mode(wide, {**sp.sample(np.random.default_rng(0)), **{
        k: vals[0] for k, vals in wide.items()}})


def test_tune_gives_the_sampler_the_device_regions_modes(tmp_path):
    """The wide mode holds ``smooth``'s best, so the narrow one gets turns; without the region, no mode has any."""
    for region, turns in ((True, True), (False, False)):
        url = f"sqlite:///{tmp_path / f'{region}.db'}"
        res = tune("conv2d", WL, CPU, trials=14, log=str(tmp_path / f"{region}.jsonl"), scopes=BUFFERS,
                   measurer=Synthetic(), progress=False, seed=1, storage=url, device_region=region)
        by = [tr.user_attrs.get("search", {}).get("by") for tr in optuna.load_study(study_name=res.study_name,
                                                                                      storage=url).trials]
        assert ("mode" in by) == turns, by


def test_a_mode_with_no_unseen_config_is_spent_and_the_next_due_mode_takes_the_turn():
    from tuner.search.regions import bound_mode, in_mode
    sp = space_of(WL)
    key = lambda v: tuple(v[n] for n in sp.choices)  # noqa: E731
    wide, narrow = region_of("CPU", "conv2d")
    only = sp.sample(np.random.default_rng(5))
    one = {k: [v] for k, v in only.items()}  # a mode of exactly one config, seen already (e.g. in the log)
    best = region_configs(sp, wide, 1, seed=0)[0]
    own, seen = [(best, 5.0)], {key(best), key(only)}
    s = xgb(corpus(smooth), modes=[wide, one, narrow], mode_min=6)
    pick = s._mode_turn(own, seen)
    assert s._modes_spent == {1} and pick is not None and in_mode(bound_mode(sp, narrow), pick)
    assert key(pick) not in seen and not sp.violations(pick)
    assert s._mode_turn(own, seen) is None  # the turns alternate with the model's own proposals
    alone = xgb(corpus(smooth), modes=[wide, one], mode_min=6)
    assert alone._mode_turn(own, seen) is None and alone._modes_spent == {1}
    assert alone._mode_turn(own, seen) is None  # spent, and no turn was taken: the alternation lost no step


def test_from_hedge_measurements_on_every_other_model_proposal_is_the_cold_models():
    """``hedge``: a model fitted without the corpus ranks every other model proposal once the study holds ``hedge``
    measurements; never before, never without a corpus, never with ``hedge=None``."""
    def bys(sampler):
        study = drive(sampler, smooth, 24)
        return [tr.user_attrs.get("search", {}).get("by") for tr in study.trials]
    opts = dict(far=(0.0, 0.0), explore="none", epsilon=0.0, seed=3)
    by = bys(xgb(corpus(smooth), hedge=8, **opts))
    assert "cold" not in by[:8] and by[8:].count("cold") >= 6
    model_turns = [b for b in by[8:] if b in ("model", "cold")]
    assert all(a != b for a, b in zip(model_turns, model_turns[1:]))  # they alternate
    assert "cold" not in bys(xgb(corpus(smooth), hedge=None, **opts))
    assert "cold" not in bys(xgb(None, **opts))  # no corpus: every model is cold already
    s = xgb(corpus(smooth), **opts)
    assert s.hedge == 8  # the default
