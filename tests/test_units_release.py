"""Issue 47, part B: tables and small-cell releases per unit of privacy (data.privacy_unit with
privacy.max_rows_per_unit=k). The tests recompute the sensitivities (a unit with k rows in one
cell, spread over cells), check that the noise scale in each report equals the recomputed one,
that the noise drawn has that scale (fixed seeds where the test draws; OpenDP's CSPRNG otherwise,
with tolerances of several standard errors), that the cap counts at most k rows per unit, and that
the dropped count stays under private/."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.data.units import cap_rows_per_unit, unit_codes
from dptrain.release.oneshot.tables import GaussianTables, LaplaceTables
from dptrain.release.spec import ReleaseSpec
from dptrain.release.units import (
    UnitBound,
    capped,
    dataset_units,
    group_privacy,
    per_row_spec,
    row_budget,
    table_sensitivity,
)
from dptrain.tasks import cli
from dptrain.tasks import release as release_task
from dptrain.tasks import tabulate as tabulate_task

A_LEVELS = [f"a{i}" for i in range(30)]
B_LEVELS = [f"b{i}" for i in range(20)]


# ----------------------------------------------------------------------------- the sensitivities


def _table(cells: np.ndarray, n_cells: int) -> np.ndarray:
    return np.bincount(cells, minlength=n_cells).astype(np.int64)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_removing_one_capped_unit_moves_a_count_table_by_at_most_k_in_l1_and_l2(k):
    """Recomputed: every unit of a capped panel removed in turn (the others' kept rows fixed, as the
    cap is per unit): the table moves by at most k in L1 and in L2; k in L2 is reached by a unit
    with k rows in one cell, sqrt(k) by one spread over k cells; table_sensitivity says (k, k)."""
    rng = np.random.default_rng(7)
    n_units, n_cells = 300, 12
    sizes = rng.integers(1, 3 * k + 2, size=n_units)
    units = np.repeat(np.arange(n_units), sizes)
    cells = rng.integers(0, n_cells, size=units.size)
    cells[units == 0] = 4  # unit 0: every row in one cell
    cells[units == 1] = np.arange((units == 1).sum()) % n_cells  # unit 1: rows in distinct cells
    sizes[:2] = max(sizes[0], k), max(sizes[1], k)
    units = np.repeat(np.arange(n_units), sizes)
    cells = rng.integers(0, n_cells, size=units.size)
    cells[units == 0] = 4
    cells[units == 1] = np.arange((units == 1).sum()) % n_cells
    keep = cap_rows_per_unit(units, k, np.random.default_rng(1))
    assert np.bincount(units[keep]).max() <= k
    full = _table(cells[keep], n_cells)
    l1, l2 = np.zeros(n_units), np.zeros(n_units)
    for u in range(n_units):
        diff = full - _table(cells[keep][units[keep] != u], n_cells)
        l1[u], l2[u] = np.abs(diff).sum(), np.sqrt((diff**2).sum())
    sens = table_sensitivity(UnitBound("person", k))
    assert l1.max() == sens["l1_sensitivity"] == k and l2.max() == pytest.approx(sens["l2_sensitivity"]) == k
    assert l2[0] == pytest.approx(k) and l2[1] == pytest.approx(math.sqrt(k)) and l1[1] == k
    assert table_sensitivity(UnitBound()) == {"l1_sensitivity": 1.0, "l2_sensitivity": 1.0}


@pytest.mark.parametrize("k", [1, 4])
def test_the_table_mechanisms_noise_scales_with_the_sensitivity(k):
    """The Gaussian's sigma and the Laplace's scale are k times the one-row ones; the rho and epsilon
    spent do not change (rho = Delta^2 / (2 sigma^2), epsilon = Delta / scale); the drawn noise has
    that scale (20,000 cells; OpenDP's exact samplers)."""
    g, lap = GaussianTables(), LaplaceTables()
    rho, eps = 0.02, 0.5
    spent = g.spent(0.5, rho, sensitivity=k)
    assert spent["sigma"] == pytest.approx(k / math.sqrt(2 * 0.5 * rho)) and spent["rho"] == pytest.approx(0.01)
    assert k**2 / (2 * spent["sigma"] ** 2) == pytest.approx(spent["rho"])
    assert g.variance(0.5, rho, sensitivity=k) == pytest.approx(spent["sigma"] ** 2)
    zeros = np.zeros(20_000, dtype=np.int64)
    draws = g.measure(zeros, 0.5, rho, sensitivity=k).astype(float)
    assert draws.std() == pytest.approx(spent["sigma"], rel=0.03) and abs(draws.mean()) < 4 * spent["sigma"] / 141
    lspent = lap.spent(0.25, eps, sensitivity=k)
    assert lspent["scale"] == pytest.approx(k / (0.25 * eps)) and lspent["epsilon"] == pytest.approx(0.125)
    t = lspent["scale"]
    var = 2 * math.exp(-1 / t) / (1 - math.exp(-1 / t)) ** 2  # the discrete Laplace's variance
    assert lap.variance(0.25, eps, sensitivity=k) == pytest.approx(2 * t**2)
    assert lap.measure(zeros, 0.25, eps, sensitivity=k).astype(float).var() == pytest.approx(var, rel=0.06)


def test_group_privacy_and_the_per_row_budget_are_inverse():
    """(epsilon, delta) per row -> (k epsilon, k e^((k-1) epsilon) delta) per group of k rows, and
    row_budget gives the per-row budget of a per-unit target."""
    assert group_privacy(0.5, 1e-7, 1) == (0.5, 1e-7)
    eps, delta = group_privacy(0.25, 1e-8, 4)
    assert eps == pytest.approx(1.0) and delta == pytest.approx(4 * math.exp(0.75) * 1e-8)
    row = row_budget(2.0, 1e-6, UnitBound("person", 5))
    assert group_privacy(*row, 5) == pytest.approx((2.0, 1e-6))
    with pytest.raises(ValueError):
        group_privacy(1.0, 0.0, 0)
    with pytest.raises(ValueError):
        UnitBound(None, 3)


def test_the_cap_keeps_at_most_k_rows_per_unit_and_counts_what_it_dropped():
    codes = unit_codes(pd.Series(["p1"] * 7 + ["p2"] * 2 + ["p3"]))
    keep, dropped = capped(codes, UnitBound("person", 3), np.random.default_rng(0))
    assert np.bincount(codes[keep]).tolist() == [3, 2, 1] and dropped == 4


# ----------------------------------------------------------------------------- task=tabulate


def _panel(tmp_path, *, k_max: int, seed: int = 0, n_units: int = 900):
    """A panel whose units' rows are identical in the tabulated columns (a, b, y): the capped
    table is then known exactly (each unit counts min(rows, k) in its one cell). ``rid``: a numeric
    column, distinct per row, that lets the test map the loader's rows back to their units."""
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.zipf(1.7, size=n_units), k_max)
    unit = np.repeat(np.arange(n_units), sizes)
    a = rng.integers(0, len(A_LEVELS), size=n_units)[unit]
    b = rng.integers(0, len(B_LEVELS), size=n_units)[unit]
    y = rng.integers(0, 2, size=n_units)[unit]
    df = pd.DataFrame({"person": [f"id{u:05d}" for u in unit], "a": np.asarray(A_LEVELS)[a],
                       "b": np.asarray(B_LEVELS)[b], "y": y, "rid": np.arange(unit.size)})
    path = tmp_path / "panel.csv"
    df.to_csv(path, index=False)
    return path, df


