"""Summarise a DP-SGD training multirun (``python -m dptrain -m ...``) over seeds.

    python scripts/summarize_sweep.py MULTIRUN_DIR [--out DIR] [--metric test/acc] [--no-diffprivlib]

Reads, in every direct sub-folder (one Hydra job) of MULTIRUN_DIR, ``privacy.json``,
``private/metrics.json``, ``metrics.json`` (the run's publishable metrics), ``.hydra/config.yaml``
and ``.hydra/overrides.yaml``; a folder missing a required one is skipped with a warning naming it.
Runs are grouped by every override that varies across the sweep except ``seed`` (plus the model
name). Like a run folder, the output (--out, default: MULTIRUN_DIR) is split in two:

* at the top, publishable numbers only: ``summary.csv``, ``summary.md``, ``summary.png`` (only when
  some run has a publishable --metric) and ``FILES.txt``. Each setting's epsilon and delta (from
  privacy.json) and its settings; test metrics (and the majority-class rate) only of runs that are
  private and whose test rows are public (``data.test_public=true``), read from their metrics.json.
* under ``private/``, computed from private rows, to keep with the data: the same three files with
  every metric of private/metrics.json (test metrics on private rows when data.test_public=false, the
  non-private baseline) and diffprivlib's LogisticRegression fitted on the sweep's private training
  rows at the sweep's epsilons (privacy spent outside every run's report), and a ``FILES.txt``.

summary.png plots the --metric against epsilon: the mean over seeds, with error bars of +/- 1
sample sd over the seeds of each setting where a sweep repeats seeds (its title says what the
bars are and their largest sd). Progress goes to stderr: a line per step, a bar over
diffprivlib's fits (the slow part: one fit per epsilon and seed on the private training rows).

Columns of summary.csv: model, the varying overrides (one column each, as written on the command
line), private, target_epsilon, noise_multiplier (mean over seeds), epsilon (mean over seeds of
the headline epsilon), epsilon_max, accountant, delta, n_seeds, seeds, then for test/acc,
test/loss and test/auc: ``<metric>_mean``, ``_std`` (sample std, ddof=1; empty for one seed),
``_min``, ``_max``; then baseline/nonprivate_acc_mean (private/ only) and baseline/majority_acc_mean.
Runs of classifiers only (objective=binary or multinomial); another objective is refused by name.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import pandas as pd
import yaml
from tqdm import tqdm

from dptrain.runfolder.folder import RunFolder
from dptrain.runfolder.tracking import MANIFEST, PRIVATE_DIR, private_dir

CAVEAT = (
    "Choosing the best run of this sweep is itself a use of the private data: "
    "no single run's epsilon covers that choice."
)
METRICS = ("test/acc", "test/loss", "test/auc")
#: the objectives whose runs this summary compares (their metrics are METRICS)
CLASSIFIERS = ("binary", "multinomial")
NONPRIVATE_LABEL = "non-private (same pipeline)"
SKLEARN_LABEL = "sklearn non-private logistic regression"
MAJORITY_LABEL = "majority-class rate"
#: every metric a record carries; PUBLIC_KEYS: those a run publishes when its test rows are public
METRIC_KEYS = (*METRICS, "baseline/nonprivate_acc", "baseline/majority_acc")
PUBLIC_KEYS = (*METRICS, "baseline/majority_acc")


def _config_file(run: Path) -> Path:
    """The run's composed config: the resolved copy a finished run writes, else Hydra's own."""
    resolved = run / ".hydra" / "resolved_config.yaml"
    return resolved if resolved.is_file() else run / ".hydra" / "config.yaml"


def _read_run(run: Path) -> dict | None:
    """One job folder -> flat record, or None (with a warning) if a file is missing/unreadable."""
    files = {
        "metrics": run / "private" / "metrics.json",
        "privacy": run / "privacy.json",
        "config": _config_file(run),
        "overrides": run / ".hydra" / "overrides.yaml",
    }
    missing = [str(p.relative_to(run)) for p in files.values() if not p.is_file()]
    if missing:
        warnings.warn(f"skipping {run}: missing {', '.join(missing)}", stacklevel=2)
        return None
    try:
        metrics = json.loads(files["metrics"].read_text())
        privacy = json.loads(files["privacy"].read_text())
        config = yaml.safe_load(files["config"].read_text()) or {}
        overrides = yaml.safe_load(files["overrides"].read_text()) or []
        published = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else {}
    except (OSError, ValueError, yaml.YAMLError) as err:
        warnings.warn(f"skipping {run}: unreadable file ({err})", stacklevel=2)
        return None

    objective = str((config.get("objective") or {}).get("name", "binary"))
    if objective not in CLASSIFIERS:  # e.g. objective=linear: rmse / r2 / mae, not accuracy
        raise SystemExit(f"summarize_sweep.py: {run} was trained with objective={objective}, which is not allowed "
                         f"here: this summary compares classifiers' test/acc, loss and auc; allowed: objective="
                         + " or ".join(CLASSIFIERS))
    target = str((config.get("model") or {}).get("_target_", "unknown"))
    over = {}
    for item in overrides:
        key, _, value = str(item).partition("=")
        over[key.lstrip("+~")] = value
    private = bool(privacy.get("private", False))
    test_public = (config.get("data") or {}).get("test_public") is True
    return {
        "run": run.name,
        "model": target.rsplit(".", 1)[-1],
        "overrides": over,
        "seed": privacy.get("seed", config.get("seed")),
        "private": private,
        "epsilon": privacy.get("epsilon") if private else None,
        "accountant": privacy.get("accountant") if private else None,
        "delta": privacy.get("delta") if private else None,
        "target_epsilon": privacy.get("target_epsilon") if private else None,
        "noise_multiplier": privacy.get("noise_multiplier") if private else None,
        **{m: metrics.get(m) for m in METRIC_KEYS},
        # what the run itself published, and only for a private run on public test rows
        "public": {m: published.get(m) for m in PUBLIC_KEYS} if private and test_public else {},
    }


def public_view(runs: list[dict]) -> list[dict]:
    """The runs with every metric replaced by its publishable value (None where there is none)."""
    return [{**r, **{m: r["public"].get(m) for m in METRIC_KEYS}} for r in runs]


def progress(message: str) -> None:
    """One progress line on stderr (the summary of a long sweep takes minutes)."""
    print(f"summarize_sweep.py: {message}", file=sys.stderr, flush=True)


def load_runs(sweep: Path, exclude: Path | None = None) -> list[dict]:
    """Every job folder of ``sweep`` except ``exclude`` (the output folder) and its private/."""
    skip = {exclude.resolve(), (exclude / PRIVATE_DIR).resolve()} if exclude is not None else set()
    folders = [p for p in sorted(sweep.iterdir()) if p.is_dir() and p.resolve() not in skip]
    progress(f"reading {len(folders)} run folder{'s' * (len(folders) != 1)} of {sweep}")
    runs = []
    for run in tqdm(folders, desc="runs read", unit="run", file=sys.stderr, disable=len(folders) < 20):
        record = _read_run(run)
        if record is not None:
            runs.append(record)
    return runs


def _unique(values) -> object:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    uniq = list(dict.fromkeys(vals))
    if not uniq:
        return None
    return uniq[0] if len(uniq) == 1 else ";".join(map(str, uniq))


def _mean(values) -> float:
    s = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").dropna()
    return float(s.mean()) if len(s) else float("nan")


def summarize(runs: list[dict]) -> pd.DataFrame:
    """Group runs by every varying override except seed (and by model); one row per group."""
    keys = sorted({k for r in runs for k in r["overrides"]})
    varying = [
        k for k in keys
        if k != "seed" and len({r["overrides"].get(k) for r in runs}) > 1
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        gkey = (r["model"], *(r["overrides"].get(k) for k in varying))
        groups.setdefault(gkey, []).append(r)

    rows = []
    for gkey, members in groups.items():
        row: dict = {"model": gkey[0]}
        row.update(dict(zip(varying, gkey[1:])))
        private = {m["private"] for m in members}
        row["private"] = private.pop() if len(private) == 1 else "mixed"
        row["target_epsilon"] = _unique(m["target_epsilon"] for m in members)
        row["noise_multiplier"] = _mean(m["noise_multiplier"] for m in members)
        row["epsilon"] = _mean(m["epsilon"] for m in members)
        row["epsilon_max"] = pd.to_numeric(
            pd.Series([m["epsilon"] for m in members], dtype=object), errors="coerce"
        ).max()
        row["accountant"] = _unique(m["accountant"] for m in members)
        row["delta"] = _unique(m["delta"] for m in members)
        row["n_seeds"] = len(members)
        row["seeds"] = ";".join(str(m["seed"]) for m in sorted(members, key=lambda m: str(m["seed"])))
        for metric in METRICS:
            s = pd.to_numeric(pd.Series([m[metric] for m in members], dtype=object), errors="coerce")
            s = s.dropna()
            row[f"{metric}_mean"] = s.mean() if len(s) else float("nan")
            row[f"{metric}_std"] = s.std(ddof=1) if len(s) > 1 else float("nan")
            row[f"{metric}_min"] = s.min() if len(s) else float("nan")
            row[f"{metric}_max"] = s.max() if len(s) else float("nan")
        row["baseline/nonprivate_acc_mean"] = _mean(m["baseline/nonprivate_acc"] for m in members)
        row["baseline/majority_acc_mean"] = _mean(m["baseline/majority_acc"] for m in members)
        rows.append(row)

    table = pd.DataFrame(rows)
    if len(table):
        table = table.sort_values(
            ["model", "private", "epsilon"], key=lambda c: c.astype(str) if c.name != "epsilon" else c,
            na_position="first",
        ).reset_index(drop=True)
    table.attrs["varying"] = varying
    return table


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}"
    return str(value)


def to_markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [
        "| " + " | ".join(esc(c) for c in cols) + " |",
        "|" + "|".join("---" for _ in cols) + "|",
    ]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(esc(_fmt(row[c])) for c in cols) + " |")
    return "\n".join(lines) + "\n"


PUBLIC_NOTE = (
    "Publishable numbers only: each setting's epsilon and delta (from each run's privacy.json) and its "
    "settings; test metrics and the majority-class rate only of private runs whose test rows are public "
    "(data.test_public=true), as each run published them in its metrics.json. Metrics computed from "
    "private rows (test metrics when data.test_public=false, the non-private baseline, non-private runs, "
    "diffprivlib) are in private/ only."
)
PRIVATE_NOTE = (
    "PRIVATE: computed from private rows; keep with the data, never publish (private/FILES.txt). Every metric "
    "of each run's private/metrics.json: test metrics are on private rows unless the run's data.test_public "
    "is true, and the non-private baseline is fitted on the training rows without privacy."
)


def write_markdown(table: pd.DataFrame, path: Path, sweep: Path, *, public: bool) -> None:
    varying = table.attrs.get("varying", [])
    text = [
        f"# Sweep summary: {sweep}" + ("" if public else " (PRIVATE)"),
        "",
        f"**{CAVEAT}**",
        "",
        PUBLIC_NOTE if public else PRIVATE_NOTE,
        "",
        f"One row per setting (grouped by model and the varying overrides except seed: "
        f"{', '.join(varying) or 'none'}). `epsilon` is the mean over seeds of each run's "
        "headline epsilon (its `accountant`, at `delta`); std is the sample std over seeds "
        "(ddof=1, empty for a single seed). Non-private runs (private = False) have no epsilon. "
        "Test metrics are computed on held-out rows."
        + (f" Rows 'diffprivlib LogisticRegression': {DIFFPRIVLIB_NOTE}." if table.attrs.get("diffprivlib") else ""),
        "",
        to_markdown(table),
    ]
    path.write_text("\n".join(text))


def error_bar_text(table: pd.DataFrame, metric: str, span: float | None = None) -> str:
    """What the figure's error bars are, in words: +/- 1 sample sd over the seeds of each setting
    (the table's ``_std`` column) and the largest one, said to be smaller than the markers when it
    is under 1% of the y axis' ``span``; or that a sweep with one seed per setting has none."""
    std = pd.to_numeric(table.get(f"{metric}_std", pd.Series(dtype=float)), errors="coerce").dropna()
    seeds = pd.to_numeric(table.get("n_seeds", pd.Series(dtype=float)), errors="coerce").dropna()
    if std.empty:
        return "one seed per setting: no error bars (repeat seeds, e.g. seed=0,1,2, to draw them)"
    n = f"{int(seeds.min())}" if seeds.min() == seeds.max() else f"{int(seeds.min())}-{int(seeds.max())}"
    small = ", smaller than the markers" if span and std.max() < 0.01 * span else ""
    return f"error bars: mean \u00b1 1 sd over {n} seeds per setting (largest sd {std.max():.2g}{small})"


def _lines(ax, table: pd.DataFrame, metric: str) -> None:
    """One error-bar line per model (and per override that varies among the private rows): the
    mean over seeds, +/- 1 sd where a setting has several seeds."""
    mean_c, std_c = f"{metric}_mean", f"{metric}_std"
    priv = table[table["private"].astype(bool) & (table["epsilon"] > 0)]
    varying = [
        k for k in table.attrs.get("varying", [])
        if k not in ("experiment", "model", "privacy.target_epsilon", "privacy.noise_multiplier")
        and priv[k].astype(str).nunique() > 1
    ]
    for key, grp in priv.groupby(["model", *varying], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        label = str(key[0]) + "".join(f", {k}={v}" for k, v in zip(varying, key[1:]))
        grp = grp.sort_values("epsilon")
        if mean_c not in grp or grp[mean_c].isna().all():
            continue
        name = label if label.startswith("diffprivlib") else f"DP-SGD {label}"
        ax.errorbar(grp["epsilon"], grp[mean_c], yerr=grp[std_c].fillna(0.0) if std_c in grp else None,
                    marker="o", capsize=5, elinewidth=1.5, label=name)
    if len(priv):
        ax.set_xscale("log")


def _baselines(ax, table: pd.DataFrame, metric: str) -> None:
    """The non-private runs, sklearn's fit and the majority-class rate as horizontal lines."""
    import matplotlib.pyplot as plt

    mean_c = f"{metric}_mean"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    nonpriv = table[~table["private"].astype(bool)]
    for i, (model, grp) in enumerate(nonpriv.groupby("model", sort=True)):
        if mean_c not in grp or grp[mean_c].isna().all():
            continue
        ax.axhline(grp[mean_c].mean(), linestyle="-.", color=colors[(i + 3) % len(colors)],
                   label=f"{NONPRIVATE_LABEL}, {model}")
    if metric == "test/acc":
        sk = table.get("baseline/nonprivate_acc_mean", pd.Series(dtype=float)).dropna()
        if len(sk):
            ax.axhline(sk.mean(), linestyle="--", color="black", label=SKLEARN_LABEL)
        maj = table.get("baseline/majority_acc_mean", pd.Series(dtype=float)).dropna()
        if len(maj):
            ax.axhline(maj.mean(), linestyle=":", color="grey", label=MAJORITY_LABEL)


def figure(table: pd.DataFrame, metric: str):
    """The privacy-utility figure (a matplotlib Figure): ``metric`` against epsilon, with error
    bars of +/- 1 sd over seeds where a setting repeats seeds (:func:`error_bar_text` says so on
    the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    _lines(ax, table, metric)
    _baselines(ax, table, metric)
    ax.set_xlabel("epsilon (mean over seeds, log scale)")
    ax.set_ylabel(f"{metric} (mean over seeds)")
    low, high = ax.get_ylim()
    ax.set_title(f"{metric} vs epsilon; {error_bar_text(table, metric, high - low)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.text(0.5, 0.01, CAVEAT, ha="center", va="bottom", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot(table: pd.DataFrame, metric: str, path: Path) -> None:
    fig = figure(table, metric)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120)
    plt.close(fig)


DIFFPRIVLIB_NOTE = (
    "diffprivlib 0.6.6 LogisticRegression (objective perturbation, Chaudhuri, Monteleoni & Sarwate 2011): "
    "pure epsilon-DP (delta = 0) under replace-one neighbours (N public), data_norm = sqrt(#numeric + "
    "#categorical columns) from the public schema, fitted on the same features and split; DP-SGD rows are "
    "(epsilon, delta)-DP under add/remove neighbours (an add/remove epsilon-DP method is 2 epsilon-DP "
    "under replace-one, so this comparison favours diffprivlib by up to that factor). These fits are trained "
    "on the sweep's private training rows: each spends its epsilon outside every run's privacy report (no run's "
    "report accounts for it), so these rows stay in private/"
)


def _sweep_data(run: Path) -> tuple:
    """The data of one run of the sweep (read with its source's own schema, as the run read it)
    and diffprivlib's data_norm from its public schema; a config or data problem is one line."""
    import numpy as np

    from dptrain.core.errors import DPTrainError
    from dptrain.data import load_dataset, schema_from_config
    from dptrain.settings.data import as_source

    try:
        config = yaml.safe_load(_config_file(run).read_text()) or {}
        data_cfg = as_source(config.get("data") or {})
        data = load_dataset(data_cfg, seed=int(config.get("seed", 0)))
        schema = schema_from_config(data_cfg)  # the explicit declaration (Adult's ships as a package file)
    except DPTrainError as err:
        raise SystemExit(_no_comparison(run, str(err))) from None
    except Exception as err:  # any other failure to read the run's data is one line too
        raise SystemExit(_no_comparison(run, f"{type(err).__name__}: {err}")) from None
    return data, float(np.sqrt(len(schema.numeric) + len(schema.categorical)))


def _no_comparison(run: Path, cause: str) -> str:
    """The one line that says why the diffprivlib comparison cannot be made, and the way out."""
    cause = " ".join(cause.split())  # an exception's own line breaks (OmegaConf's, pandas') stay out of it
    return (f"summarize_sweep.py: cannot load the data of {run} for the diffprivlib comparison ({cause}); "
            "rerun with --no-diffprivlib to skip it")


def diffprivlib_rows(sweep: Path, table: pd.DataFrame, runs: list[dict]) -> pd.DataFrame:
    """diffprivlib's LogisticRegression at each epsilon of the sweep's private settings, one fit
    per seed of the sweep, on the data of the sweep's first run (same features and split)."""
    try:
        from diffprivlib.models import LogisticRegression
    except ImportError as err:  # not installed, or broken by another scikit-learn (pyproject pins both)
        raise SystemExit(f"summarize_sweep.py: diffprivlib cannot be imported for the comparison ({err}); install "
                         "the versions pyproject.toml pins or rerun with --no-diffprivlib to skip it") from None

    progress(f"loading the data of {runs[0]['run']} for diffprivlib's fits (--no-diffprivlib skips them)")
    data, norm = _sweep_data(sweep / runs[0]["run"])
    seeds = sorted({int(r["seed"]) for r in runs if r["seed"] is not None}) or [0]
    eps_values = sorted({round(float(e), 6) for e in table.loc[table["private"].astype(bool), "epsilon"].dropna()})
    rows = []
    bar = tqdm(total=len(eps_values) * len(seeds), desc="diffprivlib fits", unit="fit", file=sys.stderr)
    for eps in eps_values:
        accs = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in seeds:
                bar.set_postfix_str(f"epsilon {eps:g}, seed {seed}")
                clf = LogisticRegression(epsilon=eps, data_norm=norm, random_state=seed, max_iter=1000)
                clf.fit(data.x_train.numpy(), data.y_train.numpy())
                accs.append(clf.score(data.x_test.numpy(), data.y_test.numpy()))
                bar.update()
        a = pd.Series(accs, dtype=float)
        rows.append({"model": "diffprivlib LogisticRegression", "private": True, "epsilon": eps,
                     "accountant": "diffprivlib (pure eps, replace-one)", "delta": 0.0, "n_seeds": len(accs),
                     "seeds": ";".join(map(str, seeds)), "test/acc_mean": a.mean(),
                     "test/acc_std": a.std(ddof=1) if len(a) > 1 else float("nan"),
                     "test/acc_min": a.min(), "test/acc_max": a.max()})
    bar.close()
    return pd.DataFrame(rows)


SUMMARY_FILES = ("summary.csv", "summary.md", "summary.png")


def _private_manifest(*, diffprivlib: bool) -> str:
    """private/FILES.txt: what each file is, and that it stays with the data."""
    dpl = ("diffprivlib LogisticRegression fitted on the sweep's private training rows at the sweep's epsilons, one "
           "fit per epsilon and seed: their epsilon is NOT accounted by any run's report (privacy.json); each fit "
           "spends privacy of its own")
    return "\n".join([
        "Files of the sweep summary's private/ folder",
        "",
        "PRIVATE: computed from private rows; keep with the data, never publish:",
        f"  {'summary.csv, summary.md':28s} every setting's metrics from each run's private/metrics.json: test "
        "metrics on private rows where the run's data.test_public is false, the non-private baseline fitted on "
        "the training rows without privacy, the metrics of non-private runs",
        f"  {'summary.png':28s} the same metrics against epsilon",
        *([f"  {'diffprivlib rows (all three)':28s} {dpl}"] if diffprivlib else []),
        f"  {MANIFEST:28s} this list",
        "",
    ])


def write_private(out: Path, runs: list[dict], sweep: Path, *, metric: str, diffprivlib: bool) -> pd.DataFrame:
    """``out/private/``: every metric of private/metrics.json (and diffprivlib) with its FILES.txt."""
    progress(f"summarising {len(runs)} runs")
    table = summarize(runs)
    if diffprivlib and table["private"].astype(bool).any():
        extra = diffprivlib_rows(sweep, table, runs)
        attrs = dict(table.attrs)
        table = pd.concat([table, extra], ignore_index=True)
        table.attrs.update(attrs)
        table.attrs["diffprivlib"] = True
    folder = private_dir(out)
    progress(f"writing the private summary and figure in {folder}")
    table.to_csv(folder / "summary.csv", index=False)
    write_markdown(table, folder / "summary.md", sweep, public=False)
    plot(table, metric, folder / "summary.png")
    (folder / MANIFEST).write_text(_private_manifest(diffprivlib=bool(table.attrs.get("diffprivlib"))))
    return table


#: the file Hydra writes at the top of a sweep folder
SWEEP_RECORD = "multirun.yaml"


def write_public(out: Path, runs: list[dict], sweep: Path, *, metric: str) -> pd.DataFrame:
    """``out/``: publishable numbers only (PUBLIC_NOTE) and FILES.txt."""
    folder = RunFolder(out, run_log=False)  # a script's folder: no run's log
    table = summarize(public_view(runs)).drop(columns=["baseline/nonprivate_acc_mean"])
    table.to_csv(folder.publishable("summary.csv, summary.md", PUBLIC_NOTE), index=False)
    write_markdown(table, out / "summary.md", sweep, public=True)
    figure = f"{metric}_mean" in table and table[f"{metric}_mean"].notna().any()
    if figure:
        plot(table, metric, folder.publishable("summary.png", f"{metric} of those runs against epsilon"))
    else:  # no publishable value to plot; never leave an earlier (private) figure beside the summary
        (out / "summary.png").unlink(missing_ok=True)
    folder.private("", "the summary with every metric computed from private rows, and diffprivlib's fits (their "
                   f"epsilon is not accounted by any run's report): {PRIVATE_DIR}/{MANIFEST}")
    if out.resolve() == sweep.resolve():
        folder.note("<each run folder>/", f"its own {MANIFEST} says which of its files may be published")
    if (out / SWEEP_RECORD).is_file():
        folder.kept(SWEEP_RECORD, "Hydra's record of the sweep: its settings, this machine's paths and the sweep "
                    "folder's name (its start time)")
    folder.finish(guarantee=f"each run's own, in its privacy.json (this summary repeats its epsilon and delta). "
                  f"{CAVEAT}", finite_guarantee=True)
    return table


def counts(runs: list[dict], table: pd.DataFrame) -> str:
    """How many runs, settings (rows of the DP-SGD table, diffprivlib's rows not among them) and seeds
    per setting: ``"8 runs, 4 settings, 2 seeds each"``."""
    per = sorted({int(n) for n in table["n_seeds"]}) if len(table) else [0]
    seeds = f"{per[0]}" if len(per) == 1 else f"{per[0]}-{per[-1]}"
    return (f"{len(runs)} run{'s' * (len(runs) != 1)}, {len(table)} setting{'s' * (len(table) != 1)}, "
            f"{seeds} seed{'s' * (per[-1] != 1)} each")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multirun_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: MULTIRUN_DIR)")
    parser.add_argument("--metric", default="test/acc", choices=METRICS, help="metric for the plot")
    parser.add_argument("--no-diffprivlib", action="store_true",
                        help="skip diffprivlib's LogisticRegression at the sweep's epsilons (fits on the private "
                        "training rows, written under private/ only)")
    args = parser.parse_args(argv)

    sweep: Path = args.multirun_dir
    if not sweep.is_dir():
        parser.error(f"not a folder: {sweep}")
    out: Path = args.out or sweep
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(sweep, exclude=out)
    if not runs:
        print(f"no complete runs found under {sweep}", file=sys.stderr)
        return 1
    private = write_private(out, runs, sweep, metric=args.metric, diffprivlib=not args.no_diffprivlib)
    progress("writing the publishable summary and figure")
    public = write_public(out, runs, sweep, metric=args.metric)
    extra = " and diffprivlib's fits" if private.attrs.get("diffprivlib") else ""
    print(f"{counts(runs, public)}: publishable summary and {MANIFEST} in {out}; "
          f"the summary computed from private rows{extra} in {out / PRIVATE_DIR} (keep with the data)")
    print(CAVEAT)
    return 0


if __name__ == "__main__":
    warnings.simplefilter("always")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    sys.exit(main())
