"""The 95% interval of DP gradient descent and DP-SGD on the unit-square line (issue 18), from
released values and public settings only.

The method spends ``interval_fraction`` of its epsilon on three noisy design statistics per cell
(:func:`design_stats`: sum of u, sum of u^2 and the centred sum of squares of t, unit scale, grid
Laplace at the shares ``SHARE`` of it, add/remove sensitivities 1/2, 1/4 and 1: pure DP, composed
with the count and the RDP-accounted steps by basic composition). With the released noisy count
n~ they give H~ = [[1, u~], [u~, m2~]], the Hessian of the squared loss per row.

Near the optimum, with clipping and the projection inactive, both algorithms are the linear
recursion e_{k+1} = A e_k + xi_k, A = I - lr H, e = W - W_ols, xi_k Gaussian with covariance
Q = (lr s / B)^2 I (s: the SD of the noise on the gradient sum, B: n~ for GD, q n~ for SGD) plus,
for Poisson subsampling, lr^2 (1 - q) / (q n~) sigma_res^2 H. The released estimate is the mean of
the iterates k = T/2 .. T-1 (iterate k = A^{k+1} e_0 + sum_{j <= k} A^{k-j} xi_j), so its error is

    W~ - W_ols = M (W_0 - W_ols) + sum_j B_j xi_j,   M = mean_k A^{k+1},   B_j = mean_k A^{k-j} [j <= k]

(:func:`linear_recursion`: M and V = sum_j B_j Q B_j^T by a backward recursion, 2x2 per cell).
The interval is theta~ -/+ (1.96 sqrt(c' V c + SE_samp^2) + |c' M (W_0 - W^)|), with W^ the
plug-in (I - M)^{-1} (W~ - M W_0) and c the unit-scale gradient of theta; SE_samp is the OLS
sampling SE from the noisy statistics (sigma^2 from the centred Syy, conservative by 1 / (1 - R^2)),
as DP-MOS does. The design (u~, v) is taken at the widest of u~ and u~ -/+ Z_U sd, with v at
v~ - Z_V sd (:func:`designs`): the noise variance falls with v, and the p25 / p75 noise depends on
u~ through the direction of slow convergence. All of it is a post-processing of DP outputs inside
the method's budget: n~, the design statistics, and W~ = the averaged (a, b) behind theta (a
function of the noisy gradients, which the RDP accounting covers as a whole; the interval may
reveal more of (a, b) than theta alone, at no privacy cost).
"""

from __future__ import annotations

import numpy as np

from dptrain.release.cells import Cells
from dptrain.release.intervals import LEVEL
from dptrain.release.methods.common import unit_rows, widths
from dptrain.release.noise import add_noise, calibrate

V_FLOOR = 1e-3  # the smallest unit-scale variance of x the interval assumes (a public constant)
SENSITIVITY = {"su": 0.5, "suu": 0.25, "stt": 1.0}  # add/remove, rows on the unit square
SHARE = {"su": 0.35, "suu": 0.35, "stt": 0.3}  # of the interval's epsilon: the noise var rests on sum u^2
Z_U, Z_V = 0.5, 0.5  # the design is taken at u~ -/+ Z_U sd and v~ - Z_V sd (the widest)