def _attach_units(monkeypatch, module, df: pd.DataFrame) -> pd.DataFrame:
    """The loader's rows with their unit codes (``unit_train``, ``unit_test``), recovered from the
    distinct ``rid`` column, where the loader does not give them itself (the codes of both sides in
    one numbering: dataset_units shifts the test side, which leaves distinct units distinct).
    Returns ``df`` whose ``side`` column (0 train, 1 test) the load fills in: a (person, side) is
    the capped group (the split is by unit, so a person is on one side)."""
    real = module.load_dataset
    df = df.assign(side=-1)

    def load(data, *, seed):
        ds = real(data, seed=seed)
        col = ds.feature_names.index("rid")
        for side in (0, 1):
            x = (ds.x_train if side == 0 else ds.x_test).numpy()[:, col].astype(np.float64)
            df.loc[np.rint(x * len(df)).astype(int), "side"] = side
        if getattr(ds, "unit_test", None) is None:
            codes = unit_codes(df["person"])
            for name in ("train", "test"):
                rows = np.rint(getattr(ds, f"x_{name}").numpy()[:, col].astype(np.float64) * len(df)).astype(int)
                object.__setattr__(ds, f"unit_{name}", codes[rows])
        return ds

    monkeypatch.setattr(module, "load_dataset", load)
    return df


