"""Maximum Observed Sensitivity (Chetty & Friedman 2019), docs/release.md sections 3-4.

The MOS mechanism on cells (the Python API's release and the registered method
``release.method=mos``, :mod:`dptrain.release.methods.mos`, both call :func:`release_mos`):

    chi_g      = max over the cells h of g's chi-group of N_h LS_h   (cells with infinite LS skipped)
    theta~_g   = theta_g + noise of scale t_g,  t_g ~= chi / (eps_theta N_g)
    SE_noised  = SE_g + noise of scale ~= chi_SE / (eps_se N_g)      (the SE is a statistic with its
                                                                       own LS and its own chi_SE)
    SE~_g      = sqrt(SE_noised^2 + 2 t_g^2)                          (SE of theta~: sampling + noise)
    N~_g       = N_g + discrete noise of scale 1 / eps_n on the integer grid
    noise_sd_g = sqrt(2) t_g

All noise comes from :mod:`dptrain.release.noise` (grid-snapped, floating-point safe), three
independent draws per cell (theta, SE, N). For Laplace noise the scale is calibrated on the grid:
t = (Delta + gamma) / eps with Delta = chi / N and gamma = grid_step(Delta / eps), a relative
inflation of at most 2^-20 / eps over chi / (eps N) (see noise.py for why).

MOS is NOT differentially private: chi is computed from the private data and a single cell can
set it. The guarantee is only epsilon-DP conditional on chi (and on the envelope LS <= chi / N).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dptrain.release.sensitivity import local_sensitivity, se_local_sensitivity

from .cells import STATISTICS, Cells, OLSFit, ReleaseError, ols, standard_error
from .cells import statistic as cell_statistic
from .intervals import interval_columns, laplace_normal_halfwidth, normal_halfwidth
from .noise import NOISE_KINDS, add_noise, calibrate, make_rng

NEIGHBORS: tuple[str, ...] = ("add", "add_remove")

NOT_DP = ("MOS is NOT differentially private: chi is computed from the private data and a single "
          "cell can set it; the guarantee is only epsilon-DP conditional on chi.")


def chi(ls: np.ndarray, n: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Per cell: the maximum of n_h * ls_h over the cells h of its group.

    Cells whose LS is infinite or NaN (not released) are ignored; a group with no finite LS gets
    NaN. ``groups``: one group label per cell (integer codes or any hashable labels); None = all
    cells form one group (the Stata guide's choice). Vectorised: one ``np.maximum.at``.
    """
    ls = np.asarray(ls, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if ls.shape != n.shape or ls.ndim != 1:
        raise ReleaseError(f"release.chi: ls {ls.shape} and n {n.shape} must be 1-d arrays of the same length")
    codes = _group_codes(groups, ls.shape[0])
    ok = np.isfinite(ls) & np.isfinite(n)
    v = np.where(ok, n * np.where(ok, ls, 0.0), -np.inf)
    k = int(codes.max()) + 1 if codes.size else 0
    m = np.full(k, -np.inf)
    np.maximum.at(m, codes, v)
    out = m[codes]
    return np.where(np.isneginf(out), np.nan, out)


def _group_codes(groups: Any, n_cells: int) -> np.ndarray:
    if groups is None:
        return np.zeros(n_cells, dtype=np.int64)
    g = np.asarray(groups)
    if g.shape != (n_cells,):
        raise ReleaseError(f"release.chi_groups has shape {g.shape}: one group label per listed cell "
                           f"({n_cells}) is needed")
    codes, _ = pd.factorize(pd.Series(g), use_na_sentinel=True)
    if (codes < 0).any():
        raise ReleaseError("release.chi_groups: some cells have a missing group; allowed: one group label per cell")
    return codes.astype(np.int64)


@dataclass(frozen=True)
class MOSRelease:
    """A MOS release. ``frame``: one row per cell (cell keys, group, released, reason,
    theta_released, se_released, n_released, noise_sd, ci_low, ci_high (the 95% interval from
    released values), chi, chi_se) and never a true value.
    ``chi_table``: per chi-group chi (theta) and chi_se. ``epsilon``: theta / se / n,
    total_per_cell (sum: sequential composition in a cell) and total (the same: parallel
    composition over disjoint cells). ``info``: method, settings, rng, warnings."""

    frame: pd.DataFrame
    chi_table: pd.DataFrame
    epsilon: dict
    info: dict

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()


@dataclass(frozen=True)
class MOSConfig:
    """How MOS runs (the defaults are the paper's). ``neighbors``: "add" (the Stata guide) or
    "add_remove"; ``noise``: "laplace" (grid discrete Laplace) or "normal" (rounded Gaussian, same
    variance, no pure-epsilon meaning); ``epsilon_split``: the shares of a single epsilon given to
    theta, SE and N; ``chi_groups``: one PUBLIC group label per cell over which chi is maximised
    (None: all cells form one group)."""

    neighbors: str = "add_remove"
    noise: str = "laplace"
    epsilon_split: tuple = (1, 1, 1)
    chi_groups: np.ndarray | None = None


@dataclass(frozen=True)
class MOSInputs:
    """What a caller has already computed for these cells: ``sensitivity`` and ``se_sensitivity``
    (``Sensitivity``-like objects with ``.ls`` and optionally ``.reason`` / ``.beat_corners``) and
    the per-cell OLS ``fit``. Whatever is None is computed by :func:`release_mos`."""

    sensitivity: Any = None
    se_sensitivity: Any = None
    fit: OLSFit | None = None


def _epsilons(epsilon: float | dict, split: tuple) -> dict[str, float]:
    if isinstance(epsilon, dict):
        if set(epsilon) != {"theta", "se", "n"}:
            raise ReleaseError(f"release.epsilon_per_statistic keys {sorted(map(str, epsilon))} are not allowed: "
                               "exactly theta, se, n")
        if tuple(split) != (1, 1, 1):
            raise ReleaseError(f"release.epsilon_split={tuple(split)!r} is not allowed with a dict epsilon: "
                               "leave it at (1, 1, 1) or give a single epsilon")
        eps = {k: epsilon[k] for k in ("theta", "se", "n")}
    else:
        try:
            split = tuple(float(s) for s in split)
        except (TypeError, ValueError):
            raise ReleaseError(f"release.epsilon_split={split!r} is not allowed: three finite numbers > 0") from None
        if len(split) != 3 or not all(np.isfinite(s) and s > 0 for s in split):
            raise ReleaseError(f"release.epsilon_split={split!r} is not allowed: three finite numbers > 0")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
            raise ReleaseError(f"release.epsilon_per_statistic={epsilon!r} is not allowed: a finite number > 0 or a "
                               "dict theta/se/n")
        eps = {k: float(epsilon) * s for k, s in zip(("theta", "se", "n"), split)}
    for k, e in eps.items():
        is_number = isinstance(e, (int, float, np.integer, np.floating)) and not isinstance(e, bool)
        if not (is_number and np.isfinite(e) and e > 0):
            raise ReleaseError(f"release.epsilon_per_statistic[{k}]={e!r} is not allowed: a finite number > 0")
    return {k: float(e) for k, e in eps.items()}


def _sens(obj: Any, n_cells: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ls = np.asarray(obj.ls, dtype=np.float64)
    if ls.shape != (n_cells,):
        raise ReleaseError(f"release: {what} LS has shape {ls.shape}, expected ({n_cells},)")
    reason = np.asarray(getattr(obj, "reason", np.full(n_cells, "", dtype=object)), dtype=object)
    beat = np.asarray(getattr(obj, "beat_corners", np.zeros(n_cells, dtype=bool)), dtype=bool)
    return ls, reason, beat


def _check_settings(statistic: str, cfg: MOSConfig) -> None:
    if statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed: one of {list(STATISTICS)}")
    if cfg.neighbors not in NEIGHBORS:
        raise ReleaseError(f"release.neighbors={cfg.neighbors!r} is not allowed: one of {list(NEIGHBORS)}")
    if cfg.noise not in NOISE_KINDS:
        raise ReleaseError(f"release.noise={cfg.noise!r} is not allowed: one of {list(NOISE_KINDS)}")


def _complete(cells: Cells, statistic: str, neighbors: str, given: MOSInputs | None) -> MOSInputs:
    """``given`` with every missing piece computed (sensitivities by the closed forms)."""
    given = given or MOSInputs()
    sens, se_sens = given.sensitivity, given.se_sensitivity
    if sens is None or se_sens is None:
        if sens is None:
            sens = local_sensitivity(cells, statistic=statistic, neighbors=neighbors)
        if se_sens is None:
            se_sens = se_local_sensitivity(cells, statistic=statistic, neighbors=neighbors)
    return MOSInputs(sensitivity=sens, se_sensitivity=se_sens, fit=ols(cells) if given.fit is None else given.fit)


@dataclass(frozen=True)
class _Cellwise:
    """The exact per-cell quantities MOS adds noise to, and what decides release (PRIVATE)."""

    theta: np.ndarray
    se: np.ndarray
    n: np.ndarray
    chi_t: np.ndarray
    chi_s: np.ndarray
    released: np.ndarray
    reason: np.ndarray
    beat_t: np.ndarray
    beat_s: np.ndarray


def _cellwise(cells: Cells, statistic: str, inputs: MOSInputs, group_codes: np.ndarray) -> _Cellwise:
    """theta, SE, N, chi and chi_SE per cell, which cells are released and why not."""
    G = cells.n_cells
    ls, reason_t, beat_t = _sens(inputs.sensitivity, G, "theta")
    ls_se, reason_s, beat_s = _sens(inputs.se_sensitivity, G, "SE")
    fit = inputs.fit
    n = np.asarray(cells.n, dtype=np.float64)
    defined = np.asarray(fit.defined, dtype=bool)
    ls = np.where(defined, ls, np.inf)
    ls_se = np.where(defined, ls_se, np.inf)
    chi_t = chi(ls, n, group_codes)
    chi_s = chi(ls_se, n, group_codes)
    released = defined & np.isfinite(ls) & np.isfinite(ls_se) & np.isfinite(chi_t) & np.isfinite(chi_s) & (n > 0)
    # why not released: the sensitivity's reason, else the OLS failure, else chi
    fallback = np.where(n < 3, "n < 3", np.where(~defined, "no spread in x", "no finite LS in the chi group"))
    reason = np.where(reason_t != "", reason_t, np.where(reason_s != "", reason_s, fallback)).astype(object)
    return _Cellwise(theta=cell_statistic(fit, statistic, cells.domain),
                     se=standard_error(fit, statistic, cells.domain), n=n, chi_t=chi_t, chi_s=chi_s,
                     released=released, reason=np.where(released, "", reason).astype(object),
                     beat_t=beat_t, beat_s=beat_s)


def _noisy(cw: _Cellwise, eps: dict[str, float], noise: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The released columns: three independent draws per cell (theta, SE, N), whatever is released."""
    released, n = cw.released, cw.n
    with np.errstate(divide="ignore", invalid="ignore"):
        delta_t = np.where(released, cw.chi_t / np.where(released, n, 1.0), np.inf)  # envelope chi / N
        delta_s = np.where(released, cw.chi_s / np.where(released, n, 1.0), np.inf)
    t_theta, g_theta = calibrate(delta_t, eps["theta"])
    t_se, g_se = calibrate(delta_s, eps["se"])
    t_n = np.where(released, 1.0 / eps["n"], np.inf)  # N moves by exactly 1 on the integer grid: no inflation
    theta_rel = add_noise(cw.theta, t_theta, kind=noise, rng=rng, step=g_theta)
    se_noised = add_noise(cw.se, t_se, kind=noise, rng=rng, step=g_se)
    n_rel = add_noise(n, t_n, kind=noise, rng=rng, step=1.0)
    noise_sd = np.where(released, np.sqrt(2.0) * t_theta, np.nan)
    # the interval, from released values only: the noised SE (clamped at 0) as the sampling SD and
    # the theta noise's own law (Laplace of scale t, or normal of SD noise_sd)
    se_part = np.maximum(np.where(released, se_noised, np.nan), 0.0)
    if noise == "laplace":
        half = laplace_normal_halfwidth(s=se_part, b=np.where(released, t_theta, np.nan))
    else:
        half = normal_halfwidth(sd=np.sqrt(se_part ** 2 + noise_sd ** 2))
    return {"theta_released": np.where(released, theta_rel, np.nan),
            "se_released": np.where(released, np.sqrt(se_noised ** 2 + noise_sd ** 2), np.nan),
            "n_released": np.where(released, n_rel, np.nan), "noise_sd": noise_sd,
            **interval_columns(theta_rel, half, released)}


def _frame(cells: Cells, cw: _Cellwise, noisy: dict, group_labels: np.ndarray) -> pd.DataFrame:
    frame = cells.keys.reset_index(drop=True).copy()
    frame["group"] = group_labels
    frame["released"] = cw.released
    frame["reason"] = cw.reason
    for col in ("theta_released", "se_released", "n_released", "noise_sd", "ci_low", "ci_high"):
        frame[col] = noisy[col]
    frame["chi"] = cw.chi_t
    frame["chi_se"] = cw.chi_s
    return frame


def _chi_table(cw: _Cellwise, group_codes: np.ndarray, group_labels: np.ndarray) -> pd.DataFrame:
    first = pd.Series(np.arange(group_codes.size)).groupby(group_codes).first().to_numpy()
    return pd.DataFrame({
        "group": group_labels[first],
        "chi": cw.chi_t[first],
        "chi_se": cw.chi_s[first],
        "cells": np.bincount(group_codes, minlength=len(first)),
    })


CAVEATS = (
    NOT_DP,
    ("noise_sd and chi are released together, so N = sqrt(2) chi / (eps_theta noise_sd) can be recovered "
     "(up to the 2^-20 grid inflation): the noise on N protects nothing while noise_sd is published."),
    "which cells are released (and the reason) depends on the private data (n < 3, no spread in x).",
    ("a cell is released whole (theta, SE, N) or not at all: an infinite LS of theta OR of its SE "
     "(e.g. n = 3 under add_remove) suppresses the cell."),
    "the noise grid step is a function of the noise scale, which depends on N: it reveals no more than the scale.",
)


def _info(statistic: str, cfg: MOSConfig, eps: dict[str, float], cw: _Cellwise, rng_desc: str) -> dict:
    total = eps["theta"] + eps["se"] + eps["n"]
    normal = cfg.noise == "normal"
    return {
        "method": "MOS: maximum observed sensitivity noise infusion (Chetty & Friedman 2019)",
        "statistic": statistic,
        "neighbors": cfg.neighbors,
        "noise": cfg.noise,
        "rng": rng_desc,
        "privacy": NOT_DP,
        "epsilon_accounting": (
            f"per cell: theta {eps['theta']:g} + SE {eps['se']:g} + N {eps['n']:g} = {total:g} "
            f"(sequential composition); across disjoint cells: the maximum, {total:g} (parallel composition); "
            "all conditional on chi" + ("; NOMINAL only: normal noise has no pure-epsilon meaning" if normal else "")),
        "noise_calibration": (
            "grid-snapped noise (dptrain.release.noise): theta scale t = (chi/N + gamma)/eps_theta with "
            "gamma = grid_step(chi/(eps N)), a power of two; SE likewise with chi_se; N on the integer grid "
            "with scale 1/eps_n. noise_sd = sqrt(2) t. se_released = sqrt(SE_noised^2 + noise_sd^2) where "
            "SE_noised = SE + noise of scale (chi_se/N + gamma)/eps_se."),
        "cells": int(cw.released.shape[0]),
        "released": int(cw.released.sum()),
        "beat_corners": int(np.count_nonzero(cw.beat_t & cw.released)),
        "beat_corners_se": int(np.count_nonzero(cw.beat_s & cw.released)),
        "caveats": list(CAVEATS) + (["normal noise: no pure epsilon-DP guarantee; the epsilons are nominal"]
                                    if normal else []),
    }


def release_mos(cells: Cells, *, statistic: str, epsilon: float | dict, rng: np.random.Generator | None = None,
                seed: int | None = None, precomputed: MOSInputs | None = None,
                config: MOSConfig | None = None) -> MOSRelease:
    """Release theta, its SE and N for every cell by MOS noise infusion (docs/release.md sections 3-4).

    Args:
        cells: the cells (sufficient statistics and rows).
        statistic: "p25" | "p75" | "slope".
        epsilon: a number (each of theta, SE, N gets ``epsilon * config.epsilon_split[i]``; with
            the default split, each gets epsilon and a cell costs 3 epsilon), or {"theta", "se", "n"}.
        rng: a numpy Generator to draw from (a release run passes ``Randomness.numpy("release-mos")``);
            overrides ``seed``.
        seed: None (CSPRNG) or an int (reproducible; not for production; never echoed in ``info``).
        precomputed: :class:`MOSInputs` already computed (the sensitivities of theta and its SE,
            the OLS fit); by default computed here.
        config: :class:`MOSConfig` (neighbours, noise, epsilon split, chi groups); default the paper's.
    """
    cfg = config or MOSConfig()
    _check_settings(statistic, cfg)
    eps = _epsilons(epsilon, cfg.epsilon_split)
    G = cells.n_cells
    group_codes = _group_codes(cfg.chi_groups, G)
    group_labels = np.asarray(cfg.chi_groups) if cfg.chi_groups is not None else np.full(G, "all", dtype=object)
    if rng is None:
        rng, rng_desc = make_rng(seed)
    else:
        rng_desc = "a numpy Generator supplied by the caller"
    cw = _cellwise(cells, statistic, _complete(cells, statistic, cfg.neighbors, precomputed), group_codes)
    noisy = _noisy(cw, eps, cfg.noise, rng)
    total = eps["theta"] + eps["se"] + eps["n"]
    return MOSRelease(frame=_frame(cells, cw, noisy, group_labels),
                      chi_table=_chi_table(cw, group_codes, group_labels),
                      epsilon={**eps, "total_per_cell": total, "total": total},
                      info=_info(statistic, cfg, eps, cw, rng_desc))
