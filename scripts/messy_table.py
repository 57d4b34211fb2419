"""Write a table the way people have them (issue 44), and the true counts of what dptrain's declared
rules do with it: 3,000 rows with an id column whose values repeat (a person on several rows),
ages with blanks and values above the declared bound, incomes written "60,366" (digit groups, in
quotes) with blanks, a region with a typo variant "Sud" for the declared "Süd" on 150 rows and
blanks, Unicode labels (some "ländlich" stored decomposed, NFD) and a yes/no target with 995 "yes",
425 "Yes", 72 blanks and 1,508 "no".

    python scripts/messy_table.py people.csv [--truth truth.json] [--seed 0]

The truth is computed here with plain pandas, independently of dptrain, for the settings
``dptrain check`` names (:data:`SETTINGS` after :data:`DECLARED`): the rows each rule leaves out,
lumps, relabels or clips. tests/test_own_table.py compares a run's private/data_diagnostics.json
with it.
"""

from __future__ import annotations

import argparse
import json
import unicodedata

import numpy as np
import pandas as pd

ROWS = 3000
#: the schema a data holder declares first (a command line; bounds and labels from a codebook)
DECLARED = ["data=table", "data.target=answer", "data.positive=yes", "data.negative=no",
            "++data.numeric={age: {lower: 18, upper: 90}, annual_income: {lower: 0, upper: 200000}}",
            '++data.categorical={region: [Nord, "Süd", Ost, West], urban: ["städtisch", "ländlich"]}']
#: what `dptrain check` names for this file, and with which the truth below is computed
SETTINGS = ["data.thousands=','", '++data.label_map={region: {Sud: "Süd"}, answer: {Yes: "yes"}}',
            "data.split_key=[person_id]"]
REGIONS = ["Nord", "Süd", "Ost", "West"]


def _exactly(rng: np.random.Generator, n: int, k: int, among: np.ndarray | None = None) -> np.ndarray:
    """A mask of n rows with exactly k True, drawn among the True rows of ``among``."""
    pool = np.flatnonzero(np.ones(n, dtype=bool) if among is None else among)
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(pool, size=k, replace=False)] = True
    return mask


def messy(seed: int = 0, rows: int = ROWS) -> pd.DataFrame:
    """The table (all cells as text, as a CSV holds them); the target depends on age, income and region."""
    rng = np.random.default_rng(seed)
    person = np.r_[np.arange(1, rows - 299), rng.integers(1, rows - 299, 300)]  # 300 rows of people seen before
    age = np.clip(rng.normal(46, 17, rows).round(), 18, 99).astype(int)
    income = np.exp(rng.normal(10.7, 0.7, rows)).round().astype(int).clip(3000, 400000)
    region = rng.choice(REGIONS, rows, p=[0.3, 0.35, 0.2, 0.15])
    urban = rng.choice(["städtisch", "ländlich"], rows, p=[0.6, 0.4])
    score = 0.04 * (age - 46) + 0.9 * (np.log(income) - 10.7) + 0.4 * (region == "Süd") + rng.logistic(size=rows)
    blank_answer = _exactly(rng, rows, 72)
    yes = np.zeros(rows, dtype=bool)
    open_rows = np.flatnonzero(~blank_answer)
    yes[open_rows[np.argsort(-score[open_rows])[:995 + 425]]] = True  # the 1,420 highest scores answer yes
    answer = np.where(yes, "yes", "no").astype(object)
    answer[_exactly(rng, rows, 425, yes)] = "Yes"
    answer[blank_answer] = ""
    region = region.astype(object)
    region[_exactly(rng, rows, 150, region == "Süd")] = "Sud"
    region[_exactly(rng, rows, 40, region != "Sud")] = ""
    urban = urban.astype(object)
    urban[_exactly(rng, rows, 60, urban == "ländlich")] = unicodedata.normalize("NFD", "ländlich")
    age_text = age.astype(str).astype(object)
    age_text[_exactly(rng, rows, 45)] = ""
    income_text = np.array([f"{v:,}" for v in income], dtype=object)
    income_text[_exactly(rng, rows, 30)] = ""
    return pd.DataFrame({"person_id": person, "age": age_text, "annual_income": income_text, "region": region,
                         "urban": urban, "answer": answer})


def truth(df: pd.DataFrame) -> dict:
    """What the declared rules do with ``df`` under DECLARED + SETTINGS, counted with pandas."""
    blank = {c: df[c].astype(str).str.strip() == "" for c in df.columns}
    age = pd.to_numeric(df["age"].where(~blank["age"]), errors="coerce")
    income = pd.to_numeric(df["annual_income"].str.replace(",", "").where(~blank["annual_income"]), errors="coerce")
    kept = ~blank["answer"] & ~blank["age"] & ~blank["annual_income"]
    return {
        "read": len(df), "kept": int(kept.sum()), "left_out": int((~kept).sum()),
        "left_out_by": {"target": {"answer": {"missing": int(blank["answer"].sum()), "undeclared": 0}},
                        "numeric": {"age": {"missing": int(blank["age"].sum()), "infinite": 0},
                                    "annual_income": {"missing": int(blank["annual_income"].sum()), "infinite": 0}}},
        "lumped": {"region": {"missing": int((blank["region"] & kept).sum()), "undeclared": 0},
                   "urban": {"missing": 0, "undeclared": 0}},
        "mapped": {"answer": int((df["answer"] == "Yes").sum()), "region": int((df["region"] == "Sud").sum())},
        "clipped": {"age": {"below_lower": int(((age < 18) & kept).sum()),
                            "above_upper": int(((age > 90) & kept).sum())},
                    "annual_income": {"below_lower": 0, "above_upper": int(((income > 200000) & kept).sum())}},
        "answers": {k: int((df["answer"] == k).sum()) for k in ("yes", "Yes", "no", "")},
        "persons": {"distinct": int(df["person_id"].nunique()),
                    "repeated_ids": int((df["person_id"].value_counts() > 1).sum())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--truth", default=None, help="also write the true counts (JSON) here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    df = messy(args.seed)
    df.to_csv(args.out, index=False)
    if args.truth:
        with open(args.truth, "w", encoding="utf-8") as f:
            json.dump(truth(df), f, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    main()
