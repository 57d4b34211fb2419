"""Neighbour relations of differential privacy, and how epsilons under them compare.

* ``ADD_REMOVE``: data sets differ by one row added or removed (N is private). DP-SGD with
  Poisson sampling, the sufficient-statistic Laplace release, DP gradient descent and MOS's
  default use it.
* ``ADD``: only additions (what the Chetty-Friedman Stata guide computes for MOS).
* ``REPLACE_ONE``: one row replaced by another; N is public (NoisyStats, DP Theil-Sen).
* ``ER_EE``: strong alpha-neighbours of employer-employee data (one establishment's size x grows
  to x' with x <= x' <= max((1 + alpha) x, x + 1), or one job added/removed);
  (alpha, epsilon)-ER-EE privacy (dptrain.release.employer.mechanisms).

An epsilon-DP add/remove mechanism is 2 epsilon-DP under replace-one (a replacement is one
removal and one addition: group privacy over two steps, with delta (1 + e^epsilon) delta). The
converse is NOT a theorem: a replace-one mechanism may have no add/remove guarantee at all (it
may publish N). To put methods side by side at one add/remove budget E, add/remove methods run
at E and replace-one methods at :func:`comparison_epsilon` (2E): every method is then 2E-DP under
replace-one. That is a comparison convention, and outputs that use it say so.
"""

from __future__ import annotations

import math
from enum import StrEnum

from dptrain.core.errors import DPTrainError


class Neighbours(StrEnum):
    ADD_REMOVE = "add_remove"
    ADD = "add"
    REPLACE_ONE = "replace_one"
    ER_EE = "er_ee"

    @classmethod
    def parse(cls, value: str | Neighbours, *, setting: str = "neighbours") -> Neighbours:
        try:
            return cls(value)
        except ValueError:
            raise DPTrainError(f"{setting}={value!r} is not allowed: must be one of "
                               f"{', '.join(n.value for n in cls)}") from None


def replace_one_from_add_remove(epsilon: float, delta: float = 0.0) -> tuple[float, float]:
    """(epsilon', delta') under replace-one of an (epsilon, delta)-DP add/remove mechanism: a
    theorem (group privacy over one removal and one addition)."""
    return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta


def comparison_epsilon(epsilon: float, neighbours: Neighbours | str) -> float:
    """The epsilon at which a method under ``neighbours`` runs when methods are compared at one
    add/remove budget ``epsilon``: epsilon for add/remove (and add), 2 epsilon for replace-one
    (the comparison convention of the module docstring, not a guarantee)."""
    return 2.0 * epsilon if Neighbours(neighbours) is Neighbours.REPLACE_ONE else float(epsilon)


def add_remove_footing(epsilon: float, neighbours: Neighbours | str) -> float:
    """The add/remove-footing number of an epsilon under ``neighbours`` (epsilon / 2 for
    replace-one): the comparison convention, NOT an add/remove guarantee."""
    return epsilon / 2.0 if Neighbours(neighbours) is Neighbours.REPLACE_ONE else float(epsilon)
