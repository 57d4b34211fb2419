"""task=tabulate (issue 33): DP marginals of a table over its declared domain. The preset runs; every
cell of the declared domain is listed; the released tables are nonnegative integers that agree on
the total and on every 1-way margin; the report's epsilon is recomputed independently from its
per-marginal budget; bad settings are refused by name before any row is read."""

from __future__ import annotations

import itertools
import json
import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.release.cell_domain import selection_threshold
from dptrain.tasks import cli


def _run(tmp_path, *overrides: str):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=adult_marginals", *overrides])
    run = tmp_path / "run"
    cli.run(cfg, run_dir=run)
    return run, json.loads((run / "privacy.json").read_text())


def test_adult_marginals_are_consistent_nonnegative_integers_over_the_declared_domain(tmp_path):
    run, report = _run(tmp_path)
    domain = report["domain"]
    assert len(domain) == 14 and len(report["marginals"]) == math.comb(14, 2)  # 13 declared columns, the target
    margins: dict[str, pd.Series] = {}
    totals = set()
    for m in report["marginals"]:
        table = pd.read_csv(run / "tables" / f"{m['table']}.csv", keep_default_na=False)
        a, b = m["table"].split("__")
        assert len(table) == len(domain[a]) * len(domain[b]) == m["cells"]  # every cell, empty or not
        assert table["count"].dtype.kind == "i" and (table["count"] >= 0).all()
        totals.add(int(table["count"].sum()))
        for col in (a, b):
            margin = table.groupby(col, sort=False)["count"].sum().reindex(domain[col])
            if col in margins:
                assert margin.equals(margins[col]), (m["table"], col)
            margins[col] = margin
    assert len(totals) == 1 and abs(totals.pop() - 48842) < 500  # Adult's 48,842 rows, a noisy total
    evaluation = json.loads((run / "private" / "evaluation.json").read_text())
    assert np.mean([r["l1_over_n"] for r in evaluation["marginals"]]) < 0.08
    files = (run / "FILES.txt").read_text()
    assert "tables/" in files.split("PRIVATE")[0] and "private/evaluation.json" in files.split("PRIVATE")[1]


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_the_reported_epsilon_is_recomputed_from_the_budget_split(tmp_path, mechanism):
    run, report = _run(tmp_path, f"privacy.mechanism={mechanism}", "privacy.epsilon=0.5",
                       "tabulate.marginals=[[age, sex], [race], [income, sex]]")
    parts = report["marginals"]
    assert [p["table"] for p in parts] == ["age__sex", "race", "sex__income"]
    if mechanism == "laplace":
        assert report["delta"] == 0.0 and sum(p["epsilon"] for p in parts) == pytest.approx(report["epsilon"])
        assert report["epsilon"] == pytest.approx(0.5)
    else:
        rho = sum(1.0 / (2.0 * p["sigma"] ** 2) for p in parts)
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.ZCDpEvent(rho))
        assert acc.get_epsilon(1e-6) == pytest.approx(report["epsilon"], rel=1e-9) and report["epsilon"] <= 0.5
    cells = np.array([p["cells"] for p in parts], dtype=float)
    power = 0.5 if mechanism == "gaussian" else 1.0 / 3.0
    assert np.allclose([p["share"] for p in parts], cells**power / np.sum(cells**power))  # finer: more budget


@pytest.mark.parametrize("override,needle", [
    ("tabulate.marginals=0", "tabulate.marginals"),
    ("tabulate.marginals=[[age, nobody]]", "'nobody' is not a declared column"),
    ("tabulate.columns=[age, sexx]", "'sexx' is not a declared column"),
    ("privacy.delta=0.5", "privacy.delta"),
    ("tabulate.bins=1", "tabulate.bins"),
    ("privacy.mechanism=uniform", "privacy.mechanism"),
])
def test_bad_settings_are_refused_by_name_and_nothing_is_written(tmp_path, override, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        _run(tmp_path, override)
    assert stop.value.code == 2 and needle in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_three_way_marginals_are_released_with_a_common_total(tmp_path):
    run, report = _run(tmp_path, "tabulate.columns=[sex, race, income, relationship]", "tabulate.marginals=3")
    sums = {int(pd.read_csv(run / "tables" / f"{m['table']}.csv")["count"].sum()) for m in report["marginals"]}
    assert len(report["marginals"]) == 4 and len(sums) == 1
    assert all(len(m["table"].split("__")) == 3 for m in report["marginals"])
    assert list(itertools.chain(*[m["table"].split("__") for m in report["marginals"]]))


def test_sparse_lists_only_cells_that_clear_the_stability_threshold(tmp_path):
    run, report = _run(tmp_path, "privacy.mechanism=laplace", "tabulate.sparse=true", "tabulate.consistent=false",
                       "privacy.epsilon=4", "privacy.delta=1e-6",
                       "tabulate.marginals=[[education, occupation, native_country]]")
    table = pd.read_csv(run / "tables" / "education__occupation__native_country.csv")
    tau = selection_threshold(4.0, 1e-6)
    assert 0 < len(table) < 17 * 15 * 42 and (table["count"] >= tau).all()
    assert report["epsilon"] == 4.0 and report["delta"] == 1e-6 and "stability-based histogram" in report["guarantee"]
    with pytest.raises(SystemExit):
        _run(tmp_path / "x", "tabulate.sparse=true")  # needs the Laplace and consistent=false: refused by name
