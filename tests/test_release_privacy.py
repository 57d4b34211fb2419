"""Regression tests of the release side's privacy findings (each docstring says what the old
code did; each test asserts the attack property is now false, or the leak is gone).

Findings: the list of cells came from the rows present; release.json of every method carried
MOS's chi and MOS's counts; default runs wrote figures and comparisons from exact values into
the run folder; the Theil-Sen pair limit aborted every release quoting a private N; NoisyStats
was labelled add/remove; DP-SGD's noise was float32 on a float64 model; suppression's exact
values were not called exact; logs and errors quoted private counts.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_module

from dptrain.privacy.randomness import seeded_mt19937
from dptrain.release.cell_domain import select_cells, selection_threshold
from dptrain.release.cells import Domain, group_cells, make_cells
from dptrain.release.methods import theil_sen as _theilsen
from dptrain.release.methods.dp_gd import DPGDConfig, dp_gradient_descent
from dptrain.release.methods.dp_sgd import DPSGDConfig, SquaredLossLinearEngine, dp_sgd_engine
from dptrain.release.methods.noisy_stats import noisy_stats
from dptrain.release.methods.ss_laplace import sufficient_stats_laplace
from dptrain.release.methods.suppression import suppression
from dptrain.release.methods.theil_sen import TheilSenConfig, dp_theil_sen
from dptrain.tasks import cli

CELLS = ["a", "b", "c", "d", "e"]
DECLARED = "release.cell_values={cell: [a, b, c, d, e, f]}"


TABLE_DOMAIN = "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}"


def _run(overrides: list[str], run_dir: Path) -> float:
    if "data=table" in overrides and not any(o.startswith("release.domain") for o in overrides):
        overrides = [*overrides, TABLE_DOMAIN]  # the PUBLIC domain is required for a table (ranks here)
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return cli.run(cfg, run_dir=run_dir)


def _table(sizes: list[int], seed: int = 0, names: list[str] | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    names = names or CELLS[:len(sizes)]
    cell = np.repeat(names, sizes)
    x = rng.random(cell.size)
    return pd.DataFrame({"cell": cell, "x": x,
                         "y": np.clip(0.2 + 0.5 * x + 0.1 * rng.standard_normal(cell.size), 0, 1)})


def _release(tmp_path: Path, df: pd.DataFrame, name: str, extra: list[str]) -> tuple[pd.DataFrame, dict]:
    p = tmp_path / f"{name}.csv"
    df.to_csv(p, index=False)
    _run(["task=release", "data=table", f"data.path={p}", *extra], tmp_path / name)
    return (pd.read_csv(tmp_path / name / "release.csv", keep_default_na=False),
            json.loads((tmp_path / name / "release.json").read_text()))


# ------------------------------------------------------------------ (a) the list of cells
def test_declared_cells_do_not_move_with_the_only_row_of_a_cell(tmp_path):
    """Old behaviour: cells were the distinct values observed in the rows, so with
    release.method=ss_laplace ("epsilon-DP (pure), add/remove") removing the only row of cell e
    removed e from release.csv: membership of that person decided with certainty. The old
    mechanism is reproduced below (group_cells on D and D minus the row gives different cell
    lists); the release run now lists the declared cells either way."""
    d = _table([30, 40, 25, 35, 1])
    d_minus = d[d.cell != "e"]
    old_with, old_without = (set(group_cells(t, x="x", y="y", cells=["cell"], domain=Domain()).keys.cell)
                             for t in (d, d_minus))
    assert old_with != old_without  # the old leak: the cell list itself told whether the person was in
    rel_with, meta_with = _release(tmp_path, d, "with", [DECLARED, "release.method=ss_laplace"])
    rel_without, meta_without = _release(tmp_path, d_minus, "without", [DECLARED, "release.method=ss_laplace"])
    assert list(rel_with.cell) == list(rel_without.cell) == ["a", "b", "c", "d", "e", "f"]
    assert list(rel_with.columns) == list(rel_without.columns)
    assert meta_with["cells"]["listed"] == meta_without["cells"]["listed"] == 6
    assert meta_with["neighbours"] == "add_remove" and meta_with["cell_selection"]["mode"] == "declared"


def test_release_refused_without_a_declaration_before_any_row_is_read(tmp_path, capsys):
    """Without a declaration the old code took the cells from the rows; now the release is refused
    before the data file is even opened (a missing file is not what the error talks about)."""
    with pytest.raises(SystemExit) as exc:
        _run(["task=release", "data=table", f"data.path={tmp_path / 'does_not_exist.csv'}"], tmp_path / "run")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for needle in ("release.cell_values", "release.cell_keys_file", "release.cell_selection=private", "refused"):
        assert needle in err, needle
    assert "no such file" not in err and not (tmp_path / "run").exists()


def test_cell_keys_file_and_rows_outside_left_out_without_count(tmp_path, caplog):
    """A cell-keys file declares a domain that is not a product; rows of undeclared cells (and
    rows with a missing cell value) are left out one by one, counted in private/data_diagnostics.json
    and in the one PRIVATE console line for the data holder, in no other log record."""
    d = _table([30, 40, 25, 1013, 20], names=["a", "b", "c", "zzz", "d"])
    d.loc[d.index[:3], "cell"] = None
    keys = tmp_path / "keys.csv"
    pd.DataFrame({"cell": ["a", "b", "c", "d", " e "], "region": ["N", "N", "S", "S", "S"]}).to_csv(keys, index=False)
    caplog.set_level(logging.INFO)
    rel, meta = _release(tmp_path, d, "run", [f"release.cell_keys_file={keys}", "release.chi_by=[region]"])
    assert list(rel.cell) == ["a", "b", "c", "d", " e "] or list(rel.cell) == ["a", "b", "c", "d", "e"]
    assert set(rel.group) == {"N", "S"} and len(meta["chi"]) == 2  # chi groups from the public key file
    assert not rel.loc[4, "released"] and rel.loc[4, "reason"] == "n < 3"  # declared, no rows
    private = [m for m in caplog.messages if "PRIVATE counts" in m]
    assert len(private) == 1 and "cells: 1016 not_listed_or_missing" in private[0]
    assert not any("1013" in m or "1016" in m for m in caplog.messages if "PRIVATE counts" not in m)
    rows = json.loads((tmp_path / "run" / "private" / "data_diagnostics.json").read_text())["rows"]
    assert rows["left_out_by"]["cells"] == {"not_listed_or_missing": 1016}


def test_selection_threshold_is_exact():
    for eps, delta in [(0.1, 1e-6), (0.5, 1e-9), (1.0, 1e-6), (2.0, 0.01), (1.0, 0.2), (5.0, 0.3)]:
        tau = selection_threshold(eps, delta)
        q = math.exp(-eps)

        def tail(m, q=q):  # P(K >= m) of the discrete Laplace
            return q ** m / (1 + q) if m >= 1 else 1 - q ** (1 - m) / (1 + q)

        assert tail(tau - 1) <= delta < tail(tau - 2), (eps, delta, tau)  # the least such threshold


def test_private_selection_lists_a_one_row_cell_with_probability_at_most_delta():
    """The stability histogram: a cell whose only row is present is listed with probability <=
    delta_sel (measured at a large delta), while big cells are listed."""
    d = _table([200, 300, 1])
    eps, delta = 1.0, 0.1
    rng = np.random.default_rng(7)
    hits = sum("c" in set(select_cells(d, ["cell"], epsilon=eps, delta=delta, rng=rng).keys.cell)
               for _ in range(4000))
    tau = selection_threshold(eps, delta)
    expected = math.exp(-eps * (tau - 1)) / (1 + math.exp(-eps))
    assert expected <= delta and abs(hits / 4000 - expected) < 4 * math.sqrt(expected / 4000) + 1e-3
    listed = select_cells(d, ["cell"], epsilon=eps, delta=1e-6, rng=rng)
    assert list(listed.keys.cell) == ["a", "b"] and listed.selection["threshold"] == selection_threshold(eps, 1e-6)


@pytest.mark.parametrize("method,neighbours,eps_total,delta_total", [
    ("ss_laplace", "add_remove", 1.0 + 0.5, 1e-6),
    ("noisy_stats", "replace_one", 2.0 + 2 * 0.5, (1 + math.exp(0.5)) * 1e-6),
])
def test_private_selection_is_reported_and_composed(tmp_path, method, neighbours, eps_total, delta_total):
    """Old behaviour: no selection at all (observed cells, no cost). Now release.json states the
    selection's epsilon and delta and composes them into the totals (basic composition)."""
    rel, meta = _release(tmp_path, _table([200, 300, 250, 1]), "run",
                         ["release.cell_selection=private", "release.selection_epsilon=0.5",
                          "release.selection_delta=1e-6", f"release.method={method}"])
    sel = meta["cell_selection"]
    assert sel["mode"] == "private" and sel["epsilon"] == 0.5 and sel["delta"] == 1e-6
    assert sel["threshold"] == selection_threshold(0.5, 1e-6)
    assert meta["neighbours"] == neighbours
    assert meta["total"]["epsilon"] == pytest.approx(eps_total)
    assert meta["total"]["delta"] == pytest.approx(delta_total)
    assert "basic composition" in meta["total"]["note"] and "basic composition" in meta["guarantee"]
    assert set(rel.cell) <= {"a", "b", "c", "d"} and {"a", "b", "c"} <= set(rel.cell)  # big cells pass


