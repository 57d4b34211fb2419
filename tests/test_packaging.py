"""The built wheel carries the configs and the Adult data, so a non-editable install works."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    """The package list of pyproject.toml is written by hand: a new subpackage left out of it is
    missing from the wheel (CI's slow wheel test below catches it in minutes; this in a second)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {init.parent.relative_to(REPO).as_posix().replace("/", ".")
            for init in (REPO / "dptrain").rglob("__init__.py")}
    assert tree - listed == set(), f"add to pyproject.toml's packages: {sorted(tree - listed)}"


@pytest.mark.slow  # builds and installs a wheel, then a whole run (10 s): CI runs it with -m slow
def test_wheel_ships_configs_and_data_and_runs_from_outside_the_repo(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("dptrain-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # every subpackage of the source tree is in the wheel (pyproject.toml lists them by hand)
    for init in sorted((REPO / "dptrain").rglob("__init__.py")):
        rel = init.relative_to(REPO).as_posix()
        assert rel in names, f"{rel} is missing from the wheel: add its package to pyproject.toml"
    for expected in ("dptrain/conf/config.yaml", "dptrain/conf/task/train.yaml", "dptrain/conf/experiment/logit.yaml",
                     "dptrain/conf/experiment/mlp.yaml", "dptrain/conf/data/adult.yaml",
                     "dptrain/data/adult/adult.csv.gz", "dptrain/data/adult/SHA256SUMS",
                     "dptrain/data/adult/schema.yaml"):
        assert expected in names, expected
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import dptrain; print(dptrain.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site))
    res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=mlp", "--cfg", "job"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dptrain.models.networks.mlp" in res.stdout and "schema: adult" in res.stdout
    run = subprocess.run(
        [sys.executable, "-c", "from dptrain.data import load_dataset; from dptrain.settings.data import DataConfig;"
         "from hydra import compose, initialize_config_module; import dptrain.tasks.cli;"
         "from omegaconf import OmegaConf\n"
         "with initialize_config_module(config_module='dptrain.conf', version_base='1.3'):\n"
         "    cfg = OmegaConf.to_object(compose(config_name='config', overrides=['experiment=logit']))\n"
         "print(load_dataset(cfg.data, seed=0).n_train)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "32561"
