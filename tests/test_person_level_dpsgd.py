"""Person-level DP-SGD (issue 47): the unit step of every engine against an explicit per-unit loop
(per-row gradients by autograd, combined by mean or sum, the combination clipped to C), and the
sensitivity: adding or removing ALL rows of one unit moves the clipped sum by at most C."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dptrain.data.units import cap_rows_per_unit
from dptrain.models.networks import logit, mlp
from dptrain.models.objectives import build_objective
from dptrain.privacy.dpsgd.engine import FastLinearEngine, NonPrivateEngine, OpacusEngine
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.units import UnitBatch, UnitPoissonSampler, rows_by_unit

D = 6
MODELS = {
    "logit": (lambda: logit(in_features=D), "binary"),
    "multinomial": (lambda: logit(in_features=D, out_features=3), "multinomial"),
    "linear": (lambda: logit(in_features=D), "linear"),
    "mlp": (lambda: mlp(in_features=D, hidden=[8, 5], activation="tanh"), "binary"),
    "mlp_gelu": (lambda: mlp(in_features=D, hidden=[7], activation="gelu", out_features=3), "multinomial"),
    # not a plain stack (two activations in a row): the fast engine's autograd path
    "stack": (lambda: torch.nn.Sequential(torch.nn.Linear(D, 5), torch.nn.Tanh(), torch.nn.ReLU(),
                                          torch.nn.Linear(5, 1), Squeeze()), "binary"),
}


def _engine(cls, model, objective, C=1.0, sigma=0.0, B=10.0):
    return cls(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
               generator=torch.Generator().manual_seed(3), objective=objective)


def _rows(counts, seed=0, kind="binary"):
    g = torch.Generator().manual_seed(seed)
    n = int(sum(counts))
    x = torch.randn(n, D, generator=g) * 2.0
    if kind == "multinomial":
        y = torch.randint(0, 3, (n,), generator=g)
    elif kind == "linear":
        y = torch.rand(n, generator=g)
    else:
        y = (torch.rand(n, generator=g) < 0.5).float()
    return x, y


def _reference(model, objective, x, y, counts, combine, C, norms=None):
    """sum_u clip_C(G_u) by an explicit loop: per-row gradients by autograd (``norms``: a list
    that receives each ||G_u||)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    start = 0
    for m in counts:
        g_u = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        for i in range(start, start + m):
            loss = objective.per_example_loss(model(x[i:i + 1]), y[i:i + 1]).sum()
            w = 1.0 / m if combine == "mean" else 1.0
            for acc, g in zip(g_u, torch.autograd.grad(loss, params)):
                acc += w * g.double()
        norm = torch.sqrt(sum((g ** 2).sum() for g in g_u))
        if norms is not None:
            norms.append(float(norm))
        c = min(1.0, C / (float(norm) + 1e-6))
        for t, g in zip(total, g_u):
            t += c * g
        start += m
    return total


COUNTS = [1, 4, 2, 7, 3, 1, 5]


@pytest.mark.parametrize("combine", ["mean", "sum"])
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("cls", [FastLinearEngine, OpacusEngine])
def test_unit_clipped_sum_equals_the_per_unit_loop(cls, name, combine):
    if cls is OpacusEngine and name in ("mlp_gelu", "stack"):
        pytest.skip("Opacus: one plain MLP is enough")
    make, kind = MODELS[name]
    torch.manual_seed(1)
    model = make()
    objective = build_objective(kind)
    x, y = _rows(COUNTS, kind=kind)
    units = UnitBatch.of_counts(np.array(COUNTS), combine=combine, dtype=x.dtype)
    norms = []
    _reference(copy.deepcopy(model), objective, x, y, COUNTS, combine, 1.0, norms)
    C = float(np.median(norms))  # some units clipped, some not
    ref = _reference(copy.deepcopy(model), objective, x, y, COUNTS, combine, C)
    eng = _engine(cls, copy.deepcopy(model), objective, C=C)
    sums, stats = eng.unit_clipped_sum(x, y, units)
    for s, r in zip(sums, ref):
        torch.testing.assert_close(s.double(), r, rtol=2e-4, atol=2e-6)
    assert stats.batch_size == sum(COUNTS)
    assert 0 < stats.clipped < sum(COUNTS)  # rows of clipped units: clipping active for some only


def _clipped_sum(eng, x, y, counts, combine):
    units = UnitBatch.of_counts(np.array(counts), combine=combine, dtype=x.dtype)
    sums, _ = eng.unit_clipped_sum(x, y, units)
    return torch.cat([s.reshape(-1).double() for s in sums])


@pytest.mark.parametrize("combine", ["mean", "sum"])
@pytest.mark.parametrize("cls, name", [(FastLinearEngine, "logit"), (FastLinearEngine, "multinomial"),
                                       (FastLinearEngine, "mlp"), (FastLinearEngine, "stack"),
                                       (OpacusEngine, "logit"), (OpacusEngine, "mlp")])