# ------------------------------------------------------------------ zero-row declared cells
@pytest.mark.parametrize("stat", ["p25", "slope"])
def test_every_method_handles_a_declared_cell_without_rows(stat):
    rng = np.random.default_rng(0)
    ns = [0, 1, 2, 3, 40, 0]
    codes = np.repeat(np.arange(len(ns)), ns)
    x = rng.random(codes.size)
    y = np.clip(0.3 + 0.4 * x + 0.1 * rng.standard_normal(codes.size), 0, 1)
    c = make_cells(x, y, codes, keys=pd.DataFrame({"cell": list("abcdef")}), domain=Domain())
    from dptrain.release.mos import release_mos
    from dptrain.release.sensitivity import local_sensitivity, se_local_sensitivity

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no division by zero / NaN arithmetic on empty cells
        for nb in ("add", "add_remove"):
            for fn in (local_sensitivity, se_local_sensitivity):
                s = fn(c, statistic=stat, neighbors=nb)
                assert np.isinf(s.ls[[0, 5]]).all() and set(s.reason[[0, 5]]) == {"n < 3"}
        mos = release_mos(c, statistic=stat, epsilon=1.0, seed=0).frame
        assert list(mos.reason[[0, 5]]) == ["n < 3", "n < 3"] and len(mos) == 6
        for f, kw in [(suppression, {"k": 5}), (sufficient_stats_laplace, {"epsilon": 1.0, "rng": rng}),
                      (noisy_stats, {"epsilon": 1.0, "rng": rng}),
                      (dp_theil_sen, {"epsilon": 1.0, "rng": rng, "config": TheilSenConfig(variant="auto", k=5)}),
                      (dp_gradient_descent, {"epsilon": 1.0, "delta": 1e-5, "rng": rng,
                                             "config": DPGDConfig(iterations=10)}),
                      (dp_sgd_engine, {"epsilon": 1.0, "delta": 1e-5, "rng": rng, "config": DPSGDConfig(steps=10)})]:
            df, _ = f(c, statistic=stat, **kw)
            assert len(df) == 6 and all(df.loc[~df.released, "reason"] != ""), f.__name__


