"""A public, seeded geography for the Census-style TopDown release (issue 33): nation -> states ->
counties -> tracts, each tract's people counted in the cells of a few person attributes.

Everything is drawn from ``numpy.random.default_rng([seed, 33])``: the same seed gives the same
tree and the same counts, so the seed is public and so is every count; the simulator stands in
for the confidential tables that a statistical agency would release with
:mod:`dptrain.release.tables.topdown`.

The design (defaults of :func:`simulate_geography`):

* 4 states; 300 counties spread over them (each state at least one, the rest by a Dirichlet
  share); 1 to 6 tracts per county (uniform).
* Right-skewed county populations: 20 people plus a lognormal(0, 2) draw, the draws scaled so the
  nation holds about 4 million people: counties run from a few dozen people to several hundred
  thousand, the median near 2,000.
* Person attributes: sex (2) x age group (4: 0-17, 18-44, 45-64, 65+) x relationship to the
  householder (3: householder, spouse, other) = 24 cells. A national profile of the cells is
  drawn once (a product of per-attribute Dirichlet marginals); each county's profile is a
  Dirichlet draw around it and each tract's a Dirichlet draw around its county's, so places
  differ in their mix.
* STRUCTURAL ZEROS: declared impossible combinations, always 0 in the data and known to be 0 to
  everyone. The default declares that nobody aged 0-17 is a householder or a spouse (4 of the 24
  cells). A pattern is one index per attribute, ``None`` for "any level".
* A county's people are split over its tracts by a multinomial draw with Dirichlet(2) shares,
  then each tract's people over the cells by its own profile: tract counts are exact integers
  and every coarser level is their sum.

Cells are numbered in C order over the attributes (``numpy.ravel_multi_index``).

Public API::

    Hierarchy, Geography, simulate_geography(seed=0, *, states, counties, tracts_per_county,
    attributes, population, structural_zeros), structural_zero_mask(attributes, patterns),
    LEVELS, ATTRIBUTE_NAMES, ATTRIBUTE_LEVELS, DEFAULT_STRUCTURAL_ZEROS
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = [
    "ATTRIBUTE_LEVELS",
    "ATTRIBUTE_NAMES",
    "DEFAULT_STRUCTURAL_ZEROS",
    "LEVELS",
    "Geography",
    "Hierarchy",
    "simulate_geography",
    "structural_zero_mask",
]

LEVELS = ("nation", "state", "county", "tract")
ATTRIBUTE_NAMES = ("sex", "age", "relationship")
ATTRIBUTE_LEVELS = (("female", "male"), ("0-17", "18-44", "45-64", "65+"), ("householder", "spouse", "other"))
#: nobody aged 0-17 is a householder or a spouse (any sex)
DEFAULT_STRUCTURAL_ZEROS: tuple[tuple[int | None, ...], ...] = ((None, 0, 0), (None, 0, 1))

_COUNTY_SIGMA = 2.0  # lognormal shape of the county sizes
_COUNTY_FLOOR = 20  # people in the smallest possible county
_COUNTY_MIX = 50.0  # Dirichlet concentration of a county's cell profile around the nation's
_TRACT_MIX = 100.0  # ... and of a tract's around its county's
_TRACT_SHARE = 2.0  # Dirichlet parameter of the tracts' shares of their county


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def structural_zero_mask(attributes: Sequence[int], patterns: Sequence[Sequence[int | None]]) -> np.ndarray:
    """Boolean mask over the cells (C order over ``attributes``): True where a cell matches one
    of ``patterns`` (one index per attribute, None for any level), i.e. is impossible."""
    shape = tuple(int(a) for a in attributes)
    mask = np.zeros(shape, dtype=bool)
    for pattern in patterns:
        if len(pattern) != len(shape):
            raise ValueError(f"structural zero pattern {tuple(pattern)!r} needs one entry per attribute {shape}")
        index = []
        for level, size in zip(pattern, shape):
            if level is not None and not (isinstance(level, (int, np.integer)) and 0 <= level < size):
                raise ValueError(f"structural zero pattern {tuple(pattern)!r}: levels must be None or in [0, size)")
            index.append(slice(None) if level is None else int(level))
        mask[tuple(index)] = True
    if mask.all():
        raise ValueError("the structural zeros cover every cell: nothing could be counted")
    return mask.reshape(-1)


def _roll_up(values: np.ndarray, parents: np.ndarray, n_parents: int) -> np.ndarray:
    out = np.zeros((n_parents,) + values.shape[1:], dtype=values.dtype)
    np.add.at(out, parents, values)
    return out


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """The PUBLIC part of a geography: the tree and the cells, no count.

    ``parents[l][u]`` is the index, at level ``l - 1``, of unit ``u`` of level ``l``
    (``parents[0]`` is ``[-1]``: the one nation). ``structural_zeros`` is a boolean mask over the
    ``prod(attributes)`` cells."""

    levels: tuple[str, ...]
    names: tuple[tuple[str, ...], ...]
    parents: tuple[np.ndarray, ...]
    attributes: tuple[int, ...]
    attribute_names: tuple[str, ...]
    structural_zeros: np.ndarray

    def __post_init__(self) -> None:
        if len(self.names) != len(self.levels) or len(self.parents) != len(self.levels) or len(self.names[0]) != 1:
            raise ValueError("a hierarchy needs names and parents for every level and exactly one top unit")
        for lv in range(1, len(self.levels)):
            par = self.parents[lv]
            if len(par) != len(self.names[lv]) or (len(par) and (par.min() < 0 or par.max() >= self.n_units(lv - 1))):
                raise ValueError(f"level {self.levels[lv]!r}: parents must index the units of the level above")
            if np.bincount(par, minlength=self.n_units(lv - 1)).min() < 1:
                raise ValueError(f"level {self.levels[lv - 1]!r}: every unit needs at least one child")
        if self.structural_zeros.shape != (self.n_cells,):
            raise ValueError("structural_zeros must be a mask over the cells")

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.attributes))

    def n_units(self, level: int) -> int:
        return len(self.names[level])

    def level(self, name: str) -> int:
        """The position of the level called ``name``."""
        if name not in self.levels:
            raise ValueError(f"level={name!r} is not one of {self.levels}")
        return self.levels.index(name)

    def roll_up(self, leaves: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per level (top first), the sums of ``leaves`` (one row per unit of the last level)
        over each unit's descendants; the last entry is ``leaves`` itself."""
        leaves = np.asarray(leaves)
        if leaves.shape[0] != self.n_units(len(self.levels) - 1):
            raise ValueError("roll_up needs one row per unit of the last level")
        out = [leaves]
        for lv in range(len(self.levels) - 1, 0, -1):
            out.append(_roll_up(out[-1], self.parents[lv], self.n_units(lv - 1)))
        return tuple(reversed(out))

    @cached_property
    def cell_labels(self) -> tuple[str, ...]:
        """One label per cell, e.g. ``sex=female|age=0-17|relationship=other``."""
        if self.attributes == tuple(len(v) for v in ATTRIBUTE_LEVELS) and self.attribute_names == ATTRIBUTE_NAMES:
            levels = ATTRIBUTE_LEVELS
        else:
            levels = tuple(tuple(str(i) for i in range(a)) for a in self.attributes)
        index = np.unravel_index(np.arange(self.n_cells), self.attributes)
        return tuple("|".join(f"{n}={levels[k][int(index[k][c])]}" for k, n in enumerate(self.attribute_names))
                     for c in range(self.n_cells))


