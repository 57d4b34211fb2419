"""Reusable DP-invariant checks (docs/privacy.md, "How it is tested").

Each ``check_*`` function exercises the real code through its public interface (an engine
factory, a sampler, or a training entry point), raises ``AssertionError`` with the offending
statistic when an invariant fails, and otherwise returns the statistics it computed (so tests
can print or record them). tests/test_mutations.py runs every check on the unbroken code and
on deliberately broken copies (mutations applied with ``monkeypatch``) to show that each check
catches the break it is meant for.

Statistical checks use fixed seeds and a per-test false-alarm level ``ALPHA``: at a fixed seed
the outcome is deterministic, and the margins seen on the real code and on the mutations are
recorded in tests/test_mutations.py.

An engine factory is anything called as
``factory(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B, generator=g)``
and returning a :class:`~dptrain.privacy.dpsgd.engine.GradientEngine`: an engine class, or
``functools.partial(make_engine, engine="fast")``.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import dp_accounting
import numpy as np
import torch
from scipy import stats

from dptrain.models.networks import mlp
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import GradientEngine
from dptrain.privacy.dpsgd.sampling import PoissonSampler

per_example_loss = BINARY.per_example_loss  # binary cross-entropy with logits, one per example


#: Two-sided false-alarm probability of each statistical test on correct code.
ALPHA = 1e-5
#: |z| above which a standard-normal statistic is rejected at ALPHA (two-sided), ~4.42.
Z_MAX = float(stats.norm.isf(ALPHA / 2))

EngineFactory = Callable[..., GradientEngine]


# ----------------------------------------------------------------------------- helpers


def make_batch(n: int, d: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features with row scales from 0.1 to 3 (so per-example norms spread widely), 0/1 labels."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.1, 3.0, n, dtype=torch.float32)[:, None]
    y = (torch.rand(n, generator=g) < 0.5).float()
    return x, y


def per_example_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Reference: an explicit loop over examples, one autograd call each (float64 results)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(x.shape[0]):
        loss = per_example_loss(model(x[i : i + 1]), y[i : i + 1]).sum()
        out.append([g.detach().double() for g in torch.autograd.grad(loss, params)])
    return out


def _norm(tensors: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def _engine(factory: EngineFactory, model: torch.nn.Module, *, C: float, sigma: float, B: float,
            seed: int) -> GradientEngine:
    return factory(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
                   generator=torch.Generator().manual_seed(seed))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().double().clone() for p in model.parameters() if p.requires_grad]


def _var_test(z: np.ndarray, target_sd: float) -> tuple[float, float]:
    """Variance ratio and two-sided p-value of sum(z^2)/target^2 ~ chi2(n) (mean known to be 0)."""
    n = z.size
    s = float(np.sum(np.square(z))) / target_sd**2
    p = 2.0 * min(float(stats.chi2.cdf(s, n)), float(stats.chi2.sf(s, n)))
    return s / n, min(p, 1.0)


def _corr_z(a: np.ndarray, b: np.ndarray) -> float:
    """sqrt(n) * r, r = mean(a b) / sqrt(mean(a^2) mean(b^2)) (zero-mean correlation, whatever
    the scale): ~ N(0, 1) for independent zero-mean draws; 0 when a or b is all zeros."""
    den = math.sqrt(float(np.mean(a * a)) * float(np.mean(b * b)))
    return float(np.mean(a * b)) / den * math.sqrt(a.size) if den > 0 else 0.0


def _median_norm_C(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list, torch.Tensor]:
    """A clipping norm halfway between the two middle per-example norms (half clipped, no ties)."""
    per_ex = per_example_grads(model, x, y)
    norms = torch.tensor([_norm(g) for g in per_ex], dtype=torch.float64)
    srt = norms.sort().values
    k = len(srt) // 2
    return float(srt[k - 1] + srt[k]) / 2, per_ex, norms


# ----------------------------------------------------------------------------- noise


def check_noise(
    factory: EngineFactory,
    *,
    sigma: float = 1.7,
    C: float = 0.5,
    B: float = 20.0,
    steps: int = 200,
    batch_steps: int = 60,
    batch_rows: int = 30,
    seed: int = 123,
) -> dict[str, Any]:
    """The noise is N(0, (sigma C / B)^2), independent per coordinate and per step, drawn once.

    (a) Zero gradient (an empty batch, ``steps`` calls): the update is pure noise. In this
        order: independence between consecutive steps (lag-1 correlation) and between
        parameter tensors (correlation of equal-length prefixes), tested first because the
        variance tests assume it; variance of the pooled draws and of EACH parameter tensor
        (chi-square on sum z^2, mean known); mean; normality (KS).
    (b) A real batch of ``batch_rows`` != B examples: noisy minus noise-free update over
        ``batch_steps`` calls has the same variance sigma^2 C^2 / B^2 (the scale uses the
        EXPECTED batch size, never the realised one).
    """
    target = sigma * C / B
    out: dict[str, Any] = {"target_sd": target}
    model = mlp(in_features=12, hidden=[16], activation="relu")
    eng = _engine(factory, model, C=C, sigma=sigma, B=B, seed=seed)
    empty_x, empty_y = torch.zeros(0, 12), torch.zeros(0)
    draws = []
    for _ in range(steps):
        st = eng(empty_x, empty_y)
        assert st.batch_size == 0, f"empty batch reported batch_size={st.batch_size}"
        draws.append(_grads(model))
    sizes = [g.numel() for g in draws[0]]
    per_param = [np.stack([d[j].flatten().numpy() for d in draws]) for j in range(len(sizes))]  # (steps, size)
    z = np.concatenate(per_param, axis=1)  # (steps, P)

    lag = _corr_z(z[:-1].ravel(), z[1:].ravel())
    out["lag1_z"] = lag
    assert abs(lag) < Z_MAX, f"noise of consecutive steps is correlated: z = {lag:.1f}"
    cross = []
    for i in range(len(sizes)):
        for j in range(i + 1, len(sizes)):
            m = min(sizes[i], sizes[j])
            cross.append(_corr_z(per_param[i][:, :m].ravel(), per_param[j][:, :m].ravel()))
    out["max_cross_z"] = max(abs(c) for c in cross)
    assert out["max_cross_z"] < Z_MAX, (
        f"noise of different parameter tensors is correlated: |z| = {out['max_cross_z']:.1f}")

    ratio, p = _var_test(z, target)
    out.update(var_ratio=ratio, var_p=p)
    assert p > ALPHA, f"noise variance / (sigma C / B)^2 = {ratio:.4f} (chi-square p = {p:.3g}) on a zero gradient"
    out["param_var_ratio"], out["param_var_p"] = [], []
    for j, zj in enumerate(per_param):
        r, pj = _var_test(zj, target)
        out["param_var_ratio"].append(r)
        out["param_var_p"].append(pj)
        assert pj > ALPHA, (f"parameter tensor {j} (size {sizes[j]}): noise variance ratio {r:.4f} "
                            f"(chi-square p = {pj:.3g})")
    mean_z = float(z.sum()) / (target * math.sqrt(z.size))
    out["mean_z"] = mean_z
    assert abs(mean_z) < Z_MAX, f"noise mean is off zero: z = {mean_z:.2f}"
    ks = stats.kstest(z.ravel() / target, "norm")
    out["ks_stat"], out["ks_p"] = float(ks.statistic), float(ks.pvalue)
    assert ks.pvalue > ALPHA, f"noise is not N(0, (sigma C / B)^2): KS D = {ks.statistic:.4f}, p = {ks.pvalue:.3g}"

    # (b) a real batch whose size differs from B
    x, y = make_batch(batch_rows, seed=seed)
    base = mlp(in_features=12, hidden=[16], activation="relu")
    clean_model, noisy_model = copy.deepcopy(base), copy.deepcopy(base)
    _engine(factory, clean_model, C=C, sigma=0.0, B=B, seed=seed)(x, y)
    clean = torch.cat([g.flatten() for g in _grads(clean_model)])
    noisy_eng = _engine(factory, noisy_model, C=C, sigma=sigma, B=B, seed=seed + 1)
    resid = []
    for _ in range(batch_steps):
        noisy_eng(x, y)
        resid.append((torch.cat([g.flatten() for g in _grads(noisy_model)]) - clean).numpy())
    ratio_b, p_b = _var_test(np.stack(resid), target)
    out.update(batch_var_ratio=ratio_b, batch_var_p=p_b)
    assert p_b > ALPHA, (f"on a batch of {batch_rows} rows (B = {B:g}) the noise variance ratio is "
                         f"{ratio_b:.4f} (chi-square p = {p_b:.3g})")
    return out


# ----------------------------------------------------------------------------- clipping


def check_clipping(factory: EngineFactory, model: torch.nn.Module, *, n: int = 24, seed: int = 2) -> dict[str, Any]:
    """Each example's contribution (engine on a one-row batch, sigma = 0, B = 1) has norm <= C
    and equals its loop-computed gradient times min(1, C / (||g_i|| + 1e-6)); C is the median
    per-example norm, so half the examples are clipped."""
    x, y = make_batch(n, seed=seed)
    C, per_ex, norms = _median_norm_C(model, x, y)
    m = copy.deepcopy(model)
    eng = _engine(factory, m, C=C, sigma=0.0, B=1.0, seed=seed)
    worst_ratio, worst_err = 0.0, 0.0
    for i in range(n):
        eng(x[i : i + 1], y[i : i + 1])
        got = _grads(m)
        worst_ratio = max(worst_ratio, _norm(got) / C)
        factor = min(1.0, C / (float(norms[i]) + 1e-6))
        ref = [g * factor for g in per_ex[i]]
        err = _norm([a - b for a, b in zip(got, ref)]) / max(_norm(ref), 1e-12)
        worst_err = max(worst_err, err)
    out = {"C": C, "clipped": int((norms > C).sum()), "max_norm_over_C": worst_ratio, "max_rel_err": worst_err}
    assert worst_ratio <= 1 + 1e-5, f"a clipped per-example contribution has norm {worst_ratio:.4f} C > C"
    assert worst_err <= 1e-4, (
        f"a per-example contribution differs from the loop reference by {worst_err:.3g} (relative)")
    return out


def check_matches_reference(factory: EngineFactory, model: torch.nn.Module, *, n: int = 40, B: float = 50.0,
                            seed: int = 1) -> dict[str, Any]:
    """On one batch of n != B rows with sigma = 0: engine update == (sum_i clip_C(g_i)) / B,
    the per-example gradients g_i from an explicit loop, C the median per-example norm."""
    x, y = make_batch(n, seed=seed)
    C, per_ex, norms = _median_norm_C(model, x, y)
    expected = [torch.zeros_like(g) for g in per_ex[0]]
    for gs, nrm in zip(per_ex, norms):
        factor = min(1.0, C / (float(nrm) + 1e-6))
        for e, g in zip(expected, gs):
            e += g * factor / B
    m = copy.deepcopy(model)
    _engine(factory, m, C=C, sigma=0.0, B=B, seed=seed)(x, y)
    got = _grads(m)
    err = _norm([a - b for a, b in zip(got, expected)]) / _norm(expected)
    out = {"C": C, "rel_err": err}
    assert err <= 1e-4, f"engine update differs from the per-example loop reference by {err:.3g} (relative)"
    return out


def check_engines_agree(factory_a: EngineFactory, factory_b: EngineFactory, model: torch.nn.Module, *,
                        n: int = 64, sigma: float = 1.3, B: float = 60.0, seed: int = 3) -> dict[str, Any]:
    """Two engines (fast and Opacus) give the same update on the same batch, C (median norm),
    sigma, B and noise seed."""
    x, y = make_batch(n, seed=seed)
    C, _, _ = _median_norm_C(model, x, y)
    ga, gb = [], []
    for factory, store in ((factory_a, ga), (factory_b, gb)):
        m = copy.deepcopy(model)
        _engine(factory, m, C=C, sigma=sigma, B=B, seed=seed + 8)(x, y)
        store.extend(_grads(m))
    diff = _norm([a - b for a, b in zip(ga, gb)]) / _norm(gb)
    out = {"rel_diff": diff}
    assert diff <= 1e-5, f"the two engines' updates differ by {diff:.3g} (relative)"
    return out


# ----------------------------------------------------------------------------- sampling


def check_sampler_law(sampler: Any, *, num_rows: int, sample_rate: float, draws: int = 3000) -> dict[str, Any]:
    """``sampler.sample()`` draws Poisson batches over ``num_rows`` rows at rate ``sample_rate``:
    sorted distinct int64 indices in range; batch sizes ~ Binomial(N, q) (mean z-test and
    chi-square goodness of fit, tails pooled); each row is included at rate q (total rate,
    largest per-row deviation, and the chi-square dispersion of per-row counts, both tails:
    a shuffled epoch visits every row exactly equally, which is too even)."""
    n, q = num_rows, sample_rate
    batches = [sampler.sample() for _ in range(draws)]
    for idx in batches[:50]:
        assert idx.dtype == torch.int64, f"indices have dtype {idx.dtype}"
        assert idx.numel() == 0 or (bool(torch.all(idx[1:] > idx[:-1])) and 0 <= int(idx[0]) and int(idx[-1]) < n), \
            "indices are not sorted, distinct and in [0, N)"
    sizes = np.array([b.numel() for b in batches])
    mu, sd = n * q, math.sqrt(n * q * (1 - q))
    out: dict[str, Any] = {"mean_size": float(sizes.mean()), "expected_mean": mu}
    mean_z = (sizes.mean() - mu) / (sd / math.sqrt(draws))
    out["mean_z"] = float(mean_z)
    assert abs(mean_z) < Z_MAX, f"mean batch size {sizes.mean():.2f} != N q = {mu:.2f} (z = {mean_z:.1f})"
    lo, hi = int(mu - 2.5 * sd), int(mu + 2.5 * sd)
    obs = np.array([(sizes <= lo).sum(), *[(sizes == k).sum() for k in range(lo + 1, hi)], (sizes >= hi).sum()])
    probs = np.array([stats.binom.cdf(lo, n, q), *[stats.binom.pmf(k, n, q) for k in range(lo + 1, hi)],
                      stats.binom.sf(hi - 1, n, q)])
    chi = stats.chisquare(obs, probs / probs.sum() * draws)
    out["size_chi2"], out["size_chi2_p"] = float(chi.statistic), float(chi.pvalue)
    assert chi.pvalue > ALPHA, (
        f"batch sizes are not Binomial(N, q): chi-square {chi.statistic:.1f}, p = {chi.pvalue:.3g}")
    counts = np.bincount(torch.cat(batches).numpy(), minlength=n).astype(np.float64)
    row_sd = math.sqrt(draws * q * (1 - q))
    row_z = (counts - draws * q) / row_sd
    out["max_row_z"] = float(np.abs(row_z).max())
    # the largest of N |z| values: Bonferroni over rows
    row_zmax = float(stats.norm.isf(ALPHA / (2 * n)))
    assert out["max_row_z"] < row_zmax, f"some row is included at a rate far from q (|z| = {out['max_row_z']:.1f})"
    disp = float(np.sum(row_z**2))
    disp_p = 2 * min(float(stats.chi2.cdf(disp, n)), float(stats.chi2.sf(disp, n)))
    out["row_dispersion"], out["row_dispersion_p"] = disp / n, disp_p
    assert disp_p > ALPHA, (
        f"per-row inclusion counts are not Binomial(draws, q): dispersion {disp / n:.3f}, p = {disp_p:.3g}")
    return out


def check_sampler(make_sampler: Callable[..., Any] = PoissonSampler, *, num_rows: int, sample_rate: float,
                  seed: int = 5, draws: int = 3000) -> dict[str, Any]:
    """Builds ``make_sampler(num_rows=, sample_rate=, rng=)`` and runs :func:`check_sampler_law`."""
    sampler = make_sampler(num_rows=num_rows, sample_rate=sample_rate, rng=np.random.default_rng(seed))
    return check_sampler_law(sampler, num_rows=num_rows, sample_rate=sample_rate, draws=draws)


# ----------------------------------------------------------------------------- accounting of a run


def curve_steps(steps: int, log_every: int, start: int = 0) -> int:
    """How many of the steps start + 1 .. steps release the dp/ curve (every ``log_every``-th
    and the last one), counted one by one."""
    return sum(1 for s in range(start + 1, steps + 1) if s % log_every == 0 or s == steps)


def reference_epsilons(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                       accountants: Sequence[str] = ("rdp", "pld"), curve_noise_multiplier: float | None = None,
                       curve_releases: int = 0) -> dict[str, float]:
    """Epsilon straight from dp-accounting (RDP: its default orders; PLD: interval 1e-4).

    With ``curve_releases`` K > 0 of the ``steps`` also releasing the dp/ curve (noise multiplier
    sigma_c) on their Poisson batch: each such step is ONE Gaussian mechanism on the pair
    (gradient sum, loss sum), of noise multiplier (sigma^-2 + sigma_c^-2)^(-1/2), Poisson-sampled
    at q; the other steps are the gradient's alone."""
    def event(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(sigma))

    parts = [(event(noise_multiplier), steps - curve_releases)]
    if curve_releases:
        joint = 1.0 / math.sqrt(noise_multiplier**-2 + curve_noise_multiplier**-2)
        parts.append((event(joint), curve_releases))
    out = {}
    for name in accountants:
        acc = (dp_accounting.rdp.RdpAccountant() if name == "rdp"
               else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
        for ev, count in parts:
            if count:
                acc.compose(ev, count)
        out[name] = float(acc.get_epsilon(delta))
    return out


def check_run_accounting(train: Callable[[Callable[[GradientEngine], None]], Any], *, delta: float,
                         accountants: Sequence[str] = ("rdp", "pld"), noise_calls: int = 1000,
                         sampler_draws: int = 2000, rtol: float = 1e-6) -> dict[str, Any]:
    """The epsilon a training run reports is the epsilon of the mechanism it actually ran.

    ``train(on_engine)`` runs one training (e.g. ``dptrain.training.fit.fit``) and returns its result
    (``.accountant``, ``.privacy``). The mechanism is OBSERVED, not read from the config: the
    engine handed to ``on_engine`` and the calls made to it (T = number of steps), the
    PoissonSampler whose ``sample`` fed them, and the dp/ curve's releases (K calls of
    ``DPSGDMechanism.release_curve``). After the run:

    * the engine's actual noise, on empty batches, has SD sigma_e C / B with sigma_e its own
      ``noise_multiplier`` (so that attribute is the noise that was really added);
    * the curve's actual noise has SD sigma_c L / B with sigma_c its mechanism's;
    * the sampler used still draws Binomial(N, q) batches (:func:`check_sampler_law`);
    * the reported RDP and PLD epsilons equal dp-accounting's for (sigma_e, q, T, delta) and
      the K curve releases at sigma_c (:func:`reference_epsilons`), and the report's sigma, q,
      steps and number of curve releases are those observed.

    ``accountants``: which reported epsilons to compare (PLD costs ~0.5 s a side).
    """
    from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism

    engines: list[GradientEngine] = []
    samplers: dict[int, Any] = {}
    sizes: list[int] = []
    releases: list[Any] = []
    orig_sample, orig_release = PoissonSampler.sample, DPSGDMechanism.release_curve

    def recording_sample(self: PoissonSampler) -> torch.Tensor:
        samplers[id(self)] = self
        return orig_sample(self)

    def recording_release(self: Any, bounded_loss_sum: float, rng: Any) -> float:
        releases.append(self)
        return orig_release(self, bounded_loss_sum, rng)

    with contextlib.ExitStack() as stack:
        def on_engine(engine: GradientEngine) -> None:
            engines.append(engine)
            cls = type(engine)
            orig_call = cls.__call__

            def recording_call(self, x, y):
                sizes.append(int(x.shape[0]))
                return orig_call(self, x, y)

            stack.enter_context(mock.patch.object(cls, "__call__", recording_call))

        stack.enter_context(mock.patch.object(PoissonSampler, "sample", recording_sample))
        stack.enter_context(mock.patch.object(DPSGDMechanism, "release_curve", recording_release))
        result = train(on_engine)

    assert len(engines) == 1, f"on_engine was called {len(engines)} times"
    assert len(samplers) == 1, f"{len(samplers)} PoissonSamplers were used"
    engine, sampler = engines[0], next(iter(samplers.values()))
    T, K = len(sizes), len(releases)
    sigma, q, n = engine.noise_multiplier, sampler.sample_rate, sampler.num_rows
    out: dict[str, Any] = {"steps": T, "curve_releases": K, "sigma": sigma, "q": q, "N": n,
                           "history": result.accountant.totals}
    sigma_c = _check_curve_noise(releases, out) if K else None

    out["reported"], out["reference"] = {}, {}
    for name in accountants:  # RDP first: cheap, and it fails before PLD is computed
        reported = result.accountant.get_epsilon(delta=delta, accountant=name)
        reference = reference_epsilons(noise_multiplier=sigma, sample_rate=q, steps=T, delta=delta,
                                       accountants=(name,), curve_noise_multiplier=sigma_c,
                                       curve_releases=K)[name]
        rel = abs(reported - reference) / reference
        out["reported"][name], out["reference"][name], out[f"{name}_rel_err"] = reported, reference, rel
        assert rel <= rtol, (
            f"reported {name} epsilon {reported:.6g} != {reference:.6g} of the mechanism run "
            f"(sigma={sigma:g} from the engine, q={q:g} from the sampler, T={T} engine calls, K={K} curve "
            f"releases at sigma_c={sigma_c}); accountant history {result.accountant.totals}")

    # the engine's noise_multiplier is the noise it really adds (measured on zero gradients)
    C, B = engine.max_grad_norm, engine.expected_batch_size
    empty_x, empty_y = torch.zeros(0, engine.params[0].shape[-1]), torch.zeros(0)
    z = []
    for _ in range(noise_calls):
        engine(empty_x, empty_y)
        z.append(torch.cat([p.grad.detach().double().flatten() for p in engine.params]).numpy())
    z = np.concatenate(z)
    sigma_hat = float(np.sqrt(np.mean(np.square(z)))) * B / C
    ratio, p = _var_test(z, sigma * C / B) if sigma > 0 else (math.inf, 0.0)
    out.update(sigma_hat=sigma_hat, noise_var_ratio=ratio, noise_var_p=p)
    assert p > ALPHA, (f"the engine adds noise of multiplier {sigma_hat:.4g}, not its noise_multiplier "
                       f"{sigma:g} (variance ratio {ratio:.4f}, chi-square p = {p:.3g})")

    out["sampler"] = check_sampler_law(sampler, num_rows=n, sample_rate=q, draws=sampler_draws)

    priv = result.privacy
    assert priv["noise_multiplier"] == sigma, f"report says sigma={priv['noise_multiplier']}, engine ran {sigma}"
    assert priv["sample_rate"] == q, f"report says q={priv['sample_rate']}, sampler ran {q}"
    assert priv["steps"] == T, f"report says {priv['steps']} steps, the engine was called {T} times"
    assert priv["dataset_size"] == n, f"report says N={priv['dataset_size']}, sampler drew from {n} rows"
    curves = priv.get("dp_curves")
    assert (curves["releases"] if curves else 0) == K, f"report says {curves} dp/ curve releases, {K} were made"
    return out


def _check_curve_noise(releases: list[Any], out: dict[str, Any], draws: int = 4000) -> float:
    """The dp/ curve's releases all came from one mechanism whose noise (measured on a zero sum
    with fresh streams) has SD sigma_c L / B; returns that sigma_c."""
    from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism

    mechanisms = {id(m): m for m in releases}
    assert len(mechanisms) == 1, f"the dp/ curve was released by {len(mechanisms)} mechanisms"
    m = releases[0]
    sigma_c, bound, b = m.curve.noise_multiplier, m.curve.loss_bound, m.expected_batch_size
    rng = np.random.default_rng(11)
    z = np.array([DPSGDMechanism.release_curve(m, 0.0, rng) for _ in range(draws)])
    ratio, p = _var_test(z, sigma_c * bound / b)
    out.update(curve_sigma=sigma_c, curve_sigma_hat=float(np.sqrt(np.mean(z * z))) * b / bound,
               curve_noise_var_ratio=ratio, curve_noise_var_p=p)
    assert p > ALPHA, (f"the dp/ curve adds noise of multiplier {out['curve_sigma_hat']:.4g}, not its "
                       f"noise_multiplier {sigma_c:g} (variance ratio {ratio:.4f}, chi-square p = {p:.3g})")
    return sigma_c
