"""Shared pieces of the release methods: argument checks, the common result frame and meta, and
the unit-square line model that DP gradient descent and DP-SGD fit.

Every method returns a :class:`~dptrain.release.methods.base.MethodResult` whose ``frame`` has one
row per cell in cell order (index ``cell``) and columns ``released`` (bool), ``reason`` ("" when
released, else why not), ``theta_released`` (NaN if not released) and ``noise_sd`` (SD of the
noise in theta where it can be computed from public or released quantities, else NaN), and
``ci_low`` / ``ci_high`` (the method's 95% interval for the true cell parameter, NaN where it
has none: ``result_frame(..., halfwidth=)`` or ``ci=``; the meta's ``interval`` says how); its
``meta`` says the method, neighbour relation, epsilon, delta, how epsilon was split, the paper,
and caveats (:func:`method_meta`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from dptrain.core.neighbours import add_remove_footing
from dptrain.privacy.accounting import AccountingError, calibrate_noise_multiplier
from dptrain.release.cells import STATISTICS, Cells, ReleaseError
from dptrain.release.intervals import LEVEL, interval_columns
from dptrain.release.noise import add_noise

ALABI = ("Alabi, McMillan, Sarathy, Smith, Vadhan, 'Differentially Private Simple Linear Regression', "
         "PoPETs 2022 (arXiv 2007.05157)")
BOX_A, BOX_B = (-0.5, 1.5), (-4.0, 4.0)  # projection box of (prediction at the x-centre, slope), unit scale


# ---------------------------------------------------------------- argument checks
def check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed: one of {list(STATISTICS)}")


def check_epsilon(epsilon: float, name: str = "release.epsilon_per_statistic") -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"{name}={epsilon!r} is not allowed: a finite number > 0")
    return float(epsilon)


def check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0.0 < delta < 1.0:
        raise ReleaseError(f"release.delta={delta!r} is not allowed: a number in (0, 1)")
    return float(delta)


def check_fraction(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ReleaseError(f"{name}={value!r} is not allowed: a number in (0, 1)")
    return float(value)


def check_int(value: int, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ReleaseError(f"{name}={value!r} is not allowed: an integer >= {low}")
    return int(value)


# ---------------------------------------------------------------- the common result
def reasons(n_cells: int, rules: list[tuple[np.ndarray, str]]) -> np.ndarray:
    """Per cell the text of the FIRST rule whose mask is true, "" where none is."""
    out = np.full(n_cells, "", dtype=object)
    for mask, text in reversed(rules):
        out[np.asarray(mask, dtype=bool)] = text
    return out


def result_frame(reason: np.ndarray, theta: np.ndarray, noise_sd: np.ndarray | float, *,
                 halfwidth: np.ndarray | float | None = None,
                 ci: tuple[np.ndarray | float, np.ndarray | float] | None = None) -> pd.DataFrame:
    """The common result: released where the reason is "" and theta is finite.

    With ``halfwidth`` (theta -/+ halfwidth) or ``ci`` = (low, high) (an interval that need not be
    symmetric about theta) the frame also has ``ci_low`` and ``ci_high``: the method's 95% interval
    for the true cell parameter, NaN where not released or where the bounds are not finite. Give at
    most one of the two; with neither the frame has the four common columns only."""
    theta = np.asarray(theta, dtype=np.float64)
    released = (reason == "") & np.isfinite(theta)
    reason = np.where((reason == "") & ~released, "estimate not finite", reason).astype(object)
    sd = np.broadcast_to(np.asarray(noise_sd, dtype=np.float64), theta.shape)
    columns = {
        "released": released,
        "reason": reason,
        "theta_released": np.where(released, theta, np.nan),
        "noise_sd": np.where(released, sd, np.nan),
    }
    if halfwidth is not None and ci is not None:
        raise ValueError("result_frame: give halfwidth or ci, not both")
    if halfwidth is not None:
        columns.update(interval_columns(theta, halfwidth, released))
    elif ci is not None:
        low, high = (np.broadcast_to(np.asarray(v, dtype=np.float64), theta.shape) for v in ci)
        ok = released & np.isfinite(low) & np.isfinite(high)
        columns.update(ci_low=np.where(ok, low, np.nan), ci_high=np.where(ok, high, np.nan))
    return pd.DataFrame(columns, index=pd.RangeIndex(theta.shape[0], name="cell"))


NO_INTERVAL = (np.nan, np.nan)  # ``ci=`` of a method that publishes no interval (NaN columns)


def bootstrap_interval(theta: np.ndarray, draw_errors, *, n_boot: int, rng: np.random.Generator,
                       level: float = LEVEL, max_elements: int = 4_000_000,
                       failed: str = "infinite") -> tuple[np.ndarray, np.ndarray]:
    """A basic (pivotal) bootstrap interval per cell: (theta - q_hi, theta - q_lo), q the
    (1 -/+ level)/2 quantiles of the simulated errors.

    ``draw_errors(rng, idx, n_boot)`` returns an (n_boot, len(idx)) array of simulated errors
    theta_b - theta~ for the cells ``idx``; a draw where the simulated release fails (NaN) counts
    as an error of -inf for the lower quantile and +inf for the upper one (conservative: the
    interval is infinite, hence NaN in the frame, when more than (1 - level)/2 of the draws fail).
    Cells are taken in blocks of about ``max_elements`` / ``n_boot`` (bounded memory), in cell
    order, so a seed reproduces the interval."""
    theta = np.asarray(theta, dtype=np.float64)
    g = theta.shape[0]
    low, high = np.full(g, np.nan), np.full(g, np.nan)
    tail = (1.0 - level) / 2.0
    block = max(1, int(max_elements) // int(n_boot))
    for start in range(0, g, block):
        idx = np.arange(start, min(g, start + block))
        err = np.asarray(draw_errors(rng, idx, n_boot), dtype=np.float64)
        bad = ~np.isfinite(err)
        if failed == "drop":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a cell whose draws all fail: NaN
                q_lo, q_hi = np.nanquantile(np.where(bad, np.nan, err), [tail, 1.0 - tail], axis=0)
        else:
            q_lo = np.quantile(np.where(bad, -np.inf, err), tail, axis=0, method="higher")
            q_hi = np.quantile(np.where(bad, np.inf, err), 1.0 - tail, axis=0, method="lower")
        low[idx], high[idx] = theta[idx] - q_hi, theta[idx] - q_lo
    return low, high


def method_meta(method: str, statistic: str, neighbours: str | None, epsilon: float | None, delta: float,
                **text) -> dict:
    """A method's facts: method, statistic, neighbour relation, the epsilon and delta it ran at,
    their add/remove footing (``dptrain.core.neighbours.add_remove_footing``: a comparison convention
    for replace-one methods, not a guarantee), then ``split`` (how epsilon was split),
    ``guarantee``, ``reference`` and any further fields in ``text``."""
    split, guarantee, reference = text.pop("split"), text.pop("guarantee"), text.pop("reference")
    return {"method": method, "statistic": statistic, "neighbours": neighbours, "epsilon": epsilon,
            "delta": delta, "epsilon_add_remove_equivalent":
            None if neighbours is None else add_remove_footing(epsilon, neighbours),
            "epsilon_split": split, "guarantee": guarantee, "reference": reference, **text}


def widths(cells: Cells) -> tuple[float, float]:
    d = cells.domain
    return d.x_hi - d.x_lo, d.y_hi - d.y_lo


def sigma_bound(cells: Cells) -> float:
    """A PUBLIC upper bound on a cell's residual SD: (y_hi - y_lo) / 2. The residual variance about
    the population OLS line is at most Var(y), and a variable in [y_lo, y_hi] has variance at
    most a quarter of the squared width. Conservative: 0.5 on [0, 1] where a typical cell has 0.2."""
    return 0.5 * widths(cells)[1]


def sampling_sd(sigma: float | np.ndarray, n: np.ndarray, d: np.ndarray | float | None,
                Sxx: np.ndarray) -> np.ndarray:
    """The OLS sampling SD of theta for residual SD ``sigma``: sigma sqrt(1/n + d^2 / Sxx) with
    d = x0 - xbar (p25/p75), sigma / sqrt(Sxx) for the slope (``d`` None); NaN where n or Sxx is
    not > 0 (callers pass released or public n, xbar and Sxx, never the private ones)."""
    n, Sxx = np.asarray(n, dtype=np.float64), np.asarray(Sxx, dtype=np.float64)
    ok = (n > 0) & (Sxx > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = 1.0 / Sxx if d is None else 1.0 / n + np.square(d) / Sxx
        return np.where(ok, sigma * np.sqrt(v), np.nan)


# ---------------------------------------------------------------- the unit-square line (DP-GD, DP-SGD)
def unit_rows(cells: Cells) -> tuple[np.ndarray, np.ndarray]:
    """Rows on the unit square, x centred: u = (x - x_lo)/wx - 1/2, t = (y - y_lo)/wy."""
    d = cells.domain
    wx, wy = widths(cells)
    return (cells.x - d.x_lo) / wx - 0.5, (cells.y - d.y_lo) / wy


def theta_from_unit(a: np.ndarray, b: np.ndarray, cells: Cells, statistic: str) -> np.ndarray:
    """theta from the unit-scale line t = a + b u (a: prediction at the x-centre)."""
    d = cells.domain
    wx, wy = widths(cells)
    if statistic == "slope":
        return b * wy / wx
    return d.y_lo + wy * (a + b * ((d.x0(statistic) - d.x_lo) / wx - 0.5))


def noisy_count(cells: Cells, eps_n: float, rng: np.random.Generator) -> np.ndarray:
    """n + discrete Laplace(1 / eps_n) on the integer grid: eps_n-DP add/remove."""
    return add_noise(cells.n, 1.0 / eps_n, kind="laplace", rng=rng, step=1.0)


def calibrate_sigma(eps_g: float, *, q: float, steps: int, delta: float) -> float:
    """The noise multiplier of ``steps`` subsampled Gaussian steps at (eps_g, delta), by RDP."""
    try:
        return calibrate_noise_multiplier(target_epsilon=eps_g, sample_rate=q, steps=steps, delta=delta)
    except AccountingError as err:
        raise ReleaseError(f"release.epsilon_per_statistic: {err}") from None
