"""Which terms the private Newton release can estimate, which of their intervals it claims, and
the plan made before anything is spent (:mod:`dptrain.privacy.newton`).

Everything here is a function of released numbers (the noisy Hessian, the noisy sums) or of
public ones (the noise's standard deviations, a reference design built from the public schema):
post-processing, no privacy spent.

* :func:`select_terms` (on the first noisy Hessian): a term is *informative* when its noisy
  curvature is above :data:`INFORMATIVE` noise sds (else it carries too little information at this
  noise and is left where DP-SGD put it); an informative term is *aliased* when the curvature it
  keeps given the earlier identified terms (a pivoted Cholesky in the declared order, as R's
  pivoted QR finds aliased columns) is both a tiny share (:data:`ALIASED_SHARE`) of its own and
  within :data:`ALIASED_SDS` noise sds of 0 (two codings of one variable): it is fixed at 0 and
  reported as R reports NA. The others are identified.
* :func:`term_claims`: per term of the table (a combination ``a`` of the parameters), the three
  checks of the coverage study, each on that term: the privacy noise's variance at most
  :data:`MAX_NOISE_TO_SAMPLING` times the sampling variance, the Hessian's noise small in the
  term's direction (``2 sd sqrt(p) |H^-1 a|^2 / a' H^-1 a``, which is at most the whole Hessian's
  ``2 sd sqrt(p) / lambda_min``), and the first Newton step at most :data:`MAX_FIRST_STEP`
  standard errors (DP-SGD's model close enough for two steps). A term that fails is not claimed,
  with its reason; the other terms keep their intervals.
* :func:`predict_claims`: the same checks on a design's EXPECTED Hessian and score covariance
  (the caller's reference design, from public facts only) with the release's noise, no draw: the
  plan that decides, before training, whether the release is worth its share of epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["INFORMATIVE", "MAX_FIRST_STEP", "MAX_HESSIAN_NOISE", "MAX_NOISE_TO_SAMPLING", "REFERENCE_OUTCOME",
           "Selection", "TermClaims", "hessian_ratio", "predict_claims", "psd", "reference_design",
           "reference_statistics", "select_terms", "term_claims"]

#: the claim's thresholds, from the coverage study (docs/inference.md)
MAX_NOISE_TO_SAMPLING = 4.0
MAX_HESSIAN_NOISE = 0.6
MAX_FIRST_STEP = 10.0
#: a term is informative when its noisy curvature is above this many noise sds
INFORMATIVE = 10.0
#: ... and identified when its curvature given the earlier identified terms is above this many
#: standard deviations of that curvature's noise
ALIASED_SDS = 5.0
#: a term that is not identified is aliased when the earlier terms explain all but this share of
#: its curvature (R's rule is 1e-7 without noise)
ALIASED_SHARE = 0.05


def psd(a: np.ndarray, floor: float) -> np.ndarray:
    """``a`` symmetrised, its eigenvalues floored at ``floor``."""
    vals, vecs = np.linalg.eigh((a + a.T) / 2.0)
    return (vecs * np.maximum(vals, floor)) @ vecs.T


def hessian_ratio(h: np.ndarray, sd: float) -> float:
    """The Hessian noise's spectral norm (about ``2 sd sqrt(p)`` for a symmetric p x p matrix of iid
    N(0, sd^2) entries) over the smallest eigenvalue of ``h`` (floored at ``sd``)."""
    p = h.shape[0]
    if p == 0:
        return 0.0
    return 2.0 * sd * math.sqrt(p) / float(np.linalg.eigvalsh(psd(h, sd)).min())


@dataclass(frozen=True)
class Selection:
    """The terms a release estimates: ``identified`` (indices, in declared order), ``aliased``
    (informative alone, not given the identified ones: fixed at 0), the rest uninformative."""

    identified: np.ndarray
    aliased: np.ndarray
    informative: np.ndarray  # bool per parameter: its own curvature above INFORMATIVE noise sds


def select_terms(h: np.ndarray, sd: float) -> Selection:
    """:class:`Selection` from a (noisy) Hessian ``h`` whose entries carry noise of sd ``sd``
    (module docstring). A term is informative when its curvature ``h_jj`` exceeds
    :data:`INFORMATIVE` noise sds. The pivot, in the declared order, computes an informative term
    j's curvature given the kept terms S, ``c_j = h_jj - h_jS h_SS^-1 h_Sj = u' h u`` with
    ``u = (-h_SS^-1 h_Sj, 1)``; the term is *aliased* (two codings of one variable) when the
    earlier terms explain all but :data:`ALIASED_SHARE` of its curvature AND ``c_j`` is within
    :data:`ALIASED_SDS` standard deviations of the quadratic form's noise,
    ``sd sqrt(sum u_i^4 + 4 sum_{i<k} u_i^2 u_k^2)``, of 0 (so a term the noise merely blurs is kept:
    leaving it out would bias the terms correlated with it). Every other informative term is
    identified."""
    diag = np.diag(h)
    informative = diag > INFORMATIVE * sd
    kept: list[int] = []
    aliased: list[int] = []
    inv = np.zeros((0, 0))  # (h_SS)^-1 of the kept terms, grown by bordering: O(p^3) in all
    for j in np.flatnonzero(informative):
        col = h[kept, j]
        b = inv @ col
        curvature = float(diag[j] - col @ b)
        u2 = np.append(b * b, 1.0)
        noise = sd * math.sqrt(float(np.sum(u2 * u2) + 2.0 * (np.sum(u2) ** 2 - np.sum(u2 * u2))))
        if curvature < ALIASED_SDS * noise and curvature < ALIASED_SHARE * float(diag[j]):
            aliased.append(int(j))
            continue
        k = len(kept)
        grown = np.empty((k + 1, k + 1))
        grown[:k, :k] = inv + np.outer(b, b) / curvature
        grown[:k, k] = grown[k, :k] = -b / curvature
        grown[k, k] = 1.0 / curvature
        inv = grown
        kept.append(int(j))
    return Selection(np.asarray(kept, dtype=np.int64), np.asarray(aliased, dtype=np.int64), informative)


@dataclass(frozen=True)
class TermClaims:
    """Per term: whether its interval is claimed, why (or why not), and the three numbers."""

    claimed: np.ndarray
    reasons: list[str]
    noise_to_sampling: np.ndarray
    hessian_noise: np.ndarray
    first_step_in_se: np.ndarray


def term_claims(a: np.ndarray, *, identified: np.ndarray, covariances: tuple[np.ndarray, np.ndarray, np.ndarray],
                sd_hessian: float, step: np.ndarray | None, run_ok: tuple[bool, str]) -> TermClaims:
    """The checks of the module docstring for each row ``a_k`` of ``a`` (terms x parameters).
    ``covariances`` (sampling, noise, bread = H^-1) are over the ``identified`` parameters; ``step``
    is the first Newton step over them (None: not checked, the plan); ``run_ok`` (ok, why) a
    run-level condition every claim needs (the second Hessian determined)."""
    sampling, noise, bread = covariances
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    k, p = a.shape
    inside = np.zeros(p, dtype=bool)
    inside[identified] = True
    ratio, hess, first = (np.full(k, np.nan) for _ in range(3))
    claimed = np.zeros(k, dtype=bool)
    reasons: list[str] = []
    m = len(identified)
    for i in range(k):
        used = np.abs(a[i]) > 0
        if not used.any():
            reasons.append("a constant term (no parameter)")
            continue
        if not np.all(inside[used]):
            reasons.append("not identified by the release (aliased, or too little information at this epsilon)")
            continue
        v = a[i, identified]
        samp, nois = float(v @ sampling @ v), float(v @ noise @ v)
        bv = bread @ v
        ratio[i] = nois / samp if samp > 0 else math.inf  # no sampling variance: a fit without residuals
        hess[i] = 2.0 * sd_hessian * math.sqrt(m) * float(bv @ bv) / max(float(v @ bv), 1e-300)
        if step is not None:
            first[i] = abs(float(v @ step)) / math.sqrt(max(samp + nois, 1e-300))
        shown = f"{ratio[i]:.3g}" if math.isfinite(ratio[i]) else "infinite (no sampling variance: the scores are 0)"
        checks = [(ratio[i] <= MAX_NOISE_TO_SAMPLING, f"privacy-noise variance / sampling variance {shown} "
                   f"(at most {MAX_NOISE_TO_SAMPLING:g})"),
                  (hess[i] <= MAX_HESSIAN_NOISE, f"Hessian noise in this term's direction {hess[i]:.3g} "
                   f"(at most {MAX_HESSIAN_NOISE:g})"),
                  (step is None or first[i] <= MAX_FIRST_STEP, f"DP-SGD's model {first[i]:.3g} standard errors "
                   f"from the estimate (at most {MAX_FIRST_STEP:g})"),
                  run_ok]
        failed = [why for ok, why in checks if not ok]
        claimed[i] = not failed
        reasons.append("; ".join(failed) if failed else "every check passed")
    return TermClaims(claimed, reasons, ratio, hess, first)


def predict_claims(h: np.ndarray, s: np.ndarray, a: np.ndarray, sd: dict[str, float]) -> TermClaims:
    """The plan: :func:`term_claims` on the EXPECTED Hessian ``h`` and score covariance ``s`` of a
    reference design (no noise drawn), with the release's noise sds ``sd`` (gradient_0, hessian_0,
    gradient_1, hessian_1) and DP-SGD's model taken at the optimum (the first step's miss is its
    gradient noise only)."""
    sel = select_terms(h, sd["hessian_0"])
    idx = sel.identified
    if idx.size == 0:
        empty = np.zeros((0, 0))
        return term_claims(a, identified=idx, covariances=(empty, empty, empty), sd_hessian=sd["hessian_1"],
                           step=None, run_ok=(False, "-"))
    bread = np.linalg.inv(psd(h[np.ix_(idx, idx)], sd["hessian_1"]))
    sampling = bread @ s[np.ix_(idx, idx)] @ bread
    miss = sd["gradient_0"] ** 2 * bread @ bread
    noise = bread @ (sd["gradient_1"] ** 2 * np.eye(idx.size)
                     + sd["hessian_1"] ** 2 * (np.trace(miss) * np.eye(idx.size) + miss)) @ bread
    ratio = hessian_ratio(h[np.ix_(idx, idx)], sd["hessian_1"])
    run_ok = (ratio <= MAX_HESSIAN_NOISE, f"Hessian noise / smallest curvature {ratio:.3g} "
              f"(at most {MAX_HESSIAN_NOISE:g})")
    return term_claims(a, identified=idx, covariances=(sampling, noise, bread), sd_hessian=sd["hessian_1"],
                       step=None, run_ok=run_ok)


#: the reference design's outcome at its most informative: per kind, (w, r^2) of a row (binary:
#: p(1 - p) at p = 1/2, the largest curvature a row can have; linear: w = 1 and a residual sd of a
#: quarter of the target's declared range; multinomial: classes equally likely). A run refines
#: them after training from its released training loss.
REFERENCE_OUTCOME = {"binary": (0.25, 0.25), "linear": (1.0, 1.0 / 16.0)}


def reference_design(numeric: int, levels: list[int]) -> np.ndarray:
    """E[z z'] of a reference-coded design z = (1, numeric columns in [0, 1], per categorical
    column its levels 2..L and an "other" level) under the PUBLIC reference design: numeric
    columns uniform on [0, 1] (mean 1/2, second moment 1/3), each categorical column's ``L``
    declared levels equally likely (the other level never), the columns independent. Public:
    only the schema's shape enters."""
    means = [1.0] + [0.5] * numeric
    second = [1.0] + [1.0 / 3.0] * numeric
    block = [0] * (1 + numeric)
    for b, count in enumerate(levels, start=1):
        share = 1.0 / count
        means += [share] * (count - 1) + [0.0]
        second += [share] * (count - 1) + [0.0]
        block += [b] * count
    m = np.outer(means, means)
    blocks = np.asarray(block)
    m[(blocks[:, None] == blocks[None, :]) & (blocks[:, None] > 0)] = 0.0  # two levels of one column never meet
    np.fill_diagonal(m, second)
    return m


def reference_statistics(moments: np.ndarray, n: int, kind: str, *, classes: int = 2,
                         outcome: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The EXPECTED (H, S) over ``n`` rows of a design with second moments ``moments``
    (:func:`reference_design`) and the outcome (w, r^2) (default :data:`REFERENCE_OUTCOME`); a
    multinomial model's K - 1 class blocks (classes equally likely, S = H)."""
    m = n * moments
    if kind == "multinomial":
        p = np.full(classes - 1, 1.0 / classes)
        h = np.kron(np.diag(p) - np.outer(p, p), m)
        return h, h
    w, r2 = outcome if outcome is not None else REFERENCE_OUTCOME[kind]
    return w * m, r2 * m