def test_zero_row_cell_through_the_private_evaluation(tmp_path):
    rel, _ = _release(tmp_path, _table([30, 40, 25, 35, 20]), "run",
                      [DECLARED, "release.private_evaluation=true", "release.tail_epsilons=[1]"])
    assert list(rel.cell)[-1] == "f" and not rel.released.iloc[-1]
    ev = tmp_path / "run" / "private" / "evaluation"
    assert (ev / "comparison.csv").exists() and (ev / "fig2_ls_vs_n.png").exists()


# ------------------------------------------------------------------ (b), (e), (g) release.json
@pytest.mark.parametrize("method", ["ss_laplace", "noisy_stats", "theil_sen", "dp_gd", "dp_sgd", "suppression_10"])
def test_release_json_holds_only_its_own_facts(tmp_path, method, caplog):
    """Old behaviour: every method's release.json carried MOS's chi (private), MOS's released /
    not-released counts (cells_released: 6 while ss_laplace released 5), the MOS "NOT differentially
    private" note and the MOS neighbour setting (noisy_stats said add_remove, epsilon 2.0); and
    suppression's exact values were not called exact."""
    caplog.set_level(logging.INFO)
    rel, meta = _release(tmp_path, _table([30, 40, 25, 35, 2]), "run", [DECLARED, f"release.method={method}"])
    text = json.dumps(meta)
    assert not {"chi", "chi_by", "mos_details", "caveats", "privacy"} & set(meta)
    assert "MOS" not in text and "chi" not in json.dumps(meta["details"]).replace("matchings", "")
    assert meta["method"] == method
    assert meta["cells"]["released"] == int(rel.released.sum()) and meta["cells"]["listed"] == 6
    assert sum(meta["cells"]["not_released"].values()) == int((~rel.released).sum())
    if method in ("noisy_stats", "theil_sen"):
        assert meta["neighbours"] == "replace_one" and meta["epsilon"] == 2.0
        assert meta["epsilon_add_remove_comparison"] == 1.0
        assert "NOT a guarantee" in meta["epsilon_add_remove_comparison_note"]
    elif method.startswith("suppression"):
        assert meta["neighbours"] is None and meta["epsilon"] is None
        assert meta["guarantee"].startswith("none") and "EXACT" in meta["guarantee"]
        assert any("EXACT" in m and "NOT" in m for m in caplog.messages if "suppression" in m)
    else:
        assert meta["neighbours"] == "add_remove" and meta["epsilon"] == 1.0
        assert "epsilon_add_remove_comparison" not in meta
    assert meta["delta"] == (1e-6 if method in ("dp_gd", "dp_sgd") else (None if "supp" in method else 0.0))


