"""XGBSampler's transfer rows weigh what they are worth on this run: records of other workloads that rank the
run's own measurements like the run does keep their weight; records that rank them backwards (another
device class's habits, a 3x3 layer's records for a 1x1 layer on a CPU) are dropped, and the run learns from
its own measurements. Synthetic objectives, no device work."""
import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tuner.search.samplers import XGBSampler, _spearman
from tuner.templates import get_template

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(values):  # big tiles and split_k 4 are fast: a landscape a model can learn
    return values["tile_m"] * 2 + (4 - abs(np.log2(values["split_k"]) - 2)) + np.log2(values["wg_m"]) * 0.5


@pytest.fixture(scope="module")
def dense(device):
    t = get_template("dense")
    wl = t.workload(data=(1, 256), weight=(100, 256))
    other = t.workload(data=(1, 512), weight=(64, 512))
    scopes = dict(input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    return t, wl, t.space(wl, device, **scopes), t.space_vars(other), t.space(other, device, **scopes)


def _transfer(dense, sign: float, n: int = 48):
    t, _, _, other_vars, other_space = dense
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(n):
        v = other_space.sample(rng)
        rows.append((other_vars, v, max(0.1, 20 + sign * objective(v))))
    return rows


def _run(dense, transfer, trials: int, seed: int = 0, agree_min: int | None = None):
    t, wl, space, _, _ = dense
    sampler = XGBSampler(space, "dense", t.space_vars(wl), seed=seed, transfer=transfer, epsilon=0.0)
    if agree_min is not None:
        sampler.AGREE_MIN = agree_min
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
    weights = []
    for _ in range(trials):
        trial = study.ask(dists)
        study.tell(trial, objective(dict(trial.params)))
        weights.append(sampler.transfer_weight)
    return sampler, [tr.value for tr in study.trials], weights


def test_spearman():
    assert _spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert _spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert _spearman([1, 1, 1], [1, 2, 3]) == 0.0


def test_a_prior_that_agrees_keeps_its_weight(dense):
    sampler, _, weights = _run(dense, _transfer(dense, +1.0), 14)
    assert len(sampler.transfer) == 48
    assert weights[:XGBSampler.AGREE_MIN] == [1.0] * XGBSampler.AGREE_MIN  # not judged before AGREE_MIN
    assert weights[-1] == 1.0


def test_a_prior_that_ranks_backwards_is_dropped(dense):
    """The transfer rows say small tiles are fast; the run's own measurements say the opposite: once it has
    AGREE_MIN of them, the rows weigh nothing, and the run then finds better configs than with the rows at
    full weight (the sampler before the check) in the same number of trials."""
    misleading = _transfer(dense, -1.0)
    sampler, values, weights = _run(dense, misleading, 20)
    assert weights[:XGBSampler.AGREE_MIN] == [1.0] * XGBSampler.AGREE_MIN
    assert weights[-8:] == [0.0] * 8
    _, static, _ = _run(dense, misleading, 20, agree_min=1 << 30)
    assert max(values) > max(static)
