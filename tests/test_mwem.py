"""MWEM (dptrain.release.synthesis.mwem): its privacy spend adds up to the rho given; the model's
workload error falls over the rounds, is small at a large rho and sane at a small one; the
factored model's blocks merge into the same distribution and respect the cap; sampled rows match
the model's marginals; the run is a function of its generator once the exact noise is fixed; the
Gumbel-max selection draws the exponential mechanism's law; bad input is refused."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dptrain.release.synthesis.mwem as mw
from dptrain.core.errors import DPTrainError
from dptrain.privacy.accounting import history_epsilon
from dptrain.privacy.events import zcdp_event
from dptrain.release.synthesis.mwem import FactoredModel, MWEMSettings, count_marginal, exponential_select, mwem

SIZES = [3, 4, 2, 5, 3]
PAIRS = list(itertools.combinations(range(len(SIZES)), 2))


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    """20,000 rows with strong 2-way dependence: 0 -> 1 -> 2 and 3 -> 4, the rest noise."""
    rng = np.random.default_rng(7)
    n = 20_000
    a = rng.choice(3, n, p=[0.6, 0.3, 0.1])
    b = np.where(rng.random(n) < 0.85, a + 1, rng.integers(0, 4, n))
    c = np.where(rng.random(n) < 0.9, (b >= 2).astype(int), rng.integers(0, 2, n))
    d = rng.choice(5, n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    e = np.where(rng.random(n) < 0.8, np.minimum(d, 2), rng.integers(0, 3, n))
    return np.stack([a, b, c, d, e], axis=1).astype(np.int64)


@pytest.fixture
def no_noise(monkeypatch):
    """The exact sampler replaced by no noise: the run is then a function of its generator."""
    monkeypatch.setattr(mw, "discrete_gaussian", lambda counts, sigma: np.asarray(counts, dtype=np.int64))


def _l1_over_n(codes: np.ndarray, answer, sets=PAIRS) -> float:
    """The workload's mean L1 error over N (as distributions, in [0, 2])."""
    errs = []
    for cols in sets:
        true = count_marginal(codes, cols, SIZES)
        est = np.asarray(answer(cols), dtype=np.float64)
        errs.append(float(np.abs(true / true.sum() - est / est.sum()).sum()))
    return float(np.mean(errs))


def test_the_spend_adds_up_to_rho_part_by_part(codes):
    rho, rounds = 0.3, 5
    s = MWEMSettings(rho=rho, rounds=rounds)
    fit = mwem(codes, SIZES, PAIRS, settings=s, rng=np.random.default_rng(0))
    kinds = [p["kind"] for p in fit.spent]
    assert kinds == ["total"] + ["select", "measure"] * rounds
    assert math.isclose(fit.total_rho, rho, rel_tol=1e-12)
    total = fit.spent[0]
    assert math.isclose(total["rho"], s.total_share * rho) and math.isclose(total["rho"], 1 / (2 * total["sigma"] ** 2))
    per_round = (rho - total["rho"]) / rounds
    for sel, meas in zip(fit.spent[1::2], fit.spent[2::2]):
        assert math.isclose(sel["rho"], sel["epsilon"] ** 2 / 8)
        assert math.isclose(sel["rho"], s.select_share * per_round)
        assert sel["sensitivity"] == 1.0 and sel["candidates"] == len(PAIRS)
        assert math.isclose(meas["rho"], 1 / (2 * meas["sigma"] ** 2))
        assert math.isclose(sel["rho"] + meas["rho"], per_round)
        assert tuple(meas["marginal"]) in PAIRS
    assert [tuple(m["marginal"]) for m in fit.spent[2::2]] == [c for c, _ in fit.measurements]
    eps_parts = history_epsilon(fit.events, delta=1e-6, accountant="rdp")
    assert math.isclose(eps_parts, history_epsilon([(zcdp_event(rho), 1)], delta=1e-6, accountant="rdp"), rel_tol=1e-6)


