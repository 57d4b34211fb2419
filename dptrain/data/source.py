"""Where a run's rows come from, as one typed value.

:class:`DataSource` is the data section of a run's settings read once
(:func:`dptrain.data.data_source`): the source (``adult``, ``table``, ``synthetic``), its checked
public :class:`~dptrain.data.schema.Schema`, and how to read it (the path, its format and
separator, the encoded-rows cache, the sharding of a distributed read, the synthetic generator's
size, the unit of privacy). Everything in it is public: settings, never rows. The loaders
(:func:`dptrain.data.load_dataset`, :mod:`dptrain.data.shards`) read this value, never the settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from dptrain.data.schema import Schema

__all__ = ["DataSource"]


@dataclass(frozen=True)
class DataSource:
    """One run's data source (module docstring). ``path``, ``format``, ``delimiter``, ``cache``
    and ``sharding`` concern ``table`` only; ``n_rows`` and ``n_features`` ``synthetic`` only."""

    name: str
    schema: Schema
    path: str | None = None
    format: str = "auto"
    delimiter: str = ","
    cache: str | None = None
    sharding: str = "auto"
    n_rows: int | None = None
    n_features: int | None = None
    n_units: int | None = None  # panel only: persons generated
    max_rows: int | None = None  # panel only: the most rows of one person
    #: data.privacy_unit: the column whose value is the unit of privacy; None: one row is the unit
    privacy_unit: str | None = None
