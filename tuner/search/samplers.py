"""Optuna samplers over a constrained search space.

``XGBSampler`` (AutoTVM's XGBoost tuner as an Optuna sampler): a gradient-boosted ranking model
(``rank:pairwise``, one query group per workload) on config features predicts which unseen configs are
fastest. It transfers by default: successful records of the template's other workloads on this device join
the training set as their own groups, and records of other devices as groups of lower weight (a weaker
prior), so with enough of them the model ranks from the first trial and the random warm-up is skipped. The
transfer knows when it misleads: its rows' weight follows the rank correlation of a transfer-only model with
this task's measurements (``trust``), from 1 down to 0. Candidates are random valid configs, random mutations
of the best measured ones and every single-knob neighbour of the best three; the share of random exploration
(``epsilon``) decays as the run goes on, so a run ends in local search around its best configs. One fit ranks
the candidates for a whole batch: the proposals of one batch (``n_parallel`` builders) are the best distinct
configs of that ranking. What the model cannot veto (``explore``): a share of proposals is model-free, TPE's
density of this study's good configs, larger while the model ranks its fresh measurements poorly. What the
early measurements cannot anchor (``far``): once the best has not improved for a while, a share of proposals is
the model's best config among random ones unlike every incumbent (``far_configs``), a region not yet searched.
``ConstrainedRandomSampler`` is uniform random search over the valid configs, ``ConstrainedTPESampler`` Optuna's
TPE restricted to them. None proposes a config the study has already measured or is measuring."""
from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from tuner.logs.best import SIBLING_WEIGHT
from tuner.search.features import features
from tuner.search.shared import measured_error


def _key(values: dict, names) -> tuple:
    return tuple(values[n] for n in names)


class _SpaceSampler(BaseSampler):
    """Shared plumbing: the bound space's knobs as categorical distributions, and the seen configs."""

    def __init__(self, space, seed: int | None = None, seen: set | None = None):
        self.space = space
        self.names = list(space.choices)
        self.rng = np.random.default_rng(seed)
        self.extra_seen = set(seen or ())  # configs measured outside the study (e.g. found in the log)

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()

    def infer_relative_search_space(self, study, trial):
        return {n: CategoricalDistribution(c) for n, c in self.space.choices.items()}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return param_distribution.choices[int(self.rng.integers(len(param_distribution.choices)))]

    def seen(self, study) -> set:
        """Configs measured (failures included: FAIL trials with their error), being measured or waiting."""
        out = set(self.extra_seen)
        for t in study.get_trials(deepcopy=False):
            if (t.state in (TrialState.RUNNING, TrialState.WAITING) or measured_error(t)) and \
                    all(n in t.params for n in self.names):
                out.add(_key(t.params, self.names))
        return out

    def random_unseen(self, seen: set, tries: int = 200) -> dict | None:
        for _ in range(tries):
            values = self.space.sample(self.rng)
            if _key(values, self.names) not in seen:
                return values
        return None


class ConstrainedRandomSampler(_SpaceSampler):
    """Uniform-ish random search over valid, not yet measured configs."""

    def sample_relative(self, study, trial, search_space):
        if not search_space:
            return {}
        return self.random_unseen(self.seen(study)) or {}


