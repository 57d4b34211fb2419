"""Write a generated survey-like table (a CSV of few distinct rows) for trying the coefficient table:
``educ`` (years of education, 1..16), ``married`` (0/1, logistic in educ with slope 0.14 per year
and intercept -1.2) and ``split`` (20% "test", the rest "train"). The truth is known, so the
interval the run prints can be checked against it.

    python scripts/survey_table.py survey.csv --rows 25000 --seed 0
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd


def survey(rows: int, seed: int, slope: float = 0.14) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    educ = rng.integers(1, 17, size=rows)
    married = (rng.uniform(size=rows) < 1 / (1 + np.exp(-(-1.2 + slope * educ)))).astype(int)
    split = np.where(rng.uniform(size=rows) < 0.2, "test", "train")
    return pd.DataFrame({"educ": educ, "married": married, "split": split})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=25000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    survey(args.rows, args.seed).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
