"""DP-MOS: MOS's shape (noise chi / (epsilon N) per cell, one chi for all cells) with every
data-dependent choice made privately, so that the WHOLE release (chi, and each cell's theta, SE,
N and interval) is (epsilon, delta)-DP under add/remove-one-row neighbours, unconditionally.
The proof is docs/dp_mos.md; the stages, in order, each a DP mechanism given the outputs of the
stages before it (adaptive sequential composition within a cell, the chi stage over all cells):

1. N~ = N + discrete Laplace(1 / eps_n) per cell (integer grid): eps_n-DP.
2. Cells with N~ < max(release.min_n, k* + 4) are not released: a rule on a released value
   (k* below: a cell needs more than k* + 3 rows to be stable at distance k*).
3. SE statistics: sum of (x - x_lo), Sxx and Syy per cell, each plus grid Laplace of scale
   3 sensitivity / eps_se (sensitivities wx, wx^2, wy^2 under add/remove): eps_se-DP. They give
   the sampling SE of theta by post-processing: SE_samp^2 = Syy~ / (N~ - 2) * h0~ (Syy, not the
   residual sum: conservative by 1 / (1 - R^2); Sxx~ and Syy~ floored at their noise scales).
4. chi: the exponential mechanism over a public grid of candidates (8 per doubling), utility
   -|#{eligible cells with N~ A_{k*} <= c} - ceil(q G_e)|, sensitivity 1 (one row changes one
   cell's value): eps_chi-DP. A_k are the stability bounds of :mod:`dptrain.release.stability`;
   k* = T + ceil(3 / eps_test), so that a cell at or below chi passes stage 5 with probability
   >= 1 - e^-3 / (1 + e^-eps_test).
5. Propose-test-release per cell with the public proposal Delta = chi / N~: the distance
   d = min{k : A_k > Delta} (sensitivity 1) plus discrete Laplace(1 / eps_test) must reach the
   integer T with P(Laplace >= T) <= delta e^-eps_test; a cell that fails is not released.
6. theta~ = theta + grid Laplace calibrated to Delta and eps_theta (dptrain.release.noise).
7. Post-processing: a prediction (p25, p75) and its interval are clamped into the public
   [y_lo, y_hi].

Before any of it, a chi group too small for the exponential mechanism to find its quantile
(:func:`check_chi_groups`, public numbers only) is refused with the settings that would help.

Stage 5-6 are (eps_test + eps_theta, delta)-DP per cell (PTR), and cells are disjoint, so the
release is (eps_n + eps_se + eps_chi + eps_test + eps_theta, delta)-DP. The interval is
theta~ +/- the exact 95% point of N(0, SE_samp^2) + Laplace(t) (:mod:`dptrain.release.intervals`),
a function of released values only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dptrain.release.mos import _group_codes

from .cells import STATISTICS, Cells, ReleaseError, ols
from .cells import statistic as cell_statistic
from .intervals import interval_columns, laplace_normal_halfwidth
from .noise import add_noise, calibrate
from .stability import distance_to_instability, stability_bounds

DEFAULT_SPLIT: dict[str, float] = {"n": 0.25, "se": 0.5, "chi": 0.25, "test": 1.0, "theta": 1.0}
GUARANTEE = ("(epsilon, delta)-DP under add/remove-one-row neighbours, end to end: chi, and every cell's theta, "
             "SE, N and interval (DP-MOS: private chi, propose-test-release per cell)")
REASON_SMALL = "noisy N below the eligibility threshold"
REASON_TEST = "failed the private stability test (above chi or unstable)"
REASON_NO_CHI = "no eligible cell: chi not chosen"
CANDIDATES_PER_DOUBLING = 8
STAGES: tuple[str, ...] = ("n", "se", "chi", "test", "theta")


def stage_epsilons(epsilon: float, split: dict) -> dict[str, float]:
    """epsilon times each stage's share; refuses a split that is not exactly the five stages."""
    if not isinstance(split, dict) or set(map(str, split)) != set(STAGES):
        raise ReleaseError(f"release.dp_mos_split={split!r} is not allowed: a mapping with exactly the keys "
                           f"{list(STAGES)} (shares of release.epsilon_per_statistic, each > 0)")
    out = {}
    for k in STAGES:
        v = split[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise ReleaseError(f"release.dp_mos_split.{k}={v!r} is not allowed: a finite number > 0")
        out[k] = float(epsilon) * float(v)
    return out


@dataclass(frozen=True)
class DPMOSConfig:
    """``split``: the share of ``epsilon`` each stage gets (module docstring; the defaults sum to 3,
    the per-cell total of MOS at the same epsilon); ``chi_quantile``: the target share of eligible
    cells at or below chi; ``min_n``: cells with a noisy N below max(min_n, k* + 4) are not released;
    ``chi_groups``: one PUBLIC group label per cell, one chi per group (None: one chi for all cells;
    each group's exponential mechanism sees only its cells, so the groups compose in parallel)."""

    split: dict = field(default_factory=lambda: dict(DEFAULT_SPLIT))
    chi_quantile: float = 0.75
    min_n: int = 3
    chi_groups: np.ndarray | None = None
    #: refuse groups too small for a useful private chi (:func:`check_chi_groups`); False: go on
    #: (the private evaluation runs every method at the release's settings)
    refuse_small_groups: bool = True


#: the exponential mechanism's utility loss bound :func:`check_chi_groups` uses holds with this probability
CHI_CONFIDENCE = 0.95
#: a group is too small when that loss exceeds this share of its cells
CHI_MAX_LOSS_SHARE = 0.5


def chi_loss_bound(n_candidates: int, eps_chi: float) -> float:
    """The exponential mechanism's utility loss (in cells) that its draw stays within with
    probability CHI_CONFIDENCE: 2 ln(candidates / (1 - CHI_CONFIDENCE)) / eps_chi (McSherry and
    Talwar's bound for a sensitivity-1 utility)."""
    return 2.0 * math.log(n_candidates / (1.0 - CHI_CONFIDENCE)) / eps_chi


def check_chi_groups(cells: Cells, statistic: str, *, epsilon: float, cfg: DPMOSConfig) -> None:
    """Refuse (ReleaseError) a chi group whose listed cells are too few for the exponential
    mechanism to find the chi_quantile: where its utility loss bound exceeds CHI_MAX_LOSS_SHARE of
    the group's cells, chi is close to a uniform draw over the grid (1e-3 to 1e6 units) and the
    cells' noise, chi / (epsilon N), can dwarf the statistic's range (8 cells of 500 rows at
    epsilon 1: chi 189,812, theta from -918 to 413 for a statistic in [0, 1]). Decided from public
    numbers only: the group sizes of the listed cells (a public or privately released list), the
    grid and epsilon. The message names the settings that help."""
    eps_chi = stage_epsilons(epsilon, cfg.split)["chi"]
    n_cand = chi_candidates(cells, statistic).size
    loss = chi_loss_bound(n_cand, eps_chi)
    codes = _group_codes(cfg.chi_groups, cells.n_cells)
    sizes = np.bincount(codes, minlength=int(codes.max()) + 1) if codes.size else np.zeros(0, dtype=int)
    if sizes.size == 0 or loss <= CHI_MAX_LOSS_SHARE * sizes.min():
        return
    smallest = int(sizes.min())
    need_eps = epsilon * loss / (CHI_MAX_LOSS_SHARE * smallest)
    need_cells = math.ceil(loss / CHI_MAX_LOSS_SHARE)
    raise ReleaseError(
        f"release.method=dp_mos: a chi group of {smallest} listed cells is too small for a private chi at "
        f"release.epsilon_per_statistic={epsilon:g} (chi's share {eps_chi:g}): the exponential mechanism's choice "
        f"is off by up to {loss:.0f} cells ({CHI_CONFIDENCE:.0%}), more than half the group, so chi would be nearly a "
        f"random point of its grid and the released values mostly noise; refused before any noise is drawn. "
        f"Allowed: release.epsilon_per_statistic of at least {need_eps:.3g}, a larger chi share "
        f"(release.dp_mos_split.chi), fewer chi groups (release.chi_by) or at least {need_cells} cells per group")


@dataclass(frozen=True)
class DPMOSRelease:
    """``frame``: per cell released, reason, theta_released, se_released, n_released, noise_sd,
    ci_low, ci_high, chi (nothing exact). ``epsilon``: per stage and total; ``info``: the facts."""

    frame: pd.DataFrame
    epsilon: dict
    delta: float
    chi: float | dict
    info: dict


def test_threshold(eps_test: float, delta_test: float) -> int:
    """The smallest integer T with P(K >= T) <= delta_test for K discrete Laplace with
    P(K = k) ~ exp(-eps_test |k|): P(K >= T) = q^T / (1 + q), q = exp(-eps_test)."""
    q = math.exp(-eps_test)
    return max(1, math.ceil(math.log(1.0 / (delta_test * (1.0 + q))) / eps_test))


def chi_candidates(cells: Cells, statistic: str) -> np.ndarray:
    """The public grid of chi values: 8 per doubling from 1e-3 to 1e6 times the unit of N LS
    (wy for a prediction, wy / wx for the slope)."""
    d = cells.domain
    unit = (d.y_hi - d.y_lo) / ((d.x_hi - d.x_lo) if statistic == "slope" else 1.0)
    lo, hi = math.log2(1e-3), math.log2(1e6)
    j = np.arange(int((hi - lo) * CANDIDATES_PER_DOUBLING) + 1)
    return unit * np.exp2(lo + j / CANDIDATES_PER_DOUBLING)


def exp_mech_quantile(values: np.ndarray, candidates: np.ndarray, *, q: float, epsilon: float,
                      rng: np.random.Generator) -> float:
    """One draw of the exponential mechanism over ``candidates`` with utility
    -|#{values <= c} - ceil(q len(values))| (sensitivity 1 when one value changes): P(c) ~
    exp(epsilon u(c) / 2), by the Gumbel-max trick (floating point, not bit-exact)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    target = math.ceil(q * v.size)
    count = np.searchsorted(v, candidates, side="right")
    logw = -epsilon * np.abs(count - target) / 2.0
    return float(candidates[int(np.argmax(logw + rng.gumbel(size=candidates.size)))])


def _se_stats(cells: Cells, eps_se: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Noisy sum of (x - x_lo), Sxx and Syy at eps_se / 3 each (sensitivities wx, wx^2, wy^2)."""
    d = cells.domain
    wx, wy = d.x_hi - d.x_lo, d.y_hi - d.y_lo
    n = np.maximum(cells.n, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        sxx = np.where(cells.n > 0, np.maximum(cells.sxx - cells.sx * cells.sx / n, 0.0), 0.0)
        syy = np.where(cells.n > 0, np.maximum(cells.syy - cells.sy * cells.sy / n, 0.0), 0.0)
    out = {}
    for key, value, sens in (("sx", cells.sx - d.x_lo * cells.n, wx), ("sxx", sxx, wx * wx), ("syy", syy, wy * wy)):
        t, step = calibrate(sens, eps_se / 3.0)
        out[key] = add_noise(value, float(t), kind="laplace", rng=rng, step=float(step))
        out[key + "_scale"] = float(t)
    return out


def _sampling_se(stats: dict, n_noisy: np.ndarray, cells: Cells, statistic: str) -> np.ndarray:
    """SE of theta from the noisy statistics, NaN where N~ < 4. Sxx~ and Syy~ are floored at their
    noise scale: where the noise swamps them (small cells) the floor overstates the SE (a wider
    interval) rather than dividing by a noisy number near 0."""
    d = cells.domain
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = n_noisy >= 4
        sxx = np.maximum(stats["sxx"], stats["sxx_scale"])
        sigma2 = np.maximum(stats["syy"], stats["syy_scale"]) / (n_noisy - 2.0)
        if statistic == "slope":
            h0 = 1.0 / sxx
        else:
            xbar = d.x_lo + np.clip(stats["sx"] / n_noisy, 0.0, d.x_hi - d.x_lo)
            h0 = 1.0 / n_noisy + (d.x0(statistic) - xbar) ** 2 / sxx
        return np.where(ok, np.sqrt(sigma2 * h0), np.nan)


@dataclass(frozen=True)
class _Radii:
    """The public constants of the test: its delta share, threshold T, k*, k_max, eligibility."""

    delta_test: float
    t_pass: int
    k_star: int
    k_max: int
    min_eligible: int


def _radii(eps_test: float, delta: float, min_n: int) -> _Radii:
    delta_test = float(delta) * math.exp(-eps_test)
    t_pass = test_threshold(eps_test, delta_test)
    k_star = t_pass + math.ceil(3.0 / eps_test)
    return _Radii(delta_test=delta_test, t_pass=t_pass, k_star=k_star,
                  k_max=k_star + math.ceil(math.log(1e6) / eps_test), min_eligible=max(int(min_n), k_star + 4))


def _check(statistic: str, cfg: DPMOSConfig, delta: float) -> None:
    if statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed for dp_mos: one of {list(STATISTICS)}")
    if not (0.0 < float(cfg.chi_quantile) <= 1.0):
        raise ReleaseError(f"release.dp_mos_chi_quantile={cfg.chi_quantile!r} is not allowed: a number in (0, 1]")
    if not (0.0 < float(delta) < 1.0):
        raise ReleaseError(f"release.delta={delta!r} is not allowed: a number in (0, 1)")


def _theta_stage(cells: Cells, statistic: str, passed: np.ndarray, proposal: np.ndarray, eps_theta: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(released, theta~, Laplace scale t): theta plus grid Laplace calibrated to Delta, eps_theta.
    A cell that passed with an undefined OLS (only inside the test's delta event) is not released."""
    theta = cell_statistic(ols(cells), statistic, cells.domain)
    passed = passed & np.isfinite(theta)
    t_theta, g_theta = calibrate(np.where(passed, proposal, np.inf), eps_theta)
    theta_rel = add_noise(np.where(passed, theta, 0.0), t_theta, kind="laplace", rng=rng,
                          step=np.where(passed, g_theta, 1.0))
    return passed, np.where(passed, theta_rel, np.nan), t_theta


def release_dp_mos(cells: Cells, *, statistic: str, epsilon: float, delta: float, rng: np.random.Generator,
                   config: DPMOSConfig | None = None,
                   bounds: Callable[[int], np.ndarray] | None = None) -> DPMOSRelease:
    """Release chi and, per cell, theta, SE, N and a 95% interval by DP-MOS (module docstring).

    Args:
        cells: the listed cells (rows clipped into the public domain).
        statistic: "p25" | "p75" | "slope".
        epsilon: release.epsilon_per_statistic; stage s gets epsilon * config.split[s] (default total 3 epsilon).
        delta: the release's delta (the propose-test-release stage's), in (0, 1).
        rng: the method's own secret stream (draws in stage order: N, SE statistics, chi, test, theta).
        config: :class:`DPMOSConfig`.
        bounds: ``k_max -> A`` (G, >= k_max + 1) if the caller caches the stability bounds of these
            cells (a release run computes them once for all its epsilons); default: computed here.
    """
    cfg = config or DPMOSConfig()
    _check(statistic, cfg, delta)
    if cfg.refuse_small_groups:
        check_chi_groups(cells, statistic, epsilon=epsilon, cfg=cfg)
    eps = stage_epsilons(epsilon, cfg.split)
    rad = _radii(eps["test"], delta, cfg.min_n)
    # 1. noisy N (integer grid, exactly 1 / eps_n); 2. eligibility, a rule on N~
    n_noisy = add_noise(cells.n, 1.0 / eps["n"], kind="laplace", rng=rng, step=1.0)
    eligible = n_noisy >= rad.min_eligible
    # 3. the SE statistics
    se_stats = _se_stats(cells, eps["se"], rng)
    # 4. chi
    a = (stability_bounds(cells, statistic=statistic, k_max=rad.k_max) if bounds is None
         else np.asarray(bounds(rad.k_max))[:, : rad.k_max + 1])
    with np.errstate(invalid="ignore"):
        values = n_noisy * a[:, rad.k_star]
    chi = _chi_per_cell(values, eligible, cells, statistic, cfg, eps["chi"], rng)
    # 5. propose-test-release with Delta = chi / N~
    with np.errstate(invalid="ignore", divide="ignore"):
        proposal = np.where(eligible, chi / np.where(eligible, n_noisy, 1.0), np.nan)
    dist = distance_to_instability(a, proposal)
    noisy_dist = add_noise(dist.astype(np.float64), 1.0 / eps["test"], kind="laplace", rng=rng, step=1.0)
    # 6. theta; 7. post-processing: SE and interval from released values
    passed, theta_rel, t_theta = _theta_stage(cells, statistic, eligible & (noisy_dist >= rad.t_pass), proposal,
                                              eps["theta"], rng)
    reason = np.where(~np.isfinite(chi) & eligible, REASON_NO_CHI,
                      np.where(~eligible, REASON_SMALL, np.where(~passed, REASON_TEST, ""))).astype(object)
    frame = _frame(passed, reason, theta_rel, t_theta, n_noisy, _sampling_se(se_stats, n_noisy, cells, statistic), chi)
    if statistic != "slope":  # a prediction lies in the PUBLIC [y_lo, y_hi]: clamp it (post-processing)
        for col in ("theta_released", "ci_low", "ci_high"):
            frame[col] = frame[col].clip(cells.domain.y_lo, cells.domain.y_hi)
    info = {
        "threshold_T": rad.t_pass, "k_star": rad.k_star, "k_max": rad.k_max, "delta_test": rad.delta_test,
        "chi_candidates": f"{CANDIDATES_PER_DOUBLING} per doubling from 1e-3 to 1e6 (units of y, y/x for the slope)",
        "chi_quantile": float(cfg.chi_quantile),
        "eligibility": f"N~ >= {rad.min_eligible} (max of release.min_n and k_star + 4)",
        "se_noise_scales": {k: se_stats[k + "_scale"] for k in ("sx", "sxx", "syy")},
    }
    if cfg.chi_groups is None:
        chi_out: float | dict = float(chi[0]) if chi.size else math.nan
    else:
        first = pd.Series(chi, index=np.asarray(cfg.chi_groups)).groupby(level=0, sort=False).first()
        chi_out = {str(k): float(v) for k, v in first.items()}
    return DPMOSRelease(frame=frame, epsilon={**eps, "total": float(sum(eps.values()))}, delta=float(delta),
                        chi=chi_out, info=info)


def _chi_per_cell(values: np.ndarray, eligible: np.ndarray, cells: Cells, statistic: str, cfg: DPMOSConfig,
                  eps_chi: float, rng: np.random.Generator) -> np.ndarray:
    """Per cell the chi of its group: the exponential mechanism over the group's eligible values
    (one draw per group in order of first appearance; NaN for a group without an eligible cell)."""
    codes = _group_codes(cfg.chi_groups, cells.n_cells)
    cand = chi_candidates(cells, statistic)
    chi = np.full(cells.n_cells, math.nan)
    for c in range(int(codes.max()) + 1 if codes.size else 0):
        members = eligible & (codes == c)
        if members.any():
            chi[codes == c] = exp_mech_quantile(values[members], cand, q=float(cfg.chi_quantile), epsilon=eps_chi,
                                                rng=rng)
    return chi


def _frame(passed: np.ndarray, reason: np.ndarray, theta_rel: np.ndarray, t_theta: np.ndarray,
           n_noisy: np.ndarray, se_samp: np.ndarray, chi: np.ndarray) -> pd.DataFrame:
    """release.csv's columns (besides the cell keys), from released values only."""
    noise_sd = np.where(passed, math.sqrt(2.0) * t_theta, np.nan)
    half = laplace_normal_halfwidth(s=se_samp, b=np.where(passed, t_theta, np.nan))
    return pd.DataFrame({
        "released": passed,
        "reason": reason,
        "theta_released": theta_rel,
        "se_released": np.where(passed, np.sqrt(se_samp ** 2 + noise_sd ** 2), np.nan),
        "n_released": n_noisy,
        "noise_sd": noise_sd,
        **interval_columns(theta_rel, half, passed),
        "chi": chi,
    }, index=pd.RangeIndex(passed.shape[0], name="cell"))
