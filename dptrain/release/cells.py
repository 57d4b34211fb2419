"""Per-cell sufficient statistics and OLS fits, for all cells at once (docs/release.md sections 1-2).

Everything here is vectorised over cells: grouped sums by ``np.bincount`` over integer cell
codes, never a Python loop over cells. Values are clipped into the declared PUBLIC domain
before anything is computed (that is what makes sensitivities finite).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from dptrain.core.errors import DPTrainError, ReleaseError  # noqa: F401 - ReleaseError offered here as before

Statistic = Literal["p25", "p75", "slope"]
STATISTICS: tuple[str, ...] = ("p25", "p75", "slope")


@dataclass(frozen=True)
class Domain:
    """The public domain of (x, y): a rectangle, by default the unit square of percentile ranks."""

    x_lo: float = 0.0
    x_hi: float = 1.0
    y_lo: float = 0.0
    y_hi: float = 1.0

    def __post_init__(self) -> None:
        for lo, hi, name in ((self.x_lo, self.x_hi, "x"), (self.y_lo, self.y_hi, "y")):
            if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise ReleaseError(f"release.domain {name}=[{lo}, {hi}] is not allowed: "
                                   "bounds must be finite with lo < hi")

    def x0(self, statistic: str) -> float:
        """The prediction point of p25 / p75: that quantile of the x range (0.25 on [0, 1])."""
        frac = {"p25": 0.25, "p75": 0.75}[statistic]
        return self.x_lo + frac * (self.x_hi - self.x_lo)


@dataclass(frozen=True)
class Cells:
    """Rows grouped into G cells. Arrays of length G are per cell (float64); ``x``, ``y``,
    ``codes`` are per row (rows already clipped to the domain; codes in 0..G-1)."""

    n: np.ndarray
    sx: np.ndarray
    sy: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray
    syy: np.ndarray
    x: np.ndarray
    y: np.ndarray
    codes: np.ndarray
    keys: pd.DataFrame  # G rows: the values of the cell columns, in code order
    domain: Domain

    @property
    def n_cells(self) -> int:
        return int(self.n.shape[0])


def cell_sums(x: np.ndarray, y: np.ndarray, codes: np.ndarray, n_cells: int) -> tuple[np.ndarray, ...]:
    """(n, sum x, sum y, sum x^2, sum xy, sum y^2) per cell by grouped sums."""

    def s(w: np.ndarray | None) -> np.ndarray:
        return np.bincount(codes, weights=w, minlength=n_cells).astype(np.float64)

    return s(None), s(x), s(y), s(x * x), s(x * y), s(y * y)


def make_cells(x: np.ndarray, y: np.ndarray, codes: np.ndarray, *, keys: pd.DataFrame, domain: Domain) -> Cells:
    """Clip rows to the domain and compute every cell's sufficient statistics."""
    x = np.clip(np.asarray(x, dtype=np.float64), domain.x_lo, domain.x_hi)
    y = np.clip(np.asarray(y, dtype=np.float64), domain.y_lo, domain.y_hi)
    codes = np.asarray(codes, dtype=np.int64)
    n, sx, sy, sxx, sxy, syy = cell_sums(x, y, codes, len(keys))
    return Cells(n=n, sx=sx, sy=sy, sxx=sxx, sxy=sxy, syy=syy, x=x, y=y, codes=codes, keys=keys, domain=domain)


def group_cells(
    df: pd.DataFrame, *, x: str, y: str, cells: list[str], domain: Domain, clip: bool = True
) -> Cells:
    """Group a table's rows into the cells OBSERVED in it (the distinct combinations of ``cells``).

    The list of cells is then a function of the private rows: a cell with one person appears
    only when that person is in the data. A release run never uses this (it takes the cells from
    a public declaration or a private selection, :mod:`dptrain.release.cell_domain`); it serves
    the Python API's analysis inside the secure environment.

    Args:
        df: the private microdata.
        x, y: names of the regressor and outcome columns (numeric, finite).
        cells: the columns whose value combinations define cells.
        domain: the public domain; rows outside it are clipped if ``clip`` else refused.
    """
    for setting, col in [("release.x", x), ("release.y", y)] + [("release.cells", c) for c in cells]:
        if col not in df.columns:
            raise ReleaseError(f"{setting}: column {col!r} is not in the data; allowed: a column of the table")
    if len(df) == 0:
        raise ReleaseError("the data has no rows: nothing to release")
    if not cells:
        raise ReleaseError("release.cells=[] is not allowed: name at least one cell column")
    xv, yv = xy_values(df, x=x, y=y, domain=domain, clip=clip)
    codes, uniques = pd.MultiIndex.from_frame(df[cells]).factorize() if len(cells) > 1 else pd.factorize(df[cells[0]])
    if (codes < 0).any():
        raise ReleaseError("release.cells: some rows have a missing cell value; allowed: a value in every cell column")
    if len(uniques) < 2:
        raise ReleaseError(f"release.cells={cells!r} defines fewer than 2 cells: a release needs at least 2 cells")
    keys = uniques.to_frame(index=False) if len(cells) > 1 else pd.DataFrame({cells[0]: np.asarray(uniques)})
    keys.columns = list(cells)
    return make_cells(xv, yv, codes, keys=keys, domain=domain)


