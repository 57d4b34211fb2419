"""Write a generated Parquet table for the data-path benchmark (issue 36): ``--rows`` rows of 8
numeric columns in [0, 1] (x0..x7, float32), 2 categorical columns (region and sector: 3 labels
each, strings; 16 encoded features) and a binary target ``y`` (0/1, int8) from a logistic model of them, in row
groups of 1,000,000 rows (written one group at a time: memory stays at one group). Seeded: the
same arguments give the same file. Nobody's data.

    python scripts/make_big_table.py --rows 20000000 --out /tmp/big20m.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REGIONS = ("north", "south", "west")
SECTORS = ("farm", "factory", "office")
GROUP = 1_000_000
NUMERIC = tuple(f"x{j}" for j in range(8))


def yaml_declaration() -> str:
    """The data declaration (Hydra overrides) that reads this table."""
    nums = ",".join(f"{c}:{{lower:0,upper:1}}" for c in NUMERIC)
    return (f"data=table data.target=y data.positive=null '++data.numeric={{{nums}}}' "
            f"'++data.categorical={{region:[{','.join(REGIONS)}],sector:[{','.join(SECTORS)}]}}'")


def write_data_config(folder: Path, table: Path, name: str = "big") -> Path:
    """``<folder>/data/<name>.yaml``: a data config for the table (``--config-dir <folder> data=<name>``)."""
    out = folder / "data" / f"{name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    nums = "\n".join(f"  {c}: {{lower: 0, upper: 1}}" for c in NUMERIC)
    out.write_text(f"defaults:\n  - table\n  - _self_\n\npath: {table}\ntarget: y\npositive: null\nnumeric:\n{nums}\n"
                   f"categorical:\n  region: [{', '.join(REGIONS)}]\n  sector: [{', '.join(SECTORS)}]\n")
    return out


def _group(rng: np.random.Generator, n: int) -> pa.Table:
    x = rng.random((n, len(NUMERIC)), dtype=np.float32)
    region = rng.integers(0, len(REGIONS), n)
    sector = rng.integers(0, len(SECTORS), n)
    logit = x @ np.linspace(-1.5, 1.5, len(NUMERIC)) + 0.3 * (region - 1) - 0.2 * sector
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    cols = {c: x[:, j] for j, c in enumerate(NUMERIC)}
    cols["region"] = pa.DictionaryArray.from_arrays(region.astype(np.int32), list(REGIONS))
    cols["sector"] = pa.DictionaryArray.from_arrays(sector.astype(np.int32), list(SECTORS))
    cols["y"] = y
    return pa.table(cols)


def make_table(path: Path, rows: int, seed: int = 36) -> Path:
    rng = np.random.default_rng([seed, rows])
    writer = None
    try:
        for start in range(0, rows, GROUP):
            table = _group(rng, min(GROUP, rows - start))
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table, row_group_size=GROUP)
    finally:
        if writer is not None:
            writer.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config-dir", type=Path, help="also write <dir>/data/big.yaml, a data config for the table")
    args = ap.parse_args()
    make_table(args.out, args.rows)
    print(f"{args.out}: {args.rows} rows, {args.out.stat().st_size / 2**20:.0f} MiB")
    if args.config_dir:
        print(f"read it with: --config-dir {args.config_dir} data=big ({write_data_config(args.config_dir, args.out)})")
    else:
        print("read it with:", yaml_declaration())


if __name__ == "__main__":
    main()
