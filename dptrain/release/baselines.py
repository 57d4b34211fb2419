"""The baselines MOS is judged against (docs/release.md section 5), all on the same cells.

Every function returns ``(frame, meta)``: ``frame`` has one row per cell in cell order (index
``cell``) and columns ``released`` (bool), ``reason`` ("" when released, else why not),
``theta_released`` (NaN if not released) and ``noise_sd`` (SD of the noise in theta where it can be
computed from public or released quantities, else NaN); ``meta`` says the method, neighbour
relation, epsilon, delta, how epsilon was split, the paper, and caveats.

Neighbour relations differ: NoisyStats and DP Theil-Sen are replace-one (n public), the others
add/remove (n private). :func:`normalise_epsilon` puts them on one footing (factor 2).

Noise: Laplace and Gaussian noise on statistics comes from :mod:`dptrain.release.noise`
(grid-snapped, floating-point safe); DP-SGD's gradient noise from :mod:`dptrain.privacy.engine`;
the exponential mechanism of Theil-Sen is textbook floating point (see ``_theilsen``). Release
decisions ("not released") depend only on public n or on DP outputs, except for suppression.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..privacy.accounting import AccountingError, calibrate_noise_multiplier, rdp_epsilon
from ..privacy.engine import GradientEngine, PoissonSampler, StepStats
from ..privacy.randomness import seeded_mt19937
from . import _theilsen
from .cells import STATISTICS, Cells, ReleaseError, ols
from .cells import statistic as cell_statistic
from .noise import add_noise, calibrate, grid_step

__all__ = [
    "NEIGHBOURS",
    "dp_gradient_descent",
    "dp_sgd_engine",
    "dp_theil_sen",
    "noisy_stats",
    "normalise_epsilon",
    "sufficient_stats_laplace",
    "suppression",
    "to_add_remove",
]

NEIGHBOURS: tuple[str, ...] = ("add_remove", "replace_one")
ALABI = ("Alabi, McMillan, Sarathy, Smith, Vadhan, 'Differentially Private Simple Linear Regression', "
         "PoPETs 2022 (arXiv 2007.05157)")
_BOX_A, _BOX_B = (-0.5, 1.5), (-4.0, 4.0)  # projection box of (prediction at the x-centre, slope), unit scale


# ---------------------------------------------------------------- epsilon on one footing
def normalise_epsilon(epsilon: float, from_rel: str, to_rel: str) -> float:
    """Epsilon under ``to_rel`` neighbours on the same footing as ``epsilon`` under ``from_rel``.

    * add_remove -> replace_one: ``2 epsilon``. A theorem: a replacement is a removal then an
      addition, so an epsilon-DP add/remove mechanism is 2 epsilon-DP under replace-one (group
      privacy over two steps; with delta: (2 eps, (1 + e^eps) delta)).
    * replace_one -> add_remove: ``epsilon / 2``. NOT a guarantee: a replace-one mechanism treats
      n as public and may have no add/remove guarantee at all (releasing n exactly is 0-DP
      replace-one). It is the comparison convention: an add/remove mechanism at epsilon / 2 is
      epsilon-DP replace-one, the same guarantee as the replace-one mechanism at epsilon.

    To compare at a common add/remove budget E: run add/remove methods at E and replace-one
    methods at ``normalise_epsilon(E, "add_remove", "replace_one")`` = 2E; then every method is
    2E-DP under replace-one, and ``to_add_remove`` of each meta gives E.
    """
    for name, rel in (("from_rel", from_rel), ("to_rel", to_rel)):
        if rel not in NEIGHBOURS:
            raise ReleaseError(f"{name}={rel!r} is not allowed: one of {list(NEIGHBOURS)}")
    eps = _check_epsilon(epsilon)
    if from_rel == to_rel:
        return eps
    return 2.0 * eps if from_rel == "add_remove" else eps / 2.0


def to_add_remove(epsilon: float, neighbours: str) -> float:
    """The add/remove-footing epsilon of a mechanism that is ``epsilon``-DP under ``neighbours``:
    epsilon for add_remove, epsilon / 2 for replace_one (see :func:`normalise_epsilon`)."""
    return normalise_epsilon(epsilon, neighbours, "add_remove")


# ---------------------------------------------------------------- shared helpers
def _check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ReleaseError(f"release.statistic={statistic!r} is not allowed: one of {list(STATISTICS)}")


def _check_epsilon(epsilon: float, name: str = "release.epsilon") -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(epsilon) and epsilon > 0):
        raise ReleaseError(f"{name}={epsilon!r} is not allowed: a finite number > 0")
    return float(epsilon)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0.0 < delta < 1.0:
        raise ReleaseError(f"release.delta={delta!r} is not allowed: a number in (0, 1)")
    return float(delta)


def _check_fraction(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ReleaseError(f"{name}={value!r} is not allowed: a number in (0, 1)")
    return float(value)


def _check_int(value: int, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ReleaseError(f"{name}={value!r} is not allowed: an integer >= {low}")
    return int(value)


def _reasons(n_cells: int, rules: list[tuple[np.ndarray, str]]) -> np.ndarray:
    """Per cell the text of the FIRST rule whose mask is true, "" where none is."""
    out = np.full(n_cells, "", dtype=object)
    for mask, text in reversed(rules):
        out[np.asarray(mask, dtype=bool)] = text
    return out


def _frame(reason: np.ndarray, theta: np.ndarray, noise_sd: np.ndarray | float) -> pd.DataFrame:
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


def _meta(method: str, *, statistic: str, neighbours: str | None, epsilon: float | None,
          delta: float, split: str, reference: str, guarantee: str, **extra) -> dict:
    return {"method": method, "statistic": statistic, "neighbours": neighbours, "epsilon": epsilon,
            "delta": delta, "epsilon_add_remove_equivalent":
            None if neighbours is None else to_add_remove(epsilon, neighbours),
            "epsilon_split": split, "guarantee": guarantee, "reference": reference, **extra}


def _widths(cells: Cells) -> tuple[float, float]:
    d = cells.domain
    return d.x_hi - d.x_lo, d.y_hi - d.y_lo


# ---------------------------------------------------------------- 1. suppression
def suppression(cells: Cells, *, statistic: str, k: int, rate_outcome: bool = False) -> tuple[pd.DataFrame, dict]:
    """Cell suppression: release the exact OLS theta only if N >= k and, for a rate outcome
    (y in {0, 1}), N p >= k events and N (1 - p) >= k non-events. No noise (noise_sd = 0).
    Not DP: the privacy loss is uncontrolled (a released cell is exact; differencing works)."""
    _check_statistic(statistic)
    k = _check_int(k, "release.k")
    n = cells.n
    rules = [(n < k, f"N < k={k}")]
    if rate_outcome:
        if np.any((cells.y != 0.0) & (cells.y != 1.0)):
            raise ReleaseError("release.rate_outcome=true needs y in {0, 1}: some rows have another value; "
                               "allowed: a binary outcome, or rate_outcome=false")
        rules += [(cells.sy < k, f"events N p < k={k}"), (n - cells.sy < k, f"non-events N (1 - p) < k={k}")]
    fit = ols(cells)
    rules.append((~fit.defined, "OLS undefined (N < 3 or no spread in x)"))
    theta = cell_statistic(fit, statistic, cells.domain)
    frame = _frame(_reasons(cells.n_cells, rules), theta, 0.0)
    return frame, _meta(
        "suppression", statistic=statistic, neighbours=None, epsilon=None, delta=0.0,
        split="none: no noise", reference="Chetty & Friedman 2019 (the teen-birth example); docs/release.md section 5",
        guarantee="none: privacy loss uncontrolled (released cells are exact; which cells are released "
                  "depends on private counts)", k=k, rate_outcome=bool(rate_outcome))


# ---------------------------------------------------------------- 2. sufficient statistics + Laplace
def _ols_and_gradient(s: dict[str, np.ndarray], x0: float | None) -> tuple[np.ndarray, np.ndarray, list]:
    """theta from sums (n, sx, sy, sxx, sxy), Sxx, and d theta / d sum for each sum (delta method)."""
    n, sx, sy, sxx, sxy = (s[key] for key in ("n", "sx", "sy", "sxx", "sxy"))
    with np.errstate(divide="ignore", invalid="ignore"):
        Sxx = sxx - sx * sx / n
        b = (sxy - sx * sy / n) / Sxx
        db = [(sx * sy / n**2 - b * sx * sx / n**2) / Sxx,  # d/dn
              (2 * b * sx - sy) / (n * Sxx), -sx / (n * Sxx), -b / Sxx, 1.0 / Sxx]  # sx, sy, sxx, sxy
        if x0 is None:
            return b, Sxx, db
        d = x0 - sx / n
        theta = sy / n + b * d
        grad = [-sy / n**2 + db[0] * d + b * sx / n**2, db[1] * d - b / n, 1.0 / n + db[2] * d,
                db[3] * d, db[4] * d]
    return theta, Sxx, grad


def _noisy_sums(cells: Cells, eps: float, rng: np.random.Generator) -> tuple[dict, dict, dict]:
    """(noisy sums, Laplace scales, sensitivities) for n, sx, sy, sxx, sxy at epsilon / 5 each."""
    d = cells.domain
    mx, my = max(abs(d.x_lo), abs(d.x_hi)), max(abs(d.y_lo), abs(d.y_hi))
    sens = {"n": 1.0, "sx": mx, "sy": my, "sxx": mx * mx, "sxy": mx * my}
    noisy, scale = {}, {}
    for key, delta_j in sens.items():
        if key == "n":  # integer grid: no rounding, scale exactly 5 / eps
            scale[key], step = 5.0 / eps, 1.0
        else:
            t, step = calibrate(delta_j, eps / 5.0)
            scale[key] = float(t)
        noisy[key] = add_noise(getattr(cells, key), scale[key], kind="laplace", rng=rng, step=step)
    return noisy, scale, sens


def sufficient_stats_laplace(cells: Cells, *, statistic: str, epsilon: float,
                             rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """Sufficient-statistic perturbation: Laplace noise on (n, sum x, sum y, sum x^2, sum xy), then
    OLS on the noisy sums. Pure epsilon-DP, add/remove neighbours.

    epsilon / 5 per statistic; per-statistic add/remove sensitivity over the domain: n 1,
    sum x max|x|, sum y max|y|, sum x^2 max x^2, sum xy max|x| max|y| (all 1 on the unit square,
    so each gets Laplace(5 / epsilon), total L1 sensitivity 5). The noise is grid-snapped
    (noise.calibrate: scale (Delta + gamma) / (epsilon / 5), gamma ~ 2^-20 of it; n on the integer
    grid, scale exactly 5 / epsilon). Not released if noisy n < 3 or noisy Sxx <= 0.
    noise_sd: delta-method SD of theta's noise, evaluated at the NOISY sums (post-processing).
    """
    _check_statistic(statistic)
    eps = _check_epsilon(epsilon)
    d = cells.domain
    noisy, scale, sens = _noisy_sums(cells, eps, rng)
    x0 = None if statistic == "slope" else d.x0(statistic)
    theta, Sxx, grad = _ols_and_gradient(noisy, x0)
    with np.errstate(invalid="ignore"):
        sd = np.sqrt(sum(g * g * 2.0 * scale[key] ** 2 for g, key in zip(grad, sens)))
    reason = _reasons(cells.n_cells, [(noisy["n"] < 3, "noisy n < 3"), (~(Sxx > 0), "noisy Sxx <= 0")])
    return _frame(reason, theta, sd), _meta(
        "sufficient_stats_laplace", statistic=statistic, neighbours="add_remove", epsilon=eps, delta=0.0,
        split="epsilon/5 to each of n, sum x, sum y, sum x^2, sum xy",
        reference="the Laplace mechanism (Dwork, McSherry, Nissim, Smith 2006); docs/release.md section 5",
        guarantee="epsilon-DP (pure), add/remove", sensitivities=sens, laplace_scales=scale,
        noise_sd_note="delta-method approximation at the noisy sums",
        caveats=[("sensitivities use max |x|, |y| over the domain; a domain not centred at 0 pays for "
                  "its offset (centring would be a different, better baseline)")])


# ---------------------------------------------------------------- 3. NoisyStats
def _noisy_moments(cells: Cells, eps: float, rng: np.random.Generator) -> tuple:
    """NoisyStats' first two draws: ncov + Lap(3 (1 - 1/n) wx wy / eps), nvar + Lap(3 (1 - 1/n) wx^2 / eps)
    (grid-snapped); returns (ncov~, nvar~, (t_ncov, t_nvar), (xbar, ybar))."""
    wx, wy = _widths(cells)
    n = cells.n
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar, ybar = cells.sx / n, cells.sy / n
        nvar = np.maximum(cells.sxx - n * xbar * xbar, 0.0)
        ncov = cells.sxy - n * xbar * ybar
    with np.errstate(divide="ignore"):
        dl = np.maximum(1.0 - 1.0 / n, 0.0)  # n = 0 (a declared cell without rows): -inf -> 0, no noise needed
    t1, g1 = calibrate(dl * wx * wy, eps / 3.0)
    t2, g2 = calibrate(dl * wx * wx, eps / 3.0)
    ncov_n = add_noise(ncov, t1, kind="laplace", rng=rng, step=g1)
    nvar_n = add_noise(nvar, t2, kind="laplace", rng=rng, step=g2)
    return ncov_n, nvar_n, (t1, t2), (xbar, ybar)


def _noisy_intercept(alpha: np.ndarray, xbar: np.ndarray, ybar: np.ndarray, n: np.ndarray, wx: float, wy: float,
                     eps3: float, rng: np.random.Generator) -> np.ndarray:
    """(ybar - alpha~ xbar) + Lap(3 Delta3 / eps) = Lap(Delta3 / eps3), Delta3 = (wy + |alpha~| wx) / n;
    NaN where alpha~ is NaN."""
    ok = np.isfinite(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        d3 = np.where(ok, (wy + np.abs(alpha) * wx) / n, 0.0)
        t3, g3 = calibrate(d3, eps3)
        return np.where(ok, add_noise(ybar - alpha * xbar, t3, kind="laplace", rng=rng, step=g3), np.nan)


def noisy_stats(cells: Cells, *, statistic: str, epsilon: float,
                rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """NoisyStats (Alabi et al. 2022, section 2.1, Algorithm NoisyStats). Replace-one, n public.

    Our reading, on a domain of widths wx, wy (the paper's unit square: wx = wy = 1):
    Delta = (1 - 1/n) (replace-one sensitivity of ncov = sum (x - xbar)(y - ybar) and of
    nvar = sum (x - xbar)^2 on [0, 1]^2; rescaled by wx wy and wx^2);
    ncov~ = ncov + Lap(3 Delta wx wy / eps), nvar~ = nvar + Lap(3 Delta wx^2 / eps);
    if nvar~ <= 0: nothing is released ("noisy variance <= 0"); else alpha~ = ncov~ / nvar~ and
    the intercept beta~ = (ybar - alpha~ xbar) + Lap(3 Delta3 / eps) with
    Delta3 = (wy + |alpha~| wx) / n (alpha~ is already private: adaptive composition);
    p25/p75 = beta~ + alpha~ x0, slope = alpha~. Each of the three gets epsilon/3; a slope release
    does not draw the intercept and so spends only 2 epsilon / 3 (meta ``epsilon_spent``).
    noise_sd: slope only, delta method at (alpha~, nvar~); NaN for p25/p75 (needs private xbar).
    """
    _check_statistic(statistic)
    eps = _check_epsilon(epsilon)
    wx, wy = _widths(cells)
    n = cells.n
    ncov_n, nvar_n, (t1, t2), (xbar, ybar) = _noisy_moments(cells, eps, rng)
    ok = nvar_n > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where(ok, ncov_n / nvar_n, np.nan)
        if statistic == "slope":
            theta = alpha
            sd = np.sqrt(2.0 * t1**2 + alpha**2 * 2.0 * t2**2) / nvar_n
        else:
            beta = _noisy_intercept(alpha, xbar, ybar, n, wx, wy, eps / 3.0, rng)
            theta = beta + alpha * cells.domain.x0(statistic)
            sd = np.nan
    reason = _reasons(cells.n_cells, [(n < 2, "N < 2"), (~ok, "noisy variance <= 0")])
    return _frame(reason, theta, sd), _meta(
        "noisy_stats", statistic=statistic, neighbours="replace_one", epsilon=eps, delta=0.0,
        split="epsilon/3 each to ncov, nvar and the intercept", reference=ALABI + ", section 2.1",
        guarantee="epsilon-DP (pure), replace-one within a cell (each cell's N treated as public)",
        epsilon_spent=2 * eps / 3 if statistic == "slope" else eps,
        laplace_scale_note="ncov: 3 (1 - 1/n) wx wy / eps; nvar: 3 (1 - 1/n) wx^2 / eps; "
                           "intercept: 3 (wy + |alpha~| wx) / (n eps); each inflated by the 2^-20 grid")


# ---------------------------------------------------------------- 4. DP Theil-Sen
def dp_theil_sen(cells: Cells, *, statistic: str, epsilon: float, rng: np.random.Generator,
                 variant: str = "all_pairs", k: int | None = None, wide: bool = False,
                 width: float = 0.01, value_range: tuple[float, float] | None = None) -> tuple[pd.DataFrame, dict]:
    """DP Theil-Sen (Alabi et al. 2022, DPExpTheilSen / DPWideTheilSen). epsilon-DP (pure),
    replace-one within a cell (each cell's n public).

    Per pair of points with distinct x: the pair's line's prediction at x0 (p25/p75) or its slope;
    clipped to ``value_range``; the median by the exponential mechanism (``_theilsen``).
    ``variant="all_pairs"``: all n(n-1)/2 pairs, each point in n - 1 of them, so the mechanism
    runs at epsilon / (n - 1); a cell with more than ``_theilsen.MAX_PAIRS`` pairs is NOT released
    (reason "all-pairs limit", no N quoted). ``"matchings"``: k random perfect matchings, each point
    in <= k pairs, epsilon / k. ``"auto"``: all pairs up to the limit, k matchings above it (needs
    k). Choosing by n is allowed here: n is public under replace-one neighbours. Either way the
    cell's estimate is epsilon-DP. ``wide``: values below/above the median pushed ``width`` (0.01
    in the paper, on the unit scale; scaled by the y width, by wy / wx for the slope) away first.
    Default range: [-0.5, 1.5] on the unit square for p25/p75 (the paper); for the slope
    [-4, 4] wy / wx, the slopes of lines whose p25 and p75 both lie in [-0.5, 1.5].
    Cells with N < 2 (public under replace-one) are not released; noise_sd is NaN.
    """
    _check_statistic(statistic)
    eps = _check_epsilon(epsilon)
    if variant not in ("all_pairs", "matchings", "auto"):
        raise ReleaseError(f"release.theil_sen_variant={variant!r} is not allowed: auto, all_pairs or matchings")
    if variant != "all_pairs":
        k = _check_int(k, "release.theil_sen_k (matchings)")
    d = cells.domain
    wx, wy = _widths(cells)
    scale = wy / wx if statistic == "slope" else wy
    if value_range is None:
        value_range = (-4.0 * scale, 4.0 * scale) if statistic == "slope" else (d.y_lo - wy / 2, d.y_hi + wy / 2)
    lo, hi = (float(v) for v in value_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ReleaseError(f"release.value_range={value_range!r} is not allowed: finite lo < hi")
    too_many = cells.n * (cells.n - 1) / 2 > _theilsen.MAX_PAIRS
    matchings = np.full(cells.n_cells, variant == "matchings") | ((variant == "auto") & too_many)
    skip = (variant == "all_pairs") & too_many
    x0 = None if statistic == "slope" else d.x0(statistic)
    w = float(width) * scale if wide else 0.0
    theta = _theilsen.theil_sen_cells(cells.x, cells.y, cells.codes, cells.n, x0=x0, lo=lo, hi=hi,
                                      epsilon=eps, matchings=matchings, k=k, width=w, rng=rng, skip=skip)
    reason = _reasons(cells.n_cells, [
        (cells.n < 2, "N < 2: no pairs"),
        (skip, (f"all-pairs limit ({_theilsen.MAX_PAIRS:,} pairs) exceeded; allowed: release.theil_sen_variant="
                "auto or matchings")),
    ])
    per = {"all_pairs": f"all pairs at epsilon/(n-1) (cells above {_theilsen.MAX_PAIRS:,} pairs not released)",
           "matchings": f"k = {k} random matchings at epsilon/k",
           "auto": f"all pairs at epsilon/(n-1) up to {_theilsen.MAX_PAIRS:,} pairs, else k = {k} random "
                   "matchings at epsilon/k (chosen by the public n)"}[variant]
    return _frame(reason, theta, np.nan), _meta(
        "dp_theil_sen" + ("_wide" if wide else ""), statistic=statistic, neighbours="replace_one", epsilon=eps,
        delta=0.0, split=f"all epsilon to one exponential-mechanism median; {per}",
        reference=ALABI + ", DPTheilSen",
        guarantee="epsilon-DP (pure), replace-one within a cell (each cell's N treated as public)",
        variant=variant, k=k, value_range=(lo, hi), width=w,
        caveats=["exponential mechanism sampled in floating point (not bit-exact)"])


# ---------------------------------------------------------------- 5a. DP gradient descent
def _unit_rows(cells: Cells) -> tuple[np.ndarray, np.ndarray]:
    """Rows on the unit square, x centred: u = (x - x_lo)/wx - 1/2, t = (y - y_lo)/wy."""
    d = cells.domain
    wx, wy = _widths(cells)
    return (cells.x - d.x_lo) / wx - 0.5, (cells.y - d.y_lo) / wy


def _theta_from_unit(a: np.ndarray, b: np.ndarray, cells: Cells, statistic: str) -> np.ndarray:
    """theta from the unit-scale line t = a + b u (a: prediction at the x-centre)."""
    d = cells.domain
    wx, wy = _widths(cells)
    if statistic == "slope":
        return b * wy / wx
    return d.y_lo + wy * (a + b * ((d.x0(statistic) - d.x_lo) / wx - 0.5))


def _noisy_count(cells: Cells, eps_n: float, rng: np.random.Generator) -> np.ndarray:
    """n + discrete Laplace(1 / eps_n) on the integer grid: eps_n-DP add/remove."""
    return add_noise(cells.n, 1.0 / eps_n, kind="laplace", rng=rng, step=1.0)


def _gaussian_sum(sums: np.ndarray, *, sigma: float, clip: float, rng: np.random.Generator) -> np.ndarray:
    """sums + N(0, sigma^2 C'^2) per element (rounded Gaussian on the 2^-20 grid, noise.py), with
    C' = C + sqrt(2) gamma: the L2 sensitivity of a 2-vector of sums snapped to grid gamma."""
    gamma = float(grid_step(sigma * clip / math.sqrt(2.0)))
    t = sigma * (clip + math.sqrt(2.0) * gamma) / math.sqrt(2.0)  # noise.py "normal": variance 2 t^2
    return add_noise(sums, t, kind="normal", rng=rng, step=gamma)


def _calibrate(eps_g: float, *, q: float, steps: int, delta: float) -> float:
    try:
        return calibrate_noise_multiplier(target_epsilon=eps_g, sample_rate=q, steps=steps, delta=delta)
    except AccountingError as err:
        raise ReleaseError(f"release.epsilon: {err}") from None


def dp_gradient_descent(cells: Cells, *, statistic: str, epsilon: float, delta: float, rng: np.random.Generator,
                        iterations: int = 100, lr: float = 0.5, max_grad_norm: float = 1.0,
                        count_fraction: float = 0.1) -> tuple[pd.DataFrame, dict]:
    """DP full-batch gradient descent on OLS (Alabi et al. 2022, section 2.3). (epsilon, delta)-DP,
    add/remove. Vectorised over cells (grouped sums per step).

    On the unit square with x centred (u in [-1/2, 1/2]), per cell: the line t = a + b u from
    (a, b) = (1/2, 0); per step the per-example gradients r_i (1, u_i) of (a + b u_i - t_i)^2 / 2 are
    clipped to L2 norm C, summed, plus N(0, sigma^2 C^2 I); divided by a noisy count n~; a step
    of size ``lr``, then projection onto a in [-0.5, 1.5], b in [-4, 4]; the estimate is the
    mean of the iterates of the second half. Budget: ``count_fraction`` epsilon to n~ (Laplace,
    pure), the rest to the T Gaussian steps: sigma = calibrate_noise_multiplier(q=1, steps=T) by
    RDP; total (epsilon, delta) by basic composition. Not released if n~ < 3.
    """
    _check_statistic(statistic)
    eps, delta = _check_epsilon(epsilon), _check_delta(delta)
    T = _check_int(iterations, "release.iterations")
    frac = _check_fraction(count_fraction, "release.count_fraction")
    C = _check_epsilon(max_grad_norm, "release.max_grad_norm")
    eps_n, eps_g = frac * eps, (1.0 - frac) * eps
    sigma = _calibrate(eps_g, q=1.0, steps=T, delta=delta)
    n_noisy = _noisy_count(cells, eps_n, rng)
    denom = np.maximum(n_noisy, 1.0)[:, None]
    u, t = _unit_rows(cells)
    codes, G = cells.codes, cells.n_cells
    W = np.tile([0.5, 0.0], (G, 1))
    acc = np.zeros_like(W)
    tail = range(T // 2, T)
    for it in range(T):
        r = W[codes, 0] + W[codes, 1] * u - t
        rc = r * np.minimum(1.0, C / (np.abs(r) * np.sqrt(1.0 + u * u) + 1e-6))
        sums = np.stack([np.bincount(codes, rc, G), np.bincount(codes, rc * u, G)], axis=1)
        W = W - lr * _gaussian_sum(sums, sigma=sigma, clip=C, rng=rng) / denom
        W[:, 0] = np.clip(W[:, 0], *_BOX_A)
        W[:, 1] = np.clip(W[:, 1], *_BOX_B)
        if it in tail:
            acc += W
    W = acc / len(tail)
    theta = _theta_from_unit(W[:, 0], W[:, 1], cells, statistic)
    reason = _reasons(G, [(n_noisy < 3, "noisy n < 3")])
    eps_used = rdp_epsilon(sample_rate=1.0, noise_multiplier=sigma, steps=T, delta=delta)
    return _frame(reason, theta, np.nan), _meta(
        "dp_gradient_descent", statistic=statistic, neighbours="add_remove", epsilon=eps, delta=delta,
        split=f"{frac:g} epsilon to a Laplace noisy count, {1 - frac:g} epsilon to {T} Gaussian steps (RDP)",
        reference=ALABI + ", section 2.3 (DPGradDescent); accounting: dptrain.privacy.accounting (RDP)",
        guarantee="(epsilon, delta)-DP, add/remove (basic composition of the count and the RDP-accounted steps)",
        noise_multiplier=sigma, gradient_noise_sd=sigma * C, max_grad_norm=C, iterations=T, lr=lr,
        epsilon_count=eps_n, epsilon_gradient=eps_used,
        caveats=["noise_sd is NaN: the noise in theta has no closed form",
                 "convergence in the slope direction is slow when x has little spread (lr, iterations)"])


# ---------------------------------------------------------------- 5b. DP-SGD by dptrain's engine
class SquaredLossLinearEngine(GradientEngine):
    """dptrain's DP-SGD step for ``nn.Linear(1, 1)`` with the squared loss (z - y)^2 / 2: example i's
    gradient is r_i (x_i, 1), r_i = z_i - y_i, of squared norm r_i^2 (x_i^2 + 1), clipped in
    closed form. Noise and the division by B are the base class's (``GradientEngine.__call__``)."""

    name = "squared_loss_linear"

    @torch.no_grad()
    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        lin = self.model
        r = (x @ lin.weight.T + lin.bias).squeeze(-1) - y
        sq = r.square() * (x.square().sum(1) + 1.0)
        cr = r * self.clip_factors(sq)
        grad_of = {id(lin.weight): (cr @ x).reshape(1, -1), id(lin.bias): cr.sum().reshape(1)}
        stats = StepStats(int(y.shape[0]), float(0.5 * r.square().sum()), 0, self.count_clipped(sq))
        return [grad_of[id(p)] for p in self.params], stats


def _sgd_cell(u: np.ndarray, t: np.ndarray, *, sigma: float, C: float, q: float, B: float, steps: int,
              lr: float, rng: np.random.Generator) -> tuple[float, float]:
    """DP-SGD on one cell; the mean of the second half of the iterates (a, b).

    The noise generator is a torch MT19937 whose whole 624-word state comes from ``rng``
    (:func:`seeded_mt19937`; ``manual_seed`` would keep 32 bits), the Poisson sampler a child of
    ``rng``. The model is float64, and so is its noise (the engine draws in the parameters' dtype)."""
    noise_rng, sample_rng = rng.spawn(2)
    gen = seeded_mt19937(noise_rng.integers(0, 2**32, size=624, dtype=np.uint64).astype(np.uint32))
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.fill_(0.5)
    engine = SquaredLossLinearEngine(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
                                     generator=gen)
    sampler = PoissonSampler(num_rows=u.size, sample_rate=q, rng=sample_rng)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = torch.from_numpy(u).reshape(-1, 1), torch.from_numpy(t)
    acc = np.zeros(2)
    for it in range(steps):
        idx = sampler.sample()
        engine(xs[idx], ys[idx])
        opt.step()
        with torch.no_grad():
            model.bias.clamp_(*_BOX_A)
            model.weight.clamp_(*_BOX_B)
        if it >= steps // 2:
            acc += (model.bias.detach().item(), model.weight.detach().item())
    return tuple(acc / (steps - steps // 2))


def dp_sgd_engine(cells: Cells, *, statistic: str, epsilon: float, delta: float, rng: np.random.Generator,
                  steps: int = 100, sample_rate: float = 0.2, lr: float = 0.5, max_grad_norm: float = 1.0,
                  count_fraction: float = 0.1) -> tuple[pd.DataFrame, dict]:
    """DP-SGD by dptrain's own engine on ``nn.Linear(1, 1)`` per cell (a loop over cells): the bridge
    between training and release. (epsilon, delta)-DP, add/remove.

    Rows on the unit square with x centred (as :func:`dp_gradient_descent`); Poisson sampling
    with rate q (``PoissonSampler``); :class:`SquaredLossLinearEngine` clips per example to C, adds
    N(0, sigma^2 C^2) in ``GradientEngine.__call__`` (float64, torch generator whose full state
    comes from ``rng``) and
    divides by B = q n~, n~ a Laplace noisy count (``count_fraction`` epsilon); SGD, projection
    onto the same box, mean of the second half of the iterates. sigma =
    calibrate_noise_multiplier(target = (1 - count_fraction) epsilon, q, steps, delta), RDP;
    total by basic composition. Not released if n~ < 3.
    """
    _check_statistic(statistic)
    eps, delta = _check_epsilon(epsilon), _check_delta(delta)
    T = _check_int(steps, "release.steps")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0.0 < sample_rate <= 1.0:
        raise ReleaseError(f"release.sample_rate={sample_rate!r} is not allowed: a number in (0, 1]")
    q = float(sample_rate)
    frac = _check_fraction(count_fraction, "release.count_fraction")
    C = _check_epsilon(max_grad_norm, "release.max_grad_norm")
    eps_n, eps_g = frac * eps, (1.0 - frac) * eps
    sigma = _calibrate(eps_g, q=q, steps=T, delta=delta)
    n_noisy = _noisy_count(cells, eps_n, rng)
    u, t = _unit_rows(cells)
    order = np.argsort(cells.codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(cells.n.astype(np.int64))))
    a, b = np.full(cells.n_cells, np.nan), np.full(cells.n_cells, np.nan)
    for g in np.flatnonzero(n_noisy >= 3):
        rows = order[starts[g]:starts[g + 1]]
        a[g], b[g] = _sgd_cell(u[rows], t[rows], sigma=sigma, C=C, q=q, B=q * float(n_noisy[g]), steps=T,
                               lr=lr, rng=rng.spawn(1)[0])
    theta = _theta_from_unit(a, b, cells, statistic)
    reason = _reasons(cells.n_cells, [(n_noisy < 3, "noisy n < 3")])
    eps_used = rdp_epsilon(sample_rate=q, noise_multiplier=sigma, steps=T, delta=delta)
    return _frame(reason, theta, np.nan), _meta(
        "dp_sgd_engine", statistic=statistic, neighbours="add_remove", epsilon=eps, delta=delta,
        split=f"{frac:g} epsilon to a Laplace noisy count, {1 - frac:g} epsilon to {T} DP-SGD steps (RDP)",
        reference="Abadi et al. 2016 DP-SGD with Poisson sampling, dptrain.privacy.engine + accounting (RDP)",
        guarantee="(epsilon, delta)-DP, add/remove (basic composition of the count and the RDP-accounted steps)",
        noise_multiplier=sigma, sample_rate=q, steps=T, lr=lr, max_grad_norm=C,
        epsilon_count=eps_n, epsilon_gradient=eps_used,
        caveats=["noise_sd is NaN: the noise in theta has no closed form",
                 "B = q n~ uses the noisy count, never the private n"])
