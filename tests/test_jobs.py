"""The public jobs-and-establishments simulator (dptrain.data.jobs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dptrain.data.jobs import (
    AGE_LABELS,
    OWNERSHIP_LABELS,
    RACE_LABELS,
    SECTOR_CODES,
    SECTOR_LABELS,
    SEX_LABELS,
    SIZE_CLASS_EDGES,
    Jobs,
    JobsConfig,
    simulate_jobs,
)


@pytest.fixture(scope="module")
def state() -> Jobs:
    return simulate_jobs(0)


@pytest.fixture(scope="module")
def small() -> Jobs:
    return simulate_jobs(3, establishments=2_000, places=15)


def _same(a: Jobs, b: Jobs) -> bool:
    names = ("place", "sector", "ownership", "size", "establishment", "age", "sex", "race")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and a.place_labels == b.place_labels


def test_deterministic_given_the_seed(small):
    assert _same(small, simulate_jobs(3, establishments=2_000, places=15))
    assert not _same(small, simulate_jobs(4, establishments=2_000, places=15))


def test_shapes_dtypes_and_read_only(small):
    m, n = small.n_establishments, small.n_jobs
    assert m == 2_000 and n == int(small.size.sum())
    for name, dtype in (("place", np.int32), ("sector", np.int8), ("ownership", np.int8), ("size", np.int32)):
        arr = getattr(small, name)
        assert arr.shape == (m,) and arr.dtype == dtype and not arr.flags.writeable
    for name, dtype in (("establishment", np.int32), ("age", np.int8), ("sex", np.int8), ("race", np.int8)):
        arr = getattr(small, name)
        assert arr.shape == (n,) and arr.dtype == dtype and not arr.flags.writeable
    # jobs are grouped by establishment, size rows each
    assert np.array_equal(np.bincount(small.establishment, minlength=m), small.size)
    assert np.all(np.diff(small.establishment) >= 0)
    with pytest.raises(ValueError):
        small.size[0] = 5


def test_public_label_ranges(small):
    assert len(SECTOR_LABELS) == len(SECTOR_CODES) == 20 and len(set(SECTOR_CODES)) == 20
    assert len(small.place_labels) == 15 and len(set(small.place_labels)) == 15
    for dim, labels in (("place", small.place_labels), ("sector", SECTOR_LABELS), ("ownership", OWNERSHIP_LABELS),
                        ("age", AGE_LABELS), ("sex", SEX_LABELS), ("race", RACE_LABELS)):
        codes = getattr(small, dim)
        assert small.labels(dim) == labels
        assert codes.min() >= 0 and codes.max() < len(labels)
    assert small.size.min() >= 1 and small.size.max() <= JobsConfig().max_size
    public_admin = small.sector == SECTOR_CODES.index("92")
    assert not np.any(small.ownership[public_admin] == 0)  # public administration is government


def test_sizes_are_right_skewed(state):
    s = state.size
    assert (s < 10).mean() > 0.6  # most establishments have 1-9 workers
    assert (s == 1).sum() > 1_000
    assert 1_000 <= s.max() <= JobsConfig().max_size  # a few employers of thousands
    assert 15 < s.mean() < 28 and np.median(s) < 6
    assert (s >= 1_000).sum() >= 10


def test_shares_of_sectors_and_ownership(state):
    sector_share = np.bincount(state.sector, minlength=20) / state.n_establishments
    assert sector_share.min() > 0 and sector_share.max() < 0.2
    own_jobs = np.bincount(state.ownership, weights=state.size, minlength=4) / state.n_jobs
    assert 0.8 < own_jobs[0] < 0.97 and own_jobs[3] > own_jobs[1]  # mostly private; local > federal


def test_cell_totals_match_the_worker_table(small):
    cells = small.cell_totals()
    assert list(cells.columns) == ["place", "sector", "ownership", "n", "establishments", "x_max"]  # no class: private
    assert cells["n"].sum() == small.n_jobs and cells["establishments"].sum() == small.n_establishments
    assert (cells["n"] > 0).all() and (cells["x_max"] <= cells["n"]).all()
    assert not cells[["place", "sector", "ownership"]].duplicated().any()
    est = small.establishments()
    brute = est.groupby(["place", "sector", "ownership"], observed=True)["size"].agg(["sum", "count", "max"])
    merged = cells.set_index(["place", "sector", "ownership"]).join(brute, how="outer")
    assert len(merged) == len(cells)
    assert (merged["n"] == merged["sum"]).all() and (merged["x_max"] == merged["max"]).all()
    assert (merged["establishments"] == merged["count"]).all()
    # jobs counted from the worker rows agree too
    per_place = np.bincount(small.place[small.establishment], minlength=15)
    by_place = small.cell_totals(by=("place",))
    assert np.array_equal(by_place["n"].to_numpy(), per_place[per_place > 0])
    with pytest.raises(ValueError):
        small.cell_totals(by=("place", "sex"))


def test_worker_counts(small):
    counts = small.worker_counts(("sector", "sex"))
    assert counts["count"].sum() == small.n_jobs and isinstance(counts["sex"].dtype, pd.CategoricalDtype)
    full = small.worker_counts(("ownership", "age", "race"), complete=True)
    assert len(full) == 4 * 3 * 5 and full["count"].sum() == small.n_jobs
    brute = pd.crosstab(small.ownership[small.establishment], small.age).reindex(
        index=range(4), columns=range(3), fill_value=0)
    table = small.worker_counts(("ownership", "age"), complete=True)["count"].to_numpy().reshape(4, 3)
    assert np.array_equal(table, brute.to_numpy())
    with pytest.raises(ValueError):
        small.worker_counts(("sex", "sex"))
    with pytest.raises(ValueError):
        small.worker_counts(("income",))


def test_worker_margins_are_plausible(state):
    n = state.n_jobs
    age = np.bincount(state.age, minlength=3) / n
    sex = np.bincount(state.sex, minlength=2) / n
    race = np.bincount(state.race, minlength=5) / n
    assert 0.15 < age[0] < 0.4 and 0.4 < age[1] < 0.65 and 0.12 < age[2] < 0.35
    assert 0.4 < sex[1] < 0.6
    assert 0.45 < race[0] < 0.75 and race[4] > race[2] and race.min() > 0.01
    # mild dependence on the sector: health care is mostly female, construction mostly male
    job_sector = state.sector[state.establishment]
    female = {code: state.sex[job_sector == SECTOR_CODES.index(code)].mean() for code in ("62", "23")}
    assert female["62"] > 0.65 and female["23"] < 0.25


def test_invalid_arguments():
    with pytest.raises(ValueError):
        simulate_jobs(0, establishments=0)
    with pytest.raises(ValueError):
        simulate_jobs(0, establishments=10, config=JobsConfig(tail_min=1))


def test_public_size_classes():
    jobs = simulate_jobs(0, establishments=3000)
    k = jobs.size_class
    edges = np.array(SIZE_CLASS_EDGES)
    assert (edges[k] <= jobs.size).all() and (jobs.size <= jobs.class_upper(k)).all()
    assert jobs.class_upper(len(edges) - 1) == jobs.config.max_size
    assert list(jobs.class_upper(np.arange(3))) == [4, 9, 19]
