"""DP invariants of the step (docs/privacy.md, "How it is tested")."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dptrain.models.networks import logit, mlp
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import (
    FastLinearEngine,
    NonPrivateEngine,
    OpacusEngine,
    fast_path_blocker,
    make_engine,
)
from dptrain.privacy.dpsgd.sampling import PoissonSampler

per_example_loss = BINARY.per_example_loss  # binary cross-entropy with logits, one per example


ENGINES = [FastLinearEngine, OpacusEngine]
MODELS = {
    "logit": lambda: logit(in_features=12),
    "mlp": lambda: mlp(in_features=12, hidden=[16, 8], activation="tanh"),
}


def _batch(n: int = 40, d: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.1, 3.0, n, dtype=torch.float32)[:, None]
    y = (torch.rand(n, generator=g) < 0.5).float()
    return x, y


def _per_example_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Reference: an explicit loop over examples."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(x.shape[0]):
        loss = per_example_loss(model(x[i : i + 1]), y[i : i + 1]).sum()
        out.append([g.detach() for g in torch.autograd.grad(loss, params)])
    return out


def _run(cls, model, x, y, *, C, sigma, B, seed=7, ones_column=None):
    m = copy.deepcopy(model)
    eng = cls(m, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
              generator=torch.Generator().manual_seed(seed))
    if ones_column is not None:  # the buffered path's GPU layout (no ones column), on the CPU
        eng.ones_column = ones_column
    assert eng.collect_stats  # on by default
    stats_ = eng(x, y)
    return [p.grad.detach().clone() for p in m.parameters()], stats_


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("cls", ENGINES)
def test_no_clip_no_noise_equals_plain_sgd(cls, model_name):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    x, y = _batch()
    B = 50.0  # expected batch size differs from the realised 40: division must use B
    grads, _ = _run(cls, model, x, y, C=1e12, sigma=0.0, B=B)
    plain = copy.deepcopy(model)
    (per_example_loss(plain(x), y).sum() / B).backward()
    for g, p in zip(grads, plain.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)
    nonpriv, _ = _run(lambda m, **kw: NonPrivateEngine(m, expected_batch_size=kw["expected_batch_size"],
                                                       generator=kw["generator"], objective=BINARY),
                      model, x, y, C=None, sigma=None, B=B)
    for g, h in zip(grads, nonpriv):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("cls", ENGINES)
def test_clipped_sum_matches_per_example_loop(cls, model_name):
    torch.manual_seed(1)
    model = MODELS[model_name]()
    x, y = _batch()
    per_ex = _per_example_grads(model, x, y)
    norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in gs)) for gs in per_ex])
    srt = norms.sort().values
    C = float(srt[19] + srt[20]) / 2  # clipping active for half of the examples, no ties
    assert (norms > C).sum() >= 10 and (norms < C).sum() >= 10
    expected = [torch.zeros_like(g) for g in per_ex[0]]
    for gs, nrm in zip(per_ex, norms):
        factor = min(1.0, C / (float(nrm) + 1e-6))
        clipped_norm = math.sqrt(sum(float((g * factor).pow(2).sum()) for g in gs))
        assert clipped_norm <= C * (1 + 1e-5)
        for e, g in zip(expected, gs):
            e += g * factor
    B = 40.0
    grads, st = _run(cls, model, x, y, C=C, sigma=0.0, B=B)
    assert st.clipped == int((norms > C).sum())
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g * B, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", ENGINES)
def test_each_clipped_example_has_norm_at_most_C(cls):
    torch.manual_seed(2)
    model = MODELS["mlp"]()
    x, y = _batch(n=30)
    per_ex = _per_example_grads(model, x, y)
    C = 0.3
    for i in range(x.shape[0]):
        grads, _ = _run(cls, model, x[i : i + 1], y[i : i + 1], C=C, sigma=0.0, B=1.0)
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        raw = math.sqrt(sum(float(g.pow(2).sum()) for g in per_ex[i]))
        assert norm <= C * (1 + 1e-5)
        if raw < C:  # unclipped examples pass through unchanged
            assert norm == pytest.approx(raw, rel=1e-4)
        else:
            assert norm == pytest.approx(C, rel=1e-4)


def _assert_fast_equals_opacus_with_noise(model, ones_column=None):
    """Same batch (64 rows, C at the median per-example norm), same noise seed: the fast
    engine's noisy update equals Opacus' per-example gradients + our clipping + the same draw."""
    x, y = _batch(n=64)
    per_ex = _per_example_grads(model, x, y)
    C = float(np.median([math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) for gs in per_ex]))
    fast, _ = _run(FastLinearEngine, model, x, y, C=C, sigma=1.3, B=60.0, seed=11, ones_column=ones_column)
    opac, _ = _run(OpacusEngine, model, x, y, C=C, sigma=1.3, B=60.0, seed=11)
    for a, b in zip(fast, opac):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_name", list(MODELS))
def test_fast_path_equals_opacus_with_noise(model_name):
    torch.manual_seed(3)
    _assert_fast_equals_opacus_with_noise(MODELS[model_name]())


@pytest.mark.parametrize("cls", ENGINES)
def test_noise_std_is_sigma_C_over_B(cls):
    """On an empty batch (zero gradient) the update is pure noise with SD sigma*C/B."""
    model = mlp(in_features=12, hidden=[16], activation="relu")
    sigma, C, B = 1.7, 0.5, 20.0
    eng = cls(model, max_grad_norm=C, noise_multiplier=sigma, expected_batch_size=B,
              generator=torch.Generator().manual_seed(123))
    empty_x, empty_y = torch.zeros(0, 12), torch.zeros(0)
    draws = []
    for _ in range(40):
        st = eng(empty_x, empty_y)
        assert st.batch_size == 0
        draws.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    z = torch.cat(draws).double().numpy()
    n = z.size
    target = sigma * C / B
    chi2 = (n - 1) * z.var(ddof=1) / target**2  # ~ chi2(n - 1) if SD is right
    p_two_sided = 2 * min(stats.chi2.cdf(chi2, n - 1), stats.chi2.sf(chi2, n - 1))
    assert p_two_sided > 1e-3, (z.std(), target)
    assert abs(z.mean()) < 5 * target / math.sqrt(n)
    # Normality of the draws (KS against N(0, target^2)).
    assert stats.kstest(z[:5000] / target, "norm").pvalue > 1e-3
    # A batch of real examples gets the same noise scale: subtract the clipped sum.
    x, y = _batch(n=25)
    model = mlp(in_features=12, hidden=[16], activation="relu")  # not yet wrapped by Opacus hooks
    g_noisy = []
    g_clean, _ = _run(cls, model, x, y, C=C, sigma=0.0, B=B)
    for seed in range(30):
        g, _ = _run(cls, model, x, y, C=C, sigma=sigma, B=B, seed=seed)
        g_noisy.append(torch.cat([(a - b).flatten() for a, b in zip(g, g_clean)]))
    resid = torch.cat(g_noisy).double().numpy()
    assert resid.std() == pytest.approx(target, rel=0.03)


@pytest.mark.parametrize("n,q", [(2000, 0.02), (400, 0.3)])  # sparse (binomial + subset) and dense (mask)
def test_poisson_batch_sizes_are_binomial(n, q):
    draws = 3000
    sampler = PoissonSampler(num_rows=n, sample_rate=q, rng=np.random.default_rng(5))
    sizes = np.array([sampler.sample().numel() for _ in range(draws)])
    assert sizes.mean() == pytest.approx(n * q, rel=0.02)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)
    # chi-square goodness of fit against Binomial(n, q), tails pooled
    mu, sd = n * q, math.sqrt(n * q * (1 - q))
    lo, hi = int(mu - 2.5 * sd), int(mu + 2.5 * sd)
    obs = np.array([(sizes <= lo).sum(), *[(sizes == k).sum() for k in range(lo + 1, hi)], (sizes >= hi).sum()])
    probs = np.array([stats.binom.cdf(lo, n, q), *[stats.binom.pmf(k, n, q) for k in range(lo + 1, hi)],
                      stats.binom.sf(hi - 1, n, q)])
    assert stats.chisquare(obs, probs * draws).pvalue > 1e-3
    # every row is picked at rate q: no row is favoured
    picks = torch.zeros(n)
    for _ in range(2000):
        picks[sampler.sample()] += 1
    rates = picks / 2000
    assert float(rates.mean()) == pytest.approx(q, rel=0.02)
    # per-row counts ~ Binomial(2000, q): no row favoured (chi-square dispersion test)
    disp = float(((picks - 2000 * q) ** 2).sum() / (2000 * q * (1 - q)))
    assert stats.chi2.sf(disp, n - 1) > 1e-3 and stats.chi2.cdf(disp, n - 1) > 1e-3
    idx = sampler.sample()
    assert idx.dtype == torch.int64 and torch.all(idx[1:] > idx[:-1])  # sorted and distinct


def test_sampler_scales_to_millions_of_rows():
    sampler = PoissonSampler(num_rows=20_000_000, sample_rate=1e-4, rng=np.random.default_rng(1))
    sizes = []
    for _ in range(50):
        idx = sampler.sample()
        assert idx.unique().numel() == idx.numel() and int(idx.max()) < 20_000_000
        sizes.append(idx.numel())
    assert np.mean(sizes) == pytest.approx(2000, rel=0.02)


def test_sampler_can_return_empty_batches():
    sampler = PoissonSampler(num_rows=50, sample_rate=0.005, rng=np.random.default_rng(0))
    sizes = [sampler.sample().numel() for _ in range(200)]
    assert sizes.count(0) > 100  # (1 - 0.005)^50 ~ 0.78


def test_auto_engine_choice():
    gen = torch.Generator()
    kw = dict(max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=8, generator=gen)
    assert make_engine(logit(in_features=3), engine="auto", **kw).name == "fast"
    assert make_engine(mlp(in_features=3), engine="auto", **kw).name == "fast"
    def conv():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))

    assert "LayerNorm" in fast_path_blocker(conv())
    assert make_engine(conv(), engine="auto", **kw).name == "opacus"
    with pytest.raises(ValueError, match="trainer.engine=fast"):
        make_engine(conv(), engine="fast", **kw)
    assert make_engine(conv(), engine="opacus", **kw).name == "opacus"
    assert make_engine(conv(), engine="nonprivate", **kw).name == "nonprivate"


@pytest.mark.parametrize("model_name", list(MODELS))
def test_diagnostics_switch_does_not_change_the_gradient(model_name):
    model = MODELS[model_name]()
    x, y = _batch()
    grads = []
    for collect in (True, False):
        m = copy.deepcopy(model)
        eng = FastLinearEngine(m, max_grad_norm=0.5, noise_multiplier=1.0, expected_batch_size=40,
                               generator=torch.Generator().manual_seed(0), objective=BINARY)
        eng.collect_stats = collect
        st = eng(x, y)
        assert st.batch_size == 40 and (math.isnan(st.loss_sum) != collect)
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_prefetched_noise_is_the_sequential_stream_and_checkpoints_rewind():
    """The background draw of the next step's noise changes nothing: same updates as drawing
    each step in turn, and the generator state a checkpoint saves is the sequential one."""
    x, y = _batch(n=64, d=12)
    model = mlp(in_features=12, hidden=[32, 32], activation="relu")
    engines, grads = [], []
    for prefetch in (True, False):
        m = copy.deepcopy(model)
        eng = FastLinearEngine(m, max_grad_norm=1.0, noise_multiplier=1.3, expected_batch_size=50,
                               generator=torch.Generator().manual_seed(11), objective=BINARY)
        eng.noise.prefetch = prefetch
        eng.noise.STARVED_WAIT_S = math.inf  # however slow the machine, keep prefetching (no timing here)
        out = []
        for step in range(5):
            eng(x[step * 10:(step + 1) * 10], y[step * 10:(step + 1) * 10])
            out.append(torch.cat([p.grad.reshape(-1) for p in eng.params]))
        engines.append(eng)
        grads.append(torch.stack(out))
    assert engines[0].noise._pending is not None  # a draw is queued ...
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    # ... but the state to checkpoint is the sequential engine's
    assert torch.equal(engines[0].noise_generator_state(), engines[1].noise_generator_state())
    engines[0].discard_prefetched_noise()
    assert torch.equal(engines[0].generator.get_state(), engines[1].generator.get_state())
    # by default only big models prefetch (a thread hand-off costs more than a tiny draw)
    assert not FastLinearEngine(logit(in_features=12), max_grad_norm=1.0, noise_multiplier=1.0,
                                expected_batch_size=10, generator=torch.Generator(), objective=BINARY).noise.prefetch
    big = mlp(in_features=100, hidden=[256, 256], activation="relu")
    assert FastLinearEngine(big, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=10,
                            generator=torch.Generator(), objective=BINARY).noise.prefetch


# ------------------------------------------------------------------ the buffered fast path

def _stack(*layers: torch.nn.Module) -> torch.nn.Sequential:
    from dptrain.models.networks import Squeeze

    return torch.nn.Sequential(*layers, Squeeze())


L = torch.nn.Linear
STACKS = {
    # every activation the fast path supports, each with its own backward formula
    "relu": lambda: _stack(L(12, 16), torch.nn.ReLU(), L(16, 8), torch.nn.ReLU(), L(8, 1)),
    "tanh": lambda: _stack(L(12, 16), torch.nn.Tanh(), L(16, 1)),
    "sigmoid": lambda: _stack(L(12, 16), torch.nn.Sigmoid(), L(16, 1)),
    "gelu": lambda: _stack(L(12, 16), torch.nn.GELU(), L(16, 1)),
    "gelu_tanh": lambda: _stack(L(12, 16), torch.nn.GELU(approximate="tanh"), L(16, 1)),
    "silu": lambda: _stack(L(12, 16), torch.nn.SiLU(), L(16, 1)),
    "elu": lambda: _stack(L(12, 16), torch.nn.ELU(), L(16, 1)),
    "elu_negative_alpha": lambda: _stack(L(12, 16), torch.nn.ELU(alpha=-0.5), L(16, 1)),
    "leaky_relu": lambda: _stack(L(12, 16), torch.nn.LeakyReLU(0.1), L(16, 1)),
    "leaky_relu_negative_slope": lambda: _stack(L(12, 16), torch.nn.LeakyReLU(-0.3), L(16, 1)),
    "identity": lambda: _stack(L(12, 16), torch.nn.Identity(), L(16, 1)),
    # layouts that take the other branches: the input wider than the first layer (scale g, bias
    # from a column sum); a layer wider than its input + 1 (scale [a | 1], ones column included);
    # layers without a bias; an activation on the logit
    "wide_input": lambda: _stack(L(12, 6), torch.nn.ReLU(), L(6, 1)),
    "expanding": lambda: _stack(L(12, 4), torch.nn.Tanh(), L(4, 16), torch.nn.ReLU(), L(16, 1)),
    "no_bias": lambda: _stack(L(12, 16, bias=False), torch.nn.ReLU(), L(16, 4, bias=False), torch.nn.Tanh(),
                              L(4, 8), torch.nn.ReLU(), L(8, 1, bias=False)),
    "activation_on_logit": lambda: _stack(L(12, 16), torch.nn.ReLU(), L(16, 1), torch.nn.Tanh()),
}


def _clipped_reference(model, x, y, C):
    per_ex = _per_example_grads(model, x, y)
    out = [torch.zeros_like(g) for g in per_ex[0]]
    clipped = 0
    for gs in per_ex:
        nrm = math.sqrt(sum(float(g.pow(2).sum()) for g in gs))
        clipped += nrm > C
        for o, g in zip(out, gs):
            o += g * min(1.0, C / (nrm + 1e-6))
    return out, clipped


@pytest.mark.parametrize("ones_column", [True, False], ids=["cpu_layout", "gpu_layout"])
@pytest.mark.parametrize("name", list(STACKS))
def test_buffered_path_matches_per_example_loop_over_steps(name, ones_column):
    """The autograd-free path (reused buffers, bias via a ones column on the CPU or apart as on
    a GPU, noise folded into the matrix products) against an explicit loop, over successive
    steps of different sizes: the workspace grows, shrinks back and is reused, and nothing
    carries over between steps."""
    torch.manual_seed(4)
    model = STACKS[name]()
    eng = FastLinearEngine(model, max_grad_norm=1.0, noise_multiplier=0.0, expected_batch_size=50.0,
                           generator=torch.Generator().manual_seed(0), objective=BINARY)
    assert eng.fused and eng.plan is not None and eng.ones_column  # the CPU's layout by default
    eng.ones_column = ones_column
    for step, n in enumerate([40, 25, 150, 40]):
        x, y = _batch(n=n, seed=step)
        per_ex = _per_example_grads(model, x, y)
        norms = sorted(math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) for gs in per_ex)
        C = (norms[n // 2 - 1] + norms[n // 2]) / 2  # clipping active for half of the examples
        eng.max_grad_norm = C
        expected, clipped = _clipped_reference(model, x, y, C)
        st = eng(x, y)
        assert st.batch_size == n and st.clipped == clipped == n - n // 2
        for p, e in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad * 50.0, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("ones_column", [True, False], ids=["cpu_layout", "gpu_layout"])
@pytest.mark.parametrize("name", ["relu", "expanding", "wide_input", "no_bias", "gelu"])
def test_buffered_path_equals_opacus_with_noise(name, ones_column):
    """Same batch, same noise seed: the fused update (noise added inside the matrix product)
    equals Opacus' per-example gradients + our clipping + the same draw, in both layouts."""
    torch.manual_seed(5)
    _assert_fast_equals_opacus_with_noise(STACKS[name](), ones_column=ones_column)


