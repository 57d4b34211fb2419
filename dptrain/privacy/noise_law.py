"""What the DP-SGD noise sampler draws, and the Gaussian mass it cannot draw (docs/privacy.md).

The accountant analyses N(0, sigma^2 C^2 I) noise. The engine draws it by Box-Muller: two
uniforms u1, u2 give the pair ``R (cos 2 pi u2, sin 2 pi u2)`` with radius ``R = sqrt(-2 ln u1)``
(dptrain.privacy.dpsgd.noise): for a float32 model on the CPU with >= 512 coordinates, the refined
float32 sampler; otherwise torch's float64 ``normal_``, added to the clipped sum in float64 and
rounded to the model's dtype.

* refined float32 (CPU): u1 = 1 - k 2^-24, refined to u1 - v 2^-24 with a 53-bit v wherever
  u1 <= 2^-12: u1 >= 2^-77, R <= sqrt(154 ln 2) = 10.33.
* CPU (torch's MT19937): u = k 2^-53, k = 0 .. 2^53 - 1, and u1 = 1 - u in [2^-53, 1], so
  R <= sqrt(-2 ln 2^-53) = sqrt(106 ln 2) = 8.5717.
* CUDA (cuRAND's Philox ``curand_normal2_double``): u1 = k 2^-53 + 2^-54 >= 2^-54, so
  R <= sqrt(108 ln 2) = 8.6521.
* float32 (the engine before issue 29): 24-bit uniforms, R <= sqrt(48 ln 2) = 5.768 (CPU).

No coordinate exceeds ``z_max`` = that bound on R. The Gaussian puts mass ``P(R > z_max) =
exp(-z_max^2 / 2) = u1_min`` (2^-53 on the CPU) outside the disc the sampler's pairs lie in:
that is the mass the sampler cannot produce, per pair. (Per single coordinate the Gaussian tail
``P(|Z| > z_max)`` is smaller, 1.0e-17 on the CPU; the pair's disc is what the sampler truncates.)

Tail mass of a run, a union bound over the pairs of every step: each of the d coordinates of a
step belongs to at most one pair and every pair holds at least one of them, so a step draws at
most d pairs and

    eta = T d exp(-z_max^2 / 2)

bounds the total variation between the run's noise and a sampler that draws the same Gaussian
without truncation. A mechanism within total variation eta of an (epsilon, delta)-DP mechanism
is (epsilon, delta + (1 + e^epsilon) eta)-DP (for any output set S:
P[M'(D) in S] <= P[M(D) in S] + eta <= e^eps P[M(D') in S] + delta + eta
<= e^eps P[M'(D') in S] + delta + (1 + e^eps) eta).

What this does NOT cover: inside the disc the sampler is treated as the Gaussian; its grid of
2^-53 in the uniforms and the float64 additions round below float32's resolution except in the
far tail (radius beyond about 7, probability about 3e-11 per pair), where the grid of Box-Muller
radii is coarser than float32's spacing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dptrain.core.errors import DPTrainError

__all__ = ["NoiseLaw", "box_muller_law", "delta_total", "numpy_ziggurat_z_max", "pair_tail", "tail_mass",
           "two_sided_tail"]


@dataclass(frozen=True)
class NoiseLaw:
    """A Box-Muller sampler: its description, the smallest u1 it feeds to the log, and z_max."""

    sampler: str
    u1_min_log2: int  # u1 >= 2^u1_min_log2
    z_max: float  # sqrt(-2 ln u1_min): no coordinate (and no pair's radius) exceeds it

    @property
    def pair_tail(self) -> float:
        """P(R > z_max) for the Gaussian's pair radius: exp(-z_max^2 / 2) = u1_min."""
        return math.ldexp(1.0, self.u1_min_log2)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pair_tail": self.pair_tail, "coordinate_tail": two_sided_tail(self.z_max)}


def _bound(log2_u1_min: int) -> float:
    return math.sqrt(-2.0 * log2_u1_min * math.log(2.0))