@dataclass(frozen=True, eq=False)
class Geography:
    """A simulated geography: the public :class:`Hierarchy` and the exact counts.

    ``counts[l]`` is an int64 array (units of level ``l``, cells); the last level holds the
    simulated tracts, every other level their sums. Structural-zero cells are 0 everywhere."""

    hierarchy: Hierarchy
    counts: tuple[np.ndarray, ...]
    seed: int

    @property
    def levels(self) -> tuple[str, ...]:
        return self.hierarchy.levels

    @property
    def parents(self) -> tuple[np.ndarray, ...]:
        return self.hierarchy.parents

    @property
    def names(self) -> tuple[tuple[str, ...], ...]:
        return self.hierarchy.names

    @property
    def tract_counts(self) -> np.ndarray:
        return self.counts[-1]

    def population(self, level: int) -> np.ndarray:
        """Total people per unit of ``level``."""
        return self.counts[level].sum(axis=1)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_sizes(states: int, counties: int, tracts_per_county: Sequence[int], population: int) -> None:
    if not (_is_int(states) and states >= 1 and _is_int(counties) and counties >= states):
        raise ValueError(f"need integers 1 <= states <= counties, got states={states!r}, counties={counties!r}")
    lo, hi = tracts_per_county
    if not (_is_int(lo) and _is_int(hi) and 1 <= lo <= hi):
        raise ValueError(f"tracts_per_county must be integers (lo, hi) with 1 <= lo <= hi, got {tracts_per_county!r}")
    if not (_is_int(population) and population >= counties * _COUNTY_FLOOR):
        raise ValueError(f"population must be an integer >= {_COUNTY_FLOOR} per county, got {population!r}")