def test_the_workload_error_falls_over_the_rounds_and_is_small_at_a_large_rho(codes):
    uniform = _l1_over_n(codes, FactoredModel(SIZES).marginal)
    errs = []
    for rounds in (1, 3, 10):
        fit = mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=200.0, rounds=rounds), rng=np.random.default_rng(1))
        errs.append(_l1_over_n(codes, fit.marginal))
    assert uniform > 0.5 and uniform > errs[0] > errs[1] > errs[2], (uniform, errs)
    assert errs[2] < 0.05 and max(_pair_errors(codes, fit)) < 0.05, errs
    assert abs(fit.total - len(codes)) < 10


def _pair_errors(codes, fit):
    return [_l1_over_n(codes, fit.marginal, [c]) for c in PAIRS]


def test_at_a_small_rho_the_model_is_still_better_than_uniform_and_sums_to_the_noisy_total(codes):
    fit = mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=1e-3, rounds=5), rng=np.random.default_rng(2))
    sigma_total = fit.spent[0]["sigma"]
    assert abs(fit.total - len(codes)) < 6 * sigma_total
    for cols in PAIRS + [(0, 2, 4), (3,)]:
        table = fit.marginal(cols)
        assert table.shape == tuple(SIZES[c] for c in cols) and table.min() >= 0
        assert math.isclose(table.sum(), fit.total, rel_tol=1e-9)
    assert _l1_over_n(codes, fit.marginal) < 0.15 < 0.5 < _l1_over_n(codes, FactoredModel(SIZES).marginal)


def test_one_noiseless_measurement_is_matched_exactly(codes, no_noise):
    fit = mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=1.0, rounds=1), rng=np.random.default_rng(3))
    (cols, y), = fit.measurements
    assert fit.total == len(codes)
    np.testing.assert_allclose(fit.marginal(cols), count_marginal(codes, cols, SIZES), atol=1e-6)
    np.testing.assert_allclose(fit.marginal(cols[::-1]), fit.marginal(cols).T)


def test_blocks_merge_into_the_same_distribution():
    model = FactoredModel([2, 3, 4, 5])
    rng = np.random.default_rng(4)
    for c, s in enumerate(model.sizes):  # non-uniform singletons
        model.fit_step((c,), rng.dirichlet(np.ones(s)), "ipf")
    before = {cols: model.marginal(cols) for k in (1, 2, 3) for cols in itertools.combinations(range(4), k)}
    assert model.merged_cells((0, 2)) == 8 and model.merged_cells((3,)) == 5
    model.merge((0, 2))
    assert sorted(b.cols for b in model.blocks) == [(0, 2), (1,), (3,)]
    model.merge((1, 2))
    assert sorted(b.cols for b in model.blocks) == [(0, 1, 2), (3,)]
    assert model.merged_cells((2, 3)) == 120 and len(model.owners((0, 1))) == 1
    for cols, table in before.items():
        np.testing.assert_allclose(model.marginal(cols), table, atol=1e-12)
    # an update inside the merged block moves only it, and couples its columns
    target = np.array([[0.4, 0.1, 0.0], [0.0, 0.1, 0.4]])
    model.fit_step((0, 1), target, "ipf")
    np.testing.assert_allclose(model.marginal((0, 1)), target, atol=1e-9)
    np.testing.assert_allclose(model.marginal((3,)), before[(3,)], atol=1e-12)
    np.testing.assert_allclose(model.marginal((1, 3)), np.outer(target.sum(axis=0), before[(3,)]), atol=1e-9)


def test_the_block_cap_limits_the_candidates_and_the_blocks(codes):
    sizes = [4, 4, 4, 4]
    data = np.minimum(codes[:, [0, 1, 3, 4]], 3)
    s = MWEMSettings(rho=50.0, rounds=6, max_block_cells=20)
    fit = mwem(data, sizes, list(itertools.combinations(range(4), 2)), settings=s, rng=np.random.default_rng(5))
    assert all(b.p.size <= 20 for b in fit.model.blocks)
    assert fit.spent[1]["candidates"] == 6 and min(p["candidates"] for p in fit.spent[1::2]) < 6
    with pytest.raises(DPTrainError, match="max_block_cells"):
        mwem(data, sizes, [(0, 1, 2)], settings=s, rng=np.random.default_rng(5))


