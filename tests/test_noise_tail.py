"""Issue 29, finding 4: the DP-SGD noise must have the tail the accountant assumes.

torch's float32 ``normal_`` is Box-Muller on 24-bit uniforms, so every draw has |z| <= 5.768: a
truncated Gaussian, whose missing tail identifies a row with a probability nothing accounted for.
The engine now draws float64 Box-Muller on 53-bit uniforms (|z| <= 8.5717), adds it to the
clipped sum in float64 and rounds once; the report adds the Gaussian mass beyond that bound to
delta (dptrain.privacy.noise_law)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from dptrain.core.errors import DPTrainError
from dptrain.models.objectives import build_objective
from dptrain.privacy import noise_law
from dptrain.privacy.dpsgd import noise
from dptrain.privacy.dpsgd.engine import FastLinearEngine
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism
from dptrain.privacy.dpsgd.noise import refine_tail, standard_normal32_refined, standard_normal64
from dptrain.privacy.report import build_report, format_report

FLOAT32_Z_MAX = math.sqrt(48 * math.log(2))  # 5.7681
CPU = torch.device("cpu")


def _engine(width: int, *, seed: int = 1, objective: str = "binary", sigma: float = 1.3, b: float = 40.0,
            dtype: torch.dtype = torch.float64):
    """A fast engine on a ``dtype`` model (float64: the float64 sampler; float32 with >= 512
    coordinates: the refined float32 sampler)."""
    model = nn.Sequential(nn.Linear(width, 1), Squeeze()).to(dtype)
    return FastLinearEngine(model, max_grad_norm=0.7, noise_multiplier=sigma, expected_batch_size=b,
                            generator=torch.Generator().manual_seed(seed), objective=build_objective(objective))


def _box_muller_from_uniforms(u: np.ndarray) -> np.ndarray:
    """torch's CPU normal_fill_16 written out in numpy: blocks of 16 uniforms, u1 = 1 - u[j],
    u2 = u[j + 8], out[j] = R cos(2 pi u2), out[j + 8] = R sin(2 pi u2), R = sqrt(-2 ln u1)."""
    b = u.reshape(-1, 2, 8)
    r, theta = np.sqrt(-2.0 * np.log(1.0 - b[:, 0])), 2.0 * math.pi * b[:, 1]
    return np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1).reshape(-1)


# ------------------------------------------------------------------------------ (1) the sampler's law


def test_float32_draws_are_truncated_and_the_engines_draws_are_box_muller_on_53_bit_uniforms():
    """The flaw, documented: 10^7 float32 draws never pass 5.77 (24-bit uniforms). The engine's
    draw is, number for number, Box-Muller on the 53-bit uniforms of the same generator state,
    so its largest possible |z| is sqrt(-2 ln 2^-53) = 8.5717 (reached at u = 1 - 2^-53)."""
    g = torch.Generator().manual_seed(29)
    old = torch.empty(10**7).normal_(0.0, 1.0, generator=g)
    assert old.abs().max().item() <= FLOAT32_Z_MAX + 1e-6 < 5.77

    engine = _engine(2**16 - 1)  # 65,536 coordinates: a multiple of 16
    state = engine.generator.get_state()
    z = engine.noise.draw()
    assert z.dtype == torch.float64 and z.numel() == 2**16
    engine.generator.set_state(state)
    u = torch.rand(2**16, dtype=torch.float64, generator=engine.generator).numpy()
    assert np.array_equal(u * 2.0**53, np.round(u * 2.0**53))  # 53-bit uniforms
    assert not np.array_equal(u * 2.0**24, np.round(u * 2.0**24))  # not float32's 24-bit grid
    np.testing.assert_allclose(z.numpy(), _box_muller_from_uniforms(u), rtol=0, atol=1e-14)
    # the extreme uniform gives the bound the report uses
    extreme = np.zeros(16)
    extreme[0] = 1.0 - 2.0**-53
    assert _box_muller_from_uniforms(extreme)[0] == pytest.approx(noise_law.box_muller_law().z_max, rel=1e-15)
    assert noise_law.box_muller_law().z_max == pytest.approx(8.571674348652905, rel=1e-15)


@pytest.mark.parametrize("n", [17, 101, 511, 512, 11457, 91905])
def test_the_vectorised_draw_is_torchs_float64_normal(n):
    """standard_normal64 is torch's float64 normal_ (the same uniforms in the same order, the
    same generator state afterwards, values within the last bit), at every size."""
    g = torch.Generator().manual_seed(n)
    state = g.get_state()
    ref = torch.empty(n, dtype=torch.float64).normal_(0.0, 1.0, generator=g)
    after = g.get_state()
    g.set_state(state)
    mine = standard_normal64(n, generator=g, device=CPU)
    assert torch.equal(g.get_state(), after)
    assert mine.dtype == torch.float64 and mine.shape == (n,)
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-14)


def test_the_engines_noise_tail_matches_the_gaussian():
    """10^7 engine draws at a fixed seed: the counts beyond 4.5 and 5.0 are what the Gaussian
    predicts (two-sided binomial tests), and float32's bound 5.77 is not a wall: the tail of the
    radius (probability 1 - exp(-z^2/2) of a pair below z) is checked through R^2 ~ chi2(2)."""
    engine = _engine(2**17 - 1, seed=4)
    z = torch.cat([engine.noise.draw() for _ in range(77)])[: 10**7].numpy()  # 77 x 2^17 > 10^7
    assert z.dtype == np.float64  # float32 draws pass the counts below too, but stop at 5.77
    for cut in (4.5, 5.0):
        k, p = int((np.abs(z) > cut).sum()), 2 * stats.norm.sf(cut)
        assert stats.binomtest(k, z.size, p).pvalue > 1e-3, (cut, k, z.size * p)
    # the pairs' squared radii are exponential with mean 2 (chi2 with 2 degrees of freedom)
    b = z[: (z.size // 16) * 16].reshape(-1, 2, 8)
    r2 = (b[:, 0] ** 2 + b[:, 1] ** 2).reshape(-1)
    assert stats.kstest(r2[:200_000], "expon", args=(0, 2)).pvalue > 1e-3
    assert np.sqrt(r2.max()) > 5.3  # float32 pairs reach at most 5.77 too; here a sanity check only


# ------------------------------------------------------------------------------ (2) the step's noise


def test_noise_on_a_zero_gradient_is_the_float64_draw_rounded_once():
    """A step whose clipped sum is exactly 0 (linear objective, zero weights, y = 0): every
    coordinate of .grad is round32(sigma C / B * z) for the float64 z the generator gives, bit
    for bit, on the fused path and on the empty-batch path; its SD is sigma C / B."""
    engine = _engine(999, objective="linear", seed=7, dtype=torch.float32)
    for p in engine.params:
        nn.init.zeros_(p)
    x, y = torch.randn(30, 999), torch.zeros(30)
    std = engine.noise_std
    assert std == pytest.approx(1.3 * 0.7 / 40.0)
    grads = []
    for rows in (30, 0):  # fused call, then an empty batch (GradientEngine.__call__)
        for _ in range(100):
            state = engine.generator.get_state()
            engine(x[:rows], y[:rows])
            g = torch.cat([p.grad.reshape(-1) for p in engine.params])
            after = engine.generator.get_state()
            engine.generator.set_state(state)
            z = engine.noise.draw()
            assert torch.equal(engine.generator.get_state(), after)
            assert g.dtype == torch.float32 and z.dtype == torch.float32  # the refined float32 sampler
            assert torch.equal(g, z * std)
            grads.append(g.double())
    g = torch.cat(grads).numpy()  # 200,000 coordinates
    # chi-square interval for the variance, 99.9%
    n = g.size
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n) / n
    assert lo < g.var() / std**2 < hi
    assert abs(g.mean()) < 4 * std / math.sqrt(n)


def test_the_noise_is_added_to_the_clipped_sum_in_float64():
    """With a non-zero clipped sum s (float32), .grad = round32(s + std z) computed in float64:
    the same as adding in float64 and rounding once (the float32 add of before rounds s + std z
    to float32 twice, once for std z)."""
    engine = _engine(300, seed=3, dtype=torch.float32)  # < 512 coordinates: the float64 sampler
    x, y = torch.randn(50, 300), (torch.rand(50) > 0.5).float()
    state = engine.generator.get_state()
    z = engine.noise.draw()
    engine.generator.set_state(state)
    s, _ = engine.noisy_grads(x, y, noise=None, noise_scale=0.0, sum_scale=1.0 / engine.expected_batch_size)
    noisy, _ = engine.noisy_grads(x, y, noise=z, noise_scale=engine.noise_std,
                                  sum_scale=1.0 / engine.expected_batch_size)
    s_flat = torch.cat([t.reshape(-1) for t in s])
    got = torch.cat([t.reshape(-1) for t in noisy])
    assert got.dtype == torch.float32
    assert torch.equal(got, (s_flat.double() + engine.noise_std * z).float())


# ------------------------------------------------------------------------------ (3) the arithmetic


def test_tail_mass_and_delta_total_arithmetic():
    cpu, cuda = noise_law.box_muller_law(device="cpu"), noise_law.box_muller_law(device="cuda:0")
    assert cpu.z_max == pytest.approx(math.sqrt(106 * math.log(2)), rel=1e-15)
    assert cuda.z_max == pytest.approx(math.sqrt(108 * math.log(2)), rel=1e-15)
    assert noise_law.FLOAT32_CPU.z_max == pytest.approx(FLOAT32_Z_MAX, rel=1e-15)
    # the Gaussian pair's radius exceeds z_max with probability exp(-z_max^2 / 2) = u1_min
    assert cpu.pair_tail == 2.0**-53 and cuda.pair_tail == 2.0**-54
    assert noise_law.pair_tail(cpu.z_max) == pytest.approx(2.0**-53, rel=1e-12)
    # per coordinate the tail is smaller (the union bound charges each coordinate its pair's)
    assert noise_law.two_sided_tail(cpu.z_max) == pytest.approx(2 * stats.norm.sf(cpu.z_max), rel=1e-9)
    assert noise_law.two_sided_tail(cpu.z_max) < cpu.pair_tail
    # eta = T d 2^-53 (the preset: 318 steps, 113 coordinates)
    eta = noise_law.tail_mass(steps=318, coordinates=113, law=cpu)
    assert eta == 318 * 113 * 2.0**-53 == pytest.approx(3.99e-12, rel=1e-3)
    assert noise_law.tail_mass(steps=0, coordinates=113, law=cpu) == 0.0
    # (eps, delta + (1 + e^eps) eta)
    assert noise_law.delta_total(epsilon=1.0, delta=1e-5, eta=1e-9) == 1e-5 + (1 + math.e) * 1e-9
    assert noise_law.delta_total(epsilon=8.0, delta=1e-5, eta=eta) == pytest.approx(1e-5 + (1 + math.exp(8)) * eta)
    assert noise_law.delta_total(epsilon=math.inf, delta=1e-5, eta=0.0) == 1e-5
    assert noise_law.delta_total(epsilon=1000.0, delta=1e-5, eta=1e-30) == math.inf
    # the finding's float32 numbers, for comparison: 2^-24 per pair
    assert noise_law.tail_mass(steps=318, coordinates=113, law=noise_law.FLOAT32_CPU) == 318 * 113 * 2.0**-24
    # numpy's ziggurat (the releases, the dp/ curve): r + sqrt(106 ln 2)
    assert noise_law.numpy_ziggurat_z_max() == pytest.approx(3.6541528853610088 + cpu.z_max)
    with pytest.raises(ValueError, match="steps=-1"):
        noise_law.tail_mass(steps=-1, coordinates=3, law=cpu)


# ------------------------------------------------------------------------------ (4) the report


def _record(engine, *, steps: int, sigma: float = 2.6) -> dict:
    m = DPSGDMechanism(enabled=True, noise_multiplier=sigma, max_grad_norm=1.0, expected_batch_size=1024,
                       dataset_size=32_561, planned_steps=steps, delta=1e-5, accountant="rdp")
    return {**m.report_fields(), "engine": "fast", "steps": steps, "epochs": steps * m.sample_rate,
            "delta_source": "config", "max_epsilon": None, "randomness": "fresh", "device": "cpu",
            **({} if engine is None else engine.noise_record())}


def test_the_report_states_the_sampler_the_tail_mass_and_delta_total():
    engine = _engine(112, dtype=torch.float32)
    assert engine.noise_record() == {"noise_coordinates": 113, "noise_dtype": "float32", "noise_refined32": False}
    eps = 1.23
    report = build_report(mechanism=_record(engine, steps=318), epsilons={"rdp": eps}, accountant="rdp", seed=0,
                          data_source="adult")
    ns = report["noise_sampler"]
    assert ns["sampler"] == ("float64 Box-Muller on 53-bit uniforms (torch normal_), added to a float64 sum, "
                             "rounded to float32")
    assert ns["z_max"] == pytest.approx(8.5717, abs=1e-4)
    assert ns["tail_mass"] == 318 * 113 * 2.0**-53
    assert report["delta"] == 1e-5  # the accountant's delta, unchanged
    assert report["delta_total"] == ns["delta_total"] == 1e-5 + (1 + math.exp(eps)) * ns["tail_mass"]
    assert f"(1.23, 1e-05 + {(1 + math.exp(eps)) * ns['tail_mass']:.2g})-DP" in report["guarantee"]
    assert "(1.23, 1e-05 + 1.8e-11)-DP" in report["guarantee"]
    text = format_report(report)
    assert "noise sampler: float64 Box-Muller on 53-bit uniforms" in text and "z_max = 8.57167" in text
    assert "tail mass eta = 3.99e-12 (318 steps x 113 coordinates x 1.11e-16)" in text
    assert f"delta_total = delta + (1 + e^epsilon) eta = {report['delta_total']:.12g}" in text
    assert "eta = 1.00000176384e-05: the guarantee holds at (epsilon, delta_total)" in text
    assert any("drawn in float64" in item for item in report["not_covered"])


def test_the_report_without_the_coordinate_count_or_without_noise():
    report = build_report(mechanism=_record(None, steps=10), epsilons={"rdp": 3.0}, accountant="rdp", seed=0,
                          data_source="adult")
    assert report["noise_sampler"]["tail_mass"] is None and report["delta_total"] is None
    assert "tail mass: NOT computed" in format_report(report)
    silent = build_report(mechanism=_record(_engine(4), steps=10, sigma=0.0), epsilons={"rdp": math.inf},
                          accountant="rdp", seed=0, data_source="adult")
    assert silent["noise_sampler"] is None and "noise sampler" not in format_report(silent)
    # estimator=ssp's record: its noise is numpy's, not the engine's; no engine sampler is claimed
    ssp = build_report(mechanism={**_record(_engine(4), steps=1), "ssp": {}}, epsilons={"rdp": 1.0},
                       accountant="rdp", seed=0, data_source="adult")
    assert ssp["noise_sampler"] is None and ssp["delta_total"] is None
    # on a GPU: cuRAND's uniforms, u1 >= 2^-54
    gpu = build_report(mechanism={**_record(_engine(4), steps=10), "device": "cuda:0 (NVIDIA H100 80GB HBM3)"},
                       epsilons={"rdp": 1.0}, accountant="rdp", seed=0, data_source="adult")
    assert gpu["noise_sampler"]["tail_mass"] == 10 * 5 * 2.0**-54 and "curand_normal2_double" in \
        gpu["noise_sampler"]["sampler"]


# ------------------------------------------------------------------------------ (5) the refined float32 sampler


def test_a_float32_model_draws_the_refined_sampler_and_its_tail_matches_the_gaussian():
    """A float32 model with >= 512 coordinates draws the refined float32 Box-Muller (a quarter of
    the float64 draw's cost): 10^7 draws at a fixed seed give the Gaussian's counts beyond 4.5
    and 5.0, and the pairs' squared radii are exponential with mean 2."""
    engine = _engine(2**17 - 1, seed=5, dtype=torch.float32)
    assert engine.noise_record()["noise_refined32"]
    draws = [engine.noise.draw() for _ in range(77)]
    assert draws[0].dtype == torch.float32
    z = torch.cat(draws)[: 10**7].double().numpy()
    for cut in (4.5, 5.0):
        k, p = int((np.abs(z) > cut).sum()), 2 * stats.norm.sf(cut)
        assert stats.binomtest(k, z.size, p).pvalue > 1e-3, (cut, k, z.size * p)
    pairs = torch.cat(draws).double().view(-1, 2, 8)  # torch's normal_ layout: pair (j, j + 8) of each block of 16
    r2 = (pairs[:, 0] ** 2 + pairs[:, 1] ** 2).reshape(-1).numpy()
    assert stats.kstest(r2[:200_000], "expon", args=(0, 2)).pvalue > 1e-3
    # the pairs that were refined (u1 <= 2^-12, radius^2 >= 24 ln 2): memoryless, exponential too
    deep = r2[r2 > 24 * math.log(2)] - 24 * math.log(2)
    assert 1000 < deep.size < 1500 and stats.kstest(deep, "expon", args=(0, 2)).pvalue > 1e-3


def _box_muller32(u: torch.Tensor) -> torch.Tensor:
    """torch's float32 normal_ kernel written out on given float32 uniforms (blocks of 16: u1 =
    1 - u[j], u2 = u[j + 8], z[j] = R cos(2 pi u2), z[j + 8] = R sin(2 pi u2))."""
    b = u.view(-1, 2, 8)
    r = torch.log(1.0 - b[:, 0]).mul_(-2.0).sqrt_()
    t = b[:, 1] * (2.0 * math.pi)
    return torch.stack([r * torch.cos(t), r * torch.sin(t)], dim=1).reshape(-1)


def test_the_refinement_reaches_the_far_tail_that_float32_cannot():
    """The refinement on pairs forced into the refined region (u1 = k 2^-24, k <= 4096) with
    random 53-bit refinements: the squared radius minus 24 ln 2 is exponential with mean 2 (as
    for the Gaussian), and radii beyond float32's wall 5.77 occur at the Gaussian's rate
    exp(-(5.77^2 - 24 ln 2) / 2) (float32 draws: never). The extreme input gives z_max."""
    n = 400_000  # pairs: 50,000 blocks of 16
    g = torch.Generator().manual_seed(11)
    k = torch.randint(1, 4097, (n,), generator=g).float()
    u = torch.stack([(1.0 - k * 2.0**-24).view(-1, 8), torch.rand(n, generator=g).view(-1, 8)], dim=1).reshape(-1)
    z = _box_muller32(u)
    refine_tail(z.numpy(), lambda m: torch.rand(m, dtype=torch.float64, generator=g).numpy())
    pairs = z.double().view(-1, 2, 8)
    r2 = (pairs[:, 0] ** 2 + pairs[:, 1] ** 2).reshape(-1).numpy()
    excess = r2 - 24 * math.log(2)
    assert stats.kstest(excess, "expon", args=(0, 2)).pvalue > 1e-3
    beyond = int((np.sqrt(r2) > FLOAT32_Z_MAX).sum())
    p = math.exp(-(FLOAT32_Z_MAX**2 - 24 * math.log(2)) / 2)
    assert beyond > 0 and stats.binomtest(beyond, n, p).pvalue > 1e-3, (beyond, n * p)
    extreme = torch.zeros(16)
    extreme[0] = 1.0 - 2.0**-24  # u1 = 2^-24, u2 = 0: the pair (R, 0)
    top = _box_muller32(extreme)
    refine_tail(top.numpy(), lambda m: np.full(m, 1.0 - 2.0**-53))
    law = noise_law.box_muller_law(dtype="float32", refined32=True)
    assert law.z_max == pytest.approx(math.sqrt(154 * math.log(2)), rel=1e-15) and law.pair_tail == 2.0**-77
    assert float(top[0]) == pytest.approx(law.z_max, rel=1e-6) and float(top.abs().max()) <= law.z_max * (1 + 1e-7)


def test_the_report_names_the_refined_sampler():
    engine = _engine(11456, dtype=torch.float32)
    report = build_report(mechanism=_record(engine, steps=318), epsilons={"rdp": 1.0}, accountant="rdp", seed=0,
                          data_source="adult")
    ns = report["noise_sampler"]
    assert "refined with 53 more bits" in ns["sampler"] and ns["z_max"] == pytest.approx(10.3317, abs=1e-4)
    assert ns["tail_mass"] == 318 * 11457 * 2.0**-77


@pytest.mark.parametrize("estimator", ["dpsgd", "subsample_aggregate"])
def test_the_interval_releases_guarantee_sentence_carries_delta_total(tmp_path, estimator):
    """Issue 43, finding 7: the interval release's own guarantee sentence (estimator=dpsgd's private
    Newton steps; subsample_aggregate's parts), which replaces the headline in privacy.json, dropped
    delta_total (1.0000000278e-05 reported as 1e-05). Now it states the pair with the tail mass."""
    from hydra import compose, initialize_config_module

    from dptrain.tasks import cli

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=logit", "data=synthetic", "data.n_rows=3000", "trainer.epochs=1", "trainer.batch_size=100",
            "trainer.progress=false", "trainer.baseline=false", "logger.tensorboard=false",
            f"estimator.name={estimator}", *(["estimator.parts=2"] if estimator != "dpsgd" else [])])
    cli.run(cfg, run_dir=tmp_path / "run")
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["delta_total"] > report["delta"] == 1e-5
    stated = f"delta_total = {report['delta_total']:.12g}"
    assert stated in report["estimator"]["guarantee"] and stated in report["guarantee"]
    assert report["guarantee"] == report["estimator"]["guarantee"]
    assert report["guarantee"].count("delta_total =") == 1