def test_other_layouts_take_the_autograd_path_and_agree():
    """Two activations in a row: not a plain stack, so the hook-based autograd path runs (and
    matches the loop); the same model without the extra activation takes the buffered path."""
    torch.manual_seed(6)
    odd = _stack(L(12, 16), torch.nn.ReLU(), torch.nn.Tanh(), L(16, 1))
    eng = FastLinearEngine(odd, max_grad_norm=0.5, noise_multiplier=0.0, expected_batch_size=40.0,
                           generator=torch.Generator(), objective=BINARY)
    assert not eng.fused and eng.plan is None
    x, y = _batch()
    expected, _ = _clipped_reference(odd, x, y, 0.5)
    eng(x, y)
    for p, e in zip(odd.parameters(), expected):
        torch.testing.assert_close(p.grad * 40.0, e, rtol=1e-4, atol=1e-6)
    assert FastLinearEngine(STACKS["relu"](), max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0,
                            generator=torch.Generator(), objective=BINARY).fused


def test_noise_thread_only_uses_idle_cpu():
    """The background noise draw runs at the lowest CPU priority (SCHED_IDLE on Linux), so it
    fills idle time instead of slowing the step's parallel regions."""
    import os
    import threading

    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this platform")
    eng = FastLinearEngine(mlp(in_features=100, hidden=[256, 256]), max_grad_norm=1.0, noise_multiplier=1.0,
                           expected_batch_size=10, generator=torch.Generator().manual_seed(0), objective=BINARY)
    assert eng.noise.prefetch
    x, y = _batch(n=10, d=100)
    eng(x, y)
    eng(x, y)
    policies = {}
    for t in threading.enumerate():
        if t.name.startswith("dptrain-noise"):
            policies[t.name] = os.sched_getscheduler(t.native_id)
    assert policies and set(policies.values()) == {os.SCHED_IDLE}
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's own thread is untouched


