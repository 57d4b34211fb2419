"""The numbers a user gets from their own table (issue 42's study): the default commands on
generated tables of the shapes users have, against the truth and statsmodels.

Designs (``--design``):

* ``survey``: 25,000 people, ``educ`` (1..16) and ``married`` only (32 distinct rows), married ~
  logistic with intercept -1.67 and 0.14 per year; ``experiment=logit`` with the DEFAULT split
  (no split column: keyed on each row and its occurrence number among identical rows).
* ``survey_region``: the same with a 4-level ``region`` (shares 0.4/0.3/0.2/0.1, effects 0, 0.3,
  -0.2, 0.1 against a).
* ``income``: 20,000 people, census-like income ~ educ + age (correlation 0.3 between them; a
  right-skewed error of sd 49,000; clipped to the declared [0, 200000]: :func:`income_table`), the
  truth being OLS's estimand on the clipped income; ``experiment=linreg`` (noisy sufficient
  statistics).

Each replication draws a table, runs the command in process (the command line's own code), reads
coefficients.csv and fits statsmodels (GLM / OLS) on the same training rows. With ``--row-id``
(logit designs) the same table is also run with ``data.split_key=[rid]`` (a row id) for the
test-accuracy comparison. Writes one CSV row per replication and term.

    python scripts/table_numbers_study.py --design survey --reps 200 --out experiments/inference/table_numbers
    python scripts/table_numbers_study.py --summarize experiments/inference/table_numbers
"""

from __future__ import annotations

import argparse
import json
import logging
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

SEEDS = {"survey": 1, "survey_region": 2, "income": 3}
REGION = {"a": 0.0, "b": 0.3, "c": -0.2, "d": 0.1}
TRUTH = {"survey": {"(Intercept)": -1.67, "educ": 0.14},
         "survey_region": {"(Intercept)": -1.67, "educ": 0.14, **{f"region[{k}] vs a": v for k, v in REGION.items()
                                                                   if k != "a"}},
         "income": None}  # income_truth(): OLS's estimand on the clipped income


