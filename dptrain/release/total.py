"""The TOTAL of a small-cell release, known before any row is read: the console's first line.

``release.epsilon_per_statistic`` is the epsilon of EACH released statistic; what a release
spends in all depends on the method (MOS and DP-MOS: 3 of it per cell by default; replace-one
methods run at 2 of it; suppression spends nothing and guarantees nothing) and on a private
cell selection. :func:`planned_total` computes it from the method's own
:meth:`~dptrain.release.methods.ReleaseMethod.budget` as release.json's ``total`` will state it
(:func:`dptrain.release.report.composed_total`), :func:`first_line` says it in words, and
:func:`total_disagreement` names a method whose output says otherwise.
"""

from __future__ import annotations

import math

from dptrain.release import report
from dptrain.release.methods import RELEASE_METHODS
from dptrain.release.spec import ReleaseSpec


def planned_total(r: ReleaseSpec, selection: dict | None) -> dict:
    """The release's TOTAL as release.json will state it ("total": epsilon, delta, note), known
    before any row is read: the method's own budget at release.epsilon_per_statistic
    (:meth:`ReleaseMethod.budget`; a custom statistic's MOS releases theta and N: 2 of it),
    composed with a private cell selection."""
    if r.statistic == "custom":
        return report.composed_total("add_remove", 2 * r.epsilon_per_statistic, 0.0, selection)
    method = RELEASE_METHODS.get(r.method)
    eps, delta = method.budget(r.epsilon_per_statistic, r)
    rel = method.relation(r)
    return report.composed_total(None if rel is None else rel.value, eps, delta, selection)


def first_line(r: ReleaseSpec, total: dict, selection: dict | None, stat_fn: str | None) -> str:
    """The release's first console line: its TOTAL epsilon and delta for release.method, then the
    per-statistic setting and the statistic."""
    eps = r.epsilon_per_statistic
    method = RELEASE_METHODS.get(r.method)
    rel = None if r.statistic == "custom" else method.relation(r)
    if total["epsilon"] is None:
        return (f"release: no epsilon: NOT differentially private, the released values are EXACT; release.method="
                f"{r.method} (release.epsilon_per_statistic is not used), statistic={r.statistic}")
    head = (f"epsilon {total['epsilon']:g}, delta {total['delta']:g} in all"
            + (" with the private cell selection" if selection else "")
            + (f" ({rel.value} neighbours)" if rel is not None and method.has_guarantee else
               " (conditional on chi: NOT differentially private)"))
    if r.statistic == "custom":
        return (f"release: {head}; release.method={r.method} with theta and N each at release.epsilon_per_statistic="
                f"{eps:g}, statistic=custom ({stat_fn})")
    setting = f"release.method={r.method} at release.epsilon_per_statistic={eps:g}"
    if method.run_epsilon(eps, r) != eps:
        setting += f" (run at {method.run_epsilon(eps, r):g}: the comparison convention of {rel.value} methods)"
    return f"release: {head}; {setting}, statistic={r.statistic}"


def total_disagreement(planned: dict, stated: dict, name: str) -> str | None:
    """The total the first line gave must be release.json's: for a method whose ``budget`` says
    otherwise than its output (a plugin's), the line that names both; None when they agree."""
    pairs = [(planned.get(k), stated.get(k)) for k in ("epsilon", "delta")]
    if all((p is None and s is None) or (p is not None and s is not None and math.isclose(p, s, rel_tol=1e-9))
           for p, s in pairs):
        return None
    return (f"release.method={name}: the total on the first line (epsilon {planned.get('epsilon')}, delta "
            f"{planned.get('delta')}) is not release.json's (epsilon {stated.get('epsilon')}, delta "
            f"{stated.get('delta')}): release.json's is the one its output satisfies; the method's budget() "
            "disagrees with it")
