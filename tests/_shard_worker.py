"""Worker for tests/test_shards.py, run under torchrun with 2 processes: one real sharded training
run through the command line (``python -m dptrain OVERRIDES``), with the sharded reader
(dptrain.data.shards.read_rows) wrapped to record which row groups this process read and how
many rows they held. Each rank writes that record to ``OUT/rank<r>.json``, a folder of the
test's own (never the run folder: how many rows a shard holds is private).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_shard_worker.py OUT OVERRIDES...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: Path, overrides: list[str]) -> None:
    from dptrain.data import shards
    from dptrain.tasks import cli

    read: list[dict] = []
    real = shards.read_rows

    def spy(pset, file, row_groups, schema):
        df = real(pset, file, row_groups, schema)
        read.append({"file": pset.files[file].name, "row_groups": row_groups, "rows": len(df),
                     "columns": sorted(df.columns)})
        return df

    shards.read_rows = spy
    sys.argv = ["dptrain", *overrides]
    try:
        cli.main()
    finally:
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(read))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
