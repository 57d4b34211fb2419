"""The default train/test split treats ROWS, not row contents (issue 42, finding 1).

Keyed on the row's content alone, identical rows always landed on the same side: on a survey
table of 32 distinct rows (education 1..16 x married) whole (educ, married) combinations went to
the test side, the training rows were a biased sample (test accuracy 0.06, a CLAIMED intercept
that missed the truth by 0.6). The split now keys each row on its content AND its occurrence
number among identical rows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from dptrain.data import load_dataset, schema_from_config
from dptrain.data.blocks import occurrences
from dptrain.data.split import split_scores


def survey(n: int, seed: int) -> pd.DataFrame:
    """The teaching example as a user extracts it: education 1..16 and married 0/1 only."""
    rng = np.random.default_rng(seed)
    educ = rng.integers(1, 17, size=n)
    married = (rng.uniform(size=n) < 1 / (1 + np.exp(-(-1.67 + 0.14 * educ)))).astype(int)
    return pd.DataFrame({"educ": educ, "married": married})


def cfg(path, **over) -> dict:
    out = dict(name="table", path=str(path), format="auto", target="married", positive=1, negative=0,
               numeric={"educ": {"lower": 1, "upper": 16}}, categorical={}, nonfinite="error",
               split_column=None, test_fraction=0.25)
    out.update(over)
    return out


def sides(df: pd.DataFrame, path, seed: int = 0) -> tuple[Counter, Counter]:
    """(training rows, test rows) as multisets of (educ, married)."""
    df.to_csv(path, index=False)
    ds = load_dataset(cfg(path), seed=seed)
    count = []
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        educ = np.rint(x[:, 0].numpy() * 15 + 1).astype(int)
        count.append(Counter(zip(educ.tolist(), y.numpy().astype(int).tolist())))
    return count[0], count[1]


def test_identical_rows_are_split_one_by_one(tmp_path):
    """Every (educ, married) combination of a 32-row-type table is split ~25% / 75% (a
    chi-square over the combinations at p = 0.001; with the content-only key every combination was
    wholly on one side), and each of 2,000 copies of one row gives a Binomial(2000, 0.25) test count."""
    df = survey(25_000, seed=1)
    train, test = sides(df, tmp_path / "s.csv")
    assert sum(train.values()) + sum(test.values()) == len(df)
    combos = sorted(set(train) | set(test))
    assert len(combos) == 32
    stat = 0.0
    for c in combos:
        n = train[c] + test[c]
        assert train[c] > 0 and test[c] > 0, c  # never a whole combination on one side
        stat += (test[c] - 0.25 * n) ** 2 / (0.25 * 0.75 * n)
    assert stat < 61.1  # chi-square(32) at p = 0.001
    two = pd.DataFrame({"educ": [7] * 4000, "married": [1, 0] * 2000})  # two distinct rows, 2,000 copies each
    _, test_two = sides(two, tmp_path / "o.csv")
    for row in ((7, 0), (7, 1)):
        assert abs(test_two[row] - 500) < 4 * np.sqrt(2000 * 0.25 * 0.75), test_two


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_copy_more_or_less_changes_the_training_rows_by_that_row(tmp_path, where):
    """The DP guarantee needs add/remove-one-row neighbours to give training multisets that differ
    by at most one row: removing one copy of a repeated row renumbers only the later copies of that
    same content, so at most one (content, occurrence) pair leaves."""
    df = survey(3000, seed=2)
    target = df.index[(df.educ == 12) & (df.married == 1)]
    pos = {"first": target[0], "middle": target[len(target) // 2], "last": target[-1]}[where]
    base_train, base_test = sides(df, tmp_path / "a.csv")
    less_train, less_test = sides(df.drop(index=pos), tmp_path / "b.csv")
    moved = (base_train - less_train) + (less_train - base_train) + (base_test - less_test) + (less_test - base_test)
    assert sum(moved.values()) == 1 and set(moved) == {(12, 1)}
    more = pd.concat([df.iloc[:pos], df.iloc[[pos]], df.iloc[pos:]], ignore_index=True)  # one more copy
    more_train, more_test = sides(more, tmp_path / "c.csv")
    moved = (more_train - base_train) + (more_test - base_test)
    assert sum(moved.values()) == 1 and not (base_train - more_train) and not (base_test - more_test)


def test_occurrence_numbers():
    w = np.array([5, 7, 5, 5, 9, 7], dtype=np.uint64)
    assert occurrences(w).tolist() == [0, 0, 1, 2, 0, 1]
    assert occurrences(w, np.array([0, 0, 1, 0, 0, 1])).tolist() == [0, 0, 0, 1, 0, 0]
    assert occurrences(np.arange(10, dtype=np.uint64)).tolist() == [0] * 10


def test_copies_are_independent_and_first_copies_keep_their_hash(tmp_path):
    """A table of distinct rows is split exactly as before (the first copy's score is the plain
    content hash); a second copy's score is a fresh draw, uncorrelated with the first's."""
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"educ": rng.integers(1, 17, 4000), "married": rng.integers(0, 2, 4000),
                       "id": np.arange(4000)})
    schema = schema_from_config(cfg("unused.csv"))
    once = split_scores(df, schema, seed=5)
    twice = split_scores(pd.concat([df, df], ignore_index=True), schema, seed=5)
    assert np.array_equal(twice[:4000], once)
    assert abs(np.corrcoef(twice[:4000], twice[4000:])[0, 1]) < 0.06  # 4 sigma of r at n = 4000
    assert 0.7 < np.mean(twice[4000:] >= 0.25) < 0.8


def test_groups_number_copies_within_each_piece():
    """A sharded read numbers copies within each Parquet piece: the split of one piece's rows does
    not depend on the other pieces, and a second piece's copies are not the first piece's."""
    df = pd.DataFrame({"educ": [3] * 400, "married": [0] * 400})
    schema = schema_from_config(cfg("unused.csv"))
    groups = np.repeat([0, 1 << 32], 200)
    u = split_scores(df, schema, seed=1, groups=groups)
    alone = split_scores(df.iloc[200:], schema, seed=1, groups=groups[200:])
    assert np.array_equal(u[200:], alone)
    assert not np.array_equal(u[201:400], u[1:200])
    assert 0.15 < np.mean(u < 0.25) < 0.35
