"""MWEM (dptrain.release.synthesis.mwem) on UCI Adult's codes: time and error.

    python scripts/bench_mwem.py [--epsilon 1] [--delta 1e-6] [--rounds 30] [--workload 3] [--bins 8]
                                 [--update ipf] [--passes 3] [--repeats 1] [--seed 0]

Builds the codes as task=tabulate does (every row of the shipped file, train and test, over the
declared domain with ``--bins`` bins per numeric column), runs MWEM with rho = gaussian_rho(epsilon,
delta) over every 2-way (and 3-way: ``--workload 3``) marginal, and prints per repeat the seconds,
the model's and the sampled rows' average L1 distance (as distributions, in [0, 2]) over all 2-way
and all 3-way marginals against the real rows, and the machine's load average before and after.
The exact counts compared are public data here (Adult); never run it as an evaluation of private rows.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np
from hydra import compose, initialize_config_module

import dptrain.tasks.cli  # noqa: F401  (registers the data sources' schemas with Hydra)
from dptrain.data import load_dataset, schema_from_config
from dptrain.release.synthesis.mwem import MWEMSettings, count_marginal, mwem
from dptrain.release.tables.domain import domain_columns, row_codes
from dptrain.release.tables.marginals import gaussian_rho


def adult_codes(bins: int) -> tuple[np.ndarray, list[int]]:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["data=adult"])
    schema = schema_from_config(cfg.data)
    data = load_dataset(cfg.data, seed=0)
    codes = row_codes(np.concatenate([data.x_train.numpy(), data.x_test.numpy()]),
                      np.concatenate([data.y_train.numpy(), data.y_test.numpy()]), schema, bins=bins)
    return codes, [c.size for c in domain_columns(schema, bins=bins)]


def errors(codes: np.ndarray, sizes: list[int], answer) -> dict[int, float]:
    """The average L1 distance (as distributions) over every k-way marginal, k = 2, 3."""
    out = {}
    for k in (2, 3):
        errs = []
        for cols in itertools.combinations(range(len(sizes)), k):
            true = count_marginal(codes, cols, sizes)
            est = answer(cols)
            errs.append(float(np.abs(true / true.sum() - est / max(est.sum(), 1e-300)).sum()))
        out[k] = float(np.mean(errs))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--workload", type=int, default=3, choices=(2, 3))
    p.add_argument("--bins", type=int, default=8)
    p.add_argument("--update", default="ipf", choices=("ipf", "mw"))
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    codes, sizes = adult_codes(args.bins)
    rho = gaussian_rho(args.epsilon, args.delta)
    work = [c for k in range(2, args.workload + 1) for c in itertools.combinations(range(len(sizes)), k)]
    settings = MWEMSettings(rho=rho, rounds=args.rounds, passes=args.passes, update=args.update)
    print(f"Adult: {codes.shape[0]} rows, {len(sizes)} columns, {len(work)} marginals in the workload; "
          f"epsilon {args.epsilon} delta {args.delta} -> rho {rho:.6g}; {settings}")
    print(f"load average before: {os.getloadavg()}, cpus {os.cpu_count()}")
    for r in range(args.repeats):
        rng = np.random.default_rng([args.seed, r])
        t0 = time.perf_counter()
        fit = mwem(codes, sizes, work, settings=settings, rng=rng)
        seconds = time.perf_counter() - t0
        rows = fit.sample(None, rng)
        model = errors(codes, sizes, fit.marginal)
        sampled = errors(codes, sizes, lambda cols, rows=rows: count_marginal(rows, cols, sizes))
        blocks = sorted((b.p.size for b in fit.model.blocks), reverse=True)[:3]
        print(f"repeat {r}: {seconds:.1f} s; model L1 2-way {model[2]:.4f} 3-way {model[3]:.4f}; sampled "
              f"{len(rows)} rows L1 2-way {sampled[2]:.4f} 3-way {sampled[3]:.4f}; rho spent {fit.total_rho:.6g}; "
              f"largest blocks {blocks}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
