"""Synthetic Adult against DP-SGD (issue 33's study): on UCI Adult at epsilon 0.5, 1 and 4 (delta
1e-6 for the synthesizers, 1e-5 for DP-SGD as its presets), the test accuracy of

  (i)   DP-SGD on the real training rows (``experiment=logit privacy.target_epsilon=E``, no interval
        release);
  (ii)  a NON-private logistic regression trained on each synthesizer's output (MST, MWEM: built
        from the TRAINING rows only, so the test rows stay held out), on the binned domain;
  (iii) the same non-private logistic regression on the real binned training rows (the ceiling);

and each synthesizer's workload error: the average L1 distance (between distributions) over all
2-way and all 3-way marginals of the training rows, against releasing those marginals directly
as independent noisy tables at the same epsilon (task=tabulate's mechanism, no consistency).

    python scripts/synthesis_study.py --reps 2 --out experiments/one_shot/synthesis
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dptrain.data import load_dataset  # noqa: E402
from dptrain.data import schema_from_config as data_schema  # noqa: E402
from dptrain.release.oneshot.tables import budget_weights, measure  # noqa: E402
from dptrain.release.synthesis.mst import mst  # noqa: E402
from dptrain.release.synthesis.mwem import MWEMSettings, mwem  # noqa: E402
from dptrain.release.tables.domain import domain_columns, row_codes  # noqa: E402
from dptrain.release.zcdp import gaussian_rho  # noqa: E402
from dptrain.tasks import cli  # noqa: E402

BINS = 8


def _adult_codes() -> tuple[np.ndarray, np.ndarray, list[int]]:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=adult_synth"])
    conf = OmegaConf.to_object(cfg)
    schema = data_schema(conf.data)
    data = load_dataset(conf.data, seed=0)
    train = row_codes(data.x_train.numpy(), data.y_train.numpy(), schema, bins=BINS)
    test = row_codes(data.x_test.numpy(), data.y_test.numpy(), schema, bins=BINS)
    return train, test, [c.size for c in domain_columns(schema, bins=BINS)]


def _counts(codes: np.ndarray, cols: tuple[int, ...], sizes: list[int]) -> np.ndarray:
    shape = [sizes[c] for c in cols]
    return np.bincount(np.ravel_multi_index(codes[:, list(cols)].T, shape), minlength=int(np.prod(shape)))


def _workload_error(real: np.ndarray, tables: dict[tuple[int, ...], np.ndarray], sizes: list[int]) -> dict:
    out = {}
    for k in (2, 3):
        errs = []
        for cols in itertools.combinations(range(len(sizes)), k):
            t = _counts(real, cols, sizes)
            est = np.maximum(tables[cols].reshape(-1).astype(float), 0.0)
            errs.append(float(np.abs(t / t.sum() - est / max(est.sum(), 1e-300)).sum()))
        out[f"l1_{k}way"] = float(np.mean(errs))
    return out


def _tables_of(codes: np.ndarray, sizes: list[int]) -> dict[tuple[int, ...], np.ndarray]:
    return {c: _counts(codes, c, sizes) for k in (2, 3) for c in itertools.combinations(range(len(sizes)), k)}


def _independent(real: np.ndarray, sizes: list[int], rho: float) -> dict[tuple[int, ...], np.ndarray]:
    sets = [c for k in (2, 3) for c in itertools.combinations(range(len(sizes)), k)]
    exact = [_counts(real, c, sizes) for c in sets]
    shares = budget_weights([e.size for e in exact], mechanism="gaussian", split="cells")
    return dict(zip(sets, measure(exact, shares, mechanism="gaussian", budget=rho)))


def _accuracy(train: np.ndarray, test: np.ndarray) -> float:
    enc = OneHotEncoder(handle_unknown="ignore").fit(np.concatenate([train[:, :-1], test[:, :-1]]))
    clf = LogisticRegression(max_iter=2000).fit(enc.transform(train[:, :-1]), train[:, -1])
    return float(clf.score(enc.transform(test[:, :-1]), test[:, -1]))


def _dpsgd(epsilon: float, work: Path) -> float:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=logit", f"privacy.target_epsilon={epsilon}",
                                                        "estimator.interval_share=0", "trainer.progress=false",
                                                        "logger.tensorboard=false"])
    run = work / f"dpsgd_{epsilon}_{time.monotonic_ns()}"
    cli.run(cfg, run_dir=run)
    return float(json.loads((run / "metrics.json").read_text())["test/acc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--mwem-rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train, test, sizes = _adult_codes()
    rows = [{"method": "non-private LR on the real binned rows", "epsilon": float("inf"), "rep": 0,
             "test_acc": _accuracy(train, test), "seconds": 0.0}]
    work = args.out / "_runs"
    for eps, rep in itertools.product(args.epsilons, range(args.reps)):
        rho, rng = gaussian_rho(eps, 1e-6), np.random.default_rng([rep, int(eps * 1000)])
        rows.append({"method": "DP-SGD (experiment=logit)", "epsilon": eps, "rep": rep, "test_acc": _dpsgd(eps, work)})
        rows.append({"method": "independent noisy marginals", "epsilon": eps, "rep": rep,
                     **_workload_error(train, _independent(train, sizes, rho), sizes)})
        for name in ("mst", "mwem"):
            t0 = time.perf_counter()
            fit = (mst(train, sizes, rho=rho, rng=rng) if name == "mst" else
                   mwem(train, sizes, [c for k in (2, 3) for c in itertools.combinations(range(len(sizes)), k)],
                        settings=MWEMSettings(rho=rho, rounds=args.mwem_rounds), rng=rng))
            synth = fit.sample(int(max(fit.total, 1)), rng)
            rows.append({"method": f"LR trained on {name.upper()} synthetic rows", "epsilon": eps, "rep": rep,
                         "test_acc": _accuracy(synth, test), "seconds": time.perf_counter() - t0,
                         **_workload_error(train, _tables_of(synth, sizes), sizes)})
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "results.csv", index=False)
    summary = df.groupby(["method", "epsilon"], sort=False)[["test_acc", "l1_2way", "l1_3way", "seconds"]].mean()
    text = (f"load {os.getloadavg()[0]:.2f} (1-min) on {os.cpu_count()} cores; {args.reps} reps per cell\n"
            + summary.to_string(float_format=lambda v: f"{v:.4f}"))
    (args.out / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
