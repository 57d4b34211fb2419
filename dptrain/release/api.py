"""Python API of the release side: fit per-cell estimates -> local sensitivity -> release.

    >>> keys = pd.DataFrame({"county": [...], "sex": [...]})          # the PUBLIC list of cells
    >>> est = fit_cells(df, x="parent_rank", y="kid_rank", cells=["county", "sex"], cell_keys=keys)
    >>> est = fit_cells(df, ..., selection=PrivateSelectionConfig())  # or: cells selected with (1, 1e-6)-DP
    >>> rel = est.release(statistic="p25", epsilon=1.0)              # MOS, CSPRNG noise
    >>> rel = est.release_dp_mos(statistic="p25", epsilon=1.0)       # DP-MOS: (3, 1e-6)-DP end to end
    >>> rel.to_frame()                                                 # one row per cell
    >>> est.release_custom(my_statistic, epsilon=1.0)                  # any f(x, y) -> float

Results are frozen objects with read-only properties and ``to_frame()``. ``CellEstimates``
holds PRIVATE per-cell estimates (for analysis and evaluation inside the secure environment);
only a ``Release`` is meant for publication. MOS is NOT differentially private: chi is computed
from the private data; the guarantee is only epsilon-DP conditional on chi.

The API refuses what the command line refuses. The list of cells must not come from the rows
present (a one-person cell would appear only when that person is in the data), so
:func:`fit_cells` takes either ``cell_keys`` (a PUBLIC table of the cells, like
``release.cell_keys_file``) or ``selection=PrivateSelectionConfig(epsilon, delta)`` (the
stability-based selection of ``release.cell_selection=private``, (epsilon, delta)-DP, composed
into every release's totals); with neither it raises the command line's refusal, and every
``release*`` method refuses estimates whose cells were not listed that way (e.g. a
``CellEstimates`` built by hand from :func:`~dptrain.release.cells.group_cells`).

Noise: fresh from the OS CSPRNG by default. ``seed``, a
:class:`~dptrain.privacy.randomness.Randomness` key (e.g. ``Randomness.from_seed_file``) or an
int (for analysis), makes it reproducible; either way the streams are bound to the rows the
mechanism reads (:func:`~dptrain.privacy.randomness.data_digest`), so the same key or seed on a
table with one row more draws independent noise (reused noise would cancel in the difference of
two releases). No returned object echoes a seed or a digest; whoever knows the seed (or holds the
key file) and the rows can regenerate the noise and remove it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from dptrain.core.validation import bad
from dptrain.privacy.randomness import Randomness, data_digest
from dptrain.release import _ls_math
from dptrain.release.cell_domain import CellDomain, CellSource, check_listing, from_table, select_cells
from dptrain.release.cells import (
    Cells,
    Domain,
    OLSFit,
    ReleaseError,
    make_cells,
    ols,
    standard_error,
    statistic,
    xy_values,
)
from dptrain.release.dp_mos import DPMOSConfig, release_dp_mos
from dptrain.release.mos import NOT_DP, MOSConfig, MOSInputs, MOSRelease, chi, release_mos
from dptrain.release.noise import add_noise, calibrate, make_rng
from dptrain.release.report import composed_total, declared_selection
from dptrain.release.sensitivity import (
    Sensitivity,
    brute_force_cells,
    local_sensitivity,
    se_local_sensitivity,
)

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
    listed: CellDomain | None = None  # None: cells observed in the rows, which every release_* refuses
    #: PRIVATE counts of the rows read and left out, per rule (:func:`estimates_for_listed`; {} when not counted)
    rows: dict = field(default_factory=dict)
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
                noise: str = "laplace", chi_groups: np.ndarray | None = None,
                seed: int | Randomness | None = None) -> Release:
        """MOS release of theta, its SE and N (docs/release.md). NOT differentially private
        (chi comes from the private data): epsilon-DP only conditional on chi."""
        self.check_listed()
        rng, rng_desc = self.stream("release-mos", seed=seed)
        mos = release_mos(self.cells, statistic=statistic, epsilon=epsilon, rng=rng,
                          precomputed=MOSInputs(fit=self.fit),
                          config=MOSConfig(neighbors=neighbors, noise=noise, chi_groups=chi_groups))
        rel = Release.from_mos(mos)
        return Release(frame=rel.frame, epsilon=rel.epsilon, info={**rel.info, **self.listing_info(), "rng": rng_desc})

    def release_dp_mos(self, *, statistic: str = "p25", epsilon: float = 1.0, delta: float = 1e-6,
                       settings: DPMOSConfig | None = None, seed: int | Randomness | None = None,
                       small_groups: bool = False) -> Release:
        """DP-MOS release of chi and, per cell, theta, SE, N and a 95% interval (docs/dp_mos.md):
        (epsilon x sum of the split's shares, delta)-DP under add/remove neighbours, END TO END
        (chi is chosen privately; each cell passes a private stability test), plus, by basic
        composition, a private cell selection's (epsilon, delta) when the cells were selected
        privately. ``settings``: a :class:`~dptrain.release.dp_mos.DPMOSConfig` (the share of
        epsilon per stage, default n 0.25, se 0.5, chi 0.25, test 1.0, theta 1.0, total 3
        epsilon; chi_quantile 0.75; min_n 3; its chi_groups must be None here); ``seed`` (an int or a
        :class:`~dptrain.privacy.randomness.Randomness` key): reproducible noise for analysis,
        bound to the rows (never echoed; None: the OS CSPRNG). ``small_groups=True`` releases even
        where the cells are too few for a useful private chi (refused by default, with the settings
        that would help: :func:`dptrain.release.dp_mos.check_chi_groups`)."""
        self.check_listed()
        rng, rng_desc = self.stream("release-dp_mos", seed=seed)
        rel = release_dp_mos(self.cells, statistic=statistic, epsilon=epsilon, delta=delta, rng=rng,
                             config=dataclasses.replace(settings or DPMOSConfig(),
                                                        refuse_small_groups=not small_groups))
        frame = pd.concat([self.keys.reset_index(drop=True), rel.frame.reset_index(drop=True)], axis=1)
        listing = self.listing_info(epsilon=float(rel.epsilon["total"]), delta=float(rel.delta))
        total = listing["total"]
        privacy = (f"({total['epsilon']:g}, {total['delta']:g})-DP end to end, add/remove neighbours"
                   + ("" if self.listed.selection is None else
                      " (DP-MOS and the private cell selection, by basic composition)"))
        info = {"method": "dp_mos", "privacy": privacy, "chi": rel.chi, "rng": rng_desc, **listing, **rel.info}
        return Release(frame=frame, epsilon=dict(rel.epsilon), info=info)

    def release_custom(self, stat_fn: Callable[[np.ndarray, np.ndarray], float], *, epsilon: float = 1.0,
                       neighbors: str = "add_remove", seed: int | Randomness | None = None,
                       grid: int = 41) -> Release:
        """MOS for ANY statistic of a cell's rows (e.g. a per-cell logit coefficient): LS by
        brute-force refits (remove each row; add a point on a grid x grid over the domain plus
        its corners), chi = max N LS, theta + discrete Laplace(chi / (epsilon N)),
        N + discrete Laplace(1 / epsilon). The SE is not released. Cost: one refit per row and
        grid point per cell (small data only); the grid makes the add-side sup a lower bound
        of the true sup, which the release states."""
        self.check_listed()
        rng, rng_desc = self.stream("release-mos-custom", seed=seed)
        rel = release_custom(self.cells, stat_fn, epsilon=epsilon, neighbors=neighbors, grid=grid, rng=rng)
        return Release(frame=rel.frame, epsilon=rel.epsilon, info={**rel.info, **self.listing_info(), "rng": rng_desc})

    # ------------------------------------------------------------------ what every release checks
    def check_listed(self) -> None:
        """Refuse cells OBSERVED in the rows (not a public declaration, not a private selection)
        with the command line's message (:func:`dptrain.release.cell_domain.check_listing`)."""
        if self.listed is None:
            check_listing(_api_source(keys=False, selection=None))
            raise ReleaseError("the cells were not listed by a declaration or a private selection")  # unreachable

    def stream(self, name: str, *, seed: int | Randomness | None) -> tuple[np.random.Generator, str]:
        """The secret stream ``name`` of one release, bound to these cells' rows (:func:`secret_stream`)."""
        digest = self.memo("data_digest", lambda: cells_digest(self.cells))
        return secret_stream(name, digest, seed=seed)

    def listing_info(self, *, epsilon: float | None = None, delta: float = 0.0) -> dict[str, Any]:
        """Where the cells come from, the selection's facts and, for a DP method's ``epsilon`` and
        ``delta``, the totals composed with a private selection (the release run's rule)."""
        out: dict[str, Any] = {"cells_source": self.cells_source, "cell_selection": declared_selection(self.listed)}
        if epsilon is not None:
            out["total"] = composed_total("add_remove", epsilon, delta, self.listed.selection)
        return out


def _api_source(*, keys: bool, selection: PrivateSelectionConfig | None) -> CellSource:
    """An API call's cells as the command line's check sees them: rows in memory (like data=table),
    a ``cell_keys`` table (a declared keys file) or a private selection."""
    return CellSource(has_values=False, keys_file="cell_keys" if keys else None,
                      selection="declared" if selection is None else "private",
                      selection_epsilon=None if selection is None else selection.epsilon,
                      selection_delta=None if selection is None else selection.delta, simulated=False)


def cells_digest(cells: Cells) -> str:
    """:func:`~dptrain.privacy.randomness.data_digest` of the rows a release reads: the listed
    cells' keys and every row's (x, y, cell)."""
    return data_digest(cells.x, cells.y, cells.codes, cells.keys)


def _int64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def secret_stream(name: str, digest: str, *, seed: int | Randomness | None) -> tuple[np.random.Generator, str]:
    """(a numpy Generator, a sentence on its seeding) for the stream ``name`` of an API call that
    reads the data of ``digest`` (:func:`~dptrain.privacy.randomness.data_digest`). ``seed``
    None: 256 fresh bits from the OS CSPRNG. A :class:`Randomness` (e.g. a key file's): its
    stream bound to the data (:meth:`Randomness.for_data`). An int: PCG64 from the seed, the data
    digest and the name, so the same seed on other rows (one row more) draws independent noise."""
    if isinstance(seed, Randomness):
        bound = seed.for_data(digest)
        return bound.numpy(name), bound.describe()
    rng, desc = make_rng(seed)  # the seed's checks; None: fresh from the OS CSPRNG
    if seed is None:
        return rng, desc
    seq = np.random.SeedSequence(entropy=int(seed), spawn_key=(_int64(digest), _int64(name)))
    return (np.random.Generator(np.random.PCG64(seq)),
            desc + "; the stream is derived from the seed AND a digest of the rows the release reads (never "
            "written), so the same seed on other rows draws independent noise")


@dataclass(frozen=True)
class PrivateSelectionConfig:
    """:func:`fit_cells`' private cell selection (``release.cell_selection=private``): the
    stability-based histogram at (``epsilon``, ``delta``)-DP under add/remove neighbours, its
    noise from ``seed`` (an int or a :class:`~dptrain.privacy.randomness.Randomness` key, bound
    to the rows; None: the OS CSPRNG)."""

    epsilon: float = 1.0
    delta: float = 1e-6
    seed: int | Randomness | None = None


def fit_cells(df: pd.DataFrame, *, x: str, y: str, cells: list[str], domain: Domain | None = None,
              clip: bool = True, cell_keys: pd.DataFrame | None = None,
              selection: PrivateSelectionConfig | None = None) -> CellEstimates:
    """Group rows into LISTED cells and fit OLS per cell (grouped sums; no loop over cells).

    The cells come, as on the command line, from ``cell_keys``: a PUBLIC table with one column
    per cell column and one row per cell (every listed cell is kept, with 0 rows if none match;
    rows of unlisted cells are left out), or from ``selection=PrivateSelectionConfig(...)``: the
    stability-based selection of ``release.cell_selection=private``
    (:func:`dptrain.release.cell_domain.select_cells`, (epsilon, delta)-DP under add/remove
    neighbours, composed into every release's totals). With neither, the command line's refusal
    is raised (:func:`dptrain.release.cell_domain.check_listing`): cells observed in the rows
    would reveal who is in them."""
    if selection is not None and not isinstance(selection, PrivateSelectionConfig):
        raise bad("selection", selection, "must be None or a dptrain.release.api.PrivateSelectionConfig")
    check_listing(_api_source(keys=cell_keys is not None, selection=selection))
    if cell_keys is not None:
        listed = from_table(pd.DataFrame(cell_keys), list(cells), origin="declared",
                            description="declared by the caller (cell_keys)", setting="cell_keys")
    else:
        rng, _ = secret_stream("release-cell-selection", data_digest(df), seed=selection.seed)
        listed = select_cells(df, list(cells), epsilon=selection.epsilon, delta=selection.delta, rng=rng)
        if listed.n_cells == 0:
            raise ReleaseError("the private cell selection listed no cell (a DP outcome); allowed: a larger "
                               "PrivateSelectionConfig epsilon or delta, or declare the cells (cell_keys)")
    return estimates_for_listed(df, listed, x=x, y=y, domain=domain or Domain(), clip=clip)


def estimates_for_listed(df: pd.DataFrame, listed: CellDomain, *, x: str, y: str, domain: Domain,
                         clip: bool = True, drop_nonfinite: bool = False) -> CellEstimates:
    """Estimates of the LISTED cells (a public declaration or a DP selection): every listed cell
    is kept (with 0 rows if none match). Each row is decided on its own by a stated rule: a row of
    an unlisted cell (or with a missing cell value) is left out; a row with a missing,
    non-numeric or infinite x or y is left out with ``drop_nonfinite`` (else the table is
    refused: data.nonfinite=error, the user's choice); a row outside ``domain`` is clipped into
    it (``clip``) or left out (``clip=False``). Nothing else about the rows is refused. The
    PRIVATE counts of each rule are the estimates' ``rows`` (never logged here)."""
    for setting, col in (("release.x", x), ("release.y", y)):
        if col not in df.columns:
            raise ReleaseError(f"{setting}: column {col!r} is not in the data; allowed: a column of the table")
    codes = listed.row_codes(df)
    listed_rows = codes >= 0
    xy_values(df.loc[listed_rows], x=x, y=y, domain=domain, drop_nonfinite=drop_nonfinite)  # refuses, if asked
    xv, yv = xy_values(df, x=x, y=y, domain=domain, drop_nonfinite=True)
    bad_x, bad_y = ~np.isfinite(xv), ~np.isfinite(yv)
    with np.errstate(invalid="ignore"):
        outside = np.zeros(len(df), dtype=bool) if clip else (
            (xv < domain.x_lo) | (xv > domain.x_hi) | (yv < domain.y_lo) | (yv > domain.y_hi))
    keep = listed_rows & ~bad_x & ~bad_y & ~outside
    rows = {"read": int(len(df)), "kept": int(keep.sum()), "left_out": int((~keep).sum()),
            "left_out_by": {"cells": {"not_listed_or_missing": int((~listed_rows).sum())},
                            "x": {"missing_or_not_a_number": int(bad_x.sum())},
                            "y": {"missing_or_not_a_number": int(bad_y.sum())},
                            "domain": {"outside (release.clip=false)": int(outside.sum())}}}
    return CellEstimates(make_cells(xv[keep], yv[keep], codes[keep], keys=listed.keys, domain=domain),
                         cells_source=listed.description, listed=listed, rows=rows)


def release_custom(cells: Cells | CellEstimates, stat_fn: Callable[[np.ndarray, np.ndarray], float], *,
                   epsilon: float, neighbors: str = "add_remove", seed: int | None = None, grid: int = 41,
                   rng: np.random.Generator | None = None) -> Release:
    """See :meth:`CellEstimates.release_custom`. NOT differentially private (chi from the data).
    ``rng`` (a release run's stream) overrides ``seed``. ``cells``: estimates (their listing is
    checked, :meth:`CellEstimates.check_listed`), or the bare ``Cells`` of a listing the caller
    has already checked (a release run's)."""
    if isinstance(cells, CellEstimates):
        cells.check_listed()
        cells = cells.cells
    if not (isinstance(epsilon, (int, float)) and np.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"release.epsilon_per_statistic={epsilon!r} is not allowed: must be a finite number > 0")
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
        rng, rng_desc = secret_stream("release-mos-custom", cells_digest(cells), seed=seed)
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
