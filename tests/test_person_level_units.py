"""The shared primitive of person-level privacy (issue 47): ``data.privacy_unit`` read into the
schema and the data source, ``privacy.max_rows_per_unit`` checked against it, and
:mod:`dptrain.data.units` (dense unit codes; at most k rows per unit, a uniform secret choice)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dptrain.core.validation import ConfigError
from dptrain.data import data_source, schema_from_config
from dptrain.data.check import check_table, format_check
from dptrain.data.encoding import encode_rows
from dptrain.data.files import DataError
from dptrain.data.units import cap_rows_per_unit, rows_per_unit, unit_codes, unit_of_rows
from dptrain.settings.common import check_unit_bound
from dptrain.settings.data import TableDataConfig

NUMERIC = {"age": {"lower": 0, "upper": 100}}


def _decl(**kw):
    return {"target": "y", "numeric": dict(NUMERIC), **kw}


# ---- unit_codes -------------------------------------------------------------------------------

def test_unit_codes_are_dense_sorted_and_independent_of_row_order():
    values = ["b", "a", 3, "b", 3.0, " a", "c"]
    codes = unit_codes(values)
    assert codes.dtype == np.int64
    # compared strings: "3" (3 and 3.0), "a" (a, " a"), "b", "c" -> sorted codes 0..3
    assert codes.tolist() == [2, 1, 0, 2, 0, 1, 3]
    perm = np.random.default_rng(0).permutation(len(values))
    assert unit_codes([values[i] for i in perm]).tolist() == codes[perm].tolist()
    series = pd.Series([10, 11, 10, 12])
    assert unit_codes(series).tolist() == [0, 1, 0, 2]


def test_a_missing_unit_id_is_refused_by_default_and_coded_minus_one_with_drop():
    values = pd.Series(["p1", None, "p2", float("nan"), "", "p1"], dtype=object)
    with pytest.raises(DataError) as err:
        unit_codes(values)
    msg = str(err.value)
    assert "data.privacy_unit" in msg and "missing=drop" in msg
    assert not any(ch.isdigit() for ch in msg)  # no count, no value
    assert unit_codes(values, missing="drop").tolist() == [0, -1, 1, -1, -1, 0]
    with pytest.raises(ValueError):
        unit_codes(values, missing="guess")


def test_rows_per_unit_and_unit_of_rows_count_exactly():
    codes = np.array([0, 2, 2, 5, 5, 5, -1])
    assert rows_per_unit(codes).tolist() == [1, 0, 2, 0, 0, 3]
    dense, n = unit_of_rows(codes[:-1])
    assert n == 3 and dense.tolist() == [0, 1, 1, 2, 2, 2]


# ---- cap_rows_per_unit ------------------------------------------------------------------------

def test_cap_keeps_exactly_min_of_rows_and_k_per_unit():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 21, size=500)
    codes = np.repeat(np.arange(500), sizes)
    codes = codes[rng.permutation(codes.size)]
    for k in (1, 3, 20, 25):
        kept = cap_rows_per_unit(codes, k, np.random.default_rng(k))
        assert kept.tolist() == sorted(set(kept.tolist()))  # ascending, no repeat
        assert np.array_equal(np.bincount(codes[kept], minlength=500), np.minimum(sizes, k))
        assert codes.size - kept.size == int(np.maximum(sizes - k, 0).sum())  # the (private) dropped count
    assert cap_rows_per_unit(np.zeros(0, dtype=np.int64), 2, rng).size == 0


def test_cap_choice_is_uniform_over_k_subsets():
    """A unit of 5 rows capped at 2: each of the C(5, 2) = 10 subsets equally likely (chi-square,
    fixed seed); another unit's rows do not change the choice's law."""
    codes = np.array([0, 1, 0, 0, 1, 0, 0, 2])  # unit 0: rows 0, 2, 3, 5, 6
    rows0 = [0, 2, 3, 5, 6]
    subsets = {s: i for i, s in enumerate(itertools.combinations(rows0, 2))}
    rng = np.random.default_rng(20261128)
    counts = np.zeros(len(subsets))
    n = 20000
    for _ in range(n):
        kept = cap_rows_per_unit(codes, 2, rng)
        counts[subsets[tuple(int(r) for r in kept if codes[r] == 0)]] += 1
        assert 1 in kept and 4 in kept and 7 in kept  # units with <= k rows keep all
    chi2 = stats.chisquare(counts).pvalue
    assert chi2 > 1e-3, counts
    assert np.all(np.abs(counts / n - 0.1) < 0.012)


def test_cap_refuses_bad_arguments():
    rng = np.random.default_rng(0)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            cap_rows_per_unit(np.array([0, 1]), k, rng)
    with pytest.raises(ValueError):
        cap_rows_per_unit(np.array([0, -1]), 1, rng)
    with pytest.raises(TypeError):
        cap_rows_per_unit(np.array([0, 1]), 1, 0)


def test_cap_draws_from_the_given_generator_only():
    codes = np.repeat(np.arange(50), 10)
    a = cap_rows_per_unit(codes, 3, np.random.default_rng(7))
    b = cap_rows_per_unit(codes, 3, np.random.default_rng(7))
    c = cap_rows_per_unit(codes, 3, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# ---- the settings -----------------------------------------------------------------------------

def test_privacy_unit_is_read_into_the_schema_and_the_source():
    schema = schema_from_config(_decl(privacy_unit=" person_id "))
    assert schema.privacy_unit == "person_id"
    assert schema.split_key == ("person_id",)  # the split is by unit
    assert ("data.privacy_unit", "person_id") in schema.declared_columns
    assert "person_id" in schema.read_columns and "person_id" not in schema.feature_columns
    src = data_source(TableDataConfig(path="x.csv", target="y", numeric=dict(NUMERIC), privacy_unit="person_id"))
    assert src.privacy_unit == "person_id" and src.schema.privacy_unit == "person_id"
    assert schema_from_config(_decl()).privacy_unit is None
    assert data_source(TableDataConfig(path="x.csv", target="y", numeric=dict(NUMERIC))).privacy_unit is None


@pytest.mark.parametrize("decl, words", [
    (_decl(privacy_unit="age"), "data.numeric.age"),
    ({"target": "y", "numeric": dict(NUMERIC), "categorical": {"pid": ["1"]}, "privacy_unit": "pid"},
     "data.categorical.pid"),
    (_decl(privacy_unit="y"), "data.target"),
    (_decl(privacy_unit="s", split_column="s"), "data.split_column"),
    (_decl(privacy_unit="pid", split_column="part"), "data.split_column='part'"),
    (_decl(privacy_unit="pid", split_key=["hh"]), "data.split_key=['hh']"),
    (_decl(privacy_unit=""), "data.privacy_unit=''"),
    (_decl(privacy_unit=3), "data.privacy_unit=3"),
])
def test_privacy_unit_refusals_name_the_setting(decl, words):
    with pytest.raises(ConfigError) as err:
        schema_from_config(decl)
    assert words in str(err.value) and "data.privacy_unit" in str(err.value)


def test_the_encoded_rows_cache_is_refused_with_a_unit():
    with pytest.raises(ConfigError, match=r"data.cache='c' is not allowed with data.privacy_unit='pid'"):
        data_source(TableDataConfig(path="x.csv", target="y", numeric=dict(NUMERIC), privacy_unit="pid", cache="c"))


def test_split_key_equal_to_the_unit_is_accepted():
    assert schema_from_config(_decl(privacy_unit="pid", split_key=["pid"])).split_key == ("pid",)


def test_max_rows_per_unit_is_required_with_a_unit_and_refused_without():
    assert check_unit_bound(None, None) is None
    assert check_unit_bound("pid", 5) == 5
    with pytest.raises(ConfigError, match=r"privacy.max_rows_per_unit=3 .*needs data.privacy_unit"):
        check_unit_bound(None, 3)
    with pytest.raises(ConfigError, match=r"privacy.max_rows_per_unit=None .*data.privacy_unit='pid': it is required"):
        check_unit_bound("pid", None)
    for bad in (0, -2, 1.5, True, "5"):
        with pytest.raises(ConfigError, match="privacy.max_rows_per_unit"):
            check_unit_bound("pid", bad)


def test_the_uniform_choice_keeps_each_row_with_probability_k_over_n():
    """A unit of n rows keeps each row with probability k/n (the marginal of a uniform k-subset)."""
    codes = np.zeros(7, dtype=np.int64)
    rng = np.random.default_rng(3)
    hits = np.zeros(7)
    reps = 14000
    for _ in range(reps):
        hits[cap_rows_per_unit(codes, 3, rng)] += 1
    p = 3 / 7
    sd = math.sqrt(p * (1 - p) / reps)
    assert np.all(np.abs(hits / reps - p) < 5 * sd)


def test_dptrain_check_reports_rows_per_unit_exactly():
    """The data holder's check: units, rows, rows without an id and the rows each cap keeps
    (PRIVATE counts, in the check's private report only)."""

    sizes = [1, 1, 2, 3, 7, 12]
    ids = np.repeat([f"p{i}" for i in range(len(sizes))], sizes).astype(object)
    df = pd.DataFrame({"y": np.arange(len(ids)) % 2, "age": np.linspace(1, 90, len(ids)), "pid": ids})
    df.loc[0, "pid"] = None  # one row without an id: the unit p0 is gone
    report = check_table(df, schema_from_config(_decl(privacy_unit="pid")))
    units = report["units"]
    assert units["column"] == "pid" and units["units"] == 5 and units["missing_ids"] == 1
    assert units["rows"] == sum(sizes) - 1
    kept = {int(k): v for k, v in units["kept_by_cap"].items()}
    rest = np.array(sizes[1:])
    assert kept == {k: int(np.minimum(rest, k).sum()) for k in (1, 2, 3, 5, 10, 20)}
    assert units["rows_per_unit"]["max"] == 12 and units["rows_per_unit"]["median"] == 3
    text = format_check(report, "t.csv")
    assert "1 rows without a unit id -> left out by the run" in text and "k=5: 16 " in text


def test_a_row_without_a_unit_id_is_left_out_and_counted_never_refused():
    """One row more or less decides nothing: a table with one row lacking its unit id runs like
    the table without that row (the same units, rows and split), the row counted privately under
    left_out_by.privacy_unit; a row with an id is never dropped by this rule."""
    sizes = [3, 1, 4, 2, 5]
    ids = np.repeat([f"p{i}" for i in range(len(sizes))], sizes).astype(object)
    df = pd.DataFrame({"y": np.arange(len(ids)) % 2, "age": np.linspace(1, 90, len(ids)), "pid": ids})
    schema = schema_from_config(_decl(privacy_unit="pid"))
    holed = pd.concat([df, pd.DataFrame({"y": [1], "age": [40.0], "pid": [None]})], ignore_index=True)
    blank = holed.assign(pid=holed["pid"].where(holed["pid"].notna(), "  "))
    full = encode_rows(df, schema, seed=0)
    for table in (holed, blank):
        rows = encode_rows(table, schema, seed=0)
        assert rows.facts["rows"]["left_out_by"]["privacy_unit"]["pid"]["no_unit_id"] == 1
        assert rows.facts["rows"]["kept"] == len(df)
        assert np.array_equal(rows.unit_train, full.unit_train) and np.array_equal(rows.unit_test, full.unit_test)
        assert np.array_equal(rows.x_train, full.x_train)
    assert full.facts["rows"]["left_out_by"]["privacy_unit"]["pid"]["no_unit_id"] == 0