# ------------------------------------------------------------------ (c) private evaluation
def test_exact_value_evaluation_is_private_and_off_for_real_data(tmp_path):
    """Old behaviour: every default run wrote fig1 (a real cell's raw rows), fig2 / error plots
    (each cell's exact N) and comparison.csv (counts per true-N band) next to release.csv."""
    d = _table([30, 40, 25, 35, 20])
    _release(tmp_path, d, "default", [DECLARED])
    files = {p.relative_to(tmp_path / "default").as_posix() for p in (tmp_path / "default").rglob("*") if p.is_file()}
    # private/data_diagnostics.json: counts of values clipped into release.domain (PRIVATE, listed so)
    assert files == {"release.csv", "release.json", "FILES.txt", "private/data_diagnostics.json"}, files
    assert "private/dptrain.log" in (tmp_path / "default" / "FILES.txt").read_text()
    _release(tmp_path, d, "on", [DECLARED, "release.private_evaluation=true", "release.tail_epsilons=[1]"])
    top = {p.name for p in (tmp_path / "on").iterdir() if p.is_file()}
    assert top == {"release.csv", "release.json", "FILES.txt"}
    assert not list((tmp_path / "on").glob("*.png"))
    ev = {p.name for p in (tmp_path / "on" / "private" / "evaluation").iterdir()}
    assert {"comparison.csv", "comparison.md", "fig1_local_sensitivity.png"} <= ev
    manifest = (tmp_path / "on" / "FILES.txt").read_text()
    private_part = manifest.split("PRIVATE:")[1]
    assert "private/evaluation/comparison.csv" in private_part and "release.csv" not in private_part


# ------------------------------------------------------------------ (d) Theil-Sen pair limit
def test_theil_sen_pair_limit_degrades_only_theil_sen_and_quotes_no_n(tmp_path, monkeypatch, capsys):
    """Old behaviour: a cell with more pairs than MAX_PAIRS (N >= 6,326) aborted the whole default
    release, even method=mos, with an error quoting the private N and advising
    release.variant=matchings, a key the schema refused."""
    monkeypatch.setattr(_theilsen, "MAX_PAIRS", 100)  # cells of N >= 16 are over the limit
    d = _table([37, 43, 29, 53, 5])
    rel, meta = _release(tmp_path, d, "mos", [DECLARED, "release.private_evaluation=true",
                                              "release.tail_epsilons=[1]", "release.theil_sen_variant=all_pairs"])
    assert rel.released.sum() >= 3  # MOS unaffected
    rel, meta = _release(tmp_path, d, "auto", [DECLARED, "release.method=theil_sen"])
    assert rel.released.iloc[:5].all() and meta["details"]["variant"] == "auto"
    rel, meta = _release(tmp_path, d, "all", [DECLARED, "release.method=theil_sen",
                                              "release.theil_sen_variant=all_pairs"])
    assert list(rel.released.iloc[:5]) == [False, False, False, False, True]
    for reason in rel.reason.iloc[:4]:
        assert "all-pairs limit" in reason and not any(str(n) in reason for n in (37, 43, 29, 53))
    assert "release.theil_sen_variant" in reason
    err = capsys.readouterr().err
    assert not any(str(n) in err for n in (37, 43, 29, 53))


