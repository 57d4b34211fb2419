"""MWEM (Hardt, Ligett and McSherry 2012), the practical form of private multiplicative weights,
over a workload of marginals, in zCDP form, on a factored model of the table.

**Input.** ``codes`` (n, d): each row's level per column (the declared domain's integer codes,
:mod:`dptrain.release.tables.domain`), ``sizes``: each column's number of levels (public), a
workload of marginals (sets of columns, e.g. every 2- and 3-way set) and a total rho (zCDP).

**Algorithm.**

1. the row count, measured with the discrete Gaussian: a public noisy total N~ (``total_share`` of
   rho; clipped at 1). Every model answer is a distribution scaled by N~;
2. ``rounds`` rounds, each with an equal part of the rest of rho, split into ``select_share`` for
   the selection and the rest for the measurement:

   a. select: the exponential mechanism over the workload's marginals that the model can hold
      (below), with utility the L1 error of the current model's marginal (scaled by N~) against
      the true counts, minus (``noise_penalty``) the expected L1 size of the measurement's own
      noise, sqrt(2 / pi) sigma cells (a public number: the marginal whose measurement is
      expected to help the most, as in AIM; a huge marginal's noise would swamp what it fixes);
   b. measure: the selected marginal's counts plus the discrete Gaussian of scale sigma;
   c. update: ``passes`` passes over ALL the measurements so far, each a multiplicative update of
      the model toward the measured marginal, in log space (``update``):

      * ``ipf`` (default): log P(x) += log T(x_C) - log P_C(x_C), T the measurement projected onto
        the distributions (Euclidean projection onto the simplex scaled to N~, then / N~; floored
        at 1e-12), P_C the model's marginal: iterative proportional fitting, the multiplicative
        update whose step is one over each cell's mass, so a pass matches each measurement in
        turn (a few passes suffice);
      * ``mw``: log P(x) += (y(x_C) - N~ P_C(x_C)) / (2 N~), y the raw noisy counts: Hardt et
        al.'s rule for each cell's counting query (the cells are disjoint, so each x gets one
        factor); slow for small cells, it needs many passes;

      then each changed block is renormalised. The output is the last model (Hardt et al.'s
      average of the iterates is not a product of blocks; their experiments also use the last).

**The factored model.** Adult's domain (14 columns) has ~6e12 cells: no joint table. The model is
a product of independent blocks, each a joint table over a set of columns (log probabilities, its
axes in column order); it starts as the uniform distribution, one block per column. Measuring a
marginal whose columns lie in several blocks first merges them into one (the product of their
tables: the same distribution, held jointly), so every measurement lies in one block and its
update moves only that block. A marginal whose merge would make a block of more than
``max_block_cells`` cells cannot be selected that round (a rule on public sizes and on the
previous selections: no privacy cost); the workload's marginals must each fit. The model answers
any marginal (the product of its blocks' marginals) and draws rows (each block independently).

**Privacy** (neighbours: add or remove one row). The total: the count moves by 1, rho_total =
1 / (2 sigma_total^2). A selection: each marginal's true counts move by 1 in one cell, so its
utility moves by at most 1 (the model, N~ and the penalty are public: earlier outputs); the
exponential mechanism P(m) proportional to exp(epsilon u(m) / 2) is epsilon-DP, and an epsilon-DP
exponential mechanism is (epsilon^2 / 8)-zCDP (Cesar and Rogers 2021, bounded range), so
epsilon_select = sqrt(8 rho_select). A measurement: L2 sensitivity 1, rho_measure =
1 / (2 sigma^2). The update, the model and the sampling are post-processing. The run is
(rho_total + rounds (rho_select + rho_measure)) = rho-zCDP by composition (adaptive: each step's
choice depends only on earlier outputs); :attr:`MWEMResult.spent` lists every part.

**Randomness.** The measurements (and N~) use OpenDP's exact discrete Gaussian
(:mod:`dptrain.privacy.samplers`). The selection is a DP draw made with the numpy Generator
passed in, by the Gumbel-max trick (argmax of epsilon u / 2 + Gumbel noise: exactly the
exponential mechanism's law in real arithmetic); it is floating point, so its low bits are not
the exact law's (pass a generator seeded from a secret, e.g. the operating system's CSPRNG).
:meth:`MWEMResult.sample` (post-processing) takes its own generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dptrain.core.errors import DPTrainError
from dptrain.privacy.events import Event, zcdp_event
from dptrain.privacy.samplers import discrete_gaussian
from dptrain.release.tables.marginals import project_simplex

__all__ = ["FactoredModel", "MWEMResult", "MWEMSettings", "count_marginal", "exponential_select", "mwem"]

UPDATES = ("ipf", "mw")
#: the smallest probability a target or a model marginal is taken as (ipf): logs stay finite and a
#: cell a measurement emptied can take mass back from a later one.
FLOOR = 1e-12


@dataclass(frozen=True)
class MWEMSettings:
    """MWEM's public parameters (module docstring): the total ``rho`` (zCDP), the rounds, the
    block cap and the budget split."""

    rho: float
    rounds: int = 30
    max_block_cells: int = 1_000_000
    total_share: float = 0.05   # of rho: the noisy row count
    select_share: float = 0.1   # of each round's rho: the selection (the rest: the measurement)
    passes: int = 3             # passes over all measurements after each round
    update: str = "ipf"         # ipf | mw
    noise_penalty: bool = True  # subtract the measurement noise's expected L1 from the utility

    def check(self) -> None:
        """Raise DPTrainError on a setting out of range."""
        if not (isinstance(self.rho, (int, float)) and math.isfinite(self.rho) and self.rho > 0):
            raise DPTrainError(f"mwem rho={self.rho!r} is not allowed: a finite number > 0")
        for name, lo in (("rounds", 1), ("max_block_cells", 2), ("passes", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise DPTrainError(f"mwem {name}={value!r} is not allowed: an integer >= {lo}")
        for name in ("total_share", "select_share"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                raise DPTrainError(f"mwem {name}={value!r} is not allowed: a number in (0, 1)")
        if self.update not in UPDATES:
            raise DPTrainError(f"mwem update={self.update!r} is not allowed: {' | '.join(UPDATES)}")


@dataclass(frozen=True)
class _Plan:
    """The budget: each part's rho and the noise scale or epsilon it buys."""

    rho_total: float
    rho_select: float
    rho_measure: float

    @property
    def sigma_total(self) -> float:
        return math.sqrt(1.0 / (2.0 * self.rho_total))

    @property
    def epsilon_select(self) -> float:
        return math.sqrt(8.0 * self.rho_select)

    @property
    def sigma_measure(self) -> float:
        return math.sqrt(1.0 / (2.0 * self.rho_measure))