def xy_values(df: pd.DataFrame, *, x: str, y: str, domain: Domain, clip: bool = True,
              drop_nonfinite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The x and y columns as float64. Missing, non-numeric or infinite entries are refused (or,
    with ``drop_nonfinite``, returned as NaN for the caller to leave out); with ``clip=False``,
    entries outside the domain are refused (:func:`dptrain.release.api.estimates_for_listed`
    leaves such rows out instead). Messages never count or quote the entries."""
    xv = pd.to_numeric(df[x], errors="coerce").to_numpy(dtype=np.float64)
    yv = pd.to_numeric(df[y], errors="coerce").to_numpy(dtype=np.float64)
    for setting, col, v in (("release.x", x, xv), ("release.y", y, yv)):
        if not drop_nonfinite and not np.isfinite(v).all():
            raise ReleaseError(f"{setting}: column {col!r} has missing, non-numeric or infinite entries; allowed: "
                               "finite numbers in every row, or data.nonfinite=drop (such rows are left out)")
    if not clip:
        for setting, col, v, lo, hi in (("release.x", x, xv, domain.x_lo, domain.x_hi),
                                        ("release.y", y, yv, domain.y_lo, domain.y_hi)):
            if ((v < lo) | (v > hi)).any():
                raise ReleaseError(
                    f"{setting}: column {col!r} has entries outside the declared domain [{lo}, {hi}]; "
                    "allowed: values inside release.domain, or release.clip=true")
    return xv, yv


@dataclass(frozen=True)
class OLSFit:
    """Per-cell OLS y = a + b x. ``defined`` is False where n < 3 or Sxx == 0 (not released)."""

    a: np.ndarray
    b: np.ndarray
    xbar: np.ndarray
    Sxx: np.ndarray  # sum (x - xbar)^2
    rss: np.ndarray  # residual sum of squares
    n: np.ndarray
    defined: np.ndarray


def centred_sums(n, sx, sy, sxx, sxy) -> tuple:
    """(xbar, ybar, Sxx, Sxy) from raw sums (broadcastable arrays): THE OLS arithmetic of the
    package. :func:`ols` uses it for every cell, :func:`ols_line` for refits on sums that are not
    a cell's (the figures' "one point added" grids)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar = sx / n
        ybar = sy / n
        Sxx = np.maximum(sxx - n * xbar * xbar, 0.0)
        Sxy = sxy - n * xbar * ybar
    return xbar, ybar, Sxx, Sxy


def ols_line(n, sx, sy, sxx, sxy) -> tuple:
    """(a, b) of the OLS line from raw sums (broadcastable; no definedness rule: NaN or inf where
    Sxx = 0). For sums that are not a cell's, e.g. a cell with one point added on a grid."""
    xbar, ybar, Sxx, Sxy = centred_sums(n, sx, sy, sxx, sxy)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = Sxy / Sxx
        return ybar - b * xbar, b


def ols(c: Cells) -> OLSFit:
    """Closed-form OLS per cell from sufficient statistics (float64; NaN where undefined).

    A release run computes it ONCE (``CellEstimates.fit``) and passes it on: to the sensitivity
    code (``_ls_math.fit_cells`` refines it), MOS, suppression and the evaluation."""
    n = c.n
    xbar, ybar, Sxx, Sxy = centred_sums(n, c.sx, c.sy, c.sxx, c.sxy)
    with np.errstate(divide="ignore", invalid="ignore"):
        Syy = np.maximum(c.syy - n * ybar * ybar, 0.0)
        # Sxx below rounding noise of the raw sums counts as no spread
        defined = (n >= 3) & (Sxx > 1e-12 * np.maximum(c.sxx, 1e-300))
        b = np.where(defined, Sxy / Sxx, np.nan)
        a = np.where(defined, ybar - b * xbar, np.nan)
        rss = np.where(defined, np.maximum(Syy - b * Sxy, 0.0), np.nan)
    return OLSFit(a=a, b=b, xbar=xbar, Sxx=Sxx, rss=rss, n=n, defined=defined)


def statistic(fit: OLSFit, kind: str, domain: Domain) -> np.ndarray:
    """theta per cell: a + b x0 for p25/p75, b for slope."""
    if kind == "slope":
        return fit.b
    return fit.a + fit.b * domain.x0(kind)


def standard_error(fit: OLSFit, kind: str, domain: Domain) -> np.ndarray:
    """Homoskedastic OLS standard error of theta: s^2 = RSS / (n - 2);
    SE(slope) = sqrt(s^2 / Sxx); SE(a + b x0) = sqrt(s^2 (1/n + (x0 - xbar)^2 / Sxx))."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = fit.rss / (fit.n - 2)
        if kind == "slope":
            v = s2 / fit.Sxx
        else:
            x0 = domain.x0(kind)
            v = s2 * (1.0 / fit.n + (x0 - fit.xbar) ** 2 / fit.Sxx)
    return np.where(fit.defined, np.sqrt(v), np.nan)