def _tree(rng: np.random.Generator, states: int, counties: int, tracts: Sequence[int]) -> tuple[list, list]:
    """(names per level, parents per level) of a random tree with these sizes."""
    per_state = rng.multinomial(counties - states, rng.dirichlet(np.full(states, 2.0))) + 1
    per_county = rng.integers(tracts[0], tracts[1] + 1, size=counties)
    state_names = [f"S{s + 1:02d}" for s in range(states)]
    county_of_state = np.repeat(np.arange(states), per_state)
    county_names = [f"{state_names[s]}-C{k + 1:03d}" for s, n in zip(range(states), per_state) for k in range(n)]
    tract_of_county = np.repeat(np.arange(counties), per_county)
    tract_names = [f"{county_names[c]}-T{k + 1}" for c, n in zip(range(counties), per_county) for k in range(n)]
    names = [("nation",), tuple(state_names), tuple(county_names), tuple(tract_names)]
    parents = [np.array([-1]), np.zeros(states, dtype=np.int64), county_of_state, tract_of_county]
    return names, parents


def _profiles(rng: np.random.Generator, zeros: np.ndarray, parents: np.ndarray, concentration: float,
              base: np.ndarray) -> np.ndarray:
    """One cell profile per child: Dirichlet(concentration * base[parent]) over the allowed
    cells, 0 on the structural zeros."""
    alpha = concentration * base[parents][:, ~zeros]
    out = np.zeros((len(parents), len(zeros)))
    g = rng.gamma(np.maximum(alpha, 1e-3))
    out[:, ~zeros] = g / g.sum(axis=1, keepdims=True)
    return out


def _national_profile(rng: np.random.Generator, attributes: tuple[int, ...], zeros: np.ndarray) -> np.ndarray:
    marginals = [rng.dirichlet(np.full(a, 5.0)) for a in attributes]
    p = marginals[0]
    for m in marginals[1:]:
        p = np.multiply.outer(p, m)
    p = np.where(zeros, 0.0, p.reshape(-1))
    return p / p.sum()


def simulate_geography(seed: int = 0, *, states: int = 4, counties: int = 300,
                       tracts_per_county: tuple[int, int] = (1, 6), attributes: tuple[int, ...] = (2, 4, 3),
                       population: int = 4_000_000,
                       structural_zeros: Sequence[Sequence[int | None]] = DEFAULT_STRUCTURAL_ZEROS) -> Geography:
    """The seeded geography (see the module docstring); deterministic given all arguments.

    ``population`` is the nation's size up to rounding; ``structural_zeros`` lists the
    impossible cell patterns (one index per attribute, None for any level; ``()`` for none)."""
    _check_sizes(states, counties, tracts_per_county, population)
    states, counties, population = int(states), int(counties), int(population)
    tracts_per_county = (int(tracts_per_county[0]), int(tracts_per_county[1]))
    attributes = tuple(int(a) for a in attributes)
    if not attributes or min(attributes) < 1:
        raise ValueError(f"attributes must be a non-empty tuple of level counts >= 1, got {attributes!r}")
    zeros = structural_zero_mask(attributes, structural_zeros)
    rng = np.random.default_rng([int(seed), 33])
    names, parents = _tree(rng, states, counties, tracts_per_county)
    raw = rng.lognormal(0.0, _COUNTY_SIGMA, size=counties)
    sizes = _COUNTY_FLOOR + np.floor(raw / raw.sum() * (population - counties * _COUNTY_FLOOR)).astype(np.int64)
    county_profile = _profiles(rng, zeros, np.zeros(counties, dtype=np.int64), _COUNTY_MIX,
                               _national_profile(rng, attributes, zeros)[None, :])
    tract_parent = parents[3]
    shares = rng.gamma(np.full(len(tract_parent), _TRACT_SHARE))
    shares /= np.bincount(tract_parent, weights=shares, minlength=counties)[tract_parent]
    tract_people = np.zeros(len(tract_parent), dtype=np.int64)
    for c in range(counties):  # the multinomial split of each county over its tracts
        idx = np.flatnonzero(tract_parent == c)
        tract_people[idx] = rng.multinomial(sizes[c], shares[idx] / shares[idx].sum())
    tract_profile = _profiles(rng, zeros, tract_parent, _TRACT_MIX, county_profile)
    leaves = rng.multinomial(tract_people, tract_profile).astype(np.int64)
    hierarchy = Hierarchy(levels=LEVELS, names=tuple(names), parents=tuple(_frozen(p) for p in parents),
                          attributes=attributes,
                          attribute_names=ATTRIBUTE_NAMES if len(attributes) == 3 else
                          tuple(f"a{k}" for k in range(len(attributes))),
                          structural_zeros=_frozen(zeros))
    return Geography(hierarchy=hierarchy, counts=tuple(_frozen(c) for c in hierarchy.roll_up(leaves)), seed=int(seed))