def _plan(s: MWEMSettings) -> _Plan:
    rho_total = s.total_share * s.rho
    per_round = (s.rho - rho_total) / s.rounds
    return _Plan(rho_total, s.select_share * per_round, per_round - s.select_share * per_round)


@dataclass
class _Block:
    """A joint table over ``cols`` (sorted): log probabilities and probabilities, summing to 1."""

    cols: tuple[int, ...]
    logp: np.ndarray
    p: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.normalise()

    def normalise(self) -> None:
        top = float(self.logp.max())
        e = np.exp(self.logp - top)
        s = float(e.sum())
        self.logp = self.logp - (top + math.log(s))
        self.p = e / s

    def onto(self, sub: tuple[int, ...]) -> np.ndarray:
        """The block's marginal over ``sub`` (sorted, within the block), axes in that order."""
        axes = tuple(i for i, c in enumerate(self.cols) if c not in sub)
        return self.p.sum(axis=axes) if axes else self.p


class FactoredModel:
    """A distribution over the domain as a product of independent blocks (module docstring)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.blocks = [_Block((c,), np.full(s, -math.log(s))) for c, s in enumerate(self.sizes)]
        self._cache: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

    def owners(self, cols: Sequence[int]) -> list[int]:
        """The indices of the blocks that hold ``cols``."""
        want = set(cols)
        return [i for i, b in enumerate(self.blocks) if want.intersection(b.cols)]

    def merged_cells(self, cols: Sequence[int]) -> int:
        """The cells of the block that measuring ``cols`` would leave them in."""
        return math.prod(self.blocks[i].p.size for i in self.owners(cols))

    def merge(self, cols: Sequence[int]) -> int:
        """Merge the blocks that hold ``cols`` into one (their product); its index."""
        idx = self.owners(cols)
        if len(idx) == 1:
            return idx[0]
        union = tuple(sorted(c for i in idx for c in self.blocks[i].cols))
        logp = np.zeros([self.sizes[c] for c in union])
        for i in idx:
            b = self.blocks[i]
            logp = logp + b.logp.reshape([self.sizes[c] if c in b.cols else 1 for c in union])
        self.blocks = [b for i, b in enumerate(self.blocks) if i not in idx] + [_Block(union, logp)]
        self._cache.clear()
        return len(self.blocks) - 1

    def marginal(self, cols: Sequence[int]) -> np.ndarray:
        """The model's probabilities over ``cols`` (distinct columns), axes in the order given."""
        order = tuple(int(c) for c in cols)
        out, axes = np.ones(()), []
        for i in self.owners(order):
            b = self.blocks[i]
            sub = tuple(c for c in b.cols if c in order)
            key = (id(b), sub)
            if key not in self._cache:
                self._cache[key] = b.onto(sub)
            out = np.multiply.outer(out, self._cache[key])
            axes += sub
        return out.transpose([axes.index(c) for c in order])

    def fit_step(self, cols: tuple[int, ...], target: np.ndarray, rule: str) -> None:
        """One multiplicative update of the block holding ``cols`` (sorted) toward ``target``
        (ipf: a distribution over ``cols``; mw: the noisy counts / N~), module docstring."""
        (i,) = self.owners(cols)
        b = self.blocks[i]
        pc = b.onto(cols)
        if rule == "ipf":
            delta = np.log(np.maximum(target, FLOOR)) - np.log(np.maximum(pc, FLOOR))
        else:
            delta = 0.5 * (target - pc)
        b.logp = b.logp + delta.reshape([self.sizes[c] if c in cols else 1 for c in b.cols])
        b.normalise()
        self._cache.clear()

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows drawn from the model: (n, d) int64 codes, each block drawn independently."""
        out = np.empty((int(n), len(self.sizes)), dtype=np.int64)
        for b in self.blocks:
            cdf = np.cumsum(b.p.reshape(-1))
            flat = np.minimum(np.searchsorted(cdf, rng.random(int(n)) * cdf[-1], side="right"), cdf.size - 1)
            for c, idx in zip(b.cols, np.unravel_index(flat, b.p.shape)):
                out[:, c] = idx
        return out


@dataclass
class MWEMResult:
    """The fitted model, the public noisy total N~, the noisy measurements (columns, counts) in
    the order made, and what each part spent (dicts with ``kind``, ``stage``, ``rho``, ...)."""

    model: FactoredModel
    total: int
    measurements: list[tuple[tuple[int, ...], np.ndarray]]
    spent: list[dict] = field(default_factory=list)

    @property
    def total_rho(self) -> float:
        return float(sum(s["rho"] for s in self.spent))

    @property
    def events(self) -> list[tuple[Event, int]]:
        """The spend as privacy events (one zCDP event per part) for the accountants."""
        return [(zcdp_event(s["rho"]), 1) for s in self.spent]

    def marginal(self, cols: Sequence[int]) -> np.ndarray:
        """The model's counts over ``cols`` (its probabilities times N~), axes in the order given."""
        return self.total * self.model.marginal(cols)

    def sample(self, n: int | None, rng: np.random.Generator) -> np.ndarray:
        """``n`` synthetic rows (N~ when None) as (n, d) int64 codes."""
        return self.model.sample(self.total if n is None else n, rng)


