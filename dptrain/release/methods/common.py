"""Shared pieces of the release methods: argument checks, the common result frame and meta, and
the unit-square line model that DP gradient descent and DP-SGD fit.

Every method returns a :class:`~dptrain.release.methods.base.MethodResult` whose ``frame`` has one
row per cell in cell order (index ``cell``) and columns ``released`` (bool), ``reason`` ("" when
released, else why not), ``theta_released`` (NaN if not released) and ``noise_sd`` (SD of the
noise in theta where it can be computed from public or released quantities, else NaN); its
``meta`` says the method, neighbour relation, epsilon, delta, how epsilon was split, the paper,
and caveats (:func:`method_meta`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dptrain.neighbours import add_remove_footing
from dptrain.privacy.accounting import AccountingError, calibrate_noise_multiplier
from dptrain.release.cells import STATISTICS, Cells, ReleaseError
from dptrain.release.noise import add_noise

ALABI = ("Alabi, McMillan, Sarathy, Smith, Vadhan, 'Differentially Private Simple Linear Regression', "
         "PoPETs 2022 (arXiv 2007.05157)")
BOX_A, BOX_B = (-0.5, 1.5), (-4.0, 4.0)  # projection box of (prediction at the x-centre, slope), unit scale


# ---------------------------------------------------------------- argument checks
def check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed: one of {list(STATISTICS)}")


def check_epsilon(epsilon: float, name: str = "release.epsilon") -> float:
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


def result_frame(reason: np.ndarray, theta: np.ndarray, noise_sd: np.ndarray | float) -> pd.DataFrame:
    """The common result: released where the reason is "" and theta is finite."""
    theta = np.asarray(theta, dtype=np.float64)
    released = (reason == "") & np.isfinite(theta)
    reason = np.where((reason == "") & ~released, "estimate not finite", reason).astype(object)
    sd = np.broadcast_to(np.asarray(noise_sd, dtype=np.float64), theta.shape)
    return pd.DataFrame({
        "released": released,
        "reason": reason,
        "theta_released": np.where(released, theta, np.nan),
        "noise_sd": np.where(released, sd, np.nan),
    }, index=pd.RangeIndex(theta.shape[0], name="cell"))


def method_meta(method: str, statistic: str, neighbours: str | None, epsilon: float | None, delta: float,
                **text) -> dict:
    """A method's facts: method, statistic, neighbour relation, the epsilon and delta it ran at,
    their add/remove footing (``dptrain.neighbours.add_remove_footing``: a comparison convention
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
        raise ReleaseError(f"release.epsilon: {err}") from None