# ------------------------------------------------------------------------------ (6) the fused refined draw (issue 45)


def test_torchs_float32_normal_is_box_muller_on_24_bit_uniforms_in_blocks_of_16():
    """What the fused refined draw relies on: torch's float32 normal_ on the CPU is Box-Muller on
    the 24-bit uniforms its float32 uniform_ draws from the same generator state (u1 = 1 - u[j],
    u2 = u[j + 8] in each block of 16), leaving the same generator state; the draw checks it once
    per process (``_float32_normal_is_box_muller16``)."""
    g = torch.Generator().manual_seed(45)
    state = g.get_state()
    z = torch.empty(2**16).normal_(0.0, 1.0, generator=g)
    after = g.get_state()
    g.set_state(state)
    u = torch.rand(2**16, generator=g)
    assert torch.equal(g.get_state(), after)
    un = u.double().numpy()
    assert np.array_equal(un * 2.0**24, np.round(un * 2.0**24))
    np.testing.assert_allclose(z.double().numpy(), _box_muller_from_uniforms(un), rtol=0, atol=2e-6)
    assert noise._float32_normal_is_box_muller16()


@pytest.mark.parametrize(("n", "draws"), [(512, 200), (11457, 40), (2**17, 2)])
def test_the_refined_draw_is_torchs_float32_normal_with_its_far_pairs_refined(n, draws):
    """Number for number: the refined draw is torch's float32 normal_ on ceil(n / 16) blocks, except
    the pairs whose uniform u1 = m 2^-24 <= 2^-12, which have radius sqrt(-2 ln((m - v) 2^-24))
    with v the next float64 uniform of the generator (one per such pair, in order) and the same
    direction; the generator state after it is that after those uniforms."""
    g, blocks, refined = torch.Generator().manual_seed(n), -(-n // 16), 0
    for _ in range(draws):
        state = g.get_state()
        z = standard_normal32_refined(n, generator=g, device=CPU)
        after = g.get_state()
        g.set_state(state)
        base = torch.empty(16 * blocks).normal_(0.0, 1.0, generator=g)
        g.set_state(state)
        u1 = 1.0 - torch.rand(16 * blocks, generator=g).double().view(-1, 2, 8)[:, 0]
        far = torch.nonzero(u1 <= 2.0**-12)  # (block, lane), ascending
        v = torch.rand(far.shape[0], dtype=torch.float64, generator=g)
        assert torch.equal(g.get_state(), after) and z.shape == (n,) and z.dtype == torch.float32
        pairs = base.double().view(-1, 2, 8).clone()
        blk, lane = far[:, 0], far[:, 1]
        old = pairs[blk, :, lane]
        radius = torch.sqrt(-2.0 * torch.log((u1[blk, lane] * 2.0**24 - v) * 2.0**-24))
        pairs[blk, :, lane] = old / old.norm(dim=1, keepdim=True) * radius[:, None]
        moved = torch.zeros(16 * blocks, dtype=torch.bool)
        moved.view(-1, 2, 8)[blk, :, lane] = True
        moved = moved[:n]
        assert torch.equal(z[~moved], base[:n][~moved])
        torch.testing.assert_close(z.double()[moved], pairs.reshape(-1)[:n][moved], rtol=2e-7, atol=0)
        refined += int(far.shape[0])
    assert refined >= 10


def test_every_far_pair_is_found_and_its_u1_recovered_exactly():
    """For every 24-bit u1 = m 2^-24 with m <= 4,608 at 11 angles (the axes and the diagonal
    included): the pairs with m <= 4,096 are refined, in order, to the
    radius their own m gives (v = 1/2: sqrt(-2 ln((m - 1/2) 2^-24)); neighbouring m differ by
    1.5e-5 in relative radius, the tolerance is 2e-7), and the others are left bit for bit."""
    ms = torch.arange(1, 4609, dtype=torch.float64)
    for u2 in (0.0, 2.0**-24, 0.0625, 0.125, 0.2, 0.375, 0.5, 0.625, 0.875, 0.9, 1.0 - 2.0**-24):
        u = torch.stack([(1.0 - ms * 2.0**-24).float().view(-1, 8), torch.full((576, 8), u2)], dim=1).reshape(-1)
        z = _box_muller32(u)
        before, calls = z.clone(), []

        def half(k: int, calls: list = calls) -> np.ndarray:
            calls.append(k)
            return np.full(k, 0.5)

        refine_tail(z.numpy(), half)
        pairs = z.double().view(-1, 2, 8)
        r = torch.sqrt(pairs[:, 0] ** 2 + pairs[:, 1] ** 2).reshape(-1)
        far = ms <= 4096
        assert calls == [4096]
        torch.testing.assert_close(r[far], torch.sqrt(-2.0 * torch.log((ms[far] - 0.5) * 2.0**-24)), rtol=2e-7,
                                   atol=0)
        kept = (~far).view(-1, 8)[:, None, :].expand(-1, 2, -1).reshape(-1)
        assert torch.equal(z[kept], before[kept])


def test_a_pair_that_is_not_box_muller_on_a_24_bit_u1_is_refused():
    """A float32 pair of radius 6 (beyond 5.77: no 24-bit u1 gives it) cannot be refined from its
    radius: refused, and nothing is changed or drawn."""
    z = torch.zeros(16)
    z[3], z[11] = 6.0 * 0.6, 6.0 * 0.8
    before = z.clone()
    with pytest.raises(RuntimeError, match="not Box-Muller on a 24-bit u1"):
        refine_tail(z.numpy(), lambda k: pytest.fail("no uniform is drawn"))
    assert torch.equal(z, before)


def test_a_torch_whose_float32_normal_is_not_that_kernel_is_refused(monkeypatch):
    monkeypatch.setattr(noise, "_float32_normal_is_box_muller16", lambda: False)
    with pytest.raises(DPTrainError, match="float32 normal_ is not Box-Muller on blocks of 16 24-bit uniforms"):
        _engine(600, dtype=torch.float32)
    with pytest.raises(DPTrainError, match="allowed: the torch version dptrain pins"):
        standard_normal32_refined(600, generator=torch.Generator(), device=CPU)
    assert not _engine(600, dtype=torch.float64).noise.refined32  # the float64 sampler does not rely on it


def _torch_gaussian_calls(path) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        torch_call = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch"
        if isinstance(f, ast.Attribute) and (f.attr == "normal_" or (torch_call and f.attr in ("randn", "normal"))):
            found.append(f.attr)
        elif isinstance(f, ast.Name) and f.id.startswith("standard_normal"):
            found.append(f.id)
        elif isinstance(f, ast.Attribute) and f.attr in ("step_noise", "NoiseStream"):
            found.append(f.attr)
        elif isinstance(f, ast.Name) and f.id == "NoiseStream":
            found.append(f.id)
    return sorted(found)


def test_one_place_draws_dp_sgd_noise():
    """Issue 45: the DP-SGD noise is drawn in ONE place. Below privacy/dpsgd/ and training/ no
    module but dptrain/privacy/dpsgd/noise.py calls a torch Gaussian sampler; its one draw
    (``standard_normal``) is called by the stream (``NoiseStream.draw``) alone; the stream is built
    by the engines' base alone, and ``step_noise`` is taken once by an engine's step and once by
    the CUDA-graph step."""
    from pathlib import Path

    import dptrain

    root = Path(dptrain.__file__).parent
    calls = {str(p.relative_to(root)): _torch_gaussian_calls(p)
             for d in ("privacy/dpsgd", "training") for p in sorted((root / d).rglob("*.py"))}
    calls = {k: v for k, v in calls.items() if v}
    assert calls == {
        # torch's float64 normal_; its float32 kernel (randn) the refined draw refines, and its one-off check
        "privacy/dpsgd/noise.py": ["normal_", "randn", "randn", "standard_normal", "standard_normal32_refined",
                                   "standard_normal64"],
        "privacy/dpsgd/base.py": ["NoiseStream", "step_noise"],
        "privacy/dpsgd/graph.py": ["step_noise"],
    }, calls