def _groups(df: pd.DataFrame):
    """The capped groups: a person's rows on one side of the split (all of them with the unit split)."""
    assert (df["side"] >= 0).all()
    return df.groupby(["person", "side"])


def _table_overrides(path, df: pd.DataFrame, *extra: str) -> list[str]:
    return ["task=tabulate", "data=table", f"data.path={path}", "data.target=y",
            f"++data.numeric={{rid: {{lower: 0, upper: {len(df)}}}}}",
            f"++data.categorical={{a: [{', '.join(A_LEVELS)}], b: [{', '.join(B_LEVELS)}]}}",
            "tabulate.marginals=[[a, b]]", "tabulate.consistent=false", *extra]


def _compose_run(overrides: list[str], run_dir):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cli.run(cfg, run_dir=run_dir)


def _exact_capped(df: pd.DataFrame, k: int) -> np.ndarray:
    """The a x b table when each unit counts min(rows, k) rows in its one cell."""
    per = _groups(df).agg(a=("a", "first"), b=("b", "first"), n=("a", "size"))
    table = np.zeros((len(A_LEVELS) + 1, len(B_LEVELS) + 1))
    for a, b, n in per.itertuples(index=False):
        table[A_LEVELS.index(a), B_LEVELS.index(b)] += min(n, k)
    return table


def _released(run) -> np.ndarray:
    t = pd.read_csv(run / "tables" / "a__b.csv")
    levels_a, levels_b = [*A_LEVELS, "<other>"], [*B_LEVELS, "<other>"]
    out = np.zeros((len(levels_a), len(levels_b)))
    for a, b, c in t[["a", "b", "count"]].itertuples(index=False):
        out[levels_a.index(a), levels_b.index(b)] = c
    return out


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_tabulate_per_unit_reports_and_draws_the_recomputed_noise_scale(tmp_path, monkeypatch, mechanism):
    """k = 4 rows per person: the report's sensitivities are (4, 4), its sigma (scale) 4 times the
    one-row law at the reported rho (epsilon), its epsilon dp-accounting's; the released counts
    minus the exact capped counts (known: each person's rows share one cell) have that spread over
    the 651 cells; the dropped rows are counted in private/units.json only."""
    k = 4
    path, df = _panel(tmp_path, k_max=12)
    df = _attach_units(monkeypatch, tabulate_task, df)
    run = tmp_path / "run"
    _compose_run(_table_overrides(path, df, "data.privacy_unit=person", f"privacy.max_rows_per_unit={k}",
                                  f"privacy.mechanism={mechanism}", "privacy.epsilon=1.0"), run)
    report = json.loads((run / "privacy.json").read_text())
    unit = report["unit_of_privacy"]
    assert unit["column"] == "person" and unit["max_rows_per_unit"] == k
    assert unit["l1_sensitivity"] == unit["l2_sensitivity"] == k
    assert "person" in report["neighbours"] and f"at most {k} counted" in report["guarantee"]
    (m,) = report["marginals"]
    assert m["l2_sensitivity"] == k and m["cells"] == 31 * 21
    noise = (_released(run) - _exact_capped(df, k)).ravel()
    if mechanism == "gaussian":
        assert m["sigma"] == pytest.approx(k / math.sqrt(2 * m["rho"]))  # recomputed: Delta_2 / sqrt(2 rho)
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.ZCDpEvent(m["rho"]))
        assert acc.get_epsilon(1e-6) == pytest.approx(report["epsilon"], rel=1e-9)
        expected = m["sigma"]
    else:
        assert m["scale"] == pytest.approx(k / m["epsilon"]) and report["epsilon"] == pytest.approx(1.0)
        expected = math.sqrt(2) * m["scale"]
    se = expected / math.sqrt(2 * noise.size)  # the standard error of a sample sd (near-normal tails)
    assert abs(noise.std() - expected) < 5 * se * (1.0 if mechanism == "gaussian" else 1.6), (noise.std(), expected)
    assert abs(noise.mean()) < 5 * expected / math.sqrt(noise.size)
    dropped = int(np.maximum(_groups(df).size() - k, 0).sum())
    assert dropped > 0
    private = json.loads((run / "private" / "units.json").read_text())
    assert private["rows_dropped"] == dropped and private["max_rows_per_unit"] == k
    published = (run / "privacy.json").read_text() + (run / "privacy.txt").read_text() + (
        run / "FILES.txt").read_text()
    assert "rows_dropped" not in published and "units.json" in (run / "FILES.txt").read_text().split("PRIVATE")[1]