def rank_correlation(a, b) -> float:
    """Spearman's rho of two sequences (average ranks for ties); 0 where either is constant or shorter than 3."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 3 or len(a) != len(b):
        return 0.0

    def ranks(x):
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):  # ties share their average rank
            tie = x == v
            if tie.sum() > 1:
                r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def trust(rho: float, n: int, reference: float) -> float:
    """How far to trust a predictor whose rank correlation with ``n`` noisy measurements is ``rho``: the upper
    end of rho's one-standard-error interval (Fisher's z, SE 1/sqrt(n-3)) over ``reference``, clipped to
    [0, 1]. A predictor is trusted fully until the measurements show it is worse than ``reference``; one no
    better than chance loses its weight slowly (0.72 at n = 24, 0.49 at 48 for reference 0.3), one that
    predicts the wrong way fast. Single timings on a loaded CPU scatter by up to 2x, and a weight taken
    from rho itself judged a helpful prior as chance after 8 trials (bench/notes/tuning.md)."""
    if n < 4:
        return 1.0
    z = math.atanh(max(-0.999, min(0.999, rho))) + 1.0 / math.sqrt(n - 3)
    return max(0.0, min(1.0, math.tanh(z) / reference))


class XGBSampler(_SpaceSampler):
    def __init__(self, space, template: str, vars: dict, seed: int | None = None, n_warmup: int = 8,
                 epsilon: float = 0.1, n_random: int = 256, n_mutants: int = 256, transfer: list | None = None,
                 seen: set | None = None, decay: int = 32, other_device_weight: float = 0.25,
                 device_weights: dict | None = None, explore: str = "tpe", share: tuple = (0.1, 0.5),
                 fresh: int = 12, weigh_transfer: bool = True, transfer_reference: float = 0.3,
                 ensemble: int = 4, kappa: float = 1.0, far: tuple = (0.0, 0.3), patience: int = 8,
                 incumbents: int = 3, prior_decay: int | None = 16, far_pick: str = "model", pair_moves: int = 0,
                 modes: list | None = None, mode_min: int = 6, hedge: int | None = 8):
        """``template``: a Template or its name; ``transfer``: ``(vars, values, score)`` of other workloads'
        successful records (``(vars, values, score, device)`` for another device's: weighted
        ``other_device_weight``, or ``device_weights[device]``: a named sibling's), ``score`` their GFLOP/s
        (normalized per group here). ``epsilon`` decays to a fifth of itself over ``decay`` measured trials.

        ``explore``: what the model cannot veto. ``"tpe"``: a share of proposals is Optuna's multivariate TPE
        over the valid configs (the density of this study's good configs, model-free); the share runs from
        ``share[1]`` down to ``share[0]`` as the model's rank correlation on the ``fresh`` latest measurements
        (a model fitted without them) rises from 0 to 1. ``"bonus"``: ``ensemble`` models on bootstrap
        samples rank the candidates by their mean score plus ``kappa`` standard deviations. ``"none"``: the
        model ranks every proposal but the ``epsilon`` share of random ones.

        ``far``: the share of proposals drawn far from the ``incumbents`` best measured configs (the model's best
        of random configs unlike them all, ``far_configs``): ``far[0]`` while the search improves, ``far[1]``
        once ``patience`` measurements in a row brought no gain of 1% on the best. The fallback, the device
        region's seeds and the corpus all pull a search towards one region; on a layer whose best configs lie
        elsewhere (bench/notes/tuning.md, 2026-11-27) neither the model nor TPE's density of the good configs
        leaves it. ``far_pick``: which far config is proposed, ``"model"`` (the model's best of them) or
        ``"random"`` (any of them, model-free: where the model itself is what holds the search in a region).
        ``pair_moves``: the candidates also hold every two-knob neighbour of the best ``pair_moves`` measured configs
        (the local search's single-knob moves cannot turn a 4x1 tile into a 2x2 one).

        ``modes``: the device region's modes (``tuner.search.regions.region_of``: knob values per mode), for a
        local search of each where there are two or more. While a mode that does not hold the best measured
        config holds fewer than ``mode_min`` measured configs, every other model proposal is the model's best
        config inside it (of the candidates in it, random draws of it and the single-knob neighbours of its best
        that stay in it). A
        mode's first draws are random in its other knobs and may all be slow where its best is the fastest
        config of all; without turns of its own, a search that found a good config in another mode first
        stays there (bench/notes/tuning.md, 2026-11-28, fifth).

        ``hedge``: from that many measurements on, every other model proposal is ranked by a model fitted on this
        study's measurements alone (noted ``by: "cold"``; None: never). A corpus that ranks this task's
        measurements well overall can still rank its best region wrongly, and its weight (``weigh_transfer``)
        does not see that; the turns of the cold model bound what it costs (bench/notes/tuning.md, 2026-11-28,
        sixth).

        ``weigh_transfer``: the transfer rows' weight is ``trust`` of the transfer-only model's rank correlation
        with this study's measurements (``transfer_reference``: the correlation trusted fully), from 1 down
        to 0, re-judged at every fit. ``prior_decay``: the corpus rows' weight is multiplied by
        ``prior_decay / (prior_decay + n)`` after n measurements of this task (None: no decay): a corpus leads a
        search to a good region fast and then keeps it there, where the same search without transfer goes on to the
        best (bench/notes/tuning.md, 2026-11-27)."""
        super().__init__(space, seed, seen)
        if isinstance(template, str):
            from tuner.templates import get_template
            template = get_template(template)
        for knob, value, allowed in (("explore", explore, EXPLORE), ("far_pick", far_pick, FAR_PICK)):
            if value not in allowed:
                from tuner.errors import TunerError
                raise TunerError(f"XGBSampler {knob}={value!r}: one of {', '.join(allowed)}")
        self.template, self.vars = template, vars
        self.n_warmup, self.epsilon, self.n_random, self.n_mutants = n_warmup, epsilon, n_random, n_mutants
        self.decay, self.other_device_weight = decay, other_device_weight
        self.device_weights = dict(device_weights or {})
        self.explore, self.share_range, self.fresh = explore, tuple(share), fresh
        self.weigh_transfer, self.transfer_reference = weigh_transfer, transfer_reference
        self.ensemble, self.kappa = ensemble, kappa
        self.far_range, self.patience, self.incumbents = tuple(far), patience, incumbents
        self.far_pick, self.pair_moves = far_pick, pair_moves
        from tuner.search.regions import bound_mode
        self.modes = [m for m in (bound_mode(space, mode) for mode in modes or ()) if m]
        self.mode_min = mode_min
        self.hedge, self._hedge_turn = hedge, False  # whether the last model proposal was the cold model's
        self._mode_turn_last = False  # whether the last model proposal was a mode's turn (they alternate)
        self._modes_spent: set = set()  # modes with no unseen valid config left
        # far_configs' distance, per knob with a choice: an ordered knob's (numbers) positions over its range
        # (0 to 1), or None for another (a difference counts 1)
        self._positions = {n: ({c: i / (len(cs) - 1) for i, c in enumerate(sorted(cs))}
                               if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cs) else None)
                           for n, cs in space.choices.items() if len(cs) > 1}
        self.prior_decay = prior_decay
        self.far_now = self.far_range[0]
        self._models: dict = {}  # cold -> (what the fit saw, the model fitted with the corpus or, cold, without
        # it: ``hedge``'s turns): shared by the ranking, the far proposals and the modes' turns
        self.transfer = self._transfer_rows(transfer or [])
        self.columns: list | None = None
        self.model_fits = 0
        self._ranking: tuple | None = None  # ((what the fit saw, cold), candidates best first): one fit per batch
        self._tpe = ConstrainedTPESampler(space, seed, seen) if explore == "tpe" else None
        self._prior = None  # the transfer-only model, fitted once
        self.transfer_weight = 1.0  # the transfer rows' weight now (``weigh_transfer``)
        self.share = sum(self.share_range) / 2  # the model-free share now (``explore="tpe"``)
        self.fresh_rho: float | None = None
        self._judged_at = self._fresh_at = -1
        self.trace: list = []  # (measured trials, transfer weight, share, fresh rho) at each judgement

    def _features(self, vars: dict, values: dict) -> dict:
        return features(self.template, self.space.space, vars, values)

    def _transfer_rows(self, transfer: list) -> list:
        groups: dict = {}
        for item in transfer:
            vars, values, score, device = (*item, None) if len(item) == 3 else item
            key = (device, tuple(sorted((k, str(v)) for k, v in vars.items())))
            groups.setdefault(key, []).append((vars, values, score))
        rows = []
        for gid, ((device, _), items) in enumerate(groups.items(), start=1):
            best = max(s for _, _, s in items) or 1.0
            weight = 1.0 if device is None else self.device_weights.get(device, self.other_device_weight)
            try:
                rows += [(gid, self._features(v, values), s / best, weight) for v, values, s in items]
            except (KeyError, TypeError, ZeroDivisionError):
                continue  # a record from another version of the space: not comparable
        return rows

    def _matrix(self, feats: list) -> np.ndarray:
        if self.columns is None:
            self.columns = sorted(feats[0])
        return np.array([[f.get(c, 0.0) for c in self.columns] for f in feats], dtype=np.float32)

    def _train(self, rows: list, seed: int, subsample: float = 0.9, colsample: float = 1.0):
        """A ranking booster on ``rows`` ``(group, features, score, weight)``, or None when they teach no order."""
        import xgboost as xgb
        rows = sorted(rows, key=lambda r: r[0])
        y = np.array([r[2] for r in rows], dtype=np.float32)
        if len(rows) < 2 or float(y.max()) == float(y.min()):
            return None
        qid = np.array([r[0] for r in rows])
        weights = np.array([w for g, w in dict((r[0], r[3]) for r in rows).items()], dtype=np.float32)
        data = xgb.DMatrix(self._matrix([r[1] for r in rows]), label=y, qid=qid, weight=weights)
        params = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.2, "subsample": subsample,
                  "colsample_bytree": colsample, "tree_method": "hist", "seed": seed, "nthread": 1}
        booster = xgb.train(params, data, num_boost_round=80)
        self.model_fits += 1
        return booster

    def _own_rows(self, own: list) -> list:
        best = max((s for _, s in own), default=0.0) or 1.0
        return [(0, self._features(self.vars, v), s / best, 1.0) for v, s in own]

    def prior_weight(self, n: int) -> float:
        """The transfer rows' weight with ``n`` measurements of this task: ``transfer_weight`` (how well the corpus
        ranks them), times ``prior_decay / (prior_decay + n)``, so this task's own measurements decide more as they
        accumulate."""
        decay = self.prior_decay
        return self.transfer_weight * (1.0 if not decay else decay / (decay + n))

    def _transfer_weighted(self, n: int) -> list:
        w = self.prior_weight(n)
        return [] if w <= 0 else [(g, f, s, wt * w) for g, f, s, wt in self.transfer]

    def _fit(self, own: list, transfer: bool = True):
        import xgboost as xgb
        rows = (self._transfer_weighted(len(own)) if transfer else []) + self._own_rows(own)
        if self.explore != "bonus":
            booster = self._train(rows, int(self.rng.integers(2**31)))
            return None if booster is None else (lambda X: booster.predict(xgb.DMatrix(X)))
        boosters = []
        for _ in range(self.ensemble):  # bootstrap: each model sees a resample of the rows
            pick = self.rng.integers(len(rows), size=len(rows))
            b = self._train([rows[i] for i in pick], int(self.rng.integers(2**31)), 0.8, 0.8)
            if b is not None:
                boosters.append(b)
        if not boosters:
            return None
        kappa = self.kappa

        def score(X):
            d = xgb.DMatrix(X)
            preds = np.array([b.predict(d) for b in boosters])  # each model's scale is its own: standardize
            preds = (preds - preds.mean(axis=1, keepdims=True)) / (preds.std(axis=1, keepdims=True) + 1e-9)
            return preds.mean(axis=0) + kappa * preds.std(axis=0)
        return score

    def _judge(self, own: list) -> None:
        """Re-weigh the transfer (its model's rank correlation with this study's measurements) and the model-free
        share (the model's rank correlation on the ``fresh`` latest measurements, fitted without them)."""
        n = len(own)
        if n == self._judged_at:
            return
        self._judged_at = n
        scores = [s for _, s in own]
        if self.weigh_transfer and self.transfer and n >= 4:
            if self._prior is None:
                self._prior = self._train(self.transfer, 0) or False
            if self._prior:
                import xgboost as xgb
                pred = self._prior.predict(xgb.DMatrix(self._matrix([self._features(self.vars, v) for v, _ in own])))
                self.transfer_weight = trust(rank_correlation(pred, scores), n, self.transfer_reference)
        if self.explore == "tpe" and n >= self.fresh + 4 and n - self._fresh_at >= 2:
            self._fresh_at = n
            import xgboost as xgb
            old, new = own[:-self.fresh], own[-self.fresh:]
            booster = self._train(self._transfer_weighted(len(old)) + self._own_rows(old),
                                  int(self.rng.integers(2**31)))
            if booster is not None:
                pred = booster.predict(xgb.DMatrix(self._matrix([self._features(self.vars, v) for v, _ in new])))
                self.fresh_rho = rank_correlation(pred, [s for _, s in new])
                lo, hi = self.share_range
                self.share = hi - (hi - lo) * max(0.0, self.fresh_rho)
        self.trace.append((n, round(self.transfer_weight, 3), round(self.share, 3),
                           None if self.fresh_rho is None else round(self.fresh_rho, 3)))

    def neighbours(self, values: dict, knobs: int = 1) -> list:
        """The valid configs that differ from ``values`` in exactly ``knobs`` knobs (1 or 2). A two-knob move is
        made of two one-knob ones, the first of which may break a constraint the second mends."""
        names = [n for n, cs in self.space.choices.items() if len(cs) > 1]

        def moves(v: dict, start: int = 0):  # (knob index, config) one knob from v, over names[start:], unchecked
            return [(i, {**v, n: c}) for i, n in enumerate(names) if i >= start
                    for c in self.space.choices[n] if c != v[n]]
        step = moves(values)
        if knobs == 2:
            step = [(j, w) for i, v in step for j, w in moves(v, i + 1)]
        return [v for _, v in step if not self.space.violations(v)]

    def _random_pool(self, count: int) -> dict:
        """``count`` random valid configs, by key (duplicates drawn once)."""
        pool: dict = {}
        for _ in range(count):
            values = self.space.sample(self.rng)
            pool.setdefault(_key(values, self.names), values)
        return pool

    def _candidates(self, own: list, seen: set) -> list:
        pool = self._random_pool(self.n_random)
        explored = [n for n in self.names if len(self.space.choices[n]) > 1]
        ranked = [v for v, _ in sorted(own, key=lambda r: -r[1])]
        top = ranked[:8]
        for i in range(self.n_mutants if top and explored else 0):
            values = dict(top[i % len(top)])
            for name in self.rng.choice(explored, size=min(len(explored), 1 + int(self.rng.integers(2))),
                                        replace=False):
                choices = self.space.choices[name]
                values[name] = choices[int(self.rng.integers(len(choices)))]
            k = _key(values, self.names)
            if k not in pool and not self.space.violations(values):
                pool[k] = values
        for best in ranked[:3]:  # local search: every single-knob neighbour of the best three
            for values in self.neighbours(best):
                pool.setdefault(_key(values, self.names), values)
        for best in ranked[:self.pair_moves]:  # and every two-knob one of the best (a 2x2 group to a 4x1 one)
            for values in self.neighbours(best, knobs=2):
                pool.setdefault(_key(values, self.names), values)
        return [v for k, v in pool.items() if k not in seen]

    def _note(self, study, trial, by: str) -> None:
        """The trial's user attribute ``search``: who proposed it (``model``, ``cold``, ``mode``, ``tpe`` or ``far``; a
        trial without it was random, enqueued or another sampler's) and the transfer weight, model-free and far shares
        then."""
        note = {"by": by, "transfer_weight": round(self.transfer_weight, 3), "share": round(self.share, 3),
                "far": round(self.far_now, 3)}
        try:
            study._storage.set_trial_user_attr(trial._trial_id, "search", note)
        except Exception:  # noqa: BLE001 - a trial finished by a peer meanwhile: the note is only for reading
            pass

    def _own(self, study) -> list:
        return [(dict(t.params), float(t.value) if t.state == TrialState.COMPLETE else 0.0)  # failures teach as 0
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
                if (t.value is not None or measured_error(t)) and all(n in t.params for n in self.names)]

    def stale(self, own: list) -> int:
        """Measurements since the last one that raised the best by at least 1% (all of them: none did)."""
        best, since = 0.0, 0
        for _, s in own:
            if s > best * 1.01:
                best, since = s, 0
            else:
                since += 1
        return since

    def far_configs(self, own: list, seen: set, count: int | None = None) -> list:
        """Random valid unseen configs unlike each of the ``incumbents`` best measured ones: of ``count`` random
        configs (default ``n_random``), the quarter farthest from their nearest incumbent. The distance sums
        over the knobs: an ordered knob's (numbers) difference in position over its range, another's 0 or 1."""
        ranked = [v for v, s in sorted(own, key=lambda r: -r[1]) if s > 0][:self.incumbents]
        cands = [v for k, v in self._random_pool(count or self.n_random).items() if k not in seen]
        if not ranked or len(cands) < 4:
            return cands
        dist = np.array([min(self._distance(c, b) for b in ranked) for c in cands])
        cut = np.quantile(dist, 0.75)
        return [c for c, d in zip(cands, dist) if d >= cut and d > 0]

    def _distance(self, a: dict, b: dict) -> float:
        return sum(abs(pos[a[n]] - pos[b[n]]) if pos else 1.0
                   for n, pos in self._positions.items() if a[n] != b[n])

    def _model_for(self, own: list, cold: bool = False):
        """The model fitted on ``own`` (one fit per new set of measurements; ``cold``: without the corpus), or None
        when they teach no order."""
        fitted = self._models.get(cold)
        if fitted is None or fitted[0] != len(own):
            self._models[cold] = fitted = (len(own), self._fit(own, transfer=not cold))
        return fitted[1]

    def sample_relative(self, study, trial, search_space):
        if not search_space:
            return {}
        seen = self.seen(study)
        own = self._own(study)
        warmup = self.n_warmup if len(self.transfer) < 20 else 0  # the prior ranks from the first trial
        epsilon = self.epsilon * max(0.2, 1.0 - len(own) / self.decay)
        if len(own) < warmup or self.rng.random() < epsilon:
            return self.random_unseen(seen) or {}
        self._judge(own)
        lo, hi = self.far_range
        self.far_now = hi if self.stale(own) >= self.patience else lo
        if self.far_now > 0 and self.rng.random() < self.far_now:  # away from the incumbents' region
            far = self.far_configs(own, seen)
            if far:
                model = self._model_for(own) if self.far_pick == "model" else None
                pick = far[int(np.argmax(model(self._matrix([self._features(self.vars, c) for c in far]))))] \
                    if model is not None else far[int(self.rng.integers(len(far)))]
                self._note(study, trial, "far")
                return pick
        if self._tpe is not None and self.rng.random() < self.share:  # model-free: the density of good configs
            values = self._tpe.sample_relative(study, trial, search_space)
            if values:
                self._note(study, trial, "tpe")
                return values
        pick = self._mode_turn(own, seen)
        if pick is not None:
            self._note(study, trial, "mode")
            return pick
        cold = False
        if self.hedge is not None and self.transfer and len(own) >= self.hedge:
            self._hedge_turn = cold = not self._hedge_turn
        self._note(study, trial, "cold" if cold else "model")
        fitted_on = (len(own), cold)
        if self._ranking is None or self._ranking[0] != fitted_on:  # new measurements since the last fit
            model = self._model_for(own, cold)
            cands = self._candidates(own, seen) if model is not None else []
            if not cands:
                return self.random_unseen(seen) or {}
            scores = model(self._matrix([self._features(self.vars, c) for c in cands]))
            self._ranking = (fitted_on, [cands[i] for i in np.argsort(-scores, kind="stable")])
        for values in self._ranking[1]:  # the best of the ranking not yet proposed (by this batch or others)
            if _key(values, self.names) not in seen:
                return values
        return self.random_unseen(seen) or {}

    def _mode_turn(self, own: list, seen: set) -> dict | None:
        """This model proposal as a mode's turn (``modes``, two or more), or None: every other call, the model's best
        config in a mode without the best measured config that holds fewer than ``mode_min`` measured configs,
        the due modes tried fewest first. A mode that has no unseen valid config left is not tried again."""
        from tuner.search.regions import in_mode
        if len(self.modes) < 2:
            return None
        if self._mode_turn_last:
            self._mode_turn_last = False
            return None
        best = max(own, key=lambda r: r[1])[0] if own else None
        counts = [sum(in_mode(m, v) for v, _ in own) for m in self.modes]
        due = sorted((c, i) for i, (m, c) in enumerate(zip(self.modes, counts)) if c < self.mode_min
                     and i not in self._modes_spent and not (best is not None and in_mode(m, best)))
        for _, i in due:
            pick = self._best_in_mode(self.modes[i], own, seen)
            if pick is not None:
                self._mode_turn_last = True
                return pick
            self._modes_spent.add(i)  # the seen configs only grow: it stays spent
        return None

    def _best_in_mode(self, mode: dict, own: list, seen: set) -> dict | None:
        """The model's best unseen config inside ``mode``: of the candidates in it, ``max(8, n_random // 4)`` random
        draws of it and the single-knob neighbours of its best measured config that stay in it (a random draw of it
        without a model; None: it has no unseen valid config)."""
        from tuner.search.regions import in_mode, region_configs
        draws = region_configs(self.space, mode, max(8, self.n_random // 4), int(self.rng.integers(2**31)), seen)
        model = self._model_for(own)
        if model is None:
            return draws[0] if draws else None
        mine = sorted(((v, s) for v, s in own if in_mode(mode, v)), key=lambda r: -r[1])
        pool = {_key(v, self.names): v for v in draws}
        for v in self._candidates(own, seen) + (self.neighbours(mine[0][0]) if mine else []):
            k = _key(v, self.names)
            if in_mode(mode, v) and k not in seen:
                pool.setdefault(k, v)
        if not pool:
            return None
        cands = list(pool.values())
        return cands[int(np.argmax(model(self._matrix([self._features(self.vars, c) for c in cands]))))]


EXPLORE = ("tpe", "bonus", "none")
FAR_PICK = ("model", "random")


class ConstrainedTPESampler(optuna.samplers.TPESampler):
    """Optuna's multivariate TPE over the valid configs only: its first ``n_startup_trials`` are random valid
    configs, and a TPE proposal that breaks a constraint (or was measured) is drawn again, up to ``retries``
    times, then replaced by a random valid config. Plain TPE learns nothing from configs a space rejects
    (they are FAIL trials, which it ignores), so on a constrained space it can spend most of its proposals
    on them."""

    def __init__(self, space, seed: int | None = None, seen: set | None = None, n_startup_trials: int = 8,
                 retries: int = 32):
        super().__init__(seed=seed, n_startup_trials=n_startup_trials, multivariate=True)
        self.valid, self.startup, self.retries = ConstrainedRandomSampler(space, seed, seen), n_startup_trials, retries

    def infer_relative_search_space(self, study, trial):
        return self.valid.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        if not search_space:
            return {}
        v = self.valid
        seen = v.seen(study)
        if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) >= self.startup:
            for _ in range(self.retries):
                params = super().sample_relative(study, trial, search_space)
                if set(params) == set(v.names) and _key(params, v.names) not in seen and \
                        not v.space.violations(params):
                    return params
        return v.random_unseen(seen) or {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.valid.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(name: str, space, template, vars: dict, seed: int | None = None, transfer=None,
                 seen: set | None = None, device_weights: dict | None = None, options: dict | None = None,
                 modes: list | None = None) -> BaseSampler:
    """The sampler ``name`` (xgb, tpe or random); ``options``: keyword arguments of XGBSampler (xgb only);
    ``modes``: the device region's modes, which the xgb sampler searches each in turn (``XGBSampler``)."""
    from tuner.errors import TunerError
    if options and name != "xgb":
        raise TunerError(f"sampler options {sorted(options)} are XGBSampler's; sampler {name!r} takes none")
    if name == "xgb":
        try:
            return XGBSampler(space, template, vars, seed=seed, transfer=transfer, seen=seen,
                              device_weights=device_weights, **{"modes": modes, **(options or {})})
        except TypeError as e:
            raise TunerError(f"xgb sampler options {sorted(options or {})}: {e}") from None
    if name == "random":
        return ConstrainedRandomSampler(space, seed=seed, seen=seen)
    if name == "tpe":
        return ConstrainedTPESampler(space, seed=seed, seen=seen)
    raise TunerError(f"unknown sampler {name!r}: xgb, tpe or random")


class CostModel:
    """The XGBoost ranking model of a template's configs, trained on logged records (``rank:pairwise``, one
    query group per device, workload and scopes; each group's GFLOP/s normalized to its best), for picking a
    config for a workload nobody tuned (``ApplyHistoryBest.suggest``). Features are the sampler's
    (``tuner.search.features``): knobs, what they imply, and the workload's sizes, so the model predicts for
    a workload it has not seen."""

    MIN_RECORDS = 16  # successful records, in groups of at least two different scores, to train at all
    SIBLING_WEIGHT = SIBLING_WEIGHT  # a named sibling device's records, beside this device's (weight 1)
    GROUP_CAP = 48  # records per group used (its best first): bounds the fit on a log of thousands
    ROUNDS = 40

    def __init__(self, booster, columns: list, space, defaults: dict):
        self.booster, self.columns, self.space, self.defaults = booster, columns, space, defaults
        self._vars: dict = {}

    @staticmethod
    def _values(defaults: dict, config: dict, dtype) -> dict:
        return {**defaults, "dtype": dtype, **config}

    @classmethod
    def fit(cls, template, weighted: list) -> "CostModel | None":
        """A model of ``template`` trained on ``[(Record, weight)]`` (successful records), or None when they
        are too few (``MIN_RECORDS``) or teach no order (every group's scores equal)."""
        import dataclasses

        from tuner.logs.record import canonical_json
        groups: dict = {}
        for r, w in weighted:
            if r.ok and r.gflops:
                groups.setdefault((r.device, canonical_json(r.workload), canonical_json(r.scopes)), []).append((r, w))
        groups = {k: sorted(v, key=lambda x: -x[0].gflops)[:cls.GROUP_CAP] for k, v in groups.items()
                  if len(v) >= 2 and len({x[0].gflops for x in v}) > 1}
        if sum(len(v) for v in groups.values()) < cls.MIN_RECORDS:
            return None
        space = template.space()
        defaults = {f.name: f.default for f in dataclasses.fields(template.config)
                    if f.default is not dataclasses.MISSING}
        rows, qid, y, weights = [], [], [], []
        for gid, items in enumerate(groups.values()):
            try:
                vars = template.space_vars(_workload_of(template, items[0][0].workload))
                feats = [features(template, space, vars, cls._values(defaults, r.config, r.workload.get("dtype")))
                         for r, _ in items]
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue  # a record of another version of the space: not comparable
            best = items[0][0].gflops
            rows += feats
            qid += [gid] * len(items)
            y += [r.gflops / best for r, _ in items]
            weights.append(items[0][1])
        if len(rows) < cls.MIN_RECORDS:
            return None
        import xgboost as xgb
        columns = sorted(rows[0])
        X = np.array([[f.get(c, 0.0) for c in columns] for f in rows], dtype=np.float32)
        data = xgb.DMatrix(X, label=np.array(y, dtype=np.float32), qid=np.array(qid),
                           weight=np.array(weights, dtype=np.float32))
        params = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.2, "subsample": 0.9, "tree_method": "hist",
                  "seed": 0, "nthread": 1}  # threads only contend here (OpenMP spins on a busy host)
        return cls(xgb.train(params, data, num_boost_round=cls.ROUNDS), columns, space, defaults)

    def predict(self, template, workload, configs: list) -> np.ndarray:
        """Scores of ``configs`` (knob dicts) for ``workload`` (a template workload): higher is faster."""
        vars = template.space_vars(workload)
        feats = []
        for c in configs:
            try:
                feats.append(features(template, self.space, vars, self._values(self.defaults, c, workload.dtype
                                                                               if hasattr(workload, "dtype") else None)))
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                feats.append(None)
        X = np.array([[f.get(k, 0.0) for k in self.columns] if f is not None else [0.0] * len(self.columns)
                      for f in feats], dtype=np.float32)
        scores = self.booster.inplace_predict(X) if len(X) else np.zeros(0, np.float32)
        return np.where([f is None for f in feats], -np.inf, scores)


def _workload_of(template, key: dict):
    return template.workload(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in key.items() if k != "op"})
