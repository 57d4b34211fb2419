"""Group privacy: what an example-level guarantee says about a person with k rows.

An example-level run protects one ROW. A person (a unit) with k rows is a group of k rows, and the
run protects the group only through group privacy, which grows fast in k:

* the (epsilon, delta) rule (Dwork and Roth 2014, Theorem 2.2, in its approximate-DP form, e.g.
  Vadhan 2017, Lemma 2.2): an (epsilon, delta)-DP mechanism is
  (k epsilon, k e^((k-1) epsilon) delta)-DP for groups of k;
* the RDP rule (Mironov 2017, "Renyi differential privacy", Proposition 2): a mechanism that is
  (alpha, r(alpha))-RDP for add/remove of one row is (alpha / 2^c, 3^c r(alpha))-RDP for groups of
  2^c rows when alpha >= 2^(c+1); a group of k rows is one of 2^c with c = ceil(log2 k). Converted
  to (epsilon, delta) by the same conversion as the run's RDP accountant (Balle et al. 2020).

:func:`group_level` gives both at the SAME delta (the first rule's, k e^((k-1) epsilon) delta) and
keeps the smaller epsilon, naming the rule: both are valid bounds, the smaller is the tighter.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dptrain.privacy.accounting import RDP_ORDERS, rdp_curve

__all__ = ["GROUP_SIZES", "approx_dp_group", "group_level", "group_section", "rdp_group_epsilon"]

#: the group sizes an example-level report shows
GROUP_SIZES = (2, 5, 10, 20)

APPROX_RULE = "(k eps, k e^((k-1) eps) delta): group privacy of (eps, delta)-DP (Dwork and Roth 2014, Thm 2.2)"
RDP_RULE = ("RDP group privacy (Mironov 2017, Prop. 2: (alpha / 2^c, 3^c r(alpha))-RDP for 2^c >= k rows), "
            "converted to (eps, delta) as the RDP accountant does")


def approx_dp_group(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(k epsilon, k e^((k-1) epsilon) delta): the group-privacy bound for k rows (delta capped at 1)."""
    if k < 1:
        raise ValueError(f"k={k!r}: a group has at least 1 row")
    log_delta = math.log(k) + (k - 1) * epsilon + math.log(delta) if delta > 0 else -math.inf
    return k * epsilon, min(1.0, math.exp(min(log_delta, 0.0)))


def rdp_group_epsilon(rdp: np.ndarray, delta: float, k: int) -> float:
    """Epsilon at ``delta`` for groups of ``k`` rows from the run's RDP curve ``rdp`` (at
    ``RDP_ORDERS``) by Mironov's group rule; inf when no order is large enough or delta >= 1."""
    if delta >= 1.0:
        return 0.0
    c = max(0, math.ceil(math.log2(k)))
    scale = 2 ** c
    orders = np.asarray(RDP_ORDERS)
    ok = orders >= 2 * scale if c > 0 else orders > 1
    if not ok.any():
        return math.inf
    a = orders[ok] / scale
    r = (3.0 ** c) * np.maximum(np.asarray(rdp, dtype=np.float64)[ok], 0.0)
    keep = a > 1
    a, r = a[keep], r[keep]
    if a.size == 0:
        return math.inf
    eps = r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
    return float(max(0.0, np.nanmin(eps)))


def group_level(epsilon: float, delta: float, k: int, history: Any = None) -> dict[str, Any]:
    """The guarantee of an example-level run for a person with ``k`` rows: the smaller epsilon of
    the (epsilon, delta) rule and (with the run's ``history`` of events) the RDP rule, both at
    the (epsilon, delta) rule's group delta."""
    eps_a, delta_k = approx_dp_group(epsilon, delta, k)
    out = {"k": k, "epsilon": eps_a, "delta": delta_k, "rule": APPROX_RULE}
    if history is not None and delta_k < 1.0:
        eps_r = rdp_group_epsilon(rdp_curve(history), delta_k, k)
        if eps_r < eps_a:
            out.update(epsilon=eps_r, rule=RDP_RULE)
    return out


def group_section(epsilon: float, delta: float, history: Any = None,
                  sizes: tuple[int, ...] = GROUP_SIZES) -> dict[str, Any]:
    """The example-level report's ``group_privacy``: the sentence and the level for a few k."""
    levels = [group_level(epsilon, delta, k, history) for k in sizes]
    return {
        "statement": "this guarantee is per ROW: a person (or any unit) with k rows in the training data is "
                     "protected only at the group-privacy level for k rows, below; declare data.privacy_unit "
                     "(with privacy.max_rows_per_unit) for a guarantee per person",
        "levels": levels,
    }