def test_tabulate_per_unit_noise_is_k_times_the_per_row_noise(tmp_path, monkeypatch):
    """The same table and budget without a unit: sigma exactly k times smaller."""
    path, df = _panel(tmp_path, k_max=3)
    _attach_units(monkeypatch, tabulate_task, df)
    _compose_run(_table_overrides(path, df), tmp_path / "rows")
    _compose_run(_table_overrides(path, df, "data.privacy_unit=person", "privacy.max_rows_per_unit=3"),
                 tmp_path / "units")
    rows, units = (json.loads((tmp_path / r / "privacy.json").read_text()) for r in ("rows", "units"))
    assert units["marginals"][0]["sigma"] == pytest.approx(3 * rows["marginals"][0]["sigma"])
    assert units["epsilon"] == pytest.approx(rows["epsilon"])
    assert rows["unit_of_privacy"]["column"] is None and "group privacy" in rows["unit_of_privacy"]["note"]
    assert not (tmp_path / "rows" / "private" / "units.json").exists()


@pytest.mark.parametrize("extra,needle", [
    (["privacy.max_rows_per_unit=3"], "privacy.max_rows_per_unit"),
    (["data.privacy_unit=person"], "privacy.max_rows_per_unit"),
    (["data.privacy_unit=person", "privacy.max_rows_per_unit=0"], "privacy.max_rows_per_unit"),
    (["data.privacy_unit=person", "privacy.max_rows_per_unit=2", "tabulate.sparse=true", "privacy.mechanism=laplace"],
     "tabulate.sparse"),
])
def test_tabulate_unit_settings_are_refused_by_name_before_any_row_is_read(tmp_path, extra, needle, capsys):
    path, df = _panel(tmp_path, k_max=3, n_units=20)
    with pytest.raises(SystemExit) as stop:
        _compose_run(_table_overrides(path, df, *extra), tmp_path / "run")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and needle in err and "dptrain: error:" in err and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- task=release


def _cells_table(tmp_path, *, k_max: int, seed: int = 3):
    """A person-level file for the small-cell release: 40 cells, persons with 1..k_max rows, each
    person's rows in one or several cells, x and y in [0, 1]."""
    rng = np.random.default_rng(seed)
    n_units = 1500
    sizes = rng.integers(1, k_max + 1, size=n_units)
    unit = np.repeat(np.arange(n_units), sizes)
    cell = rng.integers(1, 41, size=unit.size)
    x = rng.random(unit.size)
    y = np.clip(0.3 + 0.4 * x + 0.1 * rng.standard_normal(unit.size), 0, 1)
    df = pd.DataFrame({"person": unit, "cell": cell, "x": x, "y": y})
    path = tmp_path / "cells.csv"
    df.to_csv(path, index=False)
    return path, df


def _release(path, run_dir, *extra: str):
    _compose_run(["task=release", "data=table", f"data.path={path}", "release.x=x", "release.y=y",
                  "release.cells=[cell]", f"release.cell_values={{cell: [{', '.join(str(c) for c in range(1, 41))}]}}",
                  "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}", "release.private_evaluation=false", *extra],
                 run_dir)
    return json.loads((run_dir / "release.json").read_text()), pd.read_csv(run_dir / "release.csv")


