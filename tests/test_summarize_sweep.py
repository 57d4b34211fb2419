"""scripts/summarize_sweep.py on a hand-built multirun folder with known numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "summarize_sweep.py"
CAVEAT = (
    "Choosing the best run of this sweep is itself a use of the private data: "
    "no single run's epsilon covers that choice."
)


def _load_module():
    spec = importlib.util.spec_from_file_location("summarize_sweep", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(sweep: Path, *, target_eps, seed, eps, acc, loss, auc, model="logit",
               private=True, metrics=True, nonprivate_acc=0.85, majority=0.75, test_public=True):
    overrides = [f"experiment={model}"]
    if private:
        overrides.append(f"privacy.target_epsilon={target_eps}")
    else:
        overrides.append("privacy=none")
    overrides.append(f"seed={seed}")
    run = sweep / ",".join(overrides)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\ndata:\n  name: synthetic\n  test_public: {str(test_public).lower()}\n"
        f"model:\n  _target_: dptrain.models.networks.{model}\nprivacy:\n  enabled: {str(private).lower()}\n"
    )
    if metrics:
        (run / "private").mkdir()
        tests = {"test/acc": acc, "test/loss": loss, "test/auc": auc}
        (run / "private" / "metrics.json").write_text(json.dumps({
            **tests, "baseline/nonprivate_acc": nonprivate_acc, "baseline/majority_acc": majority,
            "train/steps": 10,
        }))
        # the run's publishable metrics.json, as dptrain.tasks.outputs.publishable_metrics writes it
        (run / "metrics.json").write_text(json.dumps({
            "train/steps": 10, **({"privacy/epsilon": eps, "privacy/delta": 1e-5} if private else {}),
            **({**tests, "baseline/majority_acc": majority} if test_public else {}),
        }))
    if private:
        privacy = {
            "private": True, "epsilon": eps, "delta": 1e-5, "accountant": "rdp",
            "epsilons": {"rdp": eps, "pld": eps * 0.9}, "noise_multiplier": 1.0 / target_eps,
            "target_epsilon": target_eps, "max_grad_norm": 1.0, "expected_batch_size": 100,
            "epochs": 1.0, "seed": seed, "data": "synthetic", "engine": "fast",
        }
    else:
        privacy = {"private": False, "seed": seed, "data": "synthetic", "engine": "fast",
                   "expected_batch_size": 100, "epochs": 1.0}
    (run / "privacy.json").write_text(json.dumps(privacy))
    return run


@pytest.fixture
def sweep(tmp_path):
    sw = tmp_path / "multirun"
    sw.mkdir()
    _write_run(sw, target_eps=0.5, seed=0, eps=0.49, acc=0.70, loss=0.60, auc=0.80)
    _write_run(sw, target_eps=0.5, seed=1, eps=0.51, acc=0.74, loss=0.50, auc=0.84)
    _write_run(sw, target_eps=2, seed=0, eps=1.98, acc=0.80, loss=0.40, auc=0.90)
    _write_run(sw, target_eps=2, seed=1, eps=2.00, acc=0.84, loss=0.44, auc=0.86)
    # an incomplete job folder: must be skipped with a warning naming it
    _write_run(sw, target_eps=8, seed=0, eps=8.0, acc=0.9, loss=0.3, auc=0.95, metrics=False)
    return sw


def test_summary_from_subprocess(sweep, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(sweep), "--out", str(out), "--no-diffprivlib"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "privacy.target_epsilon=8" in proc.stderr and "metrics.json" in proc.stderr

    table = pd.read_csv(out / "summary.csv")
    assert len(table) == 2
    table = table.sort_values("target_epsilon").reset_index(drop=True)
    assert list(table["n_seeds"]) == [2, 2]
    assert list(table["model"]) == ["logit", "logit"]
    assert list(table["accountant"]) == ["rdp", "rdp"]
    assert table["delta"].tolist() == [1e-5, 1e-5]
    assert table["target_epsilon"].tolist() == [0.5, 2.0]

    # hand-computed: mean, sample std (ddof=1) = |a - b| / sqrt(2), min, max
    s2 = math.sqrt(2)
    expected = [
        {"epsilon": 0.50, "test/acc": (0.72, 0.04 / s2, 0.70, 0.74),
         "test/loss": (0.55, 0.10 / s2, 0.50, 0.60), "test/auc": (0.82, 0.04 / s2, 0.80, 0.84)},
        {"epsilon": 1.99, "test/acc": (0.82, 0.04 / s2, 0.80, 0.84),
         "test/loss": (0.42, 0.04 / s2, 0.40, 0.44), "test/auc": (0.88, 0.04 / s2, 0.86, 0.90)},
    ]
    private = pd.read_csv(out / "private" / "summary.csv").sort_values("target_epsilon").reset_index(drop=True)
    assert "baseline/nonprivate_acc_mean" not in table  # fitted on the training rows without privacy
    for i, exp in enumerate(expected):
        row = table.iloc[i]
        assert row["epsilon"] == pytest.approx(exp["epsilon"], abs=1e-12)
        for metric in ("test/acc", "test/loss", "test/auc"):
            mean, std, lo, hi = exp[metric]
            assert row[f"{metric}_mean"] == pytest.approx(mean, abs=1e-12)
            assert row[f"{metric}_std"] == pytest.approx(std, abs=1e-12)
            assert row[f"{metric}_min"] == pytest.approx(lo, abs=1e-12)
            assert row[f"{metric}_max"] == pytest.approx(hi, abs=1e-12)
        assert private.iloc[i]["baseline/nonprivate_acc_mean"] == pytest.approx(0.85)
        assert row["baseline/majority_acc_mean"] == pytest.approx(0.75)

    md = (out / "summary.md").read_text()
    assert CAVEAT in md
    assert md.count("\n| logit |") == 2
    png = out / "summary.png"
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nonprivate_and_default_out(sweep, recwarn):
    mod = _load_module()
    _write_run(sweep, target_eps=None, seed=0, eps=None, acc=0.86, loss=0.35, auc=0.92,
               private=False)
    _write_run(sweep, target_eps=None, seed=1, eps=None, acc=0.88, loss=0.33, auc=0.93,
               private=False)
    assert mod.main([str(sweep), "--metric", "test/acc", "--no-diffprivlib"]) == 0
    assert any("privacy.target_epsilon=8" in str(w.message) for w in recwarn)
    for folder in (sweep, sweep / "private"):
        table = pd.read_csv(folder / "summary.csv")
        assert len(table) == 3
        nonpriv = table[~table["private"].astype(bool)]
        assert len(nonpriv) == 1
        assert nonpriv["epsilon"].isna().all()
        assert int(nonpriv["n_seeds"].iloc[0]) == 2
        assert (folder / "summary.png").stat().st_size > 1000
        # a non-private model's metrics are covered by no guarantee: private/ only
        acc = nonpriv["test/acc_mean"].iloc[0]
        assert acc == pytest.approx(0.87) if folder.name == "private" else math.isnan(acc)
    # rerunning with outputs inside the sweep folder still works: private/ is not read as a run
    recwarn.clear()
    assert mod.main([str(sweep), "--metric", "test/loss", "--no-diffprivlib"]) == 0
    assert not any(f"skipping {sweep / 'private'}:" in str(w.message) for w in recwarn)


PRIVATE_NUMBERS = {"test/acc": (0.6173, 0.6391), "test/loss": (0.4829, 0.4417), "test/auc": (0.7715, 0.7937)}


def test_private_rows_stay_under_private(tmp_path):
    """data.test_public=false: the test metrics (and the non-private baseline) are computed from
    private rows, so they are under private/ with its FILES.txt and nowhere in the top-level files."""
    sweep = tmp_path / "multirun"
    for seed in (0, 1):
        _write_run(sweep, target_eps=1, seed=seed, eps=0.98 + 0.02 * seed, test_public=False, nonprivate_acc=0.8123,
                   majority=0.7531, **{k.split("/")[1]: v[seed] for k, v in PRIVATE_NUMBERS.items()})
    (sweep / "summary.png").write_bytes(b"a figure of private numbers written by an earlier version")
    mod = _load_module()
    assert mod.main([str(sweep), "--no-diffprivlib"]) == 0

    top = pd.read_csv(sweep / "summary.csv")
    assert top["epsilon"].tolist() == [pytest.approx(0.99)] and top["delta"].tolist() == [1e-5]
    assert not [c for c in top if c.startswith(("test/", "baseline/")) and top[c].notna().any()]
    assert not (sweep / "summary.png").exists()  # nothing publishable to plot
    values = [v for pair in PRIVATE_NUMBERS.values() for v in pair] + [0.8123, 0.7531]
    for name in ("summary.csv", "summary.md", "FILES.txt"):
        text = (sweep / name).read_text()
        assert not [v for v in values if str(v) in text or f"{v:.3g}" in text], name
    manifest = (sweep / "FILES.txt").read_text()
    assert "summary.csv, summary.md" in manifest.split("PRIVATE:")[0] and "private/" in manifest.split("PRIVATE:")[1]

    private = pd.read_csv(sweep / "private" / "summary.csv")
    assert private["test/acc_mean"].tolist() == [pytest.approx(0.6282)]
    assert private["test/auc_max"].tolist() == [pytest.approx(0.7937)]
    assert private["baseline/nonprivate_acc_mean"].tolist() == [pytest.approx(0.8123)]
    assert "PRIVATE" in (sweep / "private" / "summary.md").read_text()
    assert (sweep / "private" / "summary.png").stat().st_size > 1000
    files = (sweep / "private" / "FILES.txt").read_text()
    assert "keep with the data, never publish" in files and "summary.csv" in files and "summary.png" in files


def _readme_sweep(sweep: Path, sigmas=(0.5, 1, 2, 4)) -> None:
    """The folders of the README's sweep (python -m dptrain -m experiment=logit
    privacy.noise_multiplier=0.5,1,2,4): each job's .hydra/config.yaml composed by Hydra from the
    shipped config as the run saves it, and its report and metrics files."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from dptrain.tasks.registry import register_configs

    register_configs()  # the schemas the shipped config extends, as python -m dptrain registers them
    for i, sigma in enumerate(sigmas):
        overrides = ["experiment=logit", f"privacy.noise_multiplier={sigma}"]
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        run = sweep / ",".join(overrides)
        (run / ".hydra").mkdir(parents=True)
        (run / "private").mkdir()
        (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        eps = 4.0 / sigma
        (run / "privacy.json").write_text(json.dumps({"private": True, "epsilon": eps, "delta": 1e-5, "seed": 0,
                                                      "accountant": "rdp", "noise_multiplier": sigma}))
        metrics = {"test/acc": 0.84 + 0.001 * i, "test/loss": 0.35, "test/auc": 0.89, "baseline/majority_acc": 0.76}
        (run / "metrics.json").write_text(json.dumps({"privacy/epsilon": eps, "privacy/delta": 1e-5, **metrics}))
        (run / "private" / "metrics.json").write_text(json.dumps({**metrics, "baseline/nonprivate_acc": 0.85}))


class _QuickDPLogit:
    """Stands in for diffprivlib's LogisticRegression (seconds per fit on Adult): records its calls."""

    calls: list = []

    def __init__(self, *, epsilon, data_norm, random_state, max_iter):
        self.args = {"epsilon": epsilon, "data_norm": data_norm}

    def fit(self, x, y):
        self.calls.append({**self.args, "x": x.shape, "y": sorted(set(y.tolist()))})
        return self

    def score(self, x, y):
        return 0.5


def test_readme_sweep_does_not_crash(tmp_path, monkeypatch, capsys):
    """issue 32 item 3: on the README's own sweep (data=adult, whose composed data.target is null) the
    script crashed with a 40-line OmegaConf traceback while loading the data for the diffprivlib
    comparison (its data section was merged onto the generic DataConfig, whose target is a string).
    Now it loads Adult with the source's own schema and exits 0 (diffprivlib's fit is stubbed here for
    speed; test_readme_sweep_with_diffprivlib runs it)."""
    import diffprivlib.models

    sweep = tmp_path / "multirun"
    _readme_sweep(sweep)
    monkeypatch.setattr(diffprivlib.models, "LogisticRegression", _QuickDPLogit)
    monkeypatch.setattr(_QuickDPLogit, "calls", [])
    assert _load_module().main([str(sweep)]) == 0
    # not "4 runs -> 8 settings" (issue 32, 14)
    said = capsys.readouterr()
    assert said.out.startswith("4 runs, 4 settings, 1 seed each: ")
    # issue 46: the fits (the slow part: 82 s on a larger sweep) show their progress, one per epsilon and seed
    assert "loading the data of" in said.err and "diffprivlib fits: 100%" in said.err and "4/4" in said.err
    calls = _QuickDPLogit.calls
    assert [c["epsilon"] for c in calls] == [1, 2, 4, 8]  # one fit per epsilon of the sweep, one seed
    # the logit preset's Adult: 4 numeric (education_num excluded: one coding of education), 8 categorical
    assert [c["data_norm"] for c in calls] == [pytest.approx(math.sqrt(4 + 8))] * 4
    assert all(c["y"] == [0.0, 1.0] and c["x"][0] > 10000 for c in calls)
    private = pd.read_csv(sweep / "private" / "summary.csv")
    assert (private.model == "diffprivlib LogisticRegression").sum() == 4
    assert "diffprivlib" not in set(pd.read_csv(sweep / "summary.csv").model)


@pytest.mark.slow  # four diffprivlib fits on Adult: 15-30 s on 2 cores
def test_readme_sweep_with_diffprivlib(tmp_path):
    """The README's sweep with the real diffprivlib: exits 0, and the diffprivlib fits (trained on the
    private training rows) are in private/ only."""
    sweep = tmp_path / "multirun"
    _readme_sweep(sweep)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(sweep)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = pd.read_csv(sweep / "summary.csv")
    assert top["model"].tolist() == ["logit"] * 4  # Adult's test file is public: its test metrics are here
    assert top.sort_values("epsilon")["test/acc_mean"].tolist() == pytest.approx([0.843, 0.842, 0.841, 0.84])
    private = pd.read_csv(sweep / "private" / "summary.csv")
    dpl = private[private.model == "diffprivlib LogisticRegression"].sort_values("epsilon")
    assert dpl["epsilon"].tolist() == pytest.approx([1, 2, 4, 8]) and dpl["test/acc_mean"].between(0.5, 1).all()
    assert "not accounted by any run's report" in (sweep / "private" / "FILES.txt").read_text().lower()
    assert "diffprivlib" not in (sweep / "summary.md").read_text().split("Publishable numbers only")[1].split(
        "are in private/ only")[1]


def test_unloadable_data_is_one_line(tmp_path):
    """A run whose data cannot be loaded for the diffprivlib comparison: one line naming the run,
    the setting and the way out (--no-diffprivlib), not a traceback."""
    sweep = tmp_path / "multirun"
    run = _write_run(sweep, target_eps=1, seed=0, eps=1.0, acc=0.8, loss=0.4, auc=0.9)
    (run / ".hydra" / "config.yaml").write_text("seed: 0\ndata:\n  name: table\n  target: y\n")
    with pytest.raises(SystemExit) as err:
        _load_module().main([str(sweep)])
    message = str(err.value.code)
    assert "\n" not in message and str(run) in message
    assert "data.path=None is not allowed" in message and message.endswith("rerun with --no-diffprivlib to skip it")


def test_unloadable_data_other_causes_are_one_line(tmp_path, monkeypatch):
    """Failures other than dptrain's own refusals (a malformed saved config, diffprivlib that does not
    import) are one line naming the run or diffprivlib, the cause and --no-diffprivlib, too."""
    sweep = tmp_path / "multirun"
    run = _write_run(sweep, target_eps=1, seed=0, eps=1.0, acc=0.8, loss=0.4, auc=0.9)
    (run / ".hydra" / "config.yaml").write_text("seed: abc\ndata:\n  name: synthetic\n")
    with pytest.raises(SystemExit) as err:
        _load_module().main([str(sweep)])
    message = str(err.value.code)
    assert "\n" not in message and str(run) in message and "ValueError: invalid literal for int()" in message
    assert message.endswith("rerun with --no-diffprivlib to skip it")

    monkeypatch.setitem(sys.modules, "diffprivlib.models", None)  # its import now raises ImportError
    with pytest.raises(SystemExit) as err:
        _load_module().main([str(sweep)])
    message = str(err.value.code)
    assert "\n" not in message and "diffprivlib cannot be imported" in message and "--no-diffprivlib" in message


def test_counts_runs_settings_and_seeds(tmp_path, monkeypatch, capsys):
    """issue 32, item 14: the summary said "2 runs -> 4 settings" for two runs, counting diffprivlib's
    rows as settings. It counts runs, settings (the DP-SGD table's rows) and seeds per setting."""
    import diffprivlib.models

    monkeypatch.setattr(diffprivlib.models, "LogisticRegression", _QuickDPLogit)
    monkeypatch.setattr(_QuickDPLogit, "calls", [])
    sweep = tmp_path / "multirun"
    _write_run(sweep, target_eps=0.5, seed=0, eps=0.49, acc=0.70, loss=0.60, auc=0.80)
    _write_run(sweep, target_eps=2, seed=0, eps=1.98, acc=0.80, loss=0.40, auc=0.90)
    mod = _load_module()
    assert mod.main([str(sweep)]) == 0
    assert capsys.readouterr().out.startswith("2 runs, 2 settings, 1 seed each: ")
    assert len(_QuickDPLogit.calls) == 2 and len(pd.read_csv(sweep / "private" / "summary.csv")) == 4

    _write_run(sweep, target_eps=0.5, seed=1, eps=0.51, acc=0.74, loss=0.50, auc=0.84)
    _write_run(sweep, target_eps=2, seed=1, eps=2.00, acc=0.84, loss=0.44, auc=0.86)
    assert mod.main([str(sweep), "--no-diffprivlib"]) == 0
    assert capsys.readouterr().out.startswith("4 runs, 2 settings, 2 seeds each: ")
    _write_run(sweep, target_eps=2, seed=2, eps=2.01, acc=0.83, loss=0.45, auc=0.87)
    assert mod.main([str(sweep), "--no-diffprivlib"]) == 0
    assert capsys.readouterr().out.startswith("5 runs, 2 settings, 2-3 seeds each: ")


README_SWEEP = ["-m", "experiment=logit", "privacy.noise_multiplier=0.5,1,2,4"]  # the README's sweep, as written


def test_readme_sweep_as_written(tmp_path):
    """issue 32, item 3: the README's sweep (`python -m dptrain -m experiment=logit
    privacy.noise_multiplier=0.5,1,2,4`, from a fresh folder), then the README's summary command on its
    multirun/<date>/<time> folder: exit 0 (the old script stopped with a 40-line OmegaConf traceback on
    Adult's data.target: null), one row per sigma with epsilon increasing as sigma decreases, and
    diffprivlib's rows at the same epsilons in private/ only (15-20 s on 2 cores)."""
    try:
        import diffprivlib.models  # noqa: F401
        dpl_args = []
    except ImportError:  # a dependency of the package; without it the comparison is left out by hand
        dpl_args = ["--no-diffprivlib"]
    run = subprocess.run([sys.executable, "-m", "dptrain", *README_SWEEP], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun").glob("*/*")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(sweep.relative_to(tmp_path)), *dpl_args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("4 runs, 4 settings, 1 seed each: ")  # diffprivlib's rows are no settings

    for folder in (sweep, sweep / "private"):
        table = pd.read_csv(folder / "summary.csv")
        dpsgd = table[table.model == "logit"].sort_values("noise_multiplier", ascending=False)
        assert len(dpsgd) == 4 and dpsgd["privacy.noise_multiplier"].tolist() == [4, 2, 1, 0.5]
        assert dpsgd["noise_multiplier"].tolist() == [4, 2, 1, 0.5] and dpsgd["n_seeds"].tolist() == [1] * 4
        assert dpsgd["epsilon"].is_monotonic_increasing and dpsgd["epsilon"].nunique() == 4
        assert dpsgd["test/acc_mean"].between(0.75, 1).all()  # Adult's test file is public: also at the top
    assert "diffprivlib" not in " ".join(pd.read_csv(sweep / "summary.csv").model)
    dpl = table[table.model == "diffprivlib LogisticRegression"]
    if dpl_args:
        assert dpl.empty
    else:
        assert sorted(dpl["epsilon"]) == pytest.approx(sorted(dpsgd["epsilon"]), rel=1e-5)
        assert dpl["test/acc_mean"].between(0.5, 1).all() and (dpl["n_seeds"] == 1).all()
        assert "diffprivlib" in (sweep / "private" / "FILES.txt").read_text()


def _error_bars(ax) -> list[tuple[list[float], list[float]]]:
    """Per error-bar line of the figure: its y values and the length of each vertical bar."""
    from matplotlib.container import ErrorbarContainer

    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer) and c.has_yerr:
            line, _, (bars, *_) = c
            out.append((list(line.get_ydata()), [abs(seg[1][1] - seg[0][1]) for seg in bars.get_segments()]))
    return out


@pytest.mark.filterwarnings("ignore:skipping")  # the fixture's incomplete run folder
def test_the_figure_has_error_bars_of_one_sd_over_repeated_seeds(sweep):
    """issue 46, item 7: a sweep that repeats seeds gets error bars of +/- 1 sample sd (the table's
    _std column) on its figure, and the title says what they are; a sweep of one seed per setting
    says it has none."""
    import matplotlib.pyplot as plt

    mod = _load_module()
    table = mod.summarize(mod.public_view(mod.load_runs(sweep)))
    fig = mod.figure(table, "test/acc")
    ax = fig.axes[0]
    ((means, lengths),) = _error_bars(ax)
    assert means == pytest.approx([0.72, 0.82]) and lengths == pytest.approx([2 * 0.04 / math.sqrt(2)] * 2)
    assert "error bars: mean \u00b1 1 sd over 2 seeds per setting (largest sd 0.028)" in ax.get_title()
    plt.close(fig)

    one = table.assign(**{"test/acc_std": float("nan"), "n_seeds": 1})
    fig = mod.figure(one, "test/acc")
    assert "one seed per setting: no error bars" in fig.axes[0].get_title()
    assert all(max(lengths) == 0 for _, lengths in _error_bars(fig.axes[0]))
    plt.close(fig)


@pytest.mark.filterwarnings("ignore:skipping")  # the fixture's incomplete run folder
def test_bars_shorter_than_the_markers_are_said_to_be(sweep):
    """Seeds that barely move the metric (sd 0.0005 on an axis of 0.1, as on Adult) draw bars
    hidden by the markers: the title says so, with the largest sd."""
    import matplotlib.pyplot as plt

    mod = _load_module()
    table = mod.summarize(mod.public_view(mod.load_runs(sweep))).assign(**{"test/acc_std": 0.0005})
    fig = mod.figure(table, "test/acc")
    assert "(largest sd 0.0005, smaller than the markers)" in fig.axes[0].get_title()
    plt.close(fig)


@pytest.mark.filterwarnings("ignore:skipping")  # the fixture's incomplete run folder
def test_progress_lines_while_reading_a_sweep(sweep, capsys):
    """issue 46, item 7: the summary said nothing for 82 s; it now says what it reads and writes."""
    assert _load_module().main([str(sweep), "--no-diffprivlib"]) == 0
    err = capsys.readouterr().err
    steps = [f"summarize_sweep.py: reading 5 run folders of {sweep}", "summarize_sweep.py: summarising 4 runs",
             "summarize_sweep.py: writing the private summary and figure in",
             "summarize_sweep.py: writing the publishable summary and figure"]
    assert all(step in err for step in steps), err
    assert [err.index(step) for step in steps] == sorted(err.index(step) for step in steps)
