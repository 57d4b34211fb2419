"""What DP gradient descent (``dp_gd``) and DP-SGD (``dp_sgd``) share; they differ only in how
the line is fitted on a cell's rows. On the unit square (x centred: u in [-1/2, 1/2]) each fits
t = a + b u by noisy clipped gradient steps. The budget (:func:`descent_budget`):
``count_fraction`` of epsilon to a Laplace noisy count n~, ``interval_fraction`` to the interval's
design statistics (:mod:`dptrain.release.methods._gd_interval`; 0: no interval), the rest to the
gradient steps, whose sigma is calibrated by RDP; the total (epsilon, delta) by basic composition,
add/remove. The release (:func:`descent_release`): n~, then the fit, then theta, then (drawn last,
so theta's draws are those of a release without it) the interval; a cell with n~ < 3 is not
released. The facts: :func:`descent_meta`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dptrain.privacy.accounting import rdp_epsilon
from dptrain.release.cells import Cells, ReleaseError
from dptrain.release.methods._gd_interval import design_stats, gd_interval
from dptrain.release.methods.common import (
    NO_INTERVAL,
    calibrate_sigma,
    check_delta,
    check_epsilon,
    check_fraction,
    check_statistic,
    method_meta,
    noisy_count,
    reasons,
    result_frame,
    theta_from_unit,
)

NO_INTERVAL_TEXT = "none: ci_low / ci_high are NaN (interval_fraction = 0: no epsilon spent on the interval)"


def check_run(statistic: str, epsilon: float, delta: float) -> tuple[float, float]:
    """The statistic, and (epsilon, delta) checked."""
    check_statistic(statistic)
    return check_epsilon(epsilon), check_delta(delta)


def check_shares(count_fraction: float, interval_fraction: float, max_grad_norm: float) -> tuple[float, float, float]:
    """(count share, interval share, clipping norm C) checked: the shares of epsilon for the noisy
    count and the interval (0: none) leave the rest to the gradient steps, so they sum below 1."""
    frac, ifrac = check_fraction(count_fraction, "release.count_fraction"), interval_fraction
    if ifrac != 0:
        ifrac = check_fraction(ifrac, "release.interval_fraction")
    if frac + ifrac >= 1.0:
        raise ReleaseError("release.count_fraction + release.interval_fraction must be < 1")
    return frac, float(ifrac), check_epsilon(max_grad_norm, "release.max_grad_norm")


@dataclass(frozen=True)
class DescentBudget:
    """(``epsilon``, ``delta``) split: ``eps_n`` to the count, ``eps_d`` to the interval's
    statistics, ``eps_g`` to ``steps`` gradient steps at sample rate ``q`` with noise multiplier
    ``sigma`` (RDP)."""

    epsilon: float
    delta: float
    fractions: tuple[float, float]
    q: float
    steps: int
    eps_n: float
    eps_d: float
    eps_g: float
    sigma: float


def descent_budget(epsilon: float, delta: float, fractions: tuple[float, float], *, q: float,
                   steps: int) -> DescentBudget:
    """The split of the module docstring; sigma calibrated for the steps' share by RDP."""
    frac, ifrac = fractions
    eps_n, eps_d, eps_g = frac * epsilon, ifrac * epsilon, (1.0 - frac - ifrac) * epsilon
    return DescentBudget(epsilon, delta, fractions, q, steps, eps_n, eps_d, eps_g,
                         calibrate_sigma(eps_g, q=q, steps=steps, delta=delta))


def descent_release(cells: Cells, budget: DescentBudget, *, statistic: str, rng: np.random.Generator,
                    fit: Callable[[np.ndarray], np.ndarray], recursion: dict) -> pd.DataFrame:
    """The released frame: n~, (a, b) per cell by ``fit(n~)`` (G x 2; it draws from ``rng`` too),
    theta, and the interval of the linearised ``recursion`` (lr, steps, grad_sd, batch_rate)."""
    n_noisy = noisy_count(cells, budget.eps_n, rng)
    W = fit(n_noisy)
    theta = theta_from_unit(W[:, 0], W[:, 1], cells, statistic)
    reason = reasons(cells.n_cells, [(n_noisy < 3, "noisy n < 3")])
    ci = NO_INTERVAL
    if budget.fractions[1] > 0:  # drawn last: theta's draws are those of a release without the interval
        ci = gd_interval(W, n_noisy, design_stats(cells, budget.eps_d, rng), cells, statistic=statistic,
                         recursion=recursion)
    return result_frame(reason, theta, np.nan, ci=ci)


def descent_meta(method: str, statistic: str, budget: DescentBudget, *, gradient: str, interval: str, caveat: str,
                 **details) -> dict:
    """The facts: ``gradient`` names the steps ("100 Gaussian steps"), ``interval`` describes the
    interval (``NO_INTERVAL_TEXT`` without one), ``caveat`` is the method's own, ``details`` (its
    reference and numbers) come between sigma and the epsilons spent."""
    frac, ifrac = budget.fractions
    return method_meta(
        method, statistic, "add_remove", budget.epsilon, budget.delta,
        split=f"{frac:g} epsilon to a Laplace noisy count, {ifrac:g} epsilon to the interval's noisy sum u, "
              f"sum u^2 and Syy (Laplace, shares 0.35 / 0.35 / 0.3), {1 - frac - ifrac:g} epsilon to {gradient} "
              "(RDP)",
        guarantee="(epsilon, delta)-DP, add/remove (basic composition of the count, the interval's statistics "
                  "and the RDP-accounted steps)", **details,
        epsilon_count=budget.eps_n, epsilon_interval=budget.eps_d,
        epsilon_gradient=rdp_epsilon(sample_rate=budget.q, noise_multiplier=budget.sigma, steps=budget.steps,
                                     delta=budget.delta),
        caveats=["noise_sd is NaN: the interval carries the noise (a linearisation; no closed form for theta)", caveat,
                 "the interval assumes clipping and the projection inactive near the optimum"],
        interval=interval if ifrac > 0 else NO_INTERVAL_TEXT)