@pytest.mark.parametrize("method", ["noisy_stats", "mos"])
def test_a_small_cell_release_per_unit_runs_at_epsilon_over_k_and_reports_the_group_bound(tmp_path, method):
    """k = 3 and no person above 3 rows (the cap drops nothing): the per-unit run is the per-row
    run at release.epsilon_per_statistic / 3 and release.delta / 3 (its per-statistic budget split equal; MOS's
    noise_sd, which its own sensitivities set, equal cell by cell), and release.json's
    unit_of_privacy is group privacy at 3 of that run's per-row total: (3 epsilon_row,
    3 e^(2 epsilon_row) delta_row)."""
    k, eps, delta = 3, 2.0, 1e-6
    path, _ = _cells_table(tmp_path, k_max=k)
    unit, unit_rel = _release(path, tmp_path / "unit", f"release.method={method}",
                              f"release.epsilon_per_statistic={eps}", f"release.delta={delta}",
                              "data.privacy_unit=person", f"privacy.max_rows_per_unit={k}")
    row, row_rel = _release(path, tmp_path / "row", f"release.method={method}",
                            f"release.epsilon_per_statistic={eps / k}", f"release.delta={delta / k}")
    if method == "mos":
        released = unit_rel.released.astype(bool) & row_rel.released.astype(bool)
        assert released.sum() >= 20 and unit_rel.noise_sd[released].notna().all()
        assert np.allclose(unit_rel.noise_sd[released], row_rel.noise_sd[released], rtol=1e-9)
        assert unit["epsilon"] == row["epsilon"] and unit["epsilon"]["theta"] == pytest.approx(eps / k)
        assert unit["epsilon"]["total_per_cell"] == pytest.approx(eps)
    else:
        assert unit["details"]["epsilon_split"] == pytest.approx(row["details"]["epsilon_split"])
        assert unit["epsilon"] == pytest.approx(row["epsilon"]) == pytest.approx(2 * eps / k)  # replace-one: 2E
    u = unit["unit_of_privacy"]
    assert u["column"] == "person" and u["max_rows_per_unit"] == k and u["max_cells_per_unit"] == k
    assert u["epsilon_per_row"] == pytest.approx(eps / k) and u["delta_per_row"] == pytest.approx(delta / k)
    per_row = row["total"]
    assert unit["total"]["epsilon"] == pytest.approx(per_row["epsilon"])  # the method's own fields: per row
    assert u["epsilon"] == pytest.approx(k * per_row["epsilon"])
    assert u["delta"] == pytest.approx(k * math.exp((k - 1) * per_row["epsilon"]) * per_row["delta"])
    head = "MOS is NOT differentially private" if method == "mos" else "per person (all rows of one person, at most 3"
    assert unit["guarantee"].startswith(head)
    assert "rows_dropped" not in (tmp_path / "unit" / "release.json").read_text()
    assert row["unit_of_privacy"]["column"] is None and "group privacy" in row["unit_of_privacy"]["note"]
    diag = json.loads((tmp_path / "unit" / "private" / "data_diagnostics.json").read_text())
    assert diag["units"]["rows_dropped_by_the_cap"] == 0


def test_a_small_cell_release_caps_rows_per_unit(tmp_path, caplog):
    """Persons with up to 6 rows, k = 2: the cap drops exactly sum(max(rows - 2, 0)) rows
    (private/data_diagnostics.json), the rows used are the rest; the data holder's console line
    shows neither (with the file's row count they would give the dropped count)."""
    caplog.set_level("INFO")
    path, df = _cells_table(tmp_path, k_max=6)
    meta, rel = _release(path, tmp_path / "run", "release.method=noisy_stats", "release.epsilon_per_statistic=4",
                         "data.privacy_unit=person", "privacy.max_rows_per_unit=2")
    dropped = int(np.maximum(df.groupby("person").size() - 2, 0).sum())
    diag = json.loads((tmp_path / "run" / "private" / "data_diagnostics.json").read_text())
    assert diag["units"]["rows_dropped_by_the_cap"] == dropped > 0
    assert diag["rows"]["kept"] == len(df) - dropped
    assert meta["unit_of_privacy"]["max_rows_per_unit"] == 2
    line = next(r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage())
    assert "after the cap per person" in line and str(len(df) - dropped) not in line and str(dropped) not in line


def test_mos_per_unit_still_says_it_is_not_differentially_private(tmp_path):
    path, _ = _cells_table(tmp_path, k_max=2)
    meta, _ = _release(path, tmp_path / "run", "release.method=mos", "data.privacy_unit=person",
                       "privacy.max_rows_per_unit=2")
    assert meta["guarantee"].startswith("MOS is NOT differentially private")
    assert "conditional on chi only" in meta["guarantee"] and meta["unit_of_privacy"]["column"] == "person"


@pytest.mark.parametrize("extra,needle", [
    (["privacy.max_rows_per_unit=2"], "privacy.max_rows_per_unit"),
    (["data.privacy_unit=person"], "privacy.max_rows_per_unit"),
    (["data.privacy_unit=person", "privacy.max_rows_per_unit=2", "release.cell_selection=private",
      "release.cell_values=null"], "release.cell_selection"),
    (["data.privacy_unit=nobody", "privacy.max_rows_per_unit=2"], "data.privacy_unit"),
])
def test_release_unit_settings_are_refused_by_name(tmp_path, extra, needle, capsys):
    path, _ = _cells_table(tmp_path, k_max=2)
    with pytest.raises(SystemExit) as stop:
        _release(path, tmp_path / "run", "release.method=noisy_stats", *extra)
    assert stop.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "run" / "release.csv").exists()


