"""Coverage of the default command's intervals (``python -m dptrain experiment=logit``: DP-SGD,
then two private Newton steps) on generated survey-like tables, against statsmodels' GLM.

Each replication draws a table of few distinct rows (education 1..16 uniform, married ~ logistic
with slope ``--slope`` per year, intercept -1.2; optionally a 4-level region), 20% test rows by a
split column, runs ``experiment=logit`` with ``privacy.target_epsilon`` on it (the command line's
own code, in process), and reads coefficients.csv. Writes one CSV row per replication and prints,
per cell, the coverage of the true slope, the median width against the GLM's (same train rows),
and the share of runs that CLAIM their intervals.

    python scripts/newton_coverage_study.py --rows 25000 --epsilon 1 --reps 200 --out experiments/inference/newton
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
            "newton_std_error": fit["std_error"][at] if fit else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=25000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--slope", type=float, default=0.14)
    ap.add_argument("--region", action="store_true")
    ap.add_argument("--continuous", action="store_true", help="continuous education and a continuous age")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    name = (f"rows{args.rows}_eps{args.epsilon:g}_share{args.share:g}" + ("_region" if args.region else "")
            + ("_continuous" if args.continuous else ""))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            rows.append(one(rep, args, Path(tmp)))
    df = pd.DataFrame(rows)
    df.to_csv(args.out / f"{name}.csv", index=False)
    covered = (df.ci_lower <= args.slope) & (args.slope <= df.ci_upper)
    claimed = df.claimed
    print(f"{name}: {len(df)} runs (load {os.getloadavg()[0]:.2f}); claimed {claimed.mean():.3f}; "
          f"coverage (claimed runs) {covered[claimed].mean():.3f}; median width / GLM "
          f"{(df.std_error / df.glm_se)[claimed].median():.2f}; median |estimate - GLM| / GLM se "
          f"{((df.estimate - df.glm).abs() / df.glm_se).median():.2f}")


if __name__ == "__main__":
    main()
