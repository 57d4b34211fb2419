"""The exact integer samplers of the one-shot table releases (dptrain.privacy.samplers, OpenDP's
discrete Laplace and discrete Gaussian): their laws against the exact probability mass functions
(chi-square), and the zCDP event's epsilon against dp-accounting's."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from dptrain.privacy.accounting import history_epsilon
from dptrain.privacy.events import zcdp_event
from dptrain.privacy.samplers import discrete_gaussian, discrete_laplace, pmf_discrete_gaussian, pmf_discrete_laplace


def _chi_square_p(draws: np.ndarray, pmf, span: int, min_expected: float = 20.0) -> float:
    """The chi-square test's p-value of integer ``draws`` against ``pmf`` on [-span, span] (where
    all but a negligible mass lies); values with fewer than ``min_expected`` expected draws are
    pooled into the two tails."""
    n = draws.size
    ks = np.arange(-span, span + 1)
    expected = n * pmf(ks)
    keep = np.flatnonzero(expected >= min_expected)
    lo, hi = ks[keep[0]], ks[keep[-1]]
    centre = (ks >= lo) & (ks <= hi)
    obs = [np.sum(draws < lo), *[np.sum(draws == k) for k in ks[centre]], np.sum(draws > hi)]
    exp = [expected[ks < lo].sum(), *expected[centre], expected[ks > hi].sum()]
    return float(stats.chisquare(obs, np.asarray(exp) * n / np.sum(exp)).pvalue)


@pytest.mark.parametrize("scale", [0.7, 2.0, 10.0])
def test_discrete_laplace_has_its_exact_law(scale):
    draws = discrete_laplace(np.zeros(40_000, dtype=np.int64), scale)
    assert draws.dtype == np.int64
    assert _chi_square_p(draws, lambda k: pmf_discrete_laplace(k, scale), int(60 * scale) + 60) > 1e-4
    q = math.exp(-1.0 / scale)
    assert abs(draws.var() - 2 * q / (1 - q) ** 2) < 0.05 * 2 * q / (1 - q) ** 2


@pytest.mark.parametrize("sigma", [0.8, 3.0, 12.0])
def test_discrete_gaussian_has_its_exact_law(sigma):
    draws = discrete_gaussian(np.zeros(40_000, dtype=np.int64), sigma)
    assert _chi_square_p(draws, lambda k: pmf_discrete_gaussian(k, sigma), int(20 * sigma) + 20) > 1e-4
    # the mutation a wrong scale would be is caught: the law at 1.1 sigma is rejected
    assert _chi_square_p(draws, lambda k: pmf_discrete_gaussian(k, 1.15 * sigma), int(20 * sigma) + 20) < 1e-4


def test_noise_is_added_to_the_counts_and_keeps_their_shape():
    counts = np.arange(12, dtype=np.int64).reshape(3, 4) * 1000
    out = discrete_laplace(counts, 1.0)
    assert out.shape == (3, 4) and np.all(np.abs(out - counts) < 60)
    with pytest.raises(ValueError):
        discrete_gaussian(np.ones(3), 1.0)  # floats are not counts


def test_the_zcdp_event_is_dp_accountings_zcdp_conversion():
    for rho in (0.01, 0.125, 2.0):
        ours = history_epsilon([(zcdp_event(rho), 1)], delta=1e-6, accountant="rdp")
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.ZCDpEvent(rho))
        assert ours == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
        assert ours <= rho + 2 * math.sqrt(rho * math.log(1e6))  # tighter than the simple conversion
