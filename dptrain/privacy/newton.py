"""The private Newton release: two Newton steps of a linear model's loss from a start (DP-SGD's
model), each releasing noisy sums over the rows, and a sandwich covariance.

At the start ``theta`` one Gaussian mechanism releases (noisy gradient / noisy Newton
M-estimation, Avella-Medina, Bradshaw & Loh, Annals of Statistics 2023):

* ``G = sum_i r_i z_i``, the gradient of the loss (``r_i``: the loss' derivative in the linear
  predictor, bounded by the objective: :data:`BOUNDS`);
* ``H = sum_i w_i z_i z_i'``, the Hessian (``w_i``: the second derivative, bounded);

a Newton step is taken, and at the new point G, H and ``S = sum_i r_i^2 z_i z_i'`` (the scores'
outer products, the "meat" of the sandwich) are released and a second step taken. ``z_i`` is the
row's design with ``||z||^2 <= R^2`` (PUBLIC: the caller's bound), so adding or removing one row
changes G by at most ``r_max R``, H by at most ``w_max R^2`` and S by at most ``r_max^2 R^2``
(Frobenius norms; the noise of a symmetric matrix is drawn on its upper triangle and mirrored).
The five noisy sums are adaptive Gaussian releases, which compose to ONE Gaussian mechanism
(:func:`noise_multipliers`), accounted as ``gaussian(sigma)``.

The covariance ``H^-1 (S + var_G I + var_H (E|d|^2 I + E dd')) H^-1`` adds to the sampling
variance (a sandwich, robust to a misspecified variance) the second gradient's noise and the
second Hessian's noise acting on the first step's miss ``d`` (:func:`_first_step_error`; without
it the intervals under-covered where the first step misses by a few SEs: N 5,000-10,000 at
epsilon 1). H's eigenvalues are floored at its
noise's sd. The first noisy Hessian decides which terms the release can estimate
(:mod:`dptrain.privacy.newton_terms`): a term with too little information (a declared level with
no rows, or too few) is left where the start put it, a term aliased with earlier ones (two codings
of one variable, at this noise) is set to 0 as R reports NA; neither gets a covariance.
:meth:`NewtonFit.claims` decides per term, from released numbers, whether its interval is claimed
valid. Everything after the releases is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.privacy.accounting import SIGMA_RANGE, PrivacyLedger, history_epsilon
from dptrain.privacy.calibration import smallest_noise
from dptrain.privacy.events import gaussian_event
from dptrain.privacy.newton_terms import MAX_HESSIAN_NOISE, TermClaims, hessian_ratio, psd, select_terms, term_claims

__all__ = ["BOUNDS", "NewtonFit", "noise_multipliers", "noise_sds", "planned_noise_multiplier", "private_newton",
           "release_noise_multiplier", "sensitivities", "statistics"]


#: per objective kind: (the largest |r_i|, the largest w_i) on the model's scale
BOUNDS = {"binary": (1.0, 0.25), "linear": (1.0, 1.0), "multinomial": (math.sqrt(2.0), 1.0)}


def statistics(z: np.ndarray, y: np.ndarray, eta: np.ndarray, kind: str) -> tuple[np.ndarray, ...]:
    """(G, H, S) at the linear predictor ``eta`` (module docstring). Binary: r = sigmoid(eta) - y,
    w = p (1 - p). Linear (target scaled to [0, 1]): r = clip(eta, 0, 1) - y, w = 1. Multinomial
    (``eta``: (n, K) class scores, ``y``: class indices; the parameters are classes 1..K-1 against
    class 0, class-major): r = p_k - [y = k] for k >= 1 (||r|| <= sqrt 2), W = diag(p) - p p' over
    classes 1..K-1 (||W||_F <= trace W <= 1); G = sum r (x) z, H = sum W (x) z z', S = sum r r' (x) z z'."""
    if kind not in BOUNDS:
        raise DPTrainError(f"no private Newton interval for objective kind {kind!r}: allowed: {', '.join(BOUNDS)}")
    if kind == "multinomial":
        return _multinomial(z, np.asarray(y).reshape(-1).astype(np.int64), np.asarray(eta, dtype=np.float64))
    eta = np.asarray(eta, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if kind == "binary":
        p = 1.0 / (1.0 + np.exp(-eta))
        r, w = p - y, p * (1.0 - p)
    else:
        r, w = np.clip(eta, 0.0, 1.0) - np.clip(y, 0.0, 1.0), np.ones_like(eta)
    zt = z.T if z.T.flags.c_contiguous else np.ascontiguousarray(z.T)  # (d, n): rows of one column each
    d = zt.shape[0]
    both = (zt[None, :, :] * np.stack([w, r * r])[:, None, :]).reshape(2 * d, -1) @ zt.T  # H and S in one product
    return zt @ r, both[:d], both[d:]


def _multinomial(z: np.ndarray, y: np.ndarray, eta: np.ndarray) -> tuple[np.ndarray, ...]:
    e = np.exp(eta - eta.max(axis=1, keepdims=True))
    p = (e / e.sum(axis=1, keepdims=True))[:, 1:]
    onehot = np.zeros_like(p)
    rows = np.flatnonzero(y > 0)
    onehot[rows, y[rows] - 1] = 1.0
    r = p - onehot
    k, d = p.shape[1], z.shape[1]
    g = (r.T @ z).reshape(-1)
    h, s = np.zeros((k * d, k * d)), np.zeros((k * d, k * d))
    for a in range(k):
        for c in range(a, k):
            w = (p[:, a] * (a == c)) - p[:, a] * p[:, c]
            h[a * d:(a + 1) * d, c * d:(c + 1) * d] = (z * w[:, None]).T @ z
            s[a * d:(a + 1) * d, c * d:(c + 1) * d] = (z * (r[:, a] * r[:, c])[:, None]).T @ z
            if c != a:
                h[c * d:(c + 1) * d, a * d:(a + 1) * d] = h[a * d:(a + 1) * d, c * d:(c + 1) * d].T
                s[c * d:(c + 1) * d, a * d:(a + 1) * d] = s[a * d:(a + 1) * d, c * d:(c + 1) * d].T
    return g, h, s


#: the share of the release's precision (1 / sd^2, in units of each sum's sensitivity) each noisy
#: sum gets: the second gradient, which sets the estimate's noise, most; the first gradient (its
#: noise is corrected by the second step to first order), the Hessian and the meat less
PRECISION = {"gradient_0": 0.25, "hessian_0": 1.0 / 9.0, "gradient_1": 1.0, "hessian_1": 1.0 / 9.0,
             "meat": 1.0 / 9.0}


def noise_multipliers(noise_multiplier: float) -> dict[str, float]:
    """Each sum's noise multiplier (sd / sensitivity) for the whole release's ``noise_multiplier``:
    adaptive Gaussian releases compose to ONE Gaussian mechanism with 1 / sigma^2 = sum 1 / sigma_i^2
    (Dong, Roth and Su 2019, Gaussian differential privacy), accounted as ``gaussian(sigma)``."""
    total = sum(PRECISION.values())
    return {k: noise_multiplier * math.sqrt(total / v) for k, v in PRECISION.items()}


def sensitivities(kind: str, radius_sq: float) -> dict[str, float]:
    """Each sum's add/remove-one-row sensitivity (L2 / Frobenius; module docstring)."""
    r_max, w_max = BOUNDS[kind]
    g, h = r_max * math.sqrt(radius_sq), w_max * radius_sq
    return {"gradient_0": g, "hessian_0": h, "gradient_1": g, "hessian_1": h, "meat": r_max**2 * radius_sq}


@dataclass(frozen=True)
class NewtonFit:
    """The estimate (reduced parameters) after the private Newton steps, its covariance, which
    terms the release identified (:func:`dptrain.privacy.newton_terms.select_terms`) and each
    identified term's first step (how far DP-SGD's model was from the estimate: a diagnostic of
    its convergence). Per-term claims: :meth:`claims`."""

    estimate: np.ndarray
    covariance: np.ndarray
    #: per parameter: identified by the release (estimated, with a covariance)
    informative: np.ndarray
    #: the first Newton step per parameter (NaN outside the identified ones)
    first_step: np.ndarray
    noise_sd: dict[str, float]
    #: the second Hessian's noise ratio over the identified terms (a run-level check)
    hessian_noise: float = math.inf
    #: the privacy noise's part of ``covariance`` (the estimate's spread around the non-private
    #: optimum on these rows): the second gradient's noise and the second Hessian's noise times the
    #: first step's miss
    noise_covariance: np.ndarray | None = None
    #: the inverse noisy Hessian of the second point (NaN outside the identified terms)
    bread: np.ndarray | None = None
    #: the sampling part of ``covariance`` (the sandwich H^-1 S H^-1)
    sampling_covariance: np.ndarray | None = None
    #: per parameter: aliased with earlier terms at this noise (fixed at 0, reported as NA)
    aliased: np.ndarray | None = None
    #: the objective kind (BOUNDS): a linear model's loss is quadratic, so Newton's first step from
    #: any start lands on the optimum up to the release's noise and the first-step check is moot
    kind: str = "binary"

    def degrees_of_freedom(self, a: np.ndarray) -> np.ndarray:
        """Per row ``a_k`` of ``a`` (a term as a combination of the parameters), the degrees of
        freedom of its noisy variance ``V = a' C a`` (Satterthwaite: ``df = 2 V^2 / Var V``), for
        Student's t interval. C = H^-1 M H^-1 is noisy through the meat (``v' E_S v``, ``v = H^-1
        a``) and the second Hessian (to first order ``-2 v' E_H w``, ``w = C a``); for a symmetric
        noise matrix with iid sd on and above the diagonal, ``Var(u' E w) = sd^2 sum_{i<=j} c_ij^2``
        with ``c_ij = u_i w_j + u_j w_i`` (i < j) and ``c_ii = u_i w_i``. Infinite without noise."""
        a = np.atleast_2d(np.asarray(a, dtype=np.float64))
        if self.bread is None:
            return np.full(a.shape[0], np.inf)
        bread = np.where(np.isfinite(self.bread), self.bread, 0.0)
        cov = np.where(np.isfinite(self.covariance), self.covariance, 0.0)
        v = a @ bread
        var = self.noise_sd.get("meat", 0.0) ** 2 * _bilinear_var(v, v)
        se2 = np.einsum("ij,jk,ik->i", a, cov, a)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(var > 0, 2.0 * se2**2 / var, np.inf)

    def claims(self, a: np.ndarray | None = None) -> TermClaims:
        """Per row of ``a`` (terms x parameters; default: each parameter), whether its interval is
        CLAIMED and why (:func:`dptrain.privacy.newton_terms.term_claims`): the run-level check (the
        second Hessian determined over the identified terms) and, per term, the privacy noise's
        share, the Hessian's noise in the term's direction and the first step in standard errors.
        Computed from released numbers only."""
        p = len(self.estimate)
        a = np.eye(p) if a is None else np.atleast_2d(np.asarray(a, dtype=np.float64))
        idx = np.flatnonzero(self.informative)
        if idx.size == 0 or self.sampling_covariance is None:
            return TermClaims(np.zeros(len(a), dtype=bool), ["no term carries information (the noisy curvature is "
                                                              "below its noise)"] * len(a), *(np.full(len(a), np.nan)
                                                                                              for _ in range(3)))
        sub = np.ix_(idx, idx)
        run_ok = (self.hessian_noise <= MAX_HESSIAN_NOISE, f"Hessian noise / smallest curvature "
                  f"{self.hessian_noise:.3g} (at most {MAX_HESSIAN_NOISE:g})")
        return term_claims(a, identified=idx, sd_hessian=self.noise_sd["hessian_1"],
                           covariances=(self.sampling_covariance[sub], self.noise_covariance[sub], self.bread[sub]),
                           step=None if self.kind == "linear" else self.first_step[idx], run_ok=run_ok)

    def checks(self, a: np.ndarray | None = None) -> dict[str, float | None]:
        """The largest of each per-term number among the identified terms, and the run's Hessian check
        (public: functions of the releases)."""
        c = self.claims(a)
        worst = {k: (float(np.nanmax(v)) if np.any(np.isfinite(v)) else None)
                 for k, v in (("noise_to_sampling", c.noise_to_sampling), ("term_hessian_noise", c.hessian_noise),
                              ("first_step_in_se", c.first_step_in_se))}
        return {**worst, "hessian_noise": float(self.hessian_noise) if np.any(self.informative) else None}

    def claim(self, a: np.ndarray | None = None) -> tuple[bool, str]:
        """(whether ANY term's interval is claimed, a one-line summary): the terms whose checks
        pass keep their intervals (:meth:`claims`)."""
        c = self.claims(a)
        n, k = int(c.claimed.sum()), len(c.claimed)
        if n == k:
            return True, f"every term's checks passed ({k} terms)"
        if n:
            return True, f"{n} of {k} terms claimed; the others: {_reasons(c, ~c.claimed)}"
        return False, _reasons(c, ~c.claimed)


def _reasons(c: TermClaims, which: np.ndarray) -> str:
    """The distinct reasons of the terms ``which``, the most frequent first (at most three)."""
    worst = [why for why, use in zip(c.reasons, which) if use]
    return "; ".join(sorted(set(worst), key=lambda w: (-worst.count(w), worst.index(w)))[:3])


def _bilinear_var(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row, ``Var(u' E w) / sd^2`` for E symmetric with iid entries on and above the diagonal."""
    c = u[:, :, None] * w[:, None, :]
    c = c + np.swapaxes(c, 1, 2)
    upper = np.triu(np.ones(c.shape[1:], dtype=bool), 1)
    return np.sum(c[:, upper] ** 2, axis=1) + np.sum((u * w) ** 2, axis=1)


def _symmetric(rng: np.random.Generator, p: int, sd: float) -> np.ndarray:
    upper = np.triu(rng.normal(0.0, sd, size=(p, p)))
    return upper + np.triu(upper, 1).T


def _noisy(sums: tuple[np.ndarray, ...], sd: dict[str, float], step: int, rng: np.random.Generator,
           meat: bool) -> tuple[np.ndarray, ...]:
    g, h, s = sums
    p = len(g)
    g = g + rng.normal(0.0, sd[f"gradient_{step}"], size=p)
    h = h + _symmetric(rng, p, sd[f"hessian_{step}"])
    return g, h, (s + _symmetric(rng, p, sd["meat"])) if meat else None


def _inverse(h: np.ndarray, idx: np.ndarray, sd: float) -> np.ndarray:
    """The inverse of the noisy Hessian on the identified terms, its eigenvalues floored at the
    noise's sd (a floor at the noise's spectral norm, as AdaSSP's ridge, would shrink the
    variance of the least-determined direction and under-cover)."""
    return np.linalg.inv(psd(h[np.ix_(idx, idx)], sd))


def _first_step_error(h0_inv: np.ndarray, step: np.ndarray, sd: dict[str, float]) -> np.ndarray:
    """E[delta delta'] for the first step's miss ``delta`` (the first point minus the non-private
    optimum). To first order ``delta = H0^-1 (E0 u - n0)``: ``u`` the start's distance from the
    optimum, ``n0`` the first gradient's noise, ``E0`` the first Hessian's (symmetric, iid sd on and
    above the diagonal, so Cov(E0 u) = sd^2 (|u|^2 I + u u')). |u|^2 is estimated from the released
    step, less its expected noise: |step|^2 - sd_g0^2 tr(H0^-2). The second Hessian's noise E1
    carries delta into the estimate as ``H1^-1 E1 delta``, of covariance
    ``sd1^2 H1^-1 (E|delta|^2 I + E delta delta') H1^-1`` (:func:`private_newton`)."""
    h2 = h0_inv @ h0_inv
    size = float(step @ step)
    dist = max(size - sd["gradient_0"] ** 2 * float(np.trace(h2)), 0.0)
    u = h0_inv @ step * math.sqrt(dist / size) if size > 0 else np.zeros_like(step)
    return (sd["gradient_0"] ** 2 + sd["hessian_0"] ** 2 * dist) * h2 + sd["hessian_0"] ** 2 * np.outer(u, u)


def private_newton(theta: np.ndarray, sums_at: Callable[[np.ndarray], tuple[np.ndarray, ...]], *, kind: str,
                   radius_sq: float, noise_multiplier: float, rng: np.random.Generator) -> NewtonFit:
    """Two Newton steps from DP-SGD's ``theta`` (reduced parameters; ``sums_at(theta)`` gives the
    exact (G, H, S) there): release a noisy G and H at ``theta``, select the terms the noisy Hessian
    identifies (:func:`dptrain.privacy.newton_terms.select_terms`; aliased terms are set to 0, the
    released gradient moved to that point along the released Hessian, ``g + H (theta' - theta)``)
    and step; release a noisy G, H and S at the new point and step again. The second step removes
    the first gradient's noise and most of DP-SGD's distance from the optimum; the covariance
    ``H^-1 (S + noise) H^-1`` is the second point's. Terms that are not identified keep DP-SGD's
    value (aliased ones 0) and get no covariance."""
    sd = noise_sds(noise_multiplier, kind, radius_sq)
    p = len(theta)
    g0, h0, _ = _noisy(sums_at(theta), sd, 0, rng, meat=False)
    sel = select_terms(h0, sd["hessian_0"])
    idx = sel.identified
    est, cov, first = theta.astype(np.float64).copy(), np.full((p, p), np.nan), np.full(p, np.nan)
    aliased = np.zeros(p, dtype=bool)
    aliased[sel.aliased] = True
    identified = np.zeros(p, dtype=bool)
    identified[idx] = True
    if idx.size == 0:
        return NewtonFit(est, cov, identified, first, sd, aliased=aliased, kind=kind)
    moved = np.where(aliased, 0.0, est) - est
    g0 = g0 + psd(h0, 0.0) @ moved if aliased.any() else g0  # the released gradient, moved to the new start
    est += moved
    h0_inv = _inverse(h0, idx, sd["hessian_0"])
    step0 = h0_inv @ g0[idx]
    est[idx] -= step0
    g1, h1, s1 = _noisy(sums_at(est), sd, 1, rng, meat=True)
    h_inv = _inverse(h1, idx, sd["hessian_1"])
    est[idx] -= h_inv @ g1[idx]
    sampling = h_inv @ psd(s1[np.ix_(idx, idx)], 0.0) @ h_inv
    miss = _first_step_error(h0_inv, step0, sd)
    noise = h_inv @ (sd["gradient_1"] ** 2 * np.eye(idx.size)
                     + sd["hessian_1"] ** 2 * (np.trace(miss) * np.eye(idx.size) + miss)) @ h_inv
    c = sampling + noise
    cov[np.ix_(idx, idx)] = (c + c.T) / 2.0
    first[idx] = step0
    full = {}
    for name, m in (("noise", noise), ("bread", h_inv), ("sampling", sampling)):
        full[name] = np.full((p, p), np.nan)
        full[name][np.ix_(idx, idx)] = (m + m.T) / 2.0
    return NewtonFit(est, cov, identified, first, sd, hessian_ratio(h1[np.ix_(idx, idx)], sd["hessian_1"]),
                     full["noise"], full["bread"], full["sampling"], aliased, kind)


def release_noise_multiplier(accountant: PrivacyLedger, *, delta: float, accountant_name: str, rtol: float,
                             share: float, target: float | None = None) -> float:
    """The release's noise multiplier after DP-SGD (the history ``accountant`` holds):
    :func:`planned_noise_multiplier` of that history."""
    return planned_noise_multiplier(accountant.totals, delta=delta, accountant_name=accountant_name, rtol=rtol,
                                    share=share, target=target)


def planned_noise_multiplier(history: tuple, *, delta: float, accountant_name: str, rtol: float, share: float,
                             target: float | None = None) -> float:
    """The release's noise multiplier: the smallest (the one calibration routine) whose
    ``gaussian`` event, composed with ``history`` (DP-SGD's steps, done or planned), keeps the run's
    epsilon within ``target`` (DP-SGD was calibrated to (1 - share) of it) or, without a target (a
    given noise multiplier), within DP-SGD's epsilon / (1 - share)."""
    history = tuple(history)
    if target is None:
        target = history_epsilon(history, delta=delta, accountant=accountant_name) / (1.0 - share)

    def epsilon_of(sigma: float) -> float:
        return history_epsilon((*history, (gaussian_event(sigma), 1)), delta=delta, accountant=accountant_name)

    return smallest_noise(epsilon_of, target=float(target), rtol=rtol, lower=SIGMA_RANGE[0], upper=SIGMA_RANGE[1])


def noise_sds(noise_multiplier: float, kind: str, radius_sq: float) -> dict[str, float]:
    """Each noisy sum's standard deviation: its noise multiplier times its sensitivity."""
    sig, sens = noise_multipliers(noise_multiplier), sensitivities(kind, radius_sq)
    return {k: sig[k] * sens[k] for k in sig}