# ------------------------------------------------------------------ (f) float64 noise
def test_dp_sgd_baseline_noise_is_float64():
    """Old behaviour: the DP-SGD baseline drew float32 noise for its float64 model (the low-order
    bits of the float64 gradient sum survived the noise) and seeded it with manual_seed (32
    bits). Here, on empty batches (noise only, B = 1, C = 1), every noisy gradient must carry
    float64 bits: some values are not float32 numbers."""
    model = torch.nn.Linear(1, 1).double()
    gen = seeded_mt19937(np.random.default_rng(0).integers(1, 2**32, size=624, dtype=np.uint64).astype(np.uint32))
    eng = SquaredLossLinearEngine(model, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0,
                                    generator=gen)
    x, y = torch.zeros((0, 1), dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    vals = []
    for _ in range(50):
        eng(x, y)
        for p in model.parameters():
            assert p.grad.dtype == torch.float64
            vals.append(p.grad.detach().clone())
    g = torch.cat([v.reshape(-1) for v in vals])
    assert (g.float().double() != g).float().mean() > 0.9  # float64 noise, not float32 cast up


# ------------------------------------------------------------------ (h) no private counts in logs / errors
COUNTS = ("1013", "1117", "1223", "1327", "1433", "6113", "1549", "7662")


def test_logs_and_errors_quote_no_private_count(tmp_path, caplog, capsys):
    """Old behaviour: the log said `release: 241 rows in 7 cells` and `MOS: 6 of 7 cells
    released`; errors quoted row counts (`3 missing ... entries of 241 rows`, `2 cells span several
    groups`). Here cells hold 1013..1433 rows (6113 in all), 1549 rows are outside the declared
    cells (7662 rows in the file): none of these numbers may appear in a log message or an error."""
    d = pd.concat([_table([1013, 1117, 1223, 1327, 1433]),
                   _table([1549], seed=1, names=["zzz"])], ignore_index=True)
    p = tmp_path / "micro.csv"
    d.to_csv(p, index=False)
    caplog.set_level(logging.DEBUG)
    _run(["task=release", "data=table", f"data.path={p}", DECLARED, "release.private_evaluation=true",
          "release.tail_epsilons=[1]"], tmp_path / "run")
    _run(["task=release", "data=table", f"data.path={p}", DECLARED, "release.method=ss_laplace"], tmp_path / "run2")
    _run(["task=release", "data=table", f"data.path={p}", "release.cell_selection=private"], tmp_path / "run3")
    bad = d.copy()
    bad["x"] = bad["x"].astype(object)
    bad.loc[bad.index[:1013], "x"] = "n/a"
    bad.loc[bad.index[:1117], "y"] = 3.0
    bad.to_csv(tmp_path / "bad.csv", index=False)
    for extra in (["release.chi_by=[region]"], ["data.nonfinite=error"],
                  ["release.rate_outcome=true", "release.method=suppression_10", "release.y=x", "release.x=y"]):
        src = p if extra[0].startswith("release.") else tmp_path / "bad.csv"
        with pytest.raises(SystemExit):
            _run(["task=release", "data=table", f"data.path={src}", DECLARED, *extra], tmp_path / "bad")
    # rows outside the domain (release.clip=false) and x entries that are no numbers: left out by rule (issue 44)
    for n, extra in enumerate((["release.clip=false", "release.x=y"], [])):
        _run(["task=release", "data=table", f"data.path={tmp_path / 'bad.csv'}", DECLARED, *extra],
             tmp_path / f"ran{n}")
    out, err = capsys.readouterr()
    assert err.count("dptrain: error:") == 3
    private = [m for m in caplog.messages if "PRIVATE counts" in m]  # the data holder's one line per run
    assert private and all("rows read" in m for m in private)
    ours = [r.getMessage() for r in caplog.records if r.name.split(".")[0] in ("dptrain", "hydra")]  # not matplotlib's
    for text in (*(m for m in ours if "PRIVATE counts" not in m), out, err):  # debug lines (object addresses)
        for c in COUNTS:
            assert c not in text, (c, text[:300])
