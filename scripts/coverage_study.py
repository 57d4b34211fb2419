"""Coverage study of dptrain's confidence intervals (docs/inference.md).

    python scripts/coverage_study.py --out experiments/inference --jobs 2     # the full study
    python scripts/coverage_study.py --out /tmp/quick --reps 10 --n 2000      # a quick check

Synthetic data with KNOWN coefficients and public bounds, for N in {2,000, 20,000, 200,000} and
epsilon in {0.5, 1, 4}, ``--reps`` replications per cell (default 200):

* linear regression, ``estimator=ssp`` (noisy sufficient statistics, parametric bootstrap);
* logistic regression, ``estimator=subsample_aggregate`` (DP-SGD on K = ``--parts`` disjoint
  parts, t interval).

Per cell and term: coverage of the 95% interval, mean width against the non-private interval
(statsmodels OLS / Logit on the same rows), bias (mean estimate - truth) and the non-private
interval's own coverage. Then UCI Adult: a logit of income on a few columns, the DP table
(subsample_aggregate) beside the non-private statsmodels GLM. Writes ``cells.csv`` (appended
cell by cell, so a stopped run keeps what it finished), ``adult.csv`` and ``README.md``. The
library functions are called directly (no command line per replication); every replication
draws fresh secret noise (the OS CSPRNG), the data from ``--seed``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import statsmodels.api as sm  # noqa: E402
import torch  # noqa: E402

from dptrain.data.dataset import Dataset  # noqa: E402
from dptrain.data.encoding import encode_features  # noqa: E402
from dptrain.data.schema import schema_from_config  # noqa: E402
from dptrain.inference.coefficients import encoder_from_schema, model_coefficients, term_labels  # noqa: E402
from dptrain.inference.intervals import aggregate_parts  # noqa: E402
from dptrain.inference.ssp import calibrate, ssp_estimate  # noqa: E402
from dptrain.inference.subsample import fit_parts, part_mechanism  # noqa: E402
from dptrain.tasks.plan import training_plan  # noqa: E402

#: the public schema of the synthetic covariates (bounds from the "codebook", not the rows)
DECL = {"target": "y", "numeric": {"a": {"lower": 0, "upper": 10}, "b": {"lower": -5, "upper": 5},
                                   "c": {"lower": 0, "upper": 1000, "transform": "log1p"}},
        "categorical": {"g": ["p", "q", "r"]}}
#: true coefficients (per unit of a, b, log1p(c); g against its first level p)
LOGIT_TRUTH = {"(Intercept)": -1.0, "a": 0.15, "b": -0.2, "log1p(c)": 0.25, "g[q] vs p": 0.5, "g[r] vs p": -0.5}
LINEAR_TRUTH = {"(Intercept)": 2.0, "a": 0.5, "b": -0.8, "log1p(c)": 1.0, "g[q] vs p": 1.5, "g[r] vs p": -1.0}
Y_BOUNDS = (-25.0, 35.0)  # the linear target's public bounds (about 8 noise sd beyond the mean's range)
NOISE_SD = 2.0
DELTA = 1e-6  # < 1/(10 N) for every N of the study
TERMS = list(LOGIT_TRUTH)  # g[<other>] has no rows by design: not estimable, left out
SAMPLE_RATE, EPOCHS, LR = 1.0, 300, 4.0  # DP-SGD per part (logistic cells): q, epochs, SGD learning rate
#: Adult's parts train longer: hours_per_week fills a narrow band of its public range 1-99, a slow
#: direction for gradient descent (300 epochs leave its coefficient about 20% short of the GLM's)
ADULT_EPOCHS = 1000


def simulate(n: int, rng: np.random.Generator, kind: str) -> pd.DataFrame:
    """n rows with the study's covariates and a linear or logistic target."""
    df = pd.DataFrame({"a": rng.uniform(0, 10, n), "b": rng.uniform(-5, 5, n),
                       "c": np.minimum(rng.lognormal(3.0, 1.5, n), 1000.0),
                       "g": rng.choice(["p", "q", "r"], n, p=[0.5, 0.3, 0.2])})
    t = LOGIT_TRUTH if kind == "logit" else LINEAR_TRUTH
    eta = (t["(Intercept)"] + t["a"] * df.a + t["b"] * df.b + t["log1p(c)"] * np.log1p(df.c)
           + t["g[q] vs p"] * (df.g == "q") + t["g[r] vs p"] * (df.g == "r"))
    if kind == "logit":
        df["y"] = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(np.float32)
    else:
        df["y"] = np.clip(eta + rng.normal(0, NOISE_SD, n), *Y_BOUNDS)
    return df