def test_per_row_spec_divides_the_budget_by_k():
    spec = ReleaseSpec(method="noisy_stats", method_settings={}, statistic="slope", epsilon_per_statistic=3.0,
                       delta=3e-6,
                       neighbors="add_remove", noise="laplace", min_n=10, chi_by=(), dp_mos_split={},
                       dp_mos_chi_quantile=0.95, suppression_k=(), rate_outcome=False, theil_sen_variant="",
                       theil_sen_k=1, tail_epsilons=(), y="y")
    assert per_row_spec(spec, UnitBound()) is spec
    row = per_row_spec(spec, UnitBound("person", 3))
    assert (row.epsilon_per_statistic, row.delta) == pytest.approx((1.0, 1e-6)) and row.method == "noisy_stats"


def test_dataset_units_keeps_the_sides_units_apart_and_refuses_a_loader_without_codes():
    """Each side's codes start at 0 (the loader numbers them per side); the split is by unit, so
    the test side's are shifted past the training side's: unit 0 of each side stays two units."""
    codes = dataset_units(SimpleNamespace(unit_train=np.array([0, 1, 1, 0]), unit_test=np.array([0, 0, 1])))
    assert codes.tolist() == [0, 1, 1, 0, 2, 2, 3]
    with pytest.raises(Exception, match="data.privacy_unit"):
        dataset_units(SimpleNamespace(unit_train=np.array([0]), unit_test=None))


def test_mos_per_unit_draws_n_with_k_times_the_per_row_laplace_scale(tmp_path):
    """MOS's released N is N + discrete Laplace of scale 1 / epsilon_N per row; per person with k = 3
    (no person above 3 rows: nothing capped) the scale is 3 / release.epsilon_per_statistic. Over 400 cells the
    released N minus the exact N has the discrete Laplace's sd at that scale (not at 1 / epsilon,
    3 times smaller)."""
    rng = np.random.default_rng(11)
    n_units, k, eps = 6000, 3, 1.0
    unit = np.repeat(np.arange(n_units), rng.integers(1, k + 1, size=n_units))
    cell = rng.integers(1, 401, size=unit.size)
    x = rng.random(unit.size)
    df = pd.DataFrame({"person": unit, "cell": cell, "x": x, "y": np.clip(0.2 + 0.5 * x, 0, 1)})
    df.to_csv(tmp_path / "cells.csv", index=False)
    run = tmp_path / "run"
    _compose_run(["task=release", "data=table", f"data.path={tmp_path / 'cells.csv'}", "release.x=x", "release.y=y",
                  "release.cells=[cell]", f"release.cell_values={{cell: [{', '.join(map(str, range(1, 401)))}]}}",
                  "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}", "release.private_evaluation=false",
                  "release.method=mos", f"release.epsilon_per_statistic={eps}", "data.privacy_unit=person",
                  f"privacy.max_rows_per_unit={k}"], run)
    rel = pd.read_csv(run / "release.csv")
    rel = rel[rel.released.astype(bool)]
    noise = rel.n_released.to_numpy() - df.groupby("cell").size().reindex(rel.cell).to_numpy()
    t = k / eps
    sd = math.sqrt(2 * math.exp(-1 / t) / (1 - math.exp(-1 / t)) ** 2)
    assert len(noise) > 300 and abs(noise.std() - sd) < 0.2 * sd, (noise.std(), sd)


def test_a_release_leaves_out_a_row_without_a_unit_id_and_counts_it_with_the_cap():
    """cap_units: a row without a unit id belongs to no unit (left out, counted in the PRIVATE
    dropped count with the rows the cap drops), never a refusal; the other units are capped at k."""
    df = pd.DataFrame({"pid": ["a", "a", "a", "b", None, "c", "  "], "x": range(7)})
    rng = SimpleNamespace(numpy=lambda name: np.random.default_rng(0))
    out, dropped = release_task.cap_units(df, UnitBound("pid", 2), rng)
    assert out["pid"].value_counts().to_dict() == {"a": 2, "b": 1, "c": 1}
    assert dropped == 3 and set(out["x"]) <= {0, 1, 2, 3, 5}