def test_removing_all_rows_of_one_unit_moves_the_clipped_sum_by_at_most_C(cls, name, combine):
    """The engine's own function on a batch with and without each unit (its rows capped at k by
    the secret choice first; units with more rows than k included): the difference's norm is
    at most C, and for units whose combination exceeds C it is C (the bound is tight)."""
    make, kind = MODELS[name]
    torch.manual_seed(2)
    eng = _engine(cls, make(), build_objective(kind), C=0.5)
    raw_counts = [1, 9, 3, 12, 2, 6]
    k = 4
    x, y = _rows(raw_counts, seed=5, kind=kind)
    codes = np.repeat(np.arange(len(raw_counts)), raw_counts)
    kept = cap_rows_per_unit(codes, k, np.random.default_rng(9))
    x, y, codes = x[kept], y[kept], codes[kept]
    counts = np.bincount(codes).tolist()
    assert max(counts) == k and max(raw_counts) > k
    full = _clipped_sum(eng, x, y, counts, combine)
    tight = 0
    for u in range(len(counts)):
        keep = torch.from_numpy(codes != u)
        rest = _clipped_sum(eng, x[keep], y[keep], [c for v, c in enumerate(counts) if v != u], combine)
        moved = float((full - rest).norm())
        assert moved <= 0.5 * (1 + 1e-5)
        tight += moved > 0.5 * (1 - 1e-4)
    assert tight >= 1


def test_the_non_private_engine_combines_without_clipping():
    make, kind = MODELS["logit"]
    model = make()
    objective = build_objective(kind)
    x, y = _rows(COUNTS)
    eng = NonPrivateEngine(copy.deepcopy(model), expected_batch_size=5.0, generator=torch.Generator(),
                           objective=objective)
    units = UnitBatch.of_counts(np.array(COUNTS), combine="mean", dtype=x.dtype)
    sums, _ = eng.unit_clipped_sum(x, y, units)
    ref = _reference(copy.deepcopy(model), objective, x, y, COUNTS, "mean", C=1e12)
    for s, r in zip(sums, ref):
        torch.testing.assert_close(s.double(), r, rtol=1e-5, atol=1e-7)


def test_unit_step_adds_one_noise_draw_and_divides_by_the_expected_units():
    make, kind = MODELS["mlp"]
    model = make()
    objective = build_objective(kind)
    x, y = _rows(COUNTS)
    units = UnitBatch.of_counts(np.array(COUNTS), combine="sum", dtype=x.dtype)
    plain = _engine(FastLinearEngine, copy.deepcopy(model), objective, C=0.4, sigma=0.0, B=12.0)
    sums, _ = plain.unit_clipped_sum(x, y, units)
    noisy_model = copy.deepcopy(model)
    noisy = _engine(FastLinearEngine, noisy_model, objective, C=0.4, sigma=2.0, B=12.0)
    noise = _engine(FastLinearEngine, copy.deepcopy(model), objective, C=0.4, sigma=2.0, B=12.0).step_noise()
    noisy.unit_step(x, y, units)
    grads = torch.cat([p.grad.reshape(-1).double() for p in noisy_model.parameters()])
    expected = (torch.cat([s.reshape(-1).double() for s in sums]) + 2.0 * 0.4 * noise.double()) / 12.0
    torch.testing.assert_close(grads, expected, rtol=1e-5, atol=1e-6)


def test_unit_sampler_takes_every_row_of_a_sampled_unit_and_samples_units_at_rate_q():
    codes = np.array([2, 0, 1, 2, 2, 0, 3, 1, 3, 3, 3])
    order, starts, counts = rows_by_unit(codes)
    assert codes[order].tolist() == sorted(codes.tolist())
    sampler = UnitPoissonSampler(starts=starts, counts=counts, sample_rate=0.3,
                                 rng=np.random.default_rng(11), combine="mean")
    hits = np.zeros(4)
    reps = 4000
    for _ in range(reps):
        rows, units = sampler.sample()
        unit_of = codes[order][rows.numpy()]
        sel = np.unique(unit_of)
        hits[sel] += 1
        assert len(rows) == counts[sel].sum()  # every row of each sampled unit
        assert units.n_units == len(sel) and units.index.tolist() == np.repeat(np.arange(len(sel)),
                                                                                 counts[sel]).tolist()
        assert torch.allclose(units.weights, torch.from_numpy(1.0 / np.repeat(counts[sel], counts[sel])).float())
        slot, width = units.slots()
        assert width == (counts[sel].max() if len(sel) else 1)
        assert sorted(slot.tolist()) == [u * width + t for u, c in enumerate(counts[sel]) for t in range(c)]
    sd = np.sqrt(0.3 * 0.7 / reps)
    assert np.all(np.abs(hits / reps - 0.3) < 5 * sd)


@pytest.mark.parametrize("combine", ["mean", "sum"])
@pytest.mark.parametrize("cls", [FastLinearEngine, OpacusEngine])
def test_the_dp_curve_input_moves_by_at_most_L_per_unit(cls, combine):
    """The dp/ curve's bounded loss sum (its noise is calibrated to L) is per unit: removing all
    rows of one unit moves it by at most L (per row it could move by k L)."""
    make, kind = MODELS["logit"]
    torch.manual_seed(4)
    eng = _engine(cls, make(), build_objective(kind), C=1.0)
    eng.curve_loss_bound = L = 0.3  # below most losses: a unit of many rows would add several L per row
    counts = [1, 4, 2, 4, 3]
    x, y = _rows(counts, seed=8)
    codes = np.repeat(np.arange(len(counts)), counts)

    def bounded(xb, yb, cts):
        units = UnitBatch.of_counts(np.array(cts), combine=combine, dtype=xb.dtype)
        return eng.unit_clipped_sum(xb, yb, units)[1].bounded_loss_sum

    full = bounded(x, y, counts)
    moves = []
    for u in range(len(counts)):
        keep = torch.from_numpy(codes != u)
        moves.append(full - bounded(x[keep], y[keep], [c for v, c in enumerate(counts) if v != u]))
    assert max(moves) <= L * (1 + 1e-9) and min(moves) >= 0
    assert max(moves) == pytest.approx(L)  # a unit whose rows' losses exceed L adds exactly L