def count_marginal(codes: np.ndarray, cols: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """The exact counts of the rows over ``cols`` (int64, shape: the columns' sizes)."""
    shape = [int(sizes[c]) for c in cols]
    idx = np.ravel_multi_index(codes[:, list(cols)].T, shape)
    return np.bincount(idx, minlength=math.prod(shape)).reshape(shape).astype(np.int64)


def exponential_select(scores: Sequence[float], *, epsilon: float, sensitivity: float,
                       rng: np.random.Generator) -> int:
    """The exponential mechanism: index k with probability proportional to
    exp(epsilon scores[k] / (2 sensitivity)), drawn by the Gumbel-max trick with ``rng``
    (floating point: module docstring). epsilon-DP for scores of that sensitivity."""
    z = np.asarray(scores, dtype=np.float64) * (epsilon / (2.0 * sensitivity))
    return int(np.argmax(z + rng.gumbel(size=z.size)))


def _check_inputs(codes: np.ndarray, sizes: Sequence[int], workload: Sequence[Sequence[int]],
                  cap: int) -> tuple[np.ndarray, tuple[int, ...], list[tuple[int, ...]]]:
    codes = np.asarray(codes)
    sizes = tuple(int(s) for s in sizes)
    if codes.ndim != 2 or codes.shape[1] != len(sizes) or not np.issubdtype(codes.dtype, np.integer):
        raise DPTrainError(f"mwem: codes must be an (n, {len(sizes)}) integer array, one column per domain column")
    if any(s < 1 for s in sizes):
        raise DPTrainError(f"mwem: sizes={list(sizes)} is not allowed: every column needs >= 1 level")
    if codes.size and (codes.min() < 0 or np.any(codes.max(axis=0) >= np.array(sizes))):
        raise DPTrainError("mwem: a row's code is outside its column's levels (0..size-1)")
    sets = list(dict.fromkeys(tuple(sorted({int(c) for c in s})) for s in workload))
    if not sets or any(not s or s[0] < 0 or s[-1] >= len(sizes) for s in sets):
        raise DPTrainError(f"mwem: the workload must be non-empty column sets within 0..{len(sizes) - 1}")
    big = [s for s in sets if math.prod(sizes[c] for c in s) > cap]
    if big:
        raise DPTrainError(f"mwem: the workload's marginal {list(big[0])} has "
                           f"{math.prod(sizes[c] for c in big[0])} cells, above max_block_cells={cap}")
    return codes.astype(np.int64, copy=False), sizes, sets


def _scores(model: FactoredModel, eligible: list[tuple[int, ...]], exact: dict, total: int,
            sigma: float | None) -> np.ndarray:
    """Each eligible marginal's utility: the model's L1 error, less the expected noise if ``sigma``."""
    out = np.empty(len(eligible))
    for k, cols in enumerate(eligible):
        err = float(np.abs(total * model.marginal(cols) - exact[cols]).sum())
        out[k] = err - (math.sqrt(2.0 / math.pi) * sigma * exact[cols].size if sigma else 0.0)
    return out


def _fit(model: FactoredModel, measurements: list[tuple[tuple[int, ...], np.ndarray]], total: int,
         s: MWEMSettings) -> None:
    """``passes`` passes of multiplicative updates over every measurement, oldest first."""
    if s.update == "ipf":
        targets = [project_simplex(y.astype(np.float64), float(total)).reshape(y.shape) / total
                   for _, y in measurements]
    else:
        targets = [y.astype(np.float64) / total for _, y in measurements]
    for _ in range(s.passes):
        for (cols, _), target in zip(measurements, targets):
            model.fit_step(cols, target, s.update)


def mwem(codes: np.ndarray, sizes: Sequence[int], workload: Sequence[Sequence[int]], *, settings: MWEMSettings,
         rng: np.random.Generator) -> MWEMResult:
    """MWEM on ``codes`` (n, d) over columns of ``sizes`` levels and the marginals of
    ``workload`` (module docstring); ``rng`` draws the selections. (settings.rho)-zCDP."""
    settings.check()
    codes, sizes, candidates = _check_inputs(codes, sizes, workload, settings.max_block_cells)
    plan = _plan(settings)
    exact = {c: count_marginal(codes, c, sizes) for c in candidates}
    total = max(int(discrete_gaussian(np.array([codes.shape[0]], dtype=np.int64), plan.sigma_total)[0]), 1)
    spent = [{"kind": "total", "stage": "noisy row count", "mechanism": "discrete Gaussian",
              "sigma": plan.sigma_total, "rho": plan.rho_total}]
    model = FactoredModel(sizes)
    measurements: list[tuple[tuple[int, ...], np.ndarray]] = []
    penalty = plan.sigma_measure if settings.noise_penalty else None
    for t in range(settings.rounds):
        eligible = [c for c in candidates if model.merged_cells(c) <= settings.max_block_cells]
        scores = _scores(model, eligible, exact, total, penalty)
        cols = eligible[exponential_select(scores, epsilon=plan.epsilon_select, sensitivity=1.0, rng=rng)]
        measurements.append((cols, discrete_gaussian(exact[cols], plan.sigma_measure)))
        model.merge(cols)
        _fit(model, measurements, total, settings)
        spent += [{"kind": "select", "stage": f"round {t + 1}: select", "round": t + 1,
                   "mechanism": "exponential mechanism (Gumbel-max; rho = epsilon^2 / 8)", "candidates": len(eligible),
                   "epsilon": plan.epsilon_select, "sensitivity": 1.0, "rho": plan.rho_select},
                  {"kind": "measure", "stage": f"round {t + 1}: measure {list(cols)}", "round": t + 1,
                   "marginal": list(cols), "mechanism": "discrete Gaussian", "sigma": plan.sigma_measure,
                   "rho": plan.rho_measure}]
    return MWEMResult(model, total, measurements, spent)
