"""zCDP and (epsilon, delta) for the one-shot releases: the ONE conversion and its inverse.

The table, TopDown and synthesis mechanisms are rho-zCDP (Bun and Steinke 2016): the discrete
Gaussian on counts of L2 sensitivity 1 at scale sigma is 1 / (2 sigma^2)-zCDP, an epsilon-DP
exponential mechanism epsilon^2 / 8-zCDP, and rhos add up under composition. A release states
(epsilon, delta): :func:`zcdp_epsilon` is the RDP accountant's conversion of dp-accounting's
``ZCDpEvent`` (:mod:`dptrain.privacy.accounting`), the only place a one-shot release turns a rho
into an epsilon; :func:`gaussian_rho` inverts it (the largest rho whose conversion meets a
target) with the project's one calibration routine (:mod:`dptrain.privacy.calibration`).
"""

from __future__ import annotations

from dptrain.privacy.accounting import RDP, SIGMA_RANGE, history_epsilon
from dptrain.privacy.calibration import smallest_noise
from dptrain.privacy.events import zcdp_event

__all__ = ["gaussian_rho", "zcdp_epsilon"]


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The epsilon at ``delta`` of a rho-zCDP release (the RDP accountant's conversion)."""
    return history_epsilon([(zcdp_event(rho), 1)], delta=delta, accountant=RDP)


def gaussian_rho(epsilon: float, delta: float, *, rtol: float = 1e-4) -> float:
    """The largest total rho whose zCDP release is (epsilon, delta)-DP by :func:`zcdp_epsilon` (the
    project's one calibration routine over the scale s = 1 / sqrt(2 rho))."""
    def epsilon_of(s: float) -> float:
        return zcdp_epsilon(1.0 / (2.0 * s * s), delta)

    s = smallest_noise(epsilon_of, target=float(epsilon), rtol=rtol, lower=SIGMA_RANGE[0], upper=SIGMA_RANGE[1])
    return 1.0 / (2.0 * s * s)
