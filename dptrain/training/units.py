"""The training rows of person-level DP-SGD (``data.privacy_unit``): at most k rows per unit, a
uniform choice drawn ONCE before training from the run's SECRET randomness (stream "unit-cap"),
the kept rows ordered by unit, and the sampler of units (:mod:`dptrain.privacy.dpsgd.units`).

How many rows the cap dropped and how many rows each unit has are PRIVATE: they go to the run's
private diagnostics (``private/data_diagnostics.json``, key ``units``), never to the log, the
report or an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dptrain.data import Dataset
from dptrain.data.units import cap_rows_per_unit, unit_of_rows
from dptrain.privacy.dpsgd.units import UnitBound, UnitPoissonSampler, rows_by_unit
from dptrain.privacy.randomness import Randomness

__all__ = ["unit_rows", "UNIT_CAP_STREAM"]

#: the secret stream of the choice of k rows per unit
UNIT_CAP_STREAM = "unit-cap"

#: rows-per-unit histogram bins of the private diagnostics (the last bin: this many or more)
HISTOGRAM_TOP = 50


def unit_rows(data: Dataset, unit: UnitBound, *, sample_rate: float, randomness: Randomness, rank: int = 0,
              world: int = 1) -> tuple[torch.Tensor, torch.Tensor, UnitPoissonSampler]:
    """(x, y, sampler): the training rows kept by the cap (at most ``unit.max_rows`` per unit),
    grouped by unit, and the Poisson sampler of units at ``sample_rate`` (its stream the secret
    "poisson-sampler" stream ``rank``). Records the private counts in ``data.diagnostics["units"]``.
    Across ``world`` processes (every process holds every row) process ``rank`` takes the units
    whose code is ``rank`` mod ``world``: all of a unit's rows in one process; the cap is drawn
    over all rows first, so each unit keeps the rows a single process would keep."""
    if data.unit_train is None:
        raise ValueError(f"data.privacy_unit={unit.column!r}: the loaded rows carry no units")
    codes = data.unit_train.numpy()
    kept = cap_rows_per_unit(codes, unit.max_rows, randomness.numpy(UNIT_CAP_STREAM))
    data.diagnostics["units"] = _private_counts(codes, kept, unit)
    if world > 1:
        kept = kept[codes[kept] % world == rank]
    order, starts, counts = rows_by_unit(unit_of_rows(codes[kept])[0])
    rows = torch.from_numpy(kept[order])
    sampler = UnitPoissonSampler(starts=starts, counts=counts, sample_rate=sample_rate,
                                 rng=randomness.numpy("poisson-sampler", rank), combine=unit.combine)
    return data.x_train.index_select(0, rows), data.y_train.index_select(0, rows), sampler


def _private_counts(codes: np.ndarray, kept: np.ndarray, unit: UnitBound) -> dict[str, Any]:
    """The PRIVATE facts of the cap: units, training rows, rows dropped, rows per unit (histogram)."""
    per_unit = np.bincount(codes)
    hist = np.bincount(np.minimum(per_unit, HISTOGRAM_TOP))
    return {"column": unit.column, "max_rows_per_unit": unit.max_rows, "units": int(per_unit.size),
            "training_rows": int(codes.size), "rows_kept": int(kept.size),
            "rows_dropped_by_cap": int(codes.size - kept.size),
            "units_over_cap": int((per_unit > unit.max_rows).sum()),
            "rows_per_unit_histogram": {(f"{i}+" if i == HISTOGRAM_TOP else str(i)): int(c)
                                        for i, c in enumerate(hist) if c}}