def nonprivate(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """statsmodels' fit (OLS or Logit) on the raw columns, treatment coding against the first
    level: estimate and 95% interval per term (our names)."""
    design = np.column_stack([np.ones(len(df)), df.a, df.b, np.log1p(df.c), df.g == "q", df.g == "r"]).astype(float)
    model = sm.Logit(df.y.to_numpy(float), design) if kind == "logit" else sm.OLS(df.y.to_numpy(float), design)
    fit = model.fit(disp=0) if kind == "logit" else model.fit()
    ci = np.asarray(fit.conf_int(0.05))
    return pd.DataFrame({"estimate": np.asarray(fit.params), "lower": ci[:, 0], "upper": ci[:, 1]}, index=TERMS)


def _study_config(parts: int, eps: float, *, epochs: float, batch: int, lr: float, clip: float):
    """The training plan of the logistic cells (composed like a command-line run)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import dptrain.tasks.cli  # noqa: F401

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        conf = OmegaConf.to_object(compose(config_name="config", overrides=[
            "experiment=logit", "data=synthetic", "estimator=subsample_aggregate", f"estimator.parts={parts}",
            "privacy.noise_multiplier=null", f"privacy.target_epsilon={eps}", f"privacy.delta={DELTA}",
            f"privacy.max_grad_norm={clip}", f"trainer.epochs={epochs}", f"trainer.batch_size={batch}",
            f"optim.lr={lr}", "trainer.progress=false", "trainer.baseline=false", "trainer.threads=1"]))
    return training_plan(conf)


def _dataset(df: pd.DataFrame, schema) -> Dataset:
    x = torch.from_numpy(encode_features(df, schema))
    y = torch.from_numpy(df.y.to_numpy(np.float32).copy())
    return Dataset(x_train=x, y_train=y, x_test=x[:1].contiguous(), y_test=y[:1].contiguous(),
                   feature_names=schema.feature_names, source="coverage study")


def logit_rep(df: pd.DataFrame, schema, enc, plan, mech) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One replication of subsample_aggregate: (estimate, lower, upper) per study term."""
    parts = fit_parts(plan, _dataset(df, schema), mechanism=mech)
    iv = aggregate_parts(np.stack([model_coefficients(r.model, enc) for r in parts]), level=0.95)
    idx = [term_labels(enc).index(t) for t in TERMS]
    return iv.estimate[idx], iv.lower[idx], iv.upper[idx]


def linear_rep(df: pd.DataFrame, schema, enc, sigma: float, draws: int) -> tuple[np.ndarray, ...]:
    """One replication of ssp: (estimate, lower, upper) per study term."""
    y = (df.y.to_numpy() - Y_BOUNDS[0]) / (Y_BOUNDS[1] - Y_BOUNDS[0])
    fit = ssp_estimate(encode_features(df, schema).astype(np.float64), y, enc, noise_multiplier=sigma,
                       draws=draws, rng=np.random.default_rng())  # fresh OS entropy per replication
    idx = [term_labels(enc).index(t) for t in TERMS]
    iv = fit.interval
    return iv.estimate[idx], iv.lower[idx], iv.upper[idx]


def logit_settings(n: int, parts: int, epochs: int = EPOCHS) -> dict:
    """DP-SGD settings of a logistic cell: C = sqrt(1 + 3 numeric + 1 categorical) never clips a
    logistic gradient of this encoding (|p - y| <= 1, ||(1, x)|| <= sqrt(5)): no clipping bias."""
    return {"epochs": epochs, "batch": round(SAMPLE_RATE * n), "lr": LR, "clip": math.sqrt(5)}


def cell_rng(seed: int, kind: str, n: int, eps: float) -> np.random.Generator:
    """The data of one cell: its own stream from (seed, model, N, epsilon), whatever the order or
    parallelism the cells run in (the privacy noise is fresh from the OS CSPRNG regardless)."""
    return np.random.default_rng([seed, ["linear", "logit"].index(kind), n, round(eps * 1000)])


def _cell_job(kind: str, n: int, eps: float, args: argparse.Namespace) -> pd.DataFrame:
    torch.set_num_threads(1)
    return run_cell(kind, n, eps, args, cell_rng(args.seed, kind, n, eps))


def run_cell(kind: str, n: int, eps: float, args: argparse.Namespace, rng: np.random.Generator) -> pd.DataFrame:
    schema = schema_from_config({**DECL, "numeric": DECL["numeric"]})
    truth = np.array([(LOGIT_TRUTH if kind == "logit" else LINEAR_TRUTH)[t] for t in TERMS])
    if kind == "logit":
        enc = encoder_from_schema(schema, kind="binary")
        s = logit_settings(n, args.parts)
        plan = _study_config(args.parts, eps, **s)
        mech = part_mechanism(plan, dataset_size=n, delta=DELTA)
    else:
        enc = encoder_from_schema(schema, kind="linear", target_scale=Y_BOUNDS)
        sigma = calibrate(target_epsilon=eps, delta=DELTA, accountant="rdp")
    rows, start = [], time.perf_counter()
    for _ in range(args.reps if kind == "linear" else args.logit_reps or args.reps):
        df = simulate(n, rng, kind)
        est, lo, hi = logit_rep(df, schema, enc, plan, mech) if kind == "logit" else linear_rep(
            df, schema, enc, sigma, args.draws)
        ref = nonprivate(df, kind)
        rows.append(pd.DataFrame({"term": TERMS, "truth": truth, "estimate": est, "lower": lo, "upper": hi,
                                  "np_estimate": ref.estimate.to_numpy(), "np_lower": ref.lower.to_numpy(),
                                  "np_upper": ref.upper.to_numpy()}))
    reps = pd.concat(rows)
    seconds = time.perf_counter() - start
    return summarise(reps, kind=kind, n=n, eps=eps, seconds=seconds)


def summarise(reps: pd.DataFrame, *, kind: str, n: int, eps: float, seconds: float) -> pd.DataFrame:
    reps = reps.assign(hit=(reps.lower <= reps.truth) & (reps.truth <= reps.upper),
                       np_hit=(reps.np_lower <= reps.truth) & (reps.truth <= reps.np_upper),
                       width=reps.upper - reps.lower, np_width=reps.np_upper - reps.np_lower,
                       err=reps.estimate - reps.truth)
    g = reps.groupby("term", sort=False)
    out = pd.DataFrame({
        "coverage": g.hit.mean(), "width_ratio": g.width.mean() / g.np_width.mean(), "bias": g.err.mean(),
        "rmse": np.sqrt(g.err.apply(lambda e: float(np.mean(e**2)))), "np_coverage": g.np_hit.mean(),
        "reps": g.size()}).reset_index()
    out.insert(0, "model", "linear (ssp)" if kind == "linear" else "logit (subsample_aggregate)")
    out.insert(1, "N", n)
    out.insert(2, "epsilon", eps)
    out["seconds_per_rep"] = seconds / out.reps.iloc[0]
    return out


ADULT_DECL = {"target": "income", "positive": ">50K", "negative": "<=50K",
              "numeric": {"age": {"lower": 17, "upper": 90}, "education_num": {"lower": 1, "upper": 16},
                          "hours_per_week": {"lower": 1, "upper": 99}},
              "categorical": {"sex": ["Female", "Male"]}}


def adult_tables(eps_list: list[float], parts: int) -> pd.DataFrame:
    """Adult (train split): income > 50K on age, education_num, hours_per_week and sex, DP
    (subsample_aggregate) beside statsmodels' non-private GLM (Binomial, treatment coding)."""
    import statsmodels.formula.api as smf

    from dptrain.data import load_adult_frame

    df = load_adult_frame()
    df = df[df.split == "train"].reset_index(drop=True)
    schema = schema_from_config(ADULT_DECL)
    enc = encoder_from_schema(schema, kind="binary")
    data = Dataset(x_train=torch.from_numpy(encode_features(df, schema)),
                   y_train=torch.from_numpy((df.income.astype(str).str.strip() == ">50K").to_numpy(np.float32)),
                   x_test=torch.zeros(1, enc.n_features), y_test=torch.zeros(1), feature_names=schema.feature_names,
                   source="UCI Adult (train split)")
    raw = df.assign(y=data.y_train.numpy().astype(float), sex=df.sex.astype(str).str.strip())
    glm = smf.glm("y ~ age + education_num + hours_per_week + C(sex, Treatment('Female'))", raw,
                  family=sm.families.Binomial()).fit()
    ci = glm.conf_int(0.05)
    names = ["Intercept", "age", "education_num", "hours_per_week", "C(sex, Treatment('Female'))[T.Male]"]
    terms = ["(Intercept)", "age", "education_num", "hours_per_week", "sex[Male] vs Female"]
    out = pd.DataFrame({"term": terms, "glm_estimate": glm.params[names].to_numpy(),
                        "glm_lower": ci[0][names].to_numpy(), "glm_upper": ci[1][names].to_numpy()})
    labels = term_labels(enc)
    for eps in eps_list:
        s = logit_settings(len(df), parts, epochs=ADULT_EPOCHS)
        plan = _study_config(parts, eps, **{**s, "clip": math.sqrt(5)})
        mech = part_mechanism(plan, dataset_size=data.n_train, delta=1e-5)
        fits = fit_parts(plan, data, mechanism=mech)
        iv = aggregate_parts(np.stack([model_coefficients(r.model, enc) for r in fits]))
        idx = [labels.index(t) for t in terms]
        out[f"dp_eps{eps:g}_estimate"] = iv.estimate[idx]
        out[f"dp_eps{eps:g}_lower"] = iv.lower[idx]
        out[f"dp_eps{eps:g}_upper"] = iv.upper[idx]
    return out


def _md(frame: pd.DataFrame, floatfmt: str = ".3g") -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(format(v, floatfmt) if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def claimed(model: str, n: int, eps: float, parts: int) -> str:
    """Whether dptrain claims coverage in this cell (dptrain.inference.run.validity_check: rows
    per fit x epsilon >= 2,000), as a run with these numbers would report it."""
    from dptrain.inference.run import validity_check

    name = "ssp" if model.startswith("linear") else "subsample_aggregate"
    check = validity_check(name, epsilon=eps, dataset_size=int(n), parts=1 if name == "ssp" else parts)
    return "yes" if check["claimed"] else "no"


def verdict(row: Any) -> str:
    """A claimed cell meets the 93-97% target when its mean coverage over the terms is inside
    [0.93, 0.97] and no term is further outside it than 2 binomial sd (Monte-Carlo error of a
    coverage estimated from ``reps`` replications)."""
    if row.claimed != "yes":
        return "not claimed"
    sd = math.sqrt(0.95 * 0.05 / row.reps)
    mean, low, high = row[5], row[6], row[7]  # coverage mean, min, max
    ok = 0.93 <= mean <= 0.97 and low >= 0.93 - 2 * sd and high <= 0.97 + 2 * sd
    return "meets 93-97%" if ok else "OUTSIDE 93-97%"


def write_readme(out: Path, cells: pd.DataFrame, adult: pd.DataFrame | None, args: argparse.Namespace,
                 seconds: float) -> None:
    """README.md: the command, the runtime and the tables (per cell: coverage range over terms,
    worst width ratio, largest |bias|; per term in cells.csv)."""
    g = cells.groupby(["model", "N", "epsilon"], sort=False)
    short = pd.DataFrame({
        "reps": g.reps.first(), "coverage mean": g.coverage.mean(), "coverage min": g.coverage.min(),
        "coverage max": g.coverage.max(),
        "width ratio (max over terms)": g.width_ratio.max(), "max abs bias": g.bias.apply(lambda b: b.abs().max()),
        "non-private coverage (min)": g.np_coverage.min(), "s/rep": g.seconds_per_rep.first()}).reset_index()
    short.insert(3, "claimed", [claimed(m, n, e, args.parts) for m, n, e in zip(short.model, short.N, short.epsilon)])
    short["verdict"] = [verdict(r) for r in short.itertuples(index=False)]
    cmd = " ".join(["python scripts/coverage_study.py", *sys.argv[1:]])
    text = [HEADER.format(cmd=cmd, minutes=seconds / 60, parts=args.parts, draws=args.draws),
            "## Summary per cell", "", _md(short), "", "## Per term", "", _md(cells.drop(columns=["seconds_per_rep"])),
            ""]
    if adult is not None:
        text += [f"## UCI Adult: DP (subsample_aggregate, K = {args.parts}) beside the non-private GLM", "",
                 ADULT_NOTE, "", _md(adult, ".4g"), ""]
    (out / "README.md").write_text("\n".join(text) + NOTES, encoding="utf-8")


HEADER = """# Coverage of dptrain's confidence intervals

Regenerate: `{cmd}` ({minutes:.0f} min on the 2-core development machine, sharing it with other jobs).

Synthetic data with known coefficients: covariates a ~ U(0, 10) (public bounds [0, 10]),
b ~ U(-5, 5) ([-5, 5]), c log-normal capped at 1,000 (bounds [0, 1000], `transform: log1p`),
g in {{p, q, r}} (declared, reference p). Linear regression: y = eta + N(0, 2^2), target bounds
[-25, 35], `estimator=ssp` ({draws} bootstrap draws). Logistic regression: y ~ Bernoulli(sigmoid(eta)),
`estimator=subsample_aggregate` with K = {parts} parts, C = sqrt(5) (never clips: no clipping bias),
delta = 1e-6 everywhere. Coverage: share of replications whose 95% interval holds the true
coefficient (binomial sd at 200 replications: 1.5 points). Width ratio: mean DP interval width /
mean non-private (statsmodels) interval width on the same rows. Bias: mean estimate - truth.
"""

ADULT_NOTE = """Logit of income > 50K on age, education_num, hours_per_week (public bounds of the
shipped schema) and sex (reference Female), on the 32,561 training rows: statsmodels' GLM
(Binomial, treatment coding) and dptrain's table at epsilon 1 and 4 (delta 1e-5; K = 10 parts of
about 3,256 rows, so floor(N/K) x epsilon is 13,024 at epsilon 4 (coverage claimed) and 3,256 at
epsilon 1 (NOT claimed: below subsample_aggregate's 8,000); full-batch DP-SGD, 1,000 epochs, lr 4,
C = sqrt(5)). The DP interval estimates the expectation of one part's DP-SGD
estimate: where DP-SGD has not converged on a part it misses the GLM's value (with 300 epochs
the hours_per_week coefficient, a slow direction since the column fills a narrow band of its
public range 1-99, stayed about 20% short and its interval missed the GLM's at epsilon 4)."""

NOTES = """
## Reading the tables

* **Verdict.** A cell where dptrain claims coverage (column `claimed`: rows per fit x epsilon at
  least 2,000 for `ssp`, 8,000 for `subsample_aggregate`, as `validity_check` in a run's report)
  "meets 93-97%" when the mean coverage over its terms is inside [0.93, 0.97] and no term is
  further outside that band than 2 binomial sd (1.5 points each at 200 replications): one term
  at 0.91 or 0.985 is within the Monte-Carlo error of a well-calibrated interval, and the
  non-private statsmodels intervals on the same rows spread as widely (0.90-0.985).
* **`ssp`** (linear regression, rows centred at public points before the release): every claimed
  cell meets the band; the one unclaimed cell (N = 2,000, epsilon 0.5: N x epsilon = 1,000)
  ranges from 0.905 to 0.995 over its terms (the inverse of a very noisy Gram matrix is biased
  and skewed; the basic bootstrap corrects that to first order only).
* **`subsample_aggregate`** (logistic regression, K = 10 parts, full-batch DP-SGD, C = sqrt(5)):
  the claimed cells (N = 20,000 at epsilon 4, every epsilon at N = 200,000) meet the band. Below
  8,000 the noisy part fits are biased AWAY from zero (N = 20,000: slopes 17-63% too large at
  epsilon 0.5-1) and the intervals under-cover (0.76-0.94); with 200 rows per part (N = 2,000,
  refused by default by `estimator.min_part_rows = 1000`) down to 0.67.
* **Width at N = 200,000, epsilon 4:** `ssp` at most 1.40x the non-private interval,
  `subsample_aggregate` at most 1.31x (its floor is t_{9, 0.975} / z_{0.975} = 1.15 with K = 10
  even without privacy noise): both within the 1.5x target.
* `s/rep` is the wall time per replication as run (two lanes sharing 2 cores with other jobs).
"""


def merge(args: argparse.Namespace) -> int:
    """README.md from earlier (partial) runs' cells.csv and adult.csv (e.g. run in parallel)."""
    cells = pd.concat([pd.read_csv(d / "cells.csv") for d in args.merge if (d / "cells.csv").exists()])
    cells = cells.drop_duplicates(["model", "N", "epsilon", "term"], keep="last")  # a later folder's rerun wins
    order = {t: i for i, t in enumerate(TERMS)}
    cells = cells.sort_values(["model", "N", "epsilon", "term"], key=lambda c: c.map(order) if c.name == "term" else c,
                              kind="stable")
    adults = [pd.read_csv(d / "adult.csv") for d in args.merge if (d / "adult.csv").exists()]
    args.out.mkdir(parents=True, exist_ok=True)
    cells.to_csv(args.out / "cells.csv", index=False)
    if adults:
        adults[-1].to_csv(args.out / "adult.csv", index=False)  # a later folder's table wins
    seconds = float((cells.seconds_per_rep * cells.reps).groupby([cells.model, cells.N, cells.epsilon]).first().sum())
    write_readme(args.out, cells, adults[-1] if adults else None, args, seconds)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "inference")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--n", type=int, nargs="*", default=[2000, 20000, 200000])
    p.add_argument("--eps", type=float, nargs="*", default=[0.5, 1.0, 4.0])
    p.add_argument("--models", nargs="*", default=["linear", "logit"], choices=["linear", "logit"])
    p.add_argument("--parts", type=int, default=10)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel (processes, one thread each)")
    p.add_argument("--logit-reps", type=int, default=None, help="replications of the logistic cells (default --reps)")
    p.add_argument("--no-adult", action="store_true")
    p.add_argument("--merge", type=Path, nargs="*", default=None,
                   help="only write README.md into --out from these folders' cells.csv / adult.csv")
    args = p.parse_args(argv)
    if args.merge:
        return merge(args)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    start, cells = time.perf_counter(), []
    # the slowest cells first, so that parallel workers finish together
    jobs = sorted(((kind, n, eps) for kind in args.models for n in args.n for eps in args.eps),
                  key=lambda c: (c[0] != "logit", -c[1]))

    def done(cell: pd.DataFrame) -> None:
        cells.append(cell)
        pd.concat(cells).to_csv(args.out / "cells.csv", index=False)
        print(cell.to_string(index=False), flush=True)

    if args.jobs > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for fut in as_completed([pool.submit(_cell_job, *job, args) for job in jobs]):
                done(fut.result())
    else:
        for job in jobs:
            done(_cell_job(*job, args))
    if cells:  # the tables in a fixed order, whatever order the cells finished in
        order = {t: i for i, t in enumerate(TERMS)}
        cells = [pd.concat(cells).sort_values(["model", "N", "epsilon", "term"], kind="stable", key=lambda c: c.map(
            order) if c.name == "term" else c)]
        cells[0].to_csv(args.out / "cells.csv", index=False)
    adult = None if args.no_adult else adult_tables([1.0, 4.0], args.parts)
    if adult is not None:
        adult.to_csv(args.out / "adult.csv", index=False)
        print(adult.to_string(index=False))
    if cells:
        write_readme(args.out, pd.concat(cells), adult, args, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
