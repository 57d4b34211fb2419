"""What a small-cell release run asks of the release library, as one typed value.

:class:`ReleaseSpec` holds the settings the release methods (:mod:`dptrain.release.methods`),
release.json (:mod:`dptrain.release.report`) and the private evaluation read: the chosen
method and its own settings, the statistic, the budget per statistic, the neighbour relation and
noise of MOS, the DP-MOS split, the suppression thresholds... It is frozen (a method cannot change
the run's settings under another) and holds plain values (tuples, read-only mappings), so the
library runs without the command line's dataclasses: the command line builds it once from its
checked ``release.*`` section (:func:`dptrain.settings.release.release_spec`), a Python caller
builds it directly. The cells, the domain and the data source are not in it: the runner turns
them into the estimates (:func:`dptrain.release.api.estimates_for_listed`) before any method runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReleaseSpec:
    """The settings of one small-cell release that its methods, its report and its evaluation
    read (docs/release.md names each ``release.*`` setting). ``epsilon_per_statistic`` is the
    epsilon of each released statistic (``release.epsilon_per_statistic``);
    ``method_settings`` are the chosen method's own (``ReleaseMethod.settings``), empty for its
    defaults."""

    method: str
    method_settings: Mapping[str, Any]
    statistic: str
    epsilon_per_statistic: float
    delta: float
    neighbors: str
    noise: str
    min_n: int
    chi_by: tuple[str, ...]
    dp_mos_split: Mapping[str, float]
    dp_mos_chi_quantile: float
    suppression_k: tuple[int, ...]
    rate_outcome: bool
    theil_sen_variant: str
    theil_sen_k: int
    tail_epsilons: tuple[float, ...]
    y: str
