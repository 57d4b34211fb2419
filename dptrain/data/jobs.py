"""A public, seeded simulator of jobs and establishments (the employer-employee data of issue 34).

:func:`simulate_jobs` draws ``establishments`` employers, each with a public place, a two-digit
NAICS sector (the 20 sectors, with roughly the national shares of establishments), an ownership
(private / federal / state / local government, depending on the sector) and a right-skewed size:
a lognormal-shaped body on 1 .. ``tail_min - 1`` workers and, with a sector- and
ownership-dependent probability, a truncated Pareto tail from ``tail_min`` to ``max_size``
workers, so that about 70% of establishments have 1-9 workers, the mean is about 21 and the
largest employ thousands. Then one row per job (``size`` rows per establishment, built with
``np.repeat``) with an age group, sex and race/ethnicity drawn with a mild dependence on the
sector. Everything comes from ``numpy.random.default_rng([seed, 34])``: deterministic given the
seed. The defaults are state-sized (25,000 establishments, about half a million jobs);
``establishments=NATIONAL_ESTABLISHMENTS`` gives the national scale of the example (527,000
establishments, about 11 million jobs). Nothing here is anyone's data: every label is public.

All columns are compact integer codes (int32 / int8 numpy arrays, read-only) into the public
label tuples of :class:`Jobs`; :meth:`Jobs.cell_totals` gives per cell the total jobs ``n``, the
number of establishments and the largest establishment ``x_max`` (what ER-EE mechanisms need), and
:meth:`Jobs.worker_counts` the counts of jobs by establishment and worker attributes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

NATIONAL_ESTABLISHMENTS = 527_000

# (NAICS code, public label, share of establishments in %, size factor: a multiplier of the tail
# probability, female share, share 29 or younger, share 55+, share Hispanic, Black, Asian).
_SECTORS = (
    ("11", "Agriculture, Forestry, Fishing and Hunting", 1.3, 0.6, .26, .22, .30, .40, .03, .02),
    ("21", "Mining, Quarrying, and Oil and Gas Extraction", 0.3, 1.3, .15, .20, .22, .22, .05, .03),
    ("22", "Utilities", 0.2, 1.6, .24, .14, .28, .14, .10, .05),
    ("23", "Construction", 9.5, 0.7, .11, .24, .22, .32, .06, .02),
    ("31-33", "Manufacturing", 3.5, 1.9, .30, .20, .25, .20, .10, .07),
    ("42", "Wholesale Trade", 5.5, 1.0, .30, .20, .25, .20, .09, .06),
    ("44-45", "Retail Trade", 10.5, 1.0, .49, .36, .20, .18, .12, .06),
    ("48-49", "Transportation and Warehousing", 3.5, 1.2, .25, .22, .25, .20, .19, .05),
    ("51", "Information", 2.0, 1.1, .40, .22, .20, .11, .10, .10),
    ("52", "Finance and Insurance", 6.0, 0.8, .57, .18, .23, .12, .11, .07),
    ("53", "Real Estate and Rental and Leasing", 5.0, 0.5, .46, .18, .33, .15, .08, .05),
    ("54", "Professional, Scientific, and Technical Services", 13.0, 0.6, .44, .22, .22, .10, .07, .11),
    ("55", "Management of Companies and Enterprises", 0.7, 2.5, .50, .17, .22, .12, .09, .07),
    ("56", "Administrative and Support and Waste Management and Remediation Services", 6.0, 1.2, .40, .27, .21,
     .26, .15, .04),
    ("61", "Educational Services", 1.8, 2.0, .69, .18, .27, .14, .11, .05),
    ("62", "Health Care and Social Assistance", 13.0, 1.2, .77, .22, .23, .16, .16, .07),
    ("71", "Arts, Entertainment, and Recreation", 1.8, 1.0, .46, .38, .21, .16, .10, .05),
    ("72", "Accommodation and Food Services", 8.5, 1.4, .53, .50, .10, .27, .12, .08),
    ("81", "Other Services (except Public Administration)", 7.5, 0.5, .52, .22, .27, .18, .10, .06),
    ("92", "Public Administration", 1.0, 2.0, .45, .15, .28, .13, .15, .04),
)
SECTOR_CODES = tuple(s[0] for s in _SECTORS)
SECTOR_LABELS = tuple(s[1] for s in _SECTORS)
OWNERSHIP_LABELS = ("Private", "Federal government", "State government", "Local government")
AGE_LABELS = ("29 or younger", "30 to 54", "55 or older")
SEX_LABELS = ("Male", "Female")
RACE_LABELS = (
    "White alone, not Hispanic or Latino",
    "Black or African American alone, not Hispanic or Latino",
    "Asian alone, not Hispanic or Latino",
    "Other race or two or more races, not Hispanic or Latino",
    "Hispanic or Latino",
)
_OTHER_RACE_SHARE = 0.035
# P(ownership | sector): private / federal / state / local; the default row and the exceptions.
_OWNERSHIP_DEFAULT = (0.975, 0.004, 0.007, 0.014)
_OWNERSHIP_BY_SECTOR = {
    "22": (0.80, 0.01, 0.01, 0.18),
    "48-49": (0.93, 0.04, 0.01, 0.02),
    "61": (0.55, 0.01, 0.09, 0.35),
    "62": (0.93, 0.01, 0.02, 0.04),
    "71": (0.94, 0.01, 0.01, 0.04),
    "92": (0.0, 0.25, 0.25, 0.50),
}
_OWNERSHIP_SIZE_FACTOR = (1.0, 2.5, 2.5, 2.0)  # government establishments are larger

ESTABLISHMENT_DIMS = ("place", "sector", "ownership")
#: the lower edges of the coarse size classes (1-4, 5-9, ..., 500-999, 1000 and up to the simulator's
#: public largest size). A class is computed from the size, so it is as private as the size: no
#: release uses it (a cell's largest class, e.g., would name itself through an interval's width)
SIZE_CLASS_EDGES = (1, 5, 10, 20, 50, 100, 250, 500, 1000)
WORKER_DIMS = ("age", "sex", "race")


@dataclass(frozen=True)
class JobsConfig:
    """Shape of the simulated economy. Places get Zipf weights ``rank ** -place_skew``; an
    establishment's size is from the body (a discretised lognormal with ``body_mu``,
    ``body_sigma`` on 1 .. tail_min - 1) or, with probability ``tail_share`` times its sector and
    ownership factors (normalised to average 1), from a Pareto tail of index ``tail_index``
    truncated to [tail_min, max_size]."""

    place_skew: float = 1.0  # the Zipf exponent
    body_mu: float = 0.9  # of log workers
    body_sigma: float = 0.95  # of log workers
    tail_share: float = 0.165  # a probability, at average sector and ownership factors
    tail_min: int = 20  # workers
    tail_index: float = 1.12  # Pareto index (a heavy tail: the mean is finite, the variance not)
    max_size: int = 30_000  # workers: the public largest establishment


def _mixed_radix_key(codes: list[np.ndarray], dims: tuple[int, ...]) -> np.ndarray:
    """The int64 cell index of each row (row-major over ``dims``, as ``np.ravel_multi_index``),
    built in place one dimension at a time so that only one int64 array of rows is held."""
    key = codes[0].astype(np.int64)
    for c, d in zip(codes[1:], dims[1:]):
        key *= d
        key += c
    return key


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Jobs:
    """Establishments (index = establishment id) and their jobs (one row per job), as integer
    codes into the public label tuples."""

    place: np.ndarray  # int32, establishment -> place code
    sector: np.ndarray  # int8, establishment -> sector code (SECTOR_LABELS)
    ownership: np.ndarray  # int8, establishment -> ownership code (OWNERSHIP_LABELS)
    size: np.ndarray  # int32, establishment -> number of jobs (>= 1)
    establishment: np.ndarray  # int32, job -> establishment id
    age: np.ndarray  # int8, job -> AGE_LABELS
    sex: np.ndarray  # int8, job -> SEX_LABELS
    race: np.ndarray  # int8, job -> RACE_LABELS
    place_labels: tuple[str, ...]
    seed: int = 0
    config: JobsConfig = field(default_factory=JobsConfig)

    @property
    def n_establishments(self) -> int:
        return int(self.size.shape[0])

    @property
    def n_jobs(self) -> int:
        return int(self.establishment.shape[0])

    @property
    def establishment_id(self) -> np.ndarray:
        return np.arange(self.n_establishments, dtype=np.int32)

    @property
    def size_class(self) -> np.ndarray:
        """int8, establishment -> its size class (an index into SIZE_CLASS_EDGES; PRIVATE, as the size)."""
        return (np.searchsorted(SIZE_CLASS_EDGES, self.size, side="right") - 1).astype(np.int8)

    def class_upper(self, size_class) -> np.ndarray:
        """The largest size in each public class (the last class ends at ``config.max_size``)."""
        uppers = np.array([e - 1 for e in SIZE_CLASS_EDGES[1:]] + [self.config.max_size], dtype=np.int64)
        return uppers[np.asarray(size_class, dtype=np.int64)]

    def labels(self, dim: str) -> tuple[str, ...]:
        """The public labels of one dimension (place, sector, ownership, age, sex, race)."""
        table = {"place": self.place_labels, "sector": SECTOR_LABELS, "ownership": OWNERSHIP_LABELS,
                 "age": AGE_LABELS, "sex": SEX_LABELS, "race": RACE_LABELS}
        if dim not in table:
            raise ValueError(f"unknown dimension {dim!r}; known: {sorted(table)}")
        return table[dim]

    def _codes(self, dim: str) -> np.ndarray:
        """Codes of ``dim`` per job (establishment attributes are gathered onto the jobs)."""
        if dim in ESTABLISHMENT_DIMS:
            return getattr(self, dim)[self.establishment]
        self.labels(dim)
        return getattr(self, dim)

    def _frame(self, by: tuple[str, ...], codes: list[np.ndarray]) -> pd.DataFrame:
        return pd.DataFrame({d: pd.Categorical.from_codes(c, categories=list(self.labels(d)))
                             for d, c in zip(by, codes)})

    def cell_totals(self, by: tuple[str, ...] = ESTABLISHMENT_DIMS) -> pd.DataFrame:
        """Per non-empty cell of the cross product of establishment attributes ``by``: the cell
        key (categorical columns named as ``by``), ``n`` (total jobs), ``establishments`` and
        ``x_max`` (the largest establishment's size, PRIVATE), sorted by the key."""
        by = tuple(by)
        bad = [d for d in by if d not in ESTABLISHMENT_DIMS]
        if bad or not by:
            raise ValueError(f"cell_totals groups by establishment attributes {ESTABLISHMENT_DIMS}, got {by}")
        dims = tuple(len(self.labels(d)) for d in by)
        key = _mixed_radix_key([getattr(self, d) for d in by], dims)
        cells, inverse = np.unique(key, return_inverse=True)
        n = np.bincount(inverse, weights=self.size, minlength=cells.size).astype(np.int64)
        count = np.bincount(inverse, minlength=cells.size).astype(np.int64)
        x_max = np.zeros(cells.size, dtype=np.int64)
        np.maximum.at(x_max, inverse, self.size)
        out = self._frame(by, list(np.unravel_index(cells, dims)))
        out["n"], out["establishments"], out["x_max"] = n, count, x_max
        return out

    def worker_counts(self, by: tuple[str, ...] = ("sector", "sex"), *, complete: bool = False) -> pd.DataFrame:
        """Jobs per cell of the cross product of ``by`` (establishment and/or worker attributes):
        categorical key columns and ``count``; only the non-empty cells unless ``complete``
        (then every cell of the cross product, zeros included), sorted by the key."""
        by = tuple(by)
        if not by or len(set(by)) != len(by):
            raise ValueError(f"worker_counts needs distinct dimensions, got {by}")
        dims = tuple(len(self.labels(d)) for d in by)
        key = _mixed_radix_key([self._codes(d) for d in by], dims)
        if complete:
            counts = np.bincount(key, minlength=math.prod(dims))
            cells = np.arange(counts.size)
        else:
            cells, counts = np.unique(key, return_counts=True)
        out = self._frame(by, list(np.unravel_index(cells, dims)))
        out["count"] = counts.astype(np.int64)
        return out

    def establishments(self) -> pd.DataFrame:
        """The establishment table (id, categorical place / sector / ownership, size)."""
        out = self._frame(ESTABLISHMENT_DIMS, [self.place, self.sector, self.ownership])
        out.insert(0, "establishment_id", self.establishment_id)
        out["size"] = self.size
        return out

    def workers(self) -> pd.DataFrame:
        """The job table (establishment id, categorical age / sex / race); 1 row per job."""
        out = self._frame(WORKER_DIMS, [self.age, self.sex, self.race])
        out.insert(0, "establishment_id", self.establishment)
        return out


def _categorical(rng: np.random.Generator, group: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """One int8 draw per entry of ``group`` from the categorical distribution ``probs[group]``
    (rows of ``probs`` sum to 1), by inverse CDF one threshold at a time (no n x K temporary)."""
    cum = np.cumsum(probs, axis=1)
    u = rng.random(group.shape[0], dtype=np.float32)
    out = np.zeros(group.shape[0], dtype=np.int8)
    for k in range(probs.shape[1] - 1):
        out += u >= cum[:, k].astype(np.float32)[group]
    return out


def _ownership_probs() -> np.ndarray:
    return np.array([_OWNERSHIP_BY_SECTOR.get(code, _OWNERSHIP_DEFAULT) for code in SECTOR_CODES])


def _tail_probability(sector: np.ndarray, ownership: np.ndarray, cfg: JobsConfig) -> np.ndarray:
    """Per establishment, the probability of a size from the tail: ``tail_share`` times its
    sector and ownership factors, normalised so that the expected factor is 1."""
    shares = np.array([s[2] for s in _SECTORS]) / sum(s[2] for s in _SECTORS)
    f_sector = np.array([s[3] for s in _SECTORS])
    f_own = np.array(_OWNERSHIP_SIZE_FACTOR)
    expected = float(np.sum(shares * f_sector * (_ownership_probs() @ f_own)))
    return np.minimum(cfg.tail_share * f_sector[sector] * f_own[ownership] / expected, 0.95)


def _sizes(rng: np.random.Generator, sector: np.ndarray, ownership: np.ndarray, cfg: JobsConfig) -> np.ndarray:
    """Right-skewed establishment sizes: a discretised lognormal body on 1 .. tail_min - 1 and a
    truncated Pareto tail on tail_min .. max_size (inverse CDF of the truncated law)."""
    n = sector.shape[0]
    k = np.arange(1, cfg.tail_min)
    body_pmf = np.exp(-((np.log(k) - cfg.body_mu) ** 2) / (2 * cfg.body_sigma**2)) / k
    body = rng.choice(k, size=n, p=body_pmf / body_pmf.sum())
    lo, hi, a = float(cfg.tail_min), float(cfg.max_size), cfg.tail_index
    u = rng.random(n)
    tail = np.floor(lo * (1.0 - u * (1.0 - (lo / (hi + 1.0)) ** a)) ** (-1.0 / a))
    in_tail = rng.random(n) < _tail_probability(sector, ownership, cfg)
    return np.where(in_tail, np.minimum(tail, hi), body).astype(np.int32)


def _worker_probs() -> dict[str, np.ndarray]:
    """Per sector (rows), the categorical distributions of age, sex and race/ethnicity."""
    s = np.array([row[4:] for row in _SECTORS])
    female, young, old, hispanic, black, asian = s.T
    other = np.full_like(female, _OTHER_RACE_SHARE)
    return {
        "age": np.stack([young, 1.0 - young - old, old], axis=1),
        "sex": np.stack([1.0 - female, female], axis=1),
        "race": np.stack([1.0 - hispanic - black - asian - other, black, asian, other, hispanic], axis=1),
    }


def simulate_jobs(seed: int = 0, *, establishments: int = 25_000, places: int = 200,
                  config: JobsConfig | None = None) -> Jobs:
    """A seeded simulated economy of ``establishments`` employers in ``places`` places (about 21
    jobs per establishment on average); same arguments -> same :class:`Jobs`. The defaults are
    state-sized; ``establishments=NATIONAL_ESTABLISHMENTS`` gives about 11 million jobs."""
    if establishments < 1 or places < 1:
        raise ValueError("simulate_jobs needs establishments >= 1 and places >= 1")
    cfg = config or JobsConfig()
    if not (1 < cfg.tail_min <= cfg.max_size and cfg.tail_index > 0 and 0 <= cfg.tail_share <= 1):
        raise ValueError(f"invalid JobsConfig {cfg}")
    rng = np.random.default_rng([int(seed), 34])
    place_w = np.arange(1, places + 1, dtype=float) ** -cfg.place_skew
    place = rng.choice(places, size=establishments, p=place_w / place_w.sum()).astype(np.int32)
    shares = np.array([s[2] for s in _SECTORS])
    sector = rng.choice(len(_SECTORS), size=establishments, p=shares / shares.sum()).astype(np.int8)
    ownership = _categorical(rng, sector, _ownership_probs())
    size = _sizes(rng, sector, ownership, cfg)
    establishment = np.repeat(np.arange(establishments, dtype=np.int32), size)
    job_sector = np.repeat(sector, size)
    probs = _worker_probs()
    attrs = {name: _categorical(rng, job_sector, probs[name]) for name in WORKER_DIMS}
    del job_sector
    width = len(str(places - 1))
    return Jobs(place=_read_only(place), sector=_read_only(sector), ownership=_read_only(ownership),
                size=_read_only(size), establishment=_read_only(establishment),
                age=_read_only(attrs["age"]), sex=_read_only(attrs["sex"]), race=_read_only(attrs["race"]),
                place_labels=tuple(f"place-{i:0{width}d}" for i in range(places)), seed=int(seed), config=cfg)