def design_stats(cells: Cells, eps_d: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Noisy sum u, sum u^2 and centred sum of squares of t per cell, eps_d * SHARE each (grid Laplace)."""
    u, t = unit_rows(cells)
    G, codes = cells.n_cells, cells.codes
    n = np.bincount(codes, minlength=G).astype(np.float64)
    st = np.bincount(codes, t, G)
    with np.errstate(invalid="ignore", divide="ignore"):
        stt = np.where(n > 0, np.maximum(np.bincount(codes, t * t, G) - st * st / np.maximum(n, 1.0), 0.0), 0.0)
    values = {"su": np.bincount(codes, u, G), "suu": np.bincount(codes, u * u, G), "stt": stt}
    out = {}
    for key, value in values.items():
        scale, step = calibrate(SENSITIVITY[key], eps_d * SHARE[key])
        out[key] = add_noise(value, float(scale), kind="laplace", rng=rng, step=float(step))
        out[key + "_scale"] = float(scale)
    return out


def designs(stats: dict, n_noisy: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Candidate (u~, v) per cell: the mean of u at u~ and u~ -/+ Z_U / Z_V sd, the variance of u at
    its lower bound v~ - Z_U / Z_V sd (floored at V_FLOOR, at most 1/4; sd: of the Laplace noise / n~),
    from the noisy statistics and n~. The noise variance of the recursion falls with v."""
    n = np.maximum(n_noisy, 1.0)
    ubar = np.clip(stats["su"] / n, -0.5, 0.5)
    sd_u, sd_v = (np.sqrt(2.0) * stats[k + "_scale"] / n for k in ("su", "suu"))
    v = np.clip(stats["suu"] / n - ubar * ubar - Z_V * sd_v, V_FLOOR, 0.25)
    zs = (0.0, -1.0, 1.0) if Z_U > 0 else (0.0,)
    return [(np.clip(ubar + z * Z_U * sd_u, -0.5, 0.5), v) for z in zs]


def hessian(ubar: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The per-row Hessian [[1, u], [u, v + u^2]] of the squared loss, (G, 2, 2)."""
    H = np.empty((ubar.size, 2, 2))
    H[:, 0, 0], H[:, 0, 1], H[:, 1, 0], H[:, 1, 1] = 1.0, ubar, ubar, v + ubar * ubar
    return H


def linear_recursion(A: np.ndarray, Q: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, V) of the mean of iterates steps//2 .. steps-1 of e_{k+1} = A e_k + xi_k, Cov xi = Q
    (module docstring); A and Q are (G, 2, 2), A symmetric."""
    h = steps // 2
    m = steps - h
    eye = np.broadcast_to(np.eye(2), A.shape)
    D = eye.copy()  # D_j = sum_{k = max(j, h)}^{steps-1} A^{k-j}
    V = np.zeros_like(A)
    for j in range(steps - 1, -1, -1):
        if j < steps - 1:
            D = A @ D + (eye if j >= h else 0.0)
        V += D @ Q @ np.swapaxes(D, 1, 2)
    M = A @ D  # D_0 = sum_{k=h}^{steps-1} A^k, so A D_0 = sum A^{k+1}
    return M / m, V / (m * m)


def gd_interval(W: np.ndarray, n_noisy: np.ndarray, stats: dict, cells: Cells, *, statistic: str,
                recursion: dict) -> tuple[np.ndarray, np.ndarray]:
    """(ci_low, ci_high) per cell from the released (a, b) = ``W`` (G, 2, unit scale), n~ and the
    noisy design statistics; the widest over the candidate designs (:func:`designs`). ``recursion``:
    lr, steps, grad_sd (SD per coordinate of the noise on the gradient sum), batch_rate q (1 for
    full batch; the noise is divided by q n~)."""
    n = np.maximum(n_noisy, 3.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        sigma2 = np.maximum(stats["stt"], stats["stt_scale"]) / (n_noisy - 2.0)
    sigma2 = np.where(n_noisy >= 4, np.minimum(sigma2, 0.25), np.nan)
    half = np.zeros(n.size)
    for design in designs(stats, n_noisy):
        half = np.maximum(half, _halfwidth(W, n, sigma2, design, cells=cells, statistic=statistic,
                                           recursion=recursion))
    c, _, scale = _theta_gradient(cells, statistic, np.zeros(n.size))
    theta_unit = np.einsum("gi,gi->g", c, W)
    off = _theta_offset(cells, statistic)
    return scale * (theta_unit - half) + off, scale * (theta_unit + half) + off


def _halfwidth(W: np.ndarray, n: np.ndarray, sigma2: np.ndarray, design: tuple[np.ndarray, np.ndarray], *,
               cells: Cells, statistic: str, recursion: dict) -> np.ndarray:
    """1.96 sqrt(c' V c + SE_samp^2) + |c' M (W_0 - W^)| on the unit scale, for one design (u~, v)."""
    from scipy.special import ndtri  # scipy: imported where it is used

    ubar, v = design
    lr, steps, s, q = (recursion[k] for k in ("lr", "steps", "grad_sd", "batch_rate"))
    H = hessian(ubar, v)
    Q = (lr * s / (q * n))[:, None, None] ** 2 * np.eye(2)
    if q < 1.0:
        Q = Q + (lr * lr * (1.0 - q) / (q * n) * np.nan_to_num(sigma2, nan=0.25))[:, None, None] * H
    M, V = linear_recursion(np.eye(2) - lr * H, Q, steps)
    W0 = np.array([0.5, 0.0])
    Wf = np.where(np.isfinite(W), W, 0.0)
    W_hat = np.linalg.solve(np.eye(2) - M, (Wf - M @ W0)[..., None])[..., 0]
    bias = (M @ (W0 - W_hat)[..., None])[..., 0]
    c, d, _ = _theta_gradient(cells, statistic, ubar)
    h0 = 1.0 / (n * v) if d is None else 1.0 / n + d * d / (n * v)
    var_noise = np.einsum("gi,gij,gj->g", c, V, c)
    return ndtri(0.5 + LEVEL / 2.0) * np.sqrt(var_noise + sigma2 * h0) + np.abs(np.einsum("gi,gi->g", c, bias))


def _theta_gradient(cells: Cells, statistic: str, ubar: np.ndarray):
    """c (G, 2) with theta = scale c'(a, b) + offset, d = x0 - u~ (None for the slope), scale."""
    wx, wy = widths(cells)
    G = ubar.size
    if statistic == "slope":
        return np.tile([0.0, 1.0], (G, 1)), None, wy / wx
    d = cells.domain
    x0u = (d.x0(statistic) - d.x_lo) / wx - 0.5
    return np.tile([1.0, x0u], (G, 1)), x0u - ubar, wy


def _theta_offset(cells: Cells, statistic: str) -> float:
    return 0.0 if statistic == "slope" else cells.domain.y_lo