def test_sampled_rows_have_the_domain_and_the_models_marginals(codes):
    fit = mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=5.0, rounds=4), rng=np.random.default_rng(6))
    rows = fit.sample(None, np.random.default_rng(7))
    assert rows.shape == (fit.total, len(SIZES)) and rows.dtype == np.int64
    assert rows.min() >= 0 and np.all(rows.max(axis=0) < np.array(SIZES))
    n = 200_000
    big = fit.sample(n, np.random.default_rng(8))
    assert len({b.cols for b in fit.model.blocks}) < len(SIZES)  # some columns are held jointly
    for cols in PAIRS + [(0, 1, 2)]:
        p = fit.model.marginal(cols)
        emp = count_marginal(big, cols, SIZES) / n
        assert np.all(np.abs(emp - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-6), cols


def test_the_run_is_a_function_of_its_generators_once_the_noise_is_fixed(codes, no_noise):
    s = MWEMSettings(rho=0.05, rounds=5)
    a = mwem(codes, SIZES, PAIRS, settings=s, rng=np.random.default_rng(9))
    b = mwem(codes, SIZES, PAIRS, settings=s, rng=np.random.default_rng(9))
    assert [c for c, _ in a.measurements] == [c for c, _ in b.measurements] and a.spent == b.spent
    assert [blk.cols for blk in a.model.blocks] == [blk.cols for blk in b.model.blocks]
    for x, y in zip(a.model.blocks, b.model.blocks):
        np.testing.assert_array_equal(x.p, y.p)
    np.testing.assert_array_equal(a.sample(500, np.random.default_rng(10)), b.sample(500, np.random.default_rng(10)))
    picks = {tuple(c for c, _ in mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=1e-4, rounds=5),
                                      rng=np.random.default_rng(seed)).measurements) for seed in range(6)}
    assert len(picks) > 1  # at a small epsilon the selection is random


def test_the_gumbel_max_selection_has_the_exponential_mechanisms_law():
    scores, eps = [0.0, 1.0, 2.0, 2.0], 2.0
    rng = np.random.default_rng(11)
    draws = np.array([exponential_select(scores, epsilon=eps, sensitivity=1.0, rng=rng) for _ in range(40_000)])
    want = np.exp(np.array(scores) * eps / 2)
    want /= want.sum()
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.all(np.abs(freq - want) < 5 * np.sqrt(want * (1 - want) / len(draws)))


def test_the_mw_rule_also_fits(codes):
    fit = mwem(codes, SIZES, PAIRS, settings=MWEMSettings(rho=200.0, rounds=6, update="mw", passes=20),
               rng=np.random.default_rng(12))
    assert _l1_over_n(codes, fit.marginal) < 0.6 * _l1_over_n(codes, FactoredModel(SIZES).marginal)


@pytest.mark.parametrize("change, needle", [
    ({"rho": 0.0}, "rho"), ({"rho": float("inf")}, "rho"), ({"rounds": 0}, "rounds"), ({"update": "em"}, "update"),
    ({"total_share": 1.0}, "total_share"), ({"select_share": 0.0}, "select_share"), ({"passes": 0}, "passes")])
def test_bad_settings_are_refused_by_name(codes, change, needle):
    with pytest.raises(DPTrainError, match=needle):
        mwem(codes, SIZES, PAIRS, settings=MWEMSettings(**{"rho": 1.0, **change}), rng=np.random.default_rng(0))


def test_bad_input_is_refused(codes):
    s, rng = MWEMSettings(rho=1.0), np.random.default_rng(0)
    with pytest.raises(DPTrainError, match="outside"):
        mwem(codes, [3, 4, 2, 4, 3], PAIRS, settings=s, rng=rng)
    with pytest.raises(DPTrainError, match="integer array"):
        mwem(codes.astype(float), SIZES, PAIRS, settings=s, rng=rng)
    with pytest.raises(DPTrainError, match="workload"):
        mwem(codes, SIZES, [(0, 5)], settings=s, rng=rng)
    with pytest.raises(DPTrainError, match="workload"):
        mwem(codes, SIZES, [], settings=s, rng=rng)
