#!/usr/bin/env python
"""The DP-SGD noise sampler's tail (issue 29, finding 4): measured max |z| and the tail masses.

    OMP_WAIT_POLICY=PASSIVE python scripts/noise_tail.py                 # 10^8 draws per sampler
    python scripts/noise_tail.py --draws 10000000 --seed 3

Prints, for torch's float32 ``normal_`` (the engine before issue 29), the engine's float64 draw
(dptrain.privacy.dpsgd.engine.standard_normal64: torch's float64 Box-Muller) and numpy's float64 ziggurat
(the releases and the dp/ curve): the largest |z| over ``--draws`` draws and the bound the
algorithm allows (dptrain.privacy.noise_law). Then, for the three settings of the finding, with
the parameter counts d of the presets experiment=logit (113) and experiment=mlp (11,457):

* the finding's event "a step whose noise falls outside the neighbour's support" along the
  gradient's direction: T q P(Z > z_max - 1/sigma) (one coordinate, the row in the batch);
* the tail mass the report adds: eta = T d exp(-z_max^2 / 2) and (1 + e^eps) eta at eps = 1, 8.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede `import torch`

import argparse
import math

import numpy as np
import torch

from dptrain.privacy.dpsgd.engine import standard_normal32_refined, standard_normal64
from dptrain.privacy.noise_law import (
    FLOAT32_CPU,
    REFINED_FLOAT32_CPU,
    box_muller_law,
    numpy_ziggurat_z_max,
    tail_mass,
)

#: (sigma, q, steps) of the finding: the preset, and two smaller-noise settings
SETTINGS = [(2.6, 0.031, 318), (1.0, 0.01, 1000), (0.6, 0.1, 1000)]
PRESETS = {"experiment=logit": 113, "experiment=mlp": 11_457}
CHUNK = 1 << 22


def max_abs(draw, total: int) -> float:
    """Largest |z| over ``total`` numbers drawn ``CHUNK`` at a time by ``draw(n)``."""
    best, left = 0.0, total
    while left > 0:
        n = min(CHUNK, left)
        best = max(best, float(np.abs(np.asarray(draw(n))).max()))
        left -= n
    return best


def upper_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def measure(draws: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    cpu = torch.device("cpu")
    rows = [
        ("float32 torch normal_ (before)", lambda n: torch.empty(n).normal_(0.0, 1.0, generator=g).numpy(),
         FLOAT32_CPU.z_max),
        ("float64 engine draw (float64 models, d < 512)", lambda n: standard_normal64(
            n, generator=g, device=cpu).numpy(), box_muller_law().z_max),
        ("refined float32 engine draw (float32 models)", lambda n: standard_normal32_refined(
            n, generator=g, device=cpu).numpy(), REFINED_FLOAT32_CPU.z_max),
        ("float64 numpy ziggurat (releases, dp/ curve)", lambda n: rng.standard_normal(n), numpy_ziggurat_z_max()),
    ]
    print(f"max |z| over {draws:.3g} draws (seed {seed}):")
    for name, draw, bound in rows:
        print(f"  {name:46s} {max_abs(draw, draws):8.4f}   (the algorithm's bound: {bound:.4f})")


def masses() -> None:
    new, old, refined = box_muller_law(), FLOAT32_CPU, REFINED_FLOAT32_CPU
    print("\nper run, along the gradient: T q P(Z > z_max - 1/sigma) (the finding's event)")
    for sigma, q, steps in SETTINGS:
        before = steps * q * upper_tail(old.z_max - 1.0 / sigma)
        after = steps * q * upper_tail(new.z_max - 1.0 / sigma)
        fine = steps * q * upper_tail(refined.z_max - 1.0 / sigma)
        print(f"  sigma {sigma:g}, q {q:g}, {steps} steps: float32 {before:.3g}   float64 {after:.3g}   "
              f"refined float32 {fine:.3g}")
    print("\ntail mass added to delta: eta = T d exp(-z_max^2 / 2) (float64 CPU: 2^-53 per pair)")
    for sigma, q, steps in SETTINGS:
        for preset, d in PRESETS.items():
            eta = tail_mass(steps=steps, coordinates=d, law=new)
            eta32 = tail_mass(steps=steps, coordinates=d, law=old)
            fine = tail_mass(steps=steps, coordinates=d, law=refined)
            print(f"  sigma {sigma:g}, q {q:g}, {steps} steps, d = {d:,} ({preset}): float64 eta {eta:.3g}; "
                  f"(1 + e^eps) eta {(1 + math.e) * eta:.3g} at eps 1, {(1 + math.exp(8)) * eta:.3g} at eps 8; "
                  f"refined float32 eta {fine:.3g}   [float32 sampler, same bound: {eta32:.3g}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=10**8, help="draws per sampler for the max |z| (default 10^8)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.draws < 1:
        p.error(f"--draws={args.draws} is not allowed: must be >= 1")
    measure(args.draws, args.seed)
    masses()


if __name__ == "__main__":
    main()
