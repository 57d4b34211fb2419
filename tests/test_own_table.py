"""Issue 44: a user's table as people have them (scripts/messy_table.py: 3,000 rows, numbers written
"60,366", blanks, a typo variant "Sud" of "Süd", Unicode labels, an id column, a yes/no target with
"yes" / "Yes" / blanks). `dptrain check` names every problem and the settings that handle it; the
run with those settings trains, and every count in private/data_diagnostics.json equals the truth
of the file (computed by the script with plain pandas). A "Yes" or a blank is never a negative."""

from __future__ import annotations

import importlib.util
import json
import logging
import shlex
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from dptrain.data import load_dataset
from dptrain.tasks import check as table_check
from dptrain.tasks import cli

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["experiment=logit", "trainer.epochs=1", "trainer.batch_size=256", "trainer.progress=false",
         "estimator.interval_share=0", "privacy.noise_multiplier=1.0"]


def _script():
    spec = importlib.util.spec_from_file_location("messy_table_under_test", REPO / "scripts" / "messy_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


MESSY = _script()


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("messy")
    df = MESSY.messy(seed=0)
    path = folder / "people.csv"
    df.to_csv(path, index=False)
    return path, MESSY.truth(df)


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _check(path: Path, folder: Path, extra: list[str], capsys) -> dict:
    code = table_check.main([*MESSY.DECLARED, f"data.path={path}", *extra, f"hydra.run.dir={folder}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (folder / "private" / "check.txt").read_text().strip() in out
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["check.json", "check.txt"]  # nothing else
    return json.loads((folder / "private" / "check.json").read_text())


def test_check_names_every_problem_and_the_settings_then_the_run_counts_the_truth(messy, tmp_path, capsys, caplog):
    path, truth = messy
    report = _check(path, tmp_path / "check1", [], capsys)
    assert report["rows"] == 3000 and report["target"]["missing"] == 72
    assert report["target"]["declared"] == {"no": 1508, "yes": 995}
    assert report["target"]["undeclared"] == [{"label": "Yes", "rows": 425, "variant_of": "yes",
                                               "how": "case or spacing"}]
    assert report["categorical"]["region"]["undeclared"] == [{"label": "Sud", "rows": 150, "variant_of": "Süd",
                                                              "how": "accents"}]
    assert report["categorical"]["region"]["missing"] == 40
    assert report["categorical"]["urban"]["undeclared_rows"] == 0  # 'ländlich' stored decomposed (NFD) matches
    income = report["numeric"]["annual_income"]
    assert income["missing"] == 30 and income["shapes"] == {
        "digits grouped by ',' (like 12,345)": {"entries": 2970, "setting": "data.thousands=','"}}
    assert report["ids"]["person_id"] == {"distinct": truth["persons"]["distinct"],
                                          "repeated_ids": truth["persons"]["repeated_ids"],
                                          "rows_of_repeated_ids": report["ids"]["person_id"]["rows_of_repeated_ids"],
                                          "most_rows_per_id": report["ids"]["person_id"]["most_rows_per_id"]}
    assert report["run"]["train"] == 0  # as declared, every income is unreadable: a run would be refused
    settings = [shlex.split(s)[0] for s in report["settings"]]
    assert settings == MESSY.SETTINGS
    again = _check(path, tmp_path / "check2", settings, capsys)
    assert again["settings"] == [] and again["run"]["kept"] == truth["kept"]

    caplog.set_level(logging.INFO, logger="dptrain")
    run = tmp_path / "run"
    cli.run(_compose([*TRAIN, *MESSY.DECLARED, f"data.path={path}", *settings]), run_dir=run)
    assert (run / "privacy.json").is_file()
    diagnostics = json.loads((run / "private" / "data_diagnostics.json").read_text())
    rows = diagnostics["rows"]
    for key in ("read", "kept", "left_out", "left_out_by", "lumped", "mapped"):
        assert rows[key] == truth[key], key
    assert diagnostics["clipped"] == truth["clipped"]
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["dataset_size"] == rows["train"] and rows["train"] + rows["test"] == truth["kept"]
    # the report says which outcomes still depend on the rows (issue 44): no training row, data.nonfinite=error
    assert any("a read that leaves no training row" in item and "data.nonfinite=error" in item
               for item in privacy["not_covered"])
    line = next(r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage())
    assert f"3000 rows read, {truth['kept']} used, {truth['left_out']} left out" in line
    assert "dptrain check" in caplog.text  # rows were left out and lumped: the pointer to the check
    for f in run.rglob("*"):  # no count of the rules in a publishable file
        if f.is_file() and "private" not in f.parts and f.suffix != ".pt":
            assert b"left_out_by" not in f.read_bytes() and b"3000 rows read" not in f.read_bytes(), f


def test_check_of_a_release_table(tmp_path, capsys):
    """dptrain check with a release's settings (task=release): x and y read with the release's
    rules, the rows a release would leave out (unlisted or missing cells, no number), the listed
    cells below release.min_n; nothing but the private report is written."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"cell": rng.choice(["a", "b", "zz"], 90), "x": rng.uniform(0, 2, 90).round(3),
                       "y": rng.uniform(0, 1, 90)})
    df["x"] = df["x"].astype(object)
    df.loc[:2, "x"] = "unknown"
    df.loc[3:5, "cell"] = None
    path = tmp_path / "rel.csv"
    df.to_csv(path, index=False)
    folder = tmp_path / "check"
    code = table_check.main(["task=release", "data=table", f"data.path={path}", "release.x=x", "release.y=y",
                             "release.cells=[cell]", "release.cell_values={cell: [a, b, c]}",
                             "release.domain={x_lo: 0, x_hi: 1, y_lo: 0, y_hi: 1}", f"hydra.run.dir={folder}"])
    assert code == 0, capsys.readouterr()
    report = json.loads((folder / "private" / "check.json").read_text())
    unlisted = int((df.cell == "zz").sum()) + 3
    assert report["numeric"]["x"]["not_a_number"] == 3 and report["cells"]["cell"]["missing"] == 3
    assert report["numeric"]["x"]["above_upper"] == int((pd.to_numeric(df.x, errors="coerce") > 1).sum())
    assert report["run"]["left_out_by"]["cells"]["not_listed_or_missing"] == unlisted
    assert report["run"]["cells_listed"] == 3 and report["run"]["cells_below_min_n"] == 1  # c: declared, no rows
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["check.json", "check.txt"]


def test_a_yes_or_a_blank_target_is_never_a_negative(messy):
    """995 'yes', 425 'Yes', 72 blanks, 1,508 'no' with data.positive=yes: 497 rows became negatives
    before issue 44. Now only the 'no' rows are negatives; 'Yes' counts as positive only through
    the declared data.label_map."""
    path, truth = messy
    base = {"name": "table", "path": str(path), "target": "answer", "positive": "yes", "negative": "no",
            "thousands": ",", "numeric": {"age": {"lower": 18, "upper": 90},
                                          "annual_income": {"lower": 0, "upper": 200000}},
            "categorical": {"region": ["Nord", "Süd", "Ost", "West"]}, "split_key": ["person_id"]}
    df = MESSY.messy(seed=0)
    complete = (df.age.str.strip() != "") & (df.annual_income.str.strip() != "")
    for label_map, positives in (({}, "yes"), ({"answer": {"Yes": "yes"}}, ("yes", "Yes"))):
        data = load_dataset({**base, "label_map": label_map}, seed=0)
        y = data.y_train.tolist() + data.y_test.tolist()
        assert y.count(0.0) == int(((df.answer == "no") & complete).sum())
        assert y.count(1.0) == int((df.answer.isin(list(positives) if isinstance(positives, tuple) else [positives])
                                    & complete).sum())
        target = data.diagnostics["rows"]["left_out_by"]["target"]["answer"]
        assert target == {"missing": truth["answers"][""], "undeclared": 0 if label_map else truth["answers"]["Yes"]}


def test_check_refuses_what_it_cannot_read_by_name(messy, tmp_path, capsys):
    """Exit 2 and dptrain's one error style: a missing file, a declared column the file lacks, a
    sweep; a folder that holds a run is not written into."""
    path, _ = messy
    cases = [([*MESSY.DECLARED, "data.path=nope.csv"], "no such file"),
             ([*MESSY.DECLARED, f"data.path={path}", "data.target=answr"], "'answer'"),
             ([*MESSY.DECLARED, f"data.path={path}", "seed=1,2"], "ONE run"),
             (["-m", *MESSY.DECLARED, f"data.path={path}"], "no sweep")]
    for args, needle in cases:
        assert table_check.main([*args, f"hydra.run.dir={tmp_path / 'c'}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("dptrain: error:") and needle in err, err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "FILES.txt").write_text("a run\n")
    assert table_check.main([*MESSY.DECLARED, f"data.path={path}", f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    assert not (tmp_path / "run" / "private").exists()