def table(design: str, rng: np.random.Generator) -> pd.DataFrame:
    """One replication's table (module docstring), with a row id ``rid``."""
    if design == "income":
        return income_table(rng, 20_000)
    n = 25_000
    educ = rng.integers(1, 17, size=n)
    df = pd.DataFrame({"educ": educ})
    eta = -1.67 + 0.14 * educ
    if design == "survey_region":
        df["region"] = rng.choice(list("abcd"), size=n, p=[0.4, 0.3, 0.2, 0.1])
        eta = eta + df["region"].map(REGION).to_numpy()
    df["married"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    df.insert(0, "rid", np.arange(n))
    return df


def income_table(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Census-like: education (years, about N(13, 3) on 1..16) and age (about N(45, 14) on 18..90)
    with correlation 0.3; income = 40,000 + 3,000 educ + 500 age + a right-skewed error (a Gamma of
    shape 1.5 and scale 40,000, centred: sd 49,000), clipped to the declared [0, 200000]."""
    u = rng.normal(size=(n, 2)) @ np.linalg.cholesky([[1.0, 0.3], [0.3, 1.0]]).T  # correlation 0.3
    educ = np.clip(np.round(13 + 3 * u[:, 0]), 1, 16)
    age = np.clip(np.round(45 + 14 * u[:, 1]), 18, 90)
    income = 40_000 + 3000 * educ + 500 * age + rng.gamma(1.5, 40_000, size=n) - 60_000
    return pd.DataFrame({"rid": np.arange(n), "educ": educ, "age": age, "income": np.clip(income, 0, 200_000)})


def income_truth() -> dict[str, float]:
    """The estimand of OLS on the CLIPPED income (clipping at 0 and 200,000 moves it a little off the
    generating 40,000 / 3,000 / 500): OLS on 4,000,000 rows of the same design, once (seeded)."""
    df = income_table(np.random.default_rng(12345), 4_000_000)
    fit = sm.OLS(df.income.to_numpy(), sm.add_constant(df[["educ", "age"]].to_numpy())).fit()
    return dict(zip(["(Intercept)", "educ", "age"], map(float, fit.params)))


def overrides(design: str, path: Path, epsilon: float) -> list[str]:
    if design == "income":
        return ["experiment=linreg", "data=table", f"data.path={path}", "data.target=income",
                "++data.target_bounds={lower: 0, upper: 200000}",
                "++data.numeric={educ: {lower: 1, upper: 16}, age: {lower: 18, upper: 90}}",
                f"privacy.target_epsilon={epsilon}", "trainer.progress=false"]
    out = ["experiment=logit", "data=table", f"data.path={path}", "data.target=married", "data.positive=1",
           "data.negative=0",
           "++data.numeric={educ: {lower: 1, upper: 16}}", f"privacy.target_epsilon={epsilon}",
           "trainer.progress=false"]
    if design == "survey_region":
        out.append("++data.categorical={region: [a, b, c, d]}")
    return out


def run(over: list[str], where: Path) -> Path:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=over)
    cli.run(cfg, run_dir=where)
    return where


def reference(design: str, df: pd.DataFrame, train_rids: np.ndarray) -> pd.DataFrame:
    """statsmodels on the run's training rows (GLM Binomial / OLS), named as the table's terms."""
    tr = df[df.rid.isin(train_rids)]
    if design == "income":
        fit = sm.OLS(tr.income.astype(float), sm.add_constant(tr[["educ", "age"]].astype(float))).fit()
        names = {"const": "(Intercept)"}
    else:
        x = pd.get_dummies(tr.drop(columns=["rid", "married"]), drop_first=True, dtype=float)
        fit = sm.GLM(tr.married.astype(float), sm.add_constant(x), family=sm.families.Binomial()).fit()
        names = {"const": "(Intercept)", **{f"region_{k}": f"region[{k}] vs a" for k in "bcd"}}
    return pd.DataFrame({"ref": fit.params.rename(index=names), "ref_se": fit.bse.rename(index=names)})


def train_rows(df: pd.DataFrame, run_dir: Path) -> np.ndarray:
    """The training rows' ids: the rows the default split kept for training, recomputed by the same
    public rule (dptrain.data.split.split_scores) from the run's resolved config and file."""
    from omegaconf import OmegaConf

    from dptrain.data import schema_from_config
    from dptrain.data.split import split_scores

    cfg = OmegaConf.load(run_dir / ".hydra" / "resolved_config.yaml")
    schema = schema_from_config(cfg.data)
    u = split_scores(pd.read_csv(cfg.data.path), schema, seed=int(cfg.seed))
    return df.rid.to_numpy()[u >= schema.test_fraction]


def one(rep: int, args: argparse.Namespace, work: Path) -> list[dict]:
    rng = np.random.default_rng(1_000_000 * SEEDS[args.design] + rep)
    df = table(args.design, rng)
    path = work / f"t{rep}.csv"
    df.drop(columns="rid").to_csv(path, index=False)  # the table as the user has it: no id column
    out_dir = run(overrides(args.design, path, args.epsilon), work / f"run{rep}")
    tab = pd.read_csv(out_dir / "coefficients.csv").set_index("term")
    metrics = json.loads((out_dir / "private" / "metrics.json").read_text())
    ref = reference(args.design, df, train_rows(df, out_dir))
    acc_rid = None
    if args.row_id and rep < args.row_id and args.design != "income":
        with_id = work / f"t{rep}_rid.csv"
        df.to_csv(with_id, index=False)
        rid_dir = run([*overrides(args.design, with_id, args.epsilon), "data.split_key=[rid]"], work / f"rid{rep}")
        acc_rid = json.loads((rid_dir / "private" / "metrics.json").read_text())["test/acc"]
    rows = []
    for term, truth in (TRUTH[args.design] or income_truth()).items():
        r = tab.loc[term]
        rows.append({"design": args.design, "rep": rep, "epsilon": args.epsilon, "term": term, "truth": truth,
                     "estimate": r.estimate, "std_error": r.std_error, "ci_lower": r.ci_lower, "ci_upper": r.ci_upper,
                     "claimed": bool(r.claimed), "reason": r.reason, "ref": ref.loc[term, "ref"],
                     "ref_se": ref.loc[term, "ref_se"], "test_acc": metrics.get("test/acc"),
                     "test_rmse": metrics.get("test/rmse"), "test_acc_row_id": acc_rid})
    return rows


def summarize(folder: Path) -> str:
    """Per design and term: replications, share claimed, coverage of the claimed (binomial SE),
    statsmodels' own coverage, median width / statsmodels', estimates within 2 reference SEs; per
    logit design the test accuracy against the row-id split's."""
    df = pd.concat([pd.read_csv(p) for p in sorted(folder.glob("*.csv"))], ignore_index=True)
    lines = ["| design | term | reps | claimed | coverage of the claimed (SE) | statsmodels' coverage | "
             "width / statsmodels | within 2 SEs of statsmodels |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (design, term), g in df.groupby(["design", "term"], sort=False):
        c = g.claimed.astype(bool)
        cov = ((g.ci_lower <= g.truth) & (g.truth <= g.ci_upper))[c]
        n = int(c.sum())
        rate = cov.mean() if n else float("nan")
        ref_cov = ((g.ref - g.truth).abs() <= 1.959964 * g.ref_se).mean()
        width = ((g.ci_upper - g.ci_lower) / (2 * 1.959964 * g.ref_se))[c].median()
        near = ((g.estimate - g.ref).abs() <= 2 * g.ref_se).mean()
        se = (rate * (1 - rate) / n) ** 0.5 if n else float("nan")
        lines.append(f"| {design} | {term} | {len(g)} | {c.mean():.1%} | {rate:.1%} ({se:.1%}) | {ref_cov:.1%} | "
                     f"{width:.2f} | {near:.1%} |")
    acc = df.dropna(subset=["test_acc_row_id"]).drop_duplicates(["design", "rep"])
    for design, g in acc.groupby("design"):
        diff = g.test_acc - g.test_acc_row_id
        lines.append(f"\n{design}: test accuracy {g.test_acc.mean():.4f} (default split) against "
                     f"{g.test_acc_row_id.mean():.4f} (data.split_key=[rid]) over {len(g)} tables; largest "
                     f"|difference| {diff.abs().max():.4f}")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--summarize"]:
        print(summarize(Path(sys.argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", choices=sorted(TRUTH), required=True)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--first-rep", type=int, default=0)
    ap.add_argument("--row-id", type=int, default=50, help="the first K replications also run with a row-id "
                    "split key (the test-accuracy comparison); 0: none")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logging.disable(logging.WARNING)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.first_rep, args.first_rep + args.reps):
            rows += one(rep, args, Path(tmp))
    name = f"{args.design}_eps{args.epsilon:g}" + (f"_from{args.first_rep}" if args.first_rep else "")
    pd.DataFrame(rows).to_csv(args.out / f"{name}.csv", index=False)
    print(f"{name}: done (load {os.getloadavg()[0]:.2f})")
    print(summarize(args.out))


if __name__ == "__main__":
    main()
