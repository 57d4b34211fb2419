"""Coverage of the default command's intervals (``python -m dptrain experiment=logit``: DP-SGD,
then two private Newton steps) on generated survey-like tables, against statsmodels' GLM.

Each replication draws a table of few distinct rows (education 1..16 uniform, married ~ logistic
with slope ``--slope`` per year, intercept -1.2; optionally a 4-level region), 20% test rows by a
split column, runs ``experiment=logit`` with ``privacy.target_epsilon`` on it (the command line's
own code, in process), and reads coefficients.csv. Writes one CSV row per replication and prints,
per cell, the coverage of the true slope, the median width against the GLM's (same train rows),
and the share of runs that CLAIM their intervals. ``--multinomial``: three classes (low, mid,
high; mid and high against low with slopes 0.1 and 0.2 per year), ``experiment=multiclass``,
coverage of both slopes against statsmodels' MNLogit.

    python scripts/newton_coverage_study.py --rows 25000 --epsilon 1 --reps 200 --out experiments/inference/newton
    python scripts/newton_coverage_study.py --summarize experiments/inference/newton   # the pooled table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hydra import compose, initialize_config_module  # noqa: E402

from dptrain.tasks import cli  # noqa: E402

#: --multinomial: per class against "low", (intercept, slope per year of education)
CLASSES = {"mid": (-0.5, 0.1), "high": (-2.5, 0.2)}


def _multinomial_table(rng: np.random.Generator, n: int) -> pd.DataFrame:
    educ = rng.integers(1, 17, size=n)
    scores = np.stack([np.zeros(n)] + [a + b * educ for a, b in CLASSES.values()], axis=1)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    pick = (rng.uniform(size=(n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
    df = pd.DataFrame({"educ": educ, "outcome": np.array(["low", *CLASSES])[np.minimum(pick, 2)]})
    df["split"] = np.where(rng.uniform(size=n) < 0.2, "test", "train")
    return df


def _mnlogit(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    tr = df[df.split == "train"]
    codes = tr.outcome.map({"low": 0, "mid": 1, "high": 2}).to_numpy()
    fit = sm.MNLogit(codes, sm.add_constant(tr[["educ"]].astype(float))).fit(disp=0)
    params, bse = np.asarray(fit.params), np.asarray(fit.bse)  # (terms, classes 1..2)
    return {c: (float(params[1, k]), float(bse[1, k])) for k, c in enumerate(CLASSES)}


def _multinomial_one(rep: int, args: argparse.Namespace, work: Path) -> list[dict]:
    rng = np.random.default_rng(20_000 * int(args.rows) + rep)
    df = _multinomial_table(rng, args.rows)
    path = work / f"t{rep}.csv"
    df.to_csv(path, index=False)
    overrides = ["experiment=multiclass", "data=table", f"data.path={path}", "data.target=outcome",
                 "++data.classes=[low, mid, high]", "data.split_column=split",
                 "++data.numeric={educ: {lower: 1, upper: 16}}", f"privacy.target_epsilon={args.epsilon}",
                 "trainer.progress=false", "trainer.dp_curves=false", f"estimator.interval_share={args.share}"]
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run = work / f"run{rep}"
    cli.run(cfg, run_dir=run)
    table = pd.read_csv(run / "coefficients.csv").set_index("term")
    glm = _mnlogit(df)
    check = json.loads((run / "privacy.json").read_text())["estimator"].get("validity_check") or {}
    out = []
    for c, (_, slope) in CLASSES.items():
        row = table.loc[f"{c} vs low: educ"]
        out.append({**{k: check.get(k) for k in ("noise_to_sampling", "hessian_noise", "first_step_in_se")},
                    "rep": rep, "rows": args.rows, "epsilon": args.epsilon, "share": args.share, "term": c,
                    "truth": slope, "estimate": row.estimate, "std_error": row.std_error, "ci_lower": row.ci_lower,
                    "ci_upper": row.ci_upper, "claimed": bool(row.claimed), "glm": glm[c][0], "glm_se": glm[c][1]})
    return out


def _table(rng: np.random.Generator, n: int, slope: float, region: bool, continuous: bool = False) -> pd.DataFrame:
    educ = rng.uniform(1, 16, size=n) if continuous else rng.integers(1, 17, size=n)
    eta = -1.2 + slope * educ
    df = pd.DataFrame({"educ": educ})
    if continuous:  # a second continuous covariate: age, 18..80, 0.02 per year (centred at 49)
        df["age"] = rng.uniform(18, 80, size=n)
        eta = eta + 0.02 * (df["age"].to_numpy() - 49.0)
    if region:
        df["region"] = rng.choice(list("abcd"), size=n, p=[0.4, 0.3, 0.2, 0.1])
        eta = eta + df["region"].map({"a": 0.0, "b": 0.3, "c": -0.2, "d": 0.1}).to_numpy()
    df["married"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    df["split"] = np.where(rng.uniform(size=n) < 0.2, "test", "train")
    return df


def _glm(df: pd.DataFrame) -> tuple[float, float]:
    tr = df[df.split == "train"]
    x = pd.get_dummies(tr.drop(columns=["married", "split"]), drop_first=True, dtype=float)
    fit = sm.Logit(tr.married.astype(float), sm.add_constant(x.astype(float))).fit(disp=0)
    return float(fit.params["educ"]), float(fit.bse["educ"])


def one(rep: int, args: argparse.Namespace, work: Path) -> dict:
    rng = np.random.default_rng(10_000 * int(args.rows) + rep)
    df = _table(rng, args.rows, args.slope, args.region, args.continuous)
    path = work / f"t{rep}.csv"
    df.to_csv(path, index=False)
    overrides = ["experiment=logit", "data=table", f"data.path={path}", "data.target=married",
                 "data.split_column=split", "++data.numeric={educ: {lower: 1, upper: 16}}",
                 f"privacy.target_epsilon={args.epsilon}", "trainer.progress=false", "trainer.dp_curves=false",
                 f"estimator.interval_share={args.share}"]
    if args.region:
        overrides.append("++data.categorical={region: [a, b, c, d]}")
    if args.continuous:
        overrides[5] = "++data.numeric={educ: {lower: 1, upper: 16}, age: {lower: 18, upper: 80}}"
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    run = work / f"run{rep}"
    cli.run(cfg, run_dir=run)
    row = pd.read_csv(run / "coefficients.csv").set_index("term").loc["educ"]
    glm, glm_se = _glm(df)
    estimator = json.loads((run / "privacy.json").read_text())["estimator"]
    check = estimator.get("validity_check") or {}
    fit = estimator.get("newton_fit") or {}
    at = fit["term"].index("educ") if fit else None
    return {**{k: check.get(k) for k in ("noise_to_sampling", "hessian_noise", "first_step_in_se")}, "rep": rep,
            "rows": args.rows, "epsilon": args.epsilon, "share": args.share, "region": args.region,
            "estimate": row.estimate, "std_error": row.std_error, "ci_lower": row.ci_lower,
            "ci_upper": row.ci_upper, "claimed": bool(row.claimed), "glm": glm, "glm_se": glm_se,
            "newton_estimate": fit["estimate"][at] if fit else None,
            "newton_std_error": fit["std_error"][at] if fit else None, "truth": args.slope}


def summarize(folder: Path) -> str:
    """The study's table from every CSV in ``folder`` (batches of one cell, ``..._from<K>.csv``,
    pooled): per cell the intervals, the share claimed, the coverage of the claimed intervals with
    its binomial SE, the GLM's own coverage on the same tables, and the median width against it."""
    frames: dict[str, list[pd.DataFrame]] = {}
    for path in sorted(folder.glob("rows*.csv")):
        frames.setdefault(path.stem.split("_from")[0], []).append(pd.read_csv(path))
    lines = ["| cell | intervals | claimed | coverage of the claimed (SE) | GLM's coverage | width / GLM |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, parts in frames.items():
        df = pd.concat(parts, ignore_index=True)
        truth = df["truth"] if "truth" in df else pd.Series(0.14, index=df.index)
        claimed = df["claimed"].astype(bool)
        covered = ((df.ci_lower <= truth) & (truth <= df.ci_upper))[claimed]
        rate, n = covered.mean(), int(claimed.sum())
        glm = ((df.glm - truth).abs() <= 1.959964 * df.glm_se).mean()
        lines.append(f"| {name} | {len(df)} | {claimed.mean():.1%} | {rate:.1%} ({(rate * (1 - rate) / n) ** 0.5:.1%}) "
                     f"| {glm:.1%} | {(df.std_error / df.glm_se)[claimed].median():.2f} |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--summarize"]:
        print(summarize(Path(sys.argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=25000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--slope", type=float, default=0.14)
    ap.add_argument("--region", action="store_true")
    ap.add_argument("--continuous", action="store_true", help="continuous education and a continuous age")
    ap.add_argument("--multinomial", action="store_true", help="three classes, experiment=multiclass")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--first-rep", type=int, default=0, help="the first replication's index (its table's seed): "
                    "a later batch extends a cell with new tables; its CSV is named ..._from<K>.csv")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    name = (f"rows{args.rows}_eps{args.epsilon:g}_share{args.share:g}" + ("_region" if args.region else "")
            + ("_continuous" if args.continuous else "") + ("_multinomial" if args.multinomial else "")
            + (f"_from{args.first_rep}" if args.first_rep else ""))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.first_rep, args.first_rep + args.reps):
            if args.multinomial:
                rows.extend(_multinomial_one(rep, args, Path(tmp)))
            else:
                rows.append(one(rep, args, Path(tmp)))
    df = pd.DataFrame(rows)
    df.to_csv(args.out / f"{name}.csv", index=False)
    covered = (df.ci_lower <= df.truth) & (df.truth <= df.ci_upper)
    claimed = df.claimed
    print(f"{name}: {len(df)} intervals (load {os.getloadavg()[0]:.2f}); claimed {claimed.mean():.3f}; "
          f"coverage (claimed runs) {covered[claimed].mean():.3f}; median width / GLM "
          f"{(df.std_error / df.glm_se)[claimed].median():.2f}; median |estimate - GLM| / GLM se "
          f"{((df.estimate - df.glm).abs() / df.glm_se).median():.2f}; the GLM's own 95% interval covers "
          f"{((df.glm - df.truth).abs() <= 1.959964 * df.glm_se).mean():.3f} on these tables")


if __name__ == "__main__":
    main()
