#!/usr/bin/env python
"""The establishment-size attack on worker-level DP (issue 34).

    OMP_WAIT_POLICY=PASSIVE python scripts/lodes_attack.py [--draws 2000] [--seed 0]

A cell with a few establishments; the adversary knows every establishment's size but the
target's. From one release of the cell total they (1) estimate the target's size as release -
(known others), and (2) run the Neyman-Pearson likelihood-ratio test of H0: the target has x
workers against H1: it has (1 + alpha) x. Both mechanisms' likelihood ratios are non-decreasing in
the release, so "reject H0 when release > t" with t the H0 95% quantile is the most powerful
test at a 5% false-positive rate; its power is computed exactly and by Monte Carlo.

* worker-level Laplace (epsilon 1): the estimate is off by about one worker; the power is ~1.
* log-Laplace, (alpha 0.1, epsilon 1)-ER-EE: the likelihood ratio of x vs (1 + alpha) x stays
  within e^epsilon, so no test has power above 0.05 e^epsilon = 0.136 at 5% false positives.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import math

import numpy as np

from dptrain.release.employer.mechanisms import laplace_worker, log_laplace, log_laplace_scale

OTHERS = (40.0, 250.0, 15.0)  # the sizes the adversary knows
TARGET = 100.0  # the target establishment's size under H0
FPR = 0.05


def exact_power(shift: float, scale: float) -> float:
    """Power at FPR of the test 'Laplace location shift > t' (H0: 0, H1: shift >= 0, scale b):
    t = b ln(1 / (2 FPR)); power = P(eta > t - shift) under Laplace(b)."""
    t = scale * math.log(1.0 / (2.0 * FPR))
    u = t - shift
    return 0.5 * math.exp(-u / scale) if u >= 0 else 1.0 - 0.5 * math.exp(u / scale)


def attack(draws: int = 2000, seed: int = 0, alpha: float = 0.1, epsilon: float = 1.0,
           others: tuple = OTHERS, target: float = TARGET) -> dict:
    """The attack's numbers for both mechanisms (see the module docstring)."""
    rng = np.random.default_rng(seed)
    known = float(sum(others))
    n0, n1 = known + target, known + (1.0 + alpha) * target
    out = {"n0": n0, "n1": n1, "bound": FPR * math.exp(epsilon)}
    # worker-level Laplace: the statistic is the release itself
    y0 = laplace_worker(np.full(draws, n0), epsilon, rng)
    y1 = laplace_worker(np.full(draws, n1), epsilon, rng)
    t = np.quantile(y0, 1.0 - FPR)
    out["worker_mae"] = float(np.mean(np.abs(y0 - known - target)))
    out["worker_power_mc"] = float(np.mean(y1 > t))
    out["worker_power"] = exact_power(n1 - n0, 1.0 / epsilon)
    out["worker_log_ratio"] = (n1 - n0) * epsilon  # the privacy loss of x -> (1 + alpha) x
    # log-Laplace: the statistic is ln(release + gamma), a Laplace(b) location family
    gamma, b = 1.0 / alpha, log_laplace_scale(alpha, epsilon)
    z0 = np.log(log_laplace(np.full(draws, n0), alpha, epsilon, rng) + gamma)
    z1 = np.log(log_laplace(np.full(draws, n1), alpha, epsilon, rng) + gamma)
    t = np.quantile(z0, 1.0 - FPR)
    shift = math.log((n1 + gamma) / (n0 + gamma))
    out["erree_mae"] = float(np.mean(np.abs(np.exp(z0) - gamma - known - target)))
    out["erree_power_mc"] = float(np.mean(z1 > t))
    out["erree_power"] = exact_power(shift, b)
    out["erree_log_ratio"] = shift / b  # sup of the log likelihood ratio, <= epsilon
    # the worst case for log-Laplace: the target alone in its cell
    alone = math.log(((1.0 + alpha) * target + gamma) / (target + gamma))
    out["erree_power_alone"] = exact_power(alone, b)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--epsilon", type=float, default=1.0)
    args = p.parse_args(argv)
    r = attack(args.draws, args.seed, args.alpha, args.epsilon)
    print(f"cell: known others {OTHERS}, target {TARGET:g} vs {(1 + args.alpha) * TARGET:g} "
          f"(n {r['n0']:g} vs {r['n1']:g}); {args.draws} draws; test at {FPR:.0%} false positives")
    print(f"worker-level Laplace  eps={args.epsilon:g}: target-size MAE {r['worker_mae']:.2f} workers; "
          f"power {r['worker_power_mc']:.3f} (exact {r['worker_power']:.6f}); log LR sup {r['worker_log_ratio']:.1f}")
    print(f"log-Laplace alpha={args.alpha:g} eps={args.epsilon:g}: target-size MAE {r['erree_mae']:.1f} workers; "
          f"power {r['erree_power_mc']:.3f} (exact {r['erree_power']:.4f}; target alone {r['erree_power_alone']:.4f}); "
          f"log LR sup {r['erree_log_ratio']:.3f} <= eps; bound 0.05 e^eps = {r['bound']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