_ACTS = {
    "none": None, "relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
    "gelu": torch.nn.GELU, "silu": torch.nn.SiLU, "elu": torch.nn.ELU, "leaky": torch.nn.LeakyReLU,
}


def _random_stack(widths, acts, biases):
    layers = []
    for k, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(L(a, b, bias=biases[k]))
        if acts[k] is not None and (k < len(widths) - 2 or acts[k] is torch.nn.Tanh):
            layers.append(acts[k]())
    return _stack(*layers)


def test_buffered_path_matches_per_example_loop_on_random_stacks():
    """Property test: random depths, widths (narrower and wider than their inputs), activations,
    bias flags, batch sizes and C: the buffered path equals the per-example loop, step after
    step on the same engine."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        depth=st.integers(1, 4),
        data=st.data(),
        seed=st.integers(0, 2**16),
    )
    def check(depth, data, seed):
        d_in = data.draw(st.integers(1, 12))
        hidden = data.draw(st.lists(st.integers(1, 20), min_size=depth - 1, max_size=depth - 1))
        widths = [d_in, *hidden, 1]
        acts = [_ACTS[data.draw(st.sampled_from(sorted(_ACTS)))] for _ in range(depth)]
        biases = [data.draw(st.booleans()) for _ in range(depth)]
        sizes = data.draw(st.lists(st.integers(1, 70), min_size=1, max_size=3))
        quantile = data.draw(st.floats(0.05, 0.95))
        torch.manual_seed(seed)
        model = _random_stack(widths, acts, biases)
        eng = FastLinearEngine(model, max_grad_norm=1.0, noise_multiplier=0.0, expected_batch_size=30.0,
                               generator=torch.Generator(), objective=BINARY)
        eng.ones_column = data.draw(st.booleans())  # the CPU's layout or the GPU's
        assert eng.fused and (eng.plan is not None or eng.closed_form)  # depth 1: the logit closed form
        for step, n in enumerate(sizes):
            x, y = _batch(n=n, d=d_in, seed=seed + step)
            per_ex = _per_example_grads(model, x, y)
            norms = sorted(math.sqrt(sum(float(g.pow(2).sum()) for g in gs)) for gs in per_ex)
            i = int(quantile * (n - 1))  # C between two norms (no example exactly at C)
            C = max((norms[i] + norms[i + 1]) / 2 if i + 1 < n else norms[i] * 1.5, 1e-3)
            eng.max_grad_norm = C
            expected, clipped = _clipped_reference(model, x, y, C)
            st_ = eng(x, y)
            if min(abs(v - C) for v in norms) > 1e-4 * C:  # the count is exact away from ties
                assert st_.clipped == clipped
            for p, e in zip(model.parameters(), expected):
                torch.testing.assert_close(p.grad * 30.0, e, rtol=1e-4, atol=1e-5)

    check()


def test_starved_background_draw_falls_back_to_inline_draws_with_the_same_stream():
    """On an oversubscribed machine the idle-priority noise thread gets almost no CPU: a long
    wait for it switches the engine to inline draws (64 steps, then 128, ...), and the noise
    stream stays the one a sequential engine draws. No timing: the engine's clock is replaced by
    one that advances 1 s per reading, and each queued draw is held until the main thread starts
    waiting for it (so every wait is "long", deterministically)."""
    import threading

    class HeldDrawClock:
        def __init__(self) -> None:
            self.now, self.calls, self.gate = 0.0, 0, threading.Semaphore(0)

        def __call__(self) -> float:
            self.calls += 1
            if self.calls % 2 == 1:  # the reading taken just before waiting: let the draw finish
                self.gate.release()
            self.now += 1.0
            return self.now

    x, y = _batch(n=20, d=12)
    model = mlp(in_features=12, hidden=[32], activation="relu")
    engines, grads, queued = [], [], {True: [], False: []}
    for prefetch in (True, False):
        m = copy.deepcopy(model)
        eng = FastLinearEngine(m, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=20,
                               generator=torch.Generator().manual_seed(3), objective=BINARY)
        eng.noise.prefetch = prefetch
        clock = HeldDrawClock()
        eng.noise._clock, draw = clock, eng.noise.draw

        def held_in_background(draw=draw, clock=clock):
            if threading.current_thread() is not threading.main_thread():
                assert clock.gate.acquire(timeout=30)  # held until the main thread waits for it
            return draw()

        eng.noise.draw = held_in_background
        out = []
        for _ in range(70):
            eng(x, y)
            out.append(torch.cat([p.grad.reshape(-1) for p in eng.params]))
            queued[prefetch].append(eng.noise._pending is not None)
        clock.gate.release()  # the draw still queued at the end may finish
        eng.discard_prefetched_noise()
        engines.append(eng)
        grads.append(torch.stack(out))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    # step 1 queues a draw; step 2 waits for it ("1 s"), so it and the next 63 steps draw inline
    # (none queued); step 66 queues again, step 67 starves again: 128 inline steps next, then 256
    q = queued[True]
    assert q[:2] == [True, False] and not any(q[2:65]) and q[65] and not any(q[66:])
    assert engines[0].noise._inline_steps == 256 and not any(queued[False])
