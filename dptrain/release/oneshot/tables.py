"""The table mechanisms of task=tabulate (the laws, the budget split and the post-processing:
:mod:`dptrain.release.tables.marginals`). Adding or removing one row moves each marginal's count
vector by one in one cell (L1 and L2 sensitivity 1; a unit of at most k rows, ``data.privacy_unit``:
k and k, :mod:`dptrain.release.units`, the noise scaled by it), and every cell of the declared
domain is measured:

* ``gaussian`` (``privacy.mechanism``, the default): the discrete Gaussian; marginal k at
  rho_k = share_k rho, rho = :func:`~dptrain.release.zcdp.gaussian_rho` (epsilon, delta); the
  release is (sum rho_k)-zCDP, its (epsilon, delta) the RDP accountant's conversion;
* ``laplace``: the discrete Laplace; marginal k at epsilon_k = share_k epsilon; pure epsilon-DP
  (delta 0) by basic composition;
* ``stability_histogram`` (``tabulate.sparse``, its own family): for a domain too large to list,
  each observed cell's count plus the discrete Laplace, listed only above a threshold.

Both laws from OpenDP's exact samplers (:mod:`dptrain.privacy.samplers`). With ``split=cells``
marginal k's share is proportional to c_k^exponent (c_k cells; 1/2 for the Gaussian, 1/3 for the
Laplace: the least total squared error), with ``equal`` the same for all.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.core.neighbours import Neighbours
from dptrain.privacy.accounting import RDP
from dptrain.privacy.events import Event, epsilon_delta_event, zcdp_event
from dptrain.privacy.samplers import discrete_gaussian, discrete_laplace
from dptrain.release.oneshot.base import ONE_SHOT, Guarantee, OneShotMechanism, composed, family_base, mechanism_for
from dptrain.release.tables.marginals import stability_histogram
from dptrain.release.zcdp import gaussian_rho

__all__ = ["SPLITS", "SparseTableMechanism", "TableMechanism", "TableSettings", "budget_weights", "measure",
           "noise_variance"]

SPLITS = ("cells", "equal")


@dataclass(frozen=True)
class TableSettings:
    """What the table mechanisms read (task=tabulate: ``tabulate.split``, cells | equal)."""

    split: str


@family_base
class TableMechanism(OneShotMechanism):
    """A mechanism measuring every cell of each marginal. ``budget`` is the release's budget in its
    own unit (epsilon, or rho); marginal k gets ``share`` of it. :meth:`event` takes the marginals'
    :meth:`spent` rows."""

    family = "tables"
    settings = TableSettings
    neighbours = Neighbours.ADD_REMOVE
    #: split=cells: marginal k's share is proportional to (its number of cells) ** exponent
    exponent: ClassVar[float] = 1.0

    @abstractmethod
    def budget(self, *, epsilon: float, delta: float) -> float:
        """The whole release's budget in this mechanism's unit, for (epsilon, delta)."""

    @abstractmethod
    def measure(self, table: np.ndarray, share: float, budget: float, *, sensitivity: float = 1.0) -> np.ndarray:
        """``table`` (exact counts) plus this marginal's noise (``share`` of ``budget``), for a
        count vector of L1 and L2 ``sensitivity`` (1: one row; k: a unit of at most k rows,
        :func:`dptrain.release.units.table_sensitivity`)."""

    @abstractmethod
    def variance(self, share: float, budget: float, *, sensitivity: float = 1.0) -> float:
        """One raw cell's noise variance (the continuous law's: the consistency step's weights)."""

    @abstractmethod
    def spent(self, share: float, budget: float, *, sensitivity: float = 1.0) -> dict[str, float]:
        """What one marginal spends, as its row of the report."""

    def shares(self, cells: Sequence[int], settings: TableSettings) -> np.ndarray:
        """Each marginal's share of the budget (module docstring); they sum to 1."""
        c = np.asarray(cells, dtype=np.float64)
        if settings.split == "equal":
            w = np.ones_like(c)
        elif settings.split == "cells":
            w = c ** self.exponent
        else:
            raise DPTrainError(f"tabulate.split={settings.split!r} is not allowed: cells | equal")
        return w / w.sum()


