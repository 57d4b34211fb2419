"""task=lodes (experiment=lodes_sim, issue 34): five mechanisms' tables on the simulated jobs data,
the published one at the top, the others and the comparison against exact totals under private/;
the report names the neighbour relation and what it protects; impossible settings are refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from dptrain.tasks import cli


def _run(tmp_path, *overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=lodes_sim", "lodes.establishments=3000",
                                                         *overrides])
    run = tmp_path / "run"
    cli.run(cfg, run_dir=run)
    return run


def test_lodes_sim_publishes_one_table_and_keeps_the_comparison_private(tmp_path):
    run = _run(tmp_path)
    report = json.loads((run / "privacy.json").read_text())
    assert report["published"] == "log_laplace" and "(0.1, 4)-er_ee" in report["guarantee"]
    assert "factor 1 + alpha = 1.1" in report["guarantee"] and "NOT an establishment's size" in json.dumps(
        report["mechanisms"]["laplace_worker"])
    top = pd.read_csv(run / "tables" / "place__sector__ownership.csv")
    assert {"place", "sector", "ownership", "released", "ci_low", "ci_high"} <= set(top.columns)
    assert (top.ci_low <= top.released).all() and (top.released <= top.ci_high).all()
    for other in ("smooth_gamma", "smooth_laplace", "laplace_worker", "employer_laplace"):
        table = pd.read_csv(run / "private" / "tables" / other / "place__sector__ownership.csv")
        assert (table.ci_low <= table.released).all() and (table.released <= table.ci_high).all()
        if other.startswith("smooth"):  # continuous noise: a proper interval around every cell
            assert (table.ci_high - table.ci_low > 1).all()
    assert "NOT public: an establishment's size or size class" in report["public"] and "public grid" in report["noise"]
    assert sorted(p.name for p in (run / "tables").iterdir()) == ["place__sector__ownership.csv"]
    comparison = pd.read_csv(run / "private" / "comparison.csv")
    assert set(comparison.mechanism) == {"log_laplace", "smooth_gamma", "smooth_laplace", "laplace_worker",
                                         "employer_laplace"}
    worker = comparison[comparison.mechanism == "laplace_worker"].mae.mean()
    employer = comparison[comparison.mechanism == "employer_laplace"].mae.mean()
    assert worker < 1.0 < 50 < employer  # worker-level: noise 1/epsilon; employer-level: cap/epsilon
    files = (run / "FILES.txt").read_text()
    assert "tables/place__sector__ownership.csv" in files.split("PRIVATE")[0]
    assert "comparison.csv" in files.split("PRIVATE")[1]


def test_every_marginal_is_released_with_its_composition_stated(tmp_path):
    run = _run(tmp_path, "lodes.marginals=all")
    report = json.loads((run / "privacy.json").read_text())
    assert len(report["tables"]) == 7 and report["per_table"]["epsilon"] == pytest.approx(4 / 7)
    assert "7 tables" in report["guarantee"] and "composed sequentially" in report["guarantee"]
    assert report["not_run"] == ["smooth_gamma", "smooth_laplace"]  # beta <= ln(1.1) at epsilon 4/7
    place = pd.read_csv(run / "tables" / "place.csv")
    finest = pd.read_csv(run / "tables" / "place__sector__ownership.csv")
    assert set(place.place) == set(finest.place) and len(place) < len(finest)
    with pytest.raises(SystemExit):
        _run(tmp_path / "x", "lodes.marginals=all", "lodes.publish=smooth_gamma")  # not defined there: refused


def test_a_published_mechanism_undefined_at_its_alpha_is_refused(tmp_path, capsys):
    """The smooth mechanisms need beta > ln(1 + alpha): publishing one where it is not defined is
    refused by name; another published mechanism runs, and the report says which did not run."""
    with pytest.raises(SystemExit) as stop:
        _run(tmp_path, "lodes.alpha=0.5", "lodes.publish=smooth_gamma")
    assert stop.value.code == 2 and "lodes.publish" in capsys.readouterr().err and not (tmp_path / "run").exists()
    run = _run(tmp_path / "ok", "lodes.alpha=0.5")
    assert json.loads((run / "privacy.json").read_text())["not_run"] == ["smooth_gamma", "smooth_laplace"]


def test_sector_medians_by_smooth_sensitivity(tmp_path):
    """lodes.median: each sector's median establishment size by the NRS smooth-sensitivity median,
    clamped into the public bounds; its epsilon adds to the run's in the report; the exact medians
    stay under private/."""
    run = _run(tmp_path, "lodes.median=true", "lodes.establishments=20000")
    report = json.loads((run / "privacy.json").read_text())
    assert "median establishment size" in report["guarantee"] and "(0.1, 5)-er_ee in all" in report["guarantee"]
    released = pd.read_csv(run / "tables" / "median_size_by_sector.csv")
    exact = pd.read_csv(run / "private" / "median_exact.csv")
    assert "exact" not in released.columns and released.median_size.between(1, 30000).all()
    big = exact.establishments > 1000  # large sectors: the median within a few workers
    err = abs(exact.median_size - exact.exact)[big]  # heavy-tailed noise: its 99.9% point is 10-15 workers here
    assert big.any() and (err < 40).all() and err.median() < 2, exact


def _one_largest_of_nine(jobs):
    """An establishment of 9 workers that is the only largest one of its place x sector x ownership cell."""
    key = jobs.place.astype(np.int64) * 1000 + jobs.sector * 10 + jobs.ownership
    frame = pd.DataFrame({"key": key, "size": jobs.size})
    top = frame.groupby("key")["size"].transform("max")
    ties = frame.groupby("key")["size"].transform(lambda s: (s == s.max()).sum())
    return int(frame.index[(frame["size"] == 9) & (top == 9) & (ties == 1)][0])


@pytest.mark.parametrize("name", ["smooth_laplace", "smooth_gamma"])
def test_smooth_intervals_do_not_name_the_size_class_of_the_largest_establishment(name, monkeypatch):
    """Issue 43, finding 6: the smooth mechanisms' intervals used the top of the size class of each
    cell's largest establishment, computed from the private sizes: the width named the class (1,004
    of 1,211 cells) while the headline protects a size up to a factor 1.1. Replayed on strong
    alpha-neighbours: an establishment of 9 (the largest of its cell, class 5-9) grows to 10 (class
    10-19). With the same released counts, every interval must be the same; the old width moved
    from S(9) to S(19) in that cell."""
    import dataclasses

    from dptrain.data.jobs import simulate_jobs
    from dptrain.release.employer import mechanisms
    from dptrain.settings.lodes import LodesConfig, LodesRunConfig
    from dptrain.tasks import lodes

    jobs = simulate_jobs(3, establishments=3000)
    target = _one_largest_of_nine(jobs)
    size = jobs.size.copy()
    size[target] = 10  # max((1 + 0.1) 9, 9 + 1) = 10: a strong 0.1-neighbour
    neighbour = dataclasses.replace(jobs, size=size)
    fixed = np.linspace(20.0, 400.0, len(jobs.cell_totals()))  # the same release for both: only the interval differs
    monkeypatch.setattr(mechanisms, name, lambda n, *args, **kwargs: fixed.copy())
    conf = LodesRunConfig(lodes=LodesConfig(alpha=0.1))
    tables = [lodes.release(name, j.cell_totals(), conf, (4.0, 1e-6), np.random.default_rng(0), max_size=30_000)
              for j in (jobs, neighbour)]
    assert tables[0]["released"].equals(tables[1]["released"])
    assert tables[0][["ci_low", "ci_high"]].equals(tables[1][["ci_low", "ci_high"]])


def test_published_smooth_intervals_are_recomputed_from_the_release_and_public_settings(tmp_path):
    """What an attacker holding the table can do: recompute every interval from the released column
    and the public settings (alpha, epsilon, delta, the largest size 30,000). They match: the width
    carries nothing but the release."""
    from dptrain.release.employer.intervals import smooth_laplace_interval_public

    run = _run(tmp_path, "lodes.publish=smooth_laplace")
    report = json.loads((run / "privacy.json").read_text())
    table = pd.read_csv(run / "tables" / "place__sector__ownership.csv")
    lo, hi = smooth_laplace_interval_public(table["released"].to_numpy(), report["alpha"], report["epsilon"],
                                            report["delta"], 30_000)
    for column, recomputed in (("ci_low", lo), ("ci_high", hi)):  # the table holds 6 significant digits
        assert np.allclose(table[column], recomputed, rtol=1e-4, atol=1e-4)
    assert "factor 1 + alpha = 1.1" in report["guarantee"] and "size class" not in report["guarantee"]
