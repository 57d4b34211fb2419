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
    line = next(r.getMessage() for r in caplog.records if "PRIVATE counts" in r.getMessage())
    assert f"3000 rows read, {truth['kept']} used, {truth['left_out']} left out" in line
    assert "dptrain check" in caplog.text  # rows were left out and lumped: the pointer to the check
    for f in run.rglob("*"):  # no count of the rules in a publishable file
        if f.is_file() and "private" not in f.parts and f.suffix != ".pt":
            assert b"left_out_by" not in f.read_bytes() and b"3000 rows read" not in f.read_bytes(), f


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
