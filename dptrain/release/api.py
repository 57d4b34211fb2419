"""Python API of the release side: fit per-cell estimates -> local sensitivity -> release.

    >>> keys = pd.DataFrame({"county": [...], "sex": [...]})          # the PUBLIC list of cells
    >>> est = fit_cells(df, x="parent_rank", y="kid_rank", cells=["county", "sex"], cell_keys=keys)
    >>> rel = est.release(statistic="p25", epsilon=1.0)              # MOS, CSPRNG noise
    >>> rel = est.release_dp_mos(statistic="p25", epsilon=1.0)       # DP-MOS: (3, 1e-6)-DP end to end
    >>> rel.to_frame()                                                 # one row per cell
    >>> est.release_custom(my_statistic, epsilon=1.0)                  # any f(x, y) -> float

Results are frozen objects with read-only properties and ``to_frame()``. ``CellEstimates``
holds PRIVATE per-cell estimates (for analysis and evaluation inside the secure environment);
only a ``Release`` is meant for publication. MOS is NOT differentially private: chi is computed
from the private data; the guarantee is only epsilon-DP conditional on chi.

Cells: pass ``cell_keys`` (a public table of the cells) so that the list of cells does not depend
on the rows; without it the cells are those OBSERVED in ``df`` and the list itself is private
(a one-person cell appears only when that person is in the data). ``seed``: reproducible noise
for analysis; no returned object echoes it, and whoever knows it can remove the noise.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dptrain.release import _ls_math
from dptrain.release.cells import (
    Cells,
    Domain,
    OLSFit,
    ReleaseError,
    group_cells,
    make_cells,
    ols,
    standard_error,
    statistic,
    xy_values,
)
from dptrain.release.mos import NOT_DP, MOSConfig, MOSInputs, MOSRelease, chi, release_mos
from dptrain.release.noise import add_noise, calibrate, make_rng
from dptrain.release.sensitivity import (
    Sensitivity,
    brute_force_cells,
    local_sensitivity,
    se_local_sensitivity,
)

if TYPE_CHECKING:
    from dptrain.release.cell_domain import CellDomain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Release:
    """A published release: ``frame`` (one row per cell, released values only), ``epsilon``
    (per statistic and per cell), ``info`` (method, neighbours, chi, randomness, privacy)."""

    frame: pd.DataFrame
    epsilon: dict
    info: dict

    @property
    def released(self) -> pd.Series:
        return self.frame["released"]

    @property
    def privacy(self) -> str:
        return str(self.info.get("privacy", ""))

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    @classmethod
    def from_mos(cls, mos: MOSRelease) -> Release:
        return cls(frame=mos.to_frame(), epsilon=dict(mos.epsilon),
                   info={**mos.info, "chi": mos.chi_table.to_dict(orient="records")})


@dataclass(frozen=True)
class CellEstimates:
    """Per-cell OLS fits of y on x (PRIVATE). Build with :func:`fit_cells` (or
    :func:`estimates_for_listed`, the release run's way).

    The OLS fit, its refined moments and the local sensitivities are computed once, on first
    use, and kept: a release run hands this one object to every method, the sensitivity code and
    the evaluation, so OLS runs once per run. ``listed``: the public cell list the cells came
    from (its public columns serve ``release.chi_by``), or None for observed cells."""

    cells: Cells
    cells_source: str = "observed in the rows (PRIVATE: the list of cells reveals which cells have rows)"
    listed: CellDomain | None = None
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n(self) -> np.ndarray:
        return self.cells.n.copy()

    @property
    def keys(self) -> pd.DataFrame:
        return self.cells.keys.copy()

    @cached_property
    def fit(self) -> OLSFit:
        """The per-cell OLS fit (``cells.ols``), computed once."""
        return ols(self.cells)

    @cached_property
    def moments(self) -> _ls_math.CellFit:
        """The OLS moments refined in one pass over the rows (what the sensitivity formulas use)."""
        return _ls_math.fit_cells(self.cells, self.fit)

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per ``key`` for these estimates (e.g. a method's sensitivities)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def theta(self, stat: str = "p25") -> np.ndarray:
        return statistic(self.fit, stat, self.cells.domain)

    def se(self, stat: str = "p25") -> np.ndarray:
        return standard_error(self.fit, stat, self.cells.domain)

    def local_sensitivity(self, *, statistic: str = "p25", neighbors: str = "add_remove") -> Sensitivity:
        return self.memo(("ls", statistic, neighbors), lambda: local_sensitivity(
            self.cells, statistic=statistic, neighbors=neighbors, moments=self.moments))

    def se_local_sensitivity(self, *, statistic: str = "p25", neighbors: str = "add_remove") -> Sensitivity:
        return self.memo(("se_ls", statistic, neighbors), lambda: se_local_sensitivity(
            self.cells, statistic=statistic, neighbors=neighbors, moments=self.moments))

    def to_frame(self, stat: str = "p25") -> pd.DataFrame:
        """Cell keys, N, theta, SE (PRIVATE: not for publication)."""
        out = self.keys
        out["n"], out["theta"], out["se"] = self.cells.n, self.theta(stat), self.se(stat)
        return out

    def release(self, *, statistic: str = "p25", epsilon: float | dict = 1.0, neighbors: str = "add_remove",
                noise: str = "laplace", chi_groups: np.ndarray | None = None, seed: int | None = None) -> Release:
        """MOS release of theta, its SE and N (docs/release.md). NOT differentially private
        (chi comes from the private data): epsilon-DP only conditional on chi."""
        mos = release_mos(self.cells, statistic=statistic, epsilon=epsilon, seed=seed,
                          precomputed=MOSInputs(fit=self.fit),
                          config=MOSConfig(neighbors=neighbors, noise=noise, chi_groups=chi_groups))
        rel = Release.from_mos(mos)
        return Release(frame=rel.frame, epsilon=rel.epsilon, info={**rel.info, "cells_source": self.cells_source})

    def release_dp_mos(self, *, statistic: str = "p25", epsilon: float = 1.0, delta: float = 1e-6,
                       split: dict | None = None, chi_quantile: float = 0.75, min_n: int = 3,
                       seed: int | None = None) -> Release:
        """DP-MOS release of chi and, per cell, theta, SE, N and a 95% interval (docs/dp_mos.md):
        (epsilon x sum of the split's shares, delta)-DP under add/remove neighbours, END TO END
        (chi is chosen privately; each cell passes a private stability test). ``split``: the share
        of epsilon per stage (default: n 0.25, se 0.5, chi 0.25, test 1.0, theta 1.0, total 3 epsilon);
        ``seed``: reproducible noise for analysis (never echoed; None: the OS CSPRNG)."""
        from dptrain.release.dp_mos import DEFAULT_SPLIT, DPMOSConfig, release_dp_mos

        rng, rng_desc = make_rng(seed)
        rel = release_dp_mos(self.cells, statistic=statistic, epsilon=epsilon, delta=delta, rng=rng,
                             config=DPMOSConfig(split=dict(split or DEFAULT_SPLIT), chi_quantile=chi_quantile,
                                                min_n=min_n))
        frame = pd.concat([self.keys.reset_index(drop=True), rel.frame.reset_index(drop=True)], axis=1)
        info = {"method": "dp_mos", "privacy": f"({rel.epsilon['total']:g}, {rel.delta:g})-DP end to end, "
                "add/remove neighbours", "chi": rel.chi, "rng": rng_desc, "cells_source": self.cells_source,
                **rel.info}
        return Release(frame=frame, epsilon=dict(rel.epsilon), info=info)

    def release_custom(self, stat_fn: Callable[[np.ndarray, np.ndarray], float], *, epsilon: float = 1.0,
                       neighbors: str = "add_remove", seed: int | None = None, grid: int = 41) -> Release:
        """MOS for ANY statistic of a cell's rows (e.g. a per-cell logit coefficient): LS by
        brute-force refits (remove each row; add a point on a grid x grid over the domain plus
        its corners), chi = max N LS, theta + discrete Laplace(chi / (epsilon N)),
        N + discrete Laplace(1 / epsilon). The SE is not released. Cost: one refit per row and
        grid point per cell (small data only); the grid makes the add-side sup a lower bound
        of the true sup, which the release states."""
        return release_custom(self.cells, stat_fn, epsilon=epsilon, neighbors=neighbors, seed=seed, grid=grid)


def fit_cells(df: pd.DataFrame, *, x: str, y: str, cells: list[str], domain: Domain | None = None,
              clip: bool = True, cell_keys: pd.DataFrame | None = None) -> CellEstimates:
    """Group rows into cells and fit OLS per cell (grouped sums; no loop over cells).

    ``cell_keys``: a PUBLIC table with one column per cell column and one row per cell; every
    listed cell is kept (with 0 rows if none match) and rows of unlisted cells are left out. Without
    it the cells are those observed in ``df``, which makes the list of cells private."""
    domain = domain or Domain()
    if cell_keys is None:
        return CellEstimates(group_cells(df, x=x, y=y, cells=list(cells), domain=domain, clip=clip))
    from dptrain.release.cell_domain import from_table

    listed = from_table(pd.DataFrame(cell_keys), list(cells), origin="declared", description="cell_keys",
                        setting="cell_keys")
    est = estimates_for_listed(df, listed, x=x, y=y, domain=domain, clip=clip)
    return CellEstimates(est.cells, cells_source="declared by the caller (cell_keys, public)", listed=listed)


def estimates_for_listed(df: pd.DataFrame, listed: CellDomain, *, x: str, y: str, domain: Domain,
                         clip: bool = True, drop_nonfinite: bool = False) -> CellEstimates:
    """Estimates of the LISTED cells (a public declaration or a DP selection): every listed cell
    is kept (with 0 rows if none match); each row of an unlisted cell, or with a missing cell
    value (or, with ``drop_nonfinite``, a missing or non-numeric x or y), is left out on its own,
    and the log says that some were, never how many. Rows are clipped to ``domain`` (``clip``) or
    refused if outside it."""
    for setting, col in (("release.x", x), ("release.y", y)):
        if col not in df.columns:
            raise ReleaseError(f"{setting}: column {col!r} is not in the data; allowed: a column of the table")
    codes = listed.row_codes(df)
    keep = codes >= 0
    if not keep.all():
        log.warning("release: rows whose cell is not listed (or has a missing cell value) are left out")
    xv, yv = xy_values(df.loc[keep], x=x, y=y, domain=domain, clip=clip, drop_nonfinite=drop_nonfinite)
    codes = codes[keep]
    finite = np.isfinite(xv) & np.isfinite(yv)
    if not finite.all():
        log.warning("release: rows with missing, non-numeric or infinite x or y are left out (data.nonfinite=drop)")
        xv, yv, codes = xv[finite], yv[finite], codes[finite]
    return CellEstimates(make_cells(xv, yv, codes, keys=listed.keys, domain=domain),
                         cells_source=listed.description, listed=listed)


def release_custom(cells: Cells, stat_fn: Callable[[np.ndarray, np.ndarray], float], *, epsilon: float,
                   neighbors: str = "add_remove", seed: int | None = None, grid: int = 41,
                   rng: np.random.Generator | None = None) -> Release:
    """See :meth:`CellEstimates.release_custom`. NOT differentially private (chi from the data).
    ``rng`` (a release run's stream) overrides ``seed``."""
    if not (isinstance(epsilon, (int, float)) and np.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"release.epsilon={epsilon!r} is not allowed: must be a finite number > 0")
    order = np.argsort(cells.codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(cells.codes, minlength=cells.n_cells))])
    with warnings.catch_warnings():  # a user statistic may warn on degenerate neighbours
        warnings.simplefilter("ignore")
        theta = np.array([_safe_call(stat_fn, cells.x[order[a:b]], cells.y[order[a:b]])
                          for a, b in itertools.pairwise(bounds)])
        ls = brute_force_cells(cells, stat_fn=stat_fn, neighbors=neighbors, grid=grid)
    ok = np.isfinite(ls) & np.isfinite(theta) & (cells.n >= 3)
    chi_v = chi(np.where(ok, ls, np.inf), cells.n)
    if rng is None:
        rng, rng_desc = make_rng(seed)
    else:
        rng_desc = "a numpy Generator supplied by the caller"
    with np.errstate(divide="ignore", invalid="ignore"):
        scale, step = calibrate(np.where(ok, chi_v / cells.n, np.inf), epsilon)
    theta_rel = np.where(ok, add_noise(np.where(ok, theta, 0.0), scale, kind="laplace", rng=rng, step=step), np.nan)
    n_scale, _ = calibrate(np.ones(cells.n_cells), epsilon)
    n_rel = np.where(ok, add_noise(cells.n, n_scale, kind="laplace", rng=rng, step=np.ones(cells.n_cells)), np.nan)
    frame = cells.keys.reset_index(drop=True).copy()
    frame["released"] = ok
    frame["reason"] = np.where(ok, "", np.where(cells.n < 3, "n < 3", "statistic undefined for a neighbour"))
    frame["theta_released"] = theta_rel
    frame["n_released"] = n_rel
    frame["noise_sd"] = np.where(ok, np.sqrt(2) * scale, np.nan)
    frame["chi"] = np.where(ok, chi_v, np.nan)
    info = {"method": "mos", "statistic": getattr(stat_fn, "__name__", "custom"), "neighbors": neighbors,
            "noise": "laplace", "rng": rng_desc, "privacy": NOT_DP,
            "sensitivity": f"brute-force refits on a {grid} x {grid} grid of added points plus every removal: "
            "the add-side supremum is a grid maximum (a lower bound of the exact supremum)"}
    return Release(frame=frame, epsilon={"theta": epsilon, "n": epsilon, "total_per_cell": 2 * epsilon,
                                         "total": 2 * epsilon}, info=info)


def _safe_call(fn: Callable[[np.ndarray, np.ndarray], float], x: np.ndarray, y: np.ndarray) -> float:
    try:
        v = float(fn(x, y))
    except Exception:  # noqa: BLE001 - a user statistic that fails on a cell leaves it unreleased
        return float("nan")
    return v