class GaussianTables(TableMechanism):
    """The discrete Gaussian on each marginal; (rho summed)-zCDP."""

    exponent = 0.5

    def budget(self, *, epsilon: float, delta: float) -> float:
        return float(gaussian_rho(epsilon, delta))

    def measure(self, table: np.ndarray, share: float, budget: float, *, sensitivity: float = 1.0) -> np.ndarray:
        return discrete_gaussian(table, sensitivity * math.sqrt(1.0 / (2.0 * share * budget)))

    def variance(self, share: float, budget: float, *, sensitivity: float = 1.0) -> float:
        return sensitivity**2 / (2.0 * share * budget)

    def spent(self, share: float, budget: float, *, sensitivity: float = 1.0) -> dict[str, float]:
        # rho = Delta_2^2 / (2 sigma^2) = share * budget whatever Delta_2: sigma scales with it
        return {"rho": float(share * budget), "sigma": float(sensitivity * (2.0 * share * budget) ** -0.5)}

    def event(self, spent: Sequence[dict[str, float]]) -> Event:
        return zcdp_event(float(sum(row["rho"] for row in spent)))

    def guarantee(self, event: Event, *, delta: float, settings: object = None) -> Guarantee:
        epsilon, delta, rho = composed([event], delta=delta)
        return Guarantee(epsilon, delta, self.neighbours, f"{RDP.name} (zCDP)", rho,
                         statement=f"({epsilon:.4g}, {delta:.3g})-DP: the discrete Gaussian on each marginal, "
                                   f"{rho:.6g}-zCDP in all (rho summed), converted by the RDP accountant")


class LaplaceTables(TableMechanism):
    """The discrete Laplace on each marginal; (epsilons summed, 0)-DP."""

    exponent = 1.0 / 3.0
    uses_delta = False

    def budget(self, *, epsilon: float, delta: float) -> float:
        return float(epsilon)

    def measure(self, table: np.ndarray, share: float, budget: float, *, sensitivity: float = 1.0) -> np.ndarray:
        return discrete_laplace(table, sensitivity / (share * budget))

    def variance(self, share: float, budget: float, *, sensitivity: float = 1.0) -> float:
        return 2.0 * (sensitivity / (share * budget)) ** 2

    def spent(self, share: float, budget: float, *, sensitivity: float = 1.0) -> dict[str, float]:
        # epsilon = Delta_1 / scale = share * budget whatever Delta_1: the scale grows with it
        return {"epsilon": float(share * budget), "scale": float(sensitivity / (share * budget))}

    def event(self, spent: Sequence[dict[str, float]]) -> Event:
        return epsilon_delta_event(float(sum(row["epsilon"] for row in spent)))

    def guarantee(self, event: Event, *, delta: float, settings: object = None) -> Guarantee:
        epsilon, delta, _ = composed([event], delta=delta)
        return Guarantee(epsilon, delta, self.neighbours, "pure (basic composition)",
                         statement=f"({epsilon:.4g}, 0)-DP: the discrete Laplace on each marginal, epsilons summed "
                                   "(basic composition)")


@family_base
class SparseTableMechanism(OneShotMechanism):
    """A mechanism listing only some observed cells of a marginal (a domain too large to list).
    :meth:`event` takes the (epsilon, delta) the release spends."""

    family = "sparse_tables"

    @abstractmethod
    def release(self, cell_ids: np.ndarray, *, epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """(the listed cells' ids, their noisy counts) from the rows' cell ids."""


class StabilityHistogram(SparseTableMechanism):
    """The stability-based histogram (:func:`dptrain.release.tables.marginals.stability_histogram`):
    (epsilon, delta)-DP under add/remove."""

    def release(self, cell_ids: np.ndarray, *, epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
        return stability_histogram(cell_ids, epsilon=epsilon, delta=delta)

    def event(self, spent: tuple[float, float]) -> Event:
        return epsilon_delta_event(*spent)


ONE_SHOT.register("gaussian", GaussianTables())
ONE_SHOT.register("laplace", LaplaceTables())
ONE_SHOT.register("stability_histogram", StabilityHistogram())


def _tables(name: str) -> TableMechanism:  # a member of the family is an instance of its base
    return mechanism_for("privacy.mechanism", name, "tables")


def budget_weights(cells: Sequence[int], *, mechanism: str, split: str) -> np.ndarray:
    """The shares of the table mechanism named ``mechanism`` (:meth:`TableMechanism.shares`)."""
    return _tables(mechanism).shares(cells, TableSettings(split=split))


def measure(counts: list[np.ndarray], shares: np.ndarray, *, mechanism: str, budget: float) -> list[np.ndarray]:
    """Each exact count table plus the noise of the table mechanism named ``mechanism``: ``budget``
    in its unit (epsilon for laplace, rho for gaussian), marginal k at ``shares[k]`` of it."""
    m = _tables(mechanism)
    return [m.measure(table, share, budget) for table, share in zip(counts, shares)]


def noise_variance(share: float, *, mechanism: str, budget: float) -> float:
    """One raw cell's noise variance under the table mechanism named ``mechanism``."""
    return _tables(mechanism).variance(share, budget)