def box_muller_law(*, device: str = "cpu", dtype: str | None = None, refined32: bool = False) -> NoiseLaw:
    """The engine's sampler on ``device`` (cpu | cuda...), its result rounded to ``dtype`` (the
    model's; None: not known to the caller); ``refined32``: the engine drew with its refined
    float32 sampler (a float32 model on the CPU with >= 512 noise coordinates)."""
    rounded = ("no rounding (a float64 model)" if dtype == "float64" else
               f"rounded to {dtype}" if dtype else "rounded to the model's dtype")
    if refined32 and not str(device).startswith("cuda"):
        return REFINED_FLOAT32_CPU
    if str(device).startswith("cuda"):
        return NoiseLaw(sampler="float64 Box-Muller on 53-bit uniforms offset by 2^-54 (torch normal_ on CUDA: "
                        f"cuRAND Philox curand_normal2_double), added to a float64 sum, {rounded}",
                        u1_min_log2=-54, z_max=_bound(-54))
    return NoiseLaw(sampler=f"float64 Box-Muller on 53-bit uniforms (torch normal_), added to a float64 sum, {rounded}",
                    u1_min_log2=-53, z_max=_bound(-53))


#: a float32 model on the CPU (dptrain.privacy.dpsgd.noise.standard_normal32_refined): u1 on the 24-bit
#: grid, refined with a 53-bit uniform wherever u1 <= 2^-12, hence u1 >= 2^-77
REFINED_FLOAT32_CPU = NoiseLaw(
    sampler="float32 Box-Muller whose radius uniform u1 (24-bit) is refined with 53 more bits wherever u1 <= 2^-12 "
            "(torch MT19937 uniforms), added to the float32 clipped sum",
    u1_min_log2=-77, z_max=math.sqrt(154.0 * math.log(2.0)))

#: the engine before issue 29: float32 normal_ on the CPU (24-bit uniforms), for comparison only
FLOAT32_CPU = NoiseLaw(sampler="float32 Box-Muller on 24-bit uniforms (torch normal_ in float32)", u1_min_log2=-24,
                       z_max=_bound(-24))


def numpy_ziggurat_z_max() -> float:
    """max |Z| of numpy's ``Generator.standard_normal`` (float64 ziggurat; the releases and the
    dp/ curve): the tail beyond r = 3.6541528853610088 returns r + x with x = -ln(1 - U1) / r
    accepted only when 2 (-ln(1 - U2)) > x^2; with 53-bit U, -ln(1 - U) <= 53 ln 2, so
    x < sqrt(106 ln 2) and |Z| < r + sqrt(106 ln 2) = 12.226."""
    return 3.6541528853610088 + _bound(-53)


def two_sided_tail(z: float) -> float:
    """P(|Z| > z) for one standard normal coordinate."""
    return math.erfc(z / math.sqrt(2.0))


def pair_tail(z: float) -> float:
    """P(sqrt(Z1^2 + Z2^2) > z): the mass of a Gaussian pair outside the disc of radius z."""
    return math.exp(-0.5 * z * z)


def tail_mass(*, steps: int, coordinates: int, law: NoiseLaw) -> float:
    """eta = T d P(R > z_max): a union bound over the at most d Box-Muller pairs of each of T steps."""
    if steps < 0 or coordinates < 0:
        raise DPTrainError(f"steps={steps!r} and coordinates={coordinates!r} are not allowed: both must be >= 0")
    return float(steps) * float(coordinates) * law.pair_tail


def delta_total(*, epsilon: float, delta: float, eta: float) -> float:
    """delta + (1 + e^epsilon) eta: the delta of a mechanism within total variation eta of an
    (epsilon, delta)-DP one (inf when e^epsilon overflows and eta > 0)."""
    if eta == 0.0:
        return float(delta)
    grow = math.exp(epsilon) if epsilon < 709.0 else math.inf
    return float(delta) + (1.0 + grow) * eta
