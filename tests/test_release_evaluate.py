"""dptrain.release.evaluate (docs/release.md section 6), figures, scripts/bench_release.py and the sweep summary."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dptrain.release import figures
from dptrain.release.cells import Domain, ReleaseError
from dptrain.release.evaluate import (
    DEFAULT_BANDS,
    METRICS,
    compare_methods,
    evaluate_release,
    to_markdown,
)

ROOT = Path(__file__).resolve().parents[1]

# Ten hand-made cells: OLS 0.0 .. 0.9, cells 0 and 3 suppressed.
N = np.array([5, 10, 15, 30, 40, 60, 80, 150, 200, 500])
OLS = np.arange(10) / 10
REL = np.array([np.nan, 0.2, -0.1, np.nan, 0.6, 0.5, 0.5, 0.8, 0.2, 1.2])
IS_REL = ~np.isnan(REL)
# errors vs OLS of the released cells: .1 -.3 .2 0 -.1 .1 -.6 .3
TRUTH = OLS + 0.05
COV = 2 * OLS


def frame(se: float | None = None) -> pd.DataFrame:
    df = pd.DataFrame({"released": IS_REL, "theta_released": REL})
    if se is not None:
        df["se_released"] = np.where(IS_REL, se, np.nan)
    return df


@pytest.fixture
def table():
    return evaluate_release(
        released=frame(0.2), ols_theta=OLS, ols_se=np.full(10, 0.1), n=N, truth=TRUTH, covariate=COV
    ).set_index("band")


def test_hand_computed_all_row(table):
    a = table.loc["all"]
    assert list(table.index) == ["[1,20)", "[20,50)", "[50,100)", "[100,300)", "[300,inf)", "all"]
    assert a["n_cells"] == 10 and a["n_released"] == 8 and a["share_released"] == pytest.approx(0.8)
    assert a["rmse_ols"] == pytest.approx(math.sqrt(0.61 / 8))
    assert a["p68_ols"] == pytest.approx(0.276)  # |e| sorted 0 .1 .1 .1 .2 .3 .3 .6; position 4.76
    assert a["ols_se_rms"] == pytest.approx(0.1)
    assert a["rmse_ratio_se"] == pytest.approx(math.sqrt(0.61 / 8) / 0.1)
    assert a["p68_ratio_se"] == pytest.approx(2.76)
    assert a["rmse_truth"] == pytest.approx(math.sqrt(0.66 / 8))  # errors shifted by -0.05
    # noise share: Var(e) / Var(released), population variances
    assert a["noise_var_share"] == pytest.approx((0.07625 - 0.0375**2) / (3.03 / 8 - 0.4875**2))
    # true top quintile {8, 9}: 9 (1.2) is in the released top quintile (>= 0.72), 8 (0.2) is not;
    # true bottom {0, 1}: 0 suppressed, 1 (0.2) is in the released bottom quintile (<= 0.2)
    assert a["tail_top"] == pytest.approx(0.5) and a["tail_bottom"] == pytest.approx(0.5)
    assert a["slope_truth"] == pytest.approx(0.5)
    assert a["slope_released"] == pytest.approx(np.polyfit(COV[IS_REL], REL[IS_REL], 1)[0])
    assert a["slope_bias"] == pytest.approx(a["slope_released"] - 0.5)
    assert a["coverage95"] == pytest.approx(7 / 8)  # only |-0.65| > 1.96 * 0.2


def test_hand_computed_bands(table):
    exp = {
        "[1,20)": (3, 2 / 3, math.sqrt(0.05)),
        "[20,50)": (2, 0.5, 0.2),
        "[50,100)": (2, 1.0, math.sqrt(0.005)),
        "[100,300)": (2, 1.0, math.sqrt(0.185)),
        "[300,inf)": (1, 1.0, 0.3),
    }
    for band, (cells, share, rmse) in exp.items():
        row = table.loc[band]
        assert row["n_cells"] == cells and row["share_released"] == pytest.approx(share), band
        assert row["rmse_ols"] == pytest.approx(rmse) and row["rmse_ratio_se"] == pytest.approx(
            rmse / 0.1
        ), band
    assert table.loc["[1,20)", "p68_ols"] == pytest.approx(0.1 + 0.68 * 0.2)
    assert math.isnan(table.loc["[300,inf)", "noise_var_share"])  # one cell: no variance


def test_without_truth_covariate_or_se():
    t = evaluate_release(
        released=frame(),
        ols_theta=OLS,
        ols_se=np.full(10, 0.1),
        n=N,
        bands=[(1, 100), (100, math.inf)],
    ).set_index("band")
    assert list(t.index) == ["[1,100)", "[100,inf)", "all"] and list(t.columns[2:]) == list(METRICS)
    a = t.loc["all"]
    assert (
        math.isnan(a["rmse_truth"]) and math.isnan(a["coverage95"]) and math.isnan(a["slope_bias"])
    )
    assert a["tail_top"] == pytest.approx(0.5)  # reference falls back to OLS (same order here)


def test_ideal_gaussian_release_covers_95():
    """OLS = truth + sampling error (SE se); release = OLS + N(0, tau^2) noise; the released SE
    sqrt(se^2 + tau^2) gives 95% coverage of the truth in every band."""
    rng = np.random.default_rng(0)
    g = 20_000
    n = rng.integers(5, 1000, g)
    truth = rng.random(g)
    se, tau = 0.5 / np.sqrt(n), 0.3 / np.sqrt(n)
    ols_theta = truth + se * rng.standard_normal(g)
    theta = ols_theta + tau * rng.standard_normal(g)
    df = pd.DataFrame(
        {"released": True, "theta_released": theta, "se_released": np.sqrt(se**2 + tau**2)}
    )
    t = evaluate_release(released=df, ols_theta=ols_theta, ols_se=se, n=n, truth=truth).set_index(
        "band"
    )
    assert t.loc["all", "coverage95"] == pytest.approx(0.95, abs=0.01)
    assert (t["coverage95"].iloc[:-1] - 0.95).abs().max() < 0.03
    assert t.loc["all", "share_released"] == 1.0 and 0.8 < t.loc["all", "tail_top"] < 1.0
    assert t.loc["all", "rmse_ols"] == pytest.approx(np.sqrt(np.mean(tau**2)), rel=0.05)
    assert t.loc["all", "noise_var_share"] == pytest.approx(
        np.mean(tau**2) / np.var(theta), rel=0.1
    )


def test_refusals():
    with pytest.raises(ReleaseError, match="theta_released"):
        evaluate_release(
            released=pd.DataFrame({"released": IS_REL}), ols_theta=OLS, ols_se=OLS, n=N
        )
    with pytest.raises(ReleaseError, match="ols_theta has 3 entries"):
        evaluate_release(released=frame(), ols_theta=OLS[:3], ols_se=OLS, n=N)


def test_compare_methods_and_markdown():
    kw = {"ols_theta": OLS, "ols_se": np.full(10, 0.1), "n": N, "truth": TRUTH}
    long = compare_methods({"mos": frame(0.2), "suppress|k=10": frame()}, **kw)
    assert list(long.columns[:2]) == ["method", "band"] and len(long) == 2 * (
        len(DEFAULT_BANDS) + 1
    )
    assert long.groupby("method").size().to_dict() == {"mos": 6, "suppress|k=10": 6}
    md = to_markdown(long[["method", "band", "n_cells", "rmse_ols", "coverage95"]])
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(long)
    assert lines[0].startswith("| method") and set(lines[1]) <= {"|", "-", ":"}
    assert all(line.count("|") - line.count("\\|") == 6 for line in lines)
    assert "suppress\\|k=10" in md and "nan" not in md.lower()
    assert f"{math.sqrt(0.61 / 8):.4g}" in md


def test_refit_statistic_matches_polyfit():
    rng = np.random.default_rng(2)
    x, y = rng.random(30), rng.random(30)
    for xs, ys in [(0.0, 1.0), (1.0, 0.0), (0.3, 0.7)]:
        b, a = np.polyfit(np.append(x, xs), np.append(y, ys), 1)
        got = figures.refit_statistic(
            x, y, np.array(xs), np.array(ys), statistic="p25", domain=Domain()
        )
        assert got == pytest.approx(a + 0.25 * b)
        got = figures.refit_statistic(
            x, y, np.array(xs), np.array(ys), statistic="slope", domain=Domain()
        )
        assert got == pytest.approx(b)


def is_png(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 2000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_write_png(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.random(25), rng.random(25)
    assert is_png(
        figures.plot_local_sensitivity_cell(
            x, y, statistic="p25", domain=Domain(), path=tmp_path / "a/ls.png"
        )
    )
    def med(u, v):
        return float(np.median(v))

    assert is_png(
        figures.plot_local_sensitivity_cell(
            x, y, statistic=med, domain=Domain(), path=tmp_path / "ls2.png", grid=9
        )
    )
    n = rng.integers(3, 300, 200).astype(float)
    ls = rng.random(200) / n
    ls[0] = np.inf
    assert is_png(
        figures.plot_ls_vs_n(n, ls, float(np.max(n[1:] * ls[1:])), path=tmp_path / "lsn.png")
    )
    err = {
        "mos": (n, rng.random(200) / np.sqrt(n)),
        "suppress": (n, np.where(n < 20, np.nan, 0.01)),
    }
    assert is_png(figures.plot_error_vs_n(err, path=tmp_path / "err.png"))
    assert is_png(
        figures.plot_downstream_slopes(
            {"truth": 0.08, "suppress k=10": 0.02, "mos": 0.079}, 0.08, path=tmp_path / "slopes.png"
        )
    )
    assert is_png(
        figures.plot_tail_vs_epsilon(
            [0.25, 1, 4],
            {"mos": [0.4, 0.6, 0.8], "sslap": [0.3, 0.4, 0.7]},
            path=tmp_path / "tail.png",
        )
    )
    with pytest.raises(ReleaseError, match="statistic='median'"):
        figures.plot_local_sensitivity_cell(
            x, y, statistic="median", domain=Domain(), path=tmp_path / "x.png"
        )


def test_bench_script_small(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/bench_release.py"),
            "--rows",
            "20000",
            "--cells",
            "400",
            "--out",
            str(tmp_path / "release.csv"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "make_cells" in out.stdout
        and "peak memory (VmHWM)" in out.stdout
        and "goal <= 60 s" in out.stdout
    )


def test_summarize_release_sweep_reads_private_evaluations(tmp_path):
    """scripts/summarize_release_sweep.py reads each run's private/evaluation/comparison.csv; its
    epsilon column is release.epsilon_per_statistic (release.epsilon in a sweep run before the rename)."""
    kw = dict(ols_theta=OLS, ols_se=np.full(10, 0.1), n=N, truth=TRUTH, covariate=COV)
    for eps, key in ((1, "release.epsilon_per_statistic"), (2, "release.epsilon")):
        run = tmp_path / "sweep" / f"{key}={eps}"
        (run / "private" / "evaluation").mkdir(parents=True)
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(f"- {key}={eps}\n")
        compare_methods({"mos": frame(0.2), "ss_laplace": frame()}, **kw).to_csv(
            run / "private" / "evaluation" / "comparison.csv", index=False)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/summarize_release_sweep.py"), str(tmp_path / "sweep"),
                          "--out", str(tmp_path / "out")], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert set(summary.epsilon) == {1.0, 2.0} and set(summary.method) == {"mos", "ss_laplace"}
    assert "eps=2" in (tmp_path / "out" / "summary.md").read_text()


def test_coverage_uses_the_methods_own_interval_and_counts_cells_without_one():
    """With ci_low / ci_high the interval is the method's (here asymmetric and sometimes missing):
    coverage over cells that have one, interval_share and the median width."""
    n = np.array([10, 10, 60, 60, 400])
    truth = np.array([0.5, 0.5, 0.5, 0.5, 0.5])
    df = pd.DataFrame({
        "released": [True, True, True, False, True],
        "theta_released": [0.6, 0.2, 0.45, np.nan, 0.52],
        "ci_low": [0.45, 0.1, np.nan, np.nan, 0.49],  # cell 2: released without an interval
        "ci_high": [0.9, 0.4, np.nan, np.nan, 0.53],
        "se_released": [9.0, 9.0, 9.0, np.nan, 9.0],  # ignored when the method has an interval
    })
    t = evaluate_release(released=df, ols_theta=truth, ols_se=np.full(5, 0.1), n=n, truth=truth).set_index("band")
    a = t.loc["all"]
    assert a["coverage95"] == pytest.approx(2 / 3)  # cells 0 and 4 cover, cell 1 does not
    assert a["interval_share"] == pytest.approx(3 / 4)
    assert a["ci_width"] == pytest.approx(np.median([0.45, 0.3, 0.04]))
    assert t.loc["[50,100)", "interval_share"] == 0.0 and math.isnan(t.loc["[50,100)", "coverage95"])
