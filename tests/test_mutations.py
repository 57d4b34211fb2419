"""Mutation checks (docs/privacy.md, "How it is tested"): the DP-invariant checks of
tests/dp_invariants.py pass on the real engine, sampler, accountant and training loop, and
each deliberately broken version (applied with ``monkeypatch`` to the public classes, never by
editing dptrain/) makes the check meant for it fail.

Statistics seen at these fixed seeds (torch 2.13 CPU, numpy PCG64) are recorded next to each
test. The real code passes every statistical test with p >= 0.05 against ALPHA = 1e-5 (|z|
<= 1.3 against 4.42; largest per-row |z| 3.9 against the Bonferroni bound 5.0), and the
deterministic comparisons with relative errors <= 2.1e-7 against tolerances 1e-4 (loop
reference, clipping) and 1e-5 (fast vs Opacus); the reported epsilons equal dp-accounting's
exactly (relative error 0). Every mutation fails its check by orders of magnitude more.
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import torch
from dp_invariants import (
    check_clipping,
    check_engines_agree,
    check_matches_reference,
    check_noise,
    check_run_accounting,
    check_sampler,
)
from torch import nn

import dptrain.privacy.dpsgd.engine
import dptrain.training.fit
from dptrain.models.networks import logit, mlp
from dptrain.privacy.accounting import PrivacyLedger
from dptrain.privacy.dpsgd.engine import (
    FastLinearEngine,
    GradientEngine,
    OpacusEngine,
    make_engine,
)
from dptrain.privacy.dpsgd.sampling import PoissonSampler
from dptrain.privacy.events import poisson_gaussian
from dptrain.tasks.plan import training_plan

ENGINES = {
    "fast": functools.partial(make_engine, engine="fast"),
    "opacus": functools.partial(make_engine, engine="opacus"),
}
MODELS = {
    "logit": lambda: logit(in_features=12),
    "mlp": lambda: mlp(in_features=12, hidden=[16, 8], activation="tanh"),
}
SAMPLERS = {"sparse": (2000, 0.02), "dense": (400, 0.3)}  # binomial + subset, and Bernoulli mask


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


# ============================================================================ mutations


def _noise_mutant(kind: str):
    """GradientEngine.__call__ that runs the real step with the noise off (so .grad holds the
    clipped sum / B) and then adds noise in the way ``kind`` says (``"correct"``: one
    N(0, (sigma C / B)^2) draw per coordinate, i.e. the real behaviour)."""
    orig = GradientEngine.__call__

    def call(self, x, y):
        sigma = self.noise_multiplier
        self.noise_multiplier = 0.0
        try:
            st = orig(self, x, y)
        finally:
            self.noise_multiplier = sigma
        std = sigma * self.max_grad_norm / self.expected_batch_size
        if kind == "none" or std == 0:
            return st
        gen = torch.Generator().manual_seed(0) if kind == "same_every_step" else self.generator

        def draw(k: int, sd: float = std) -> torch.Tensor:
            return torch.randn(k, generator=gen, dtype=torch.float64) * sd

        shared = draw(max(p.numel() for p in self.params))
        for p in self.params:
            k = p.numel()
            if kind in ("correct", "same_every_step"):
                z = draw(k)
            elif kind == "twice":  # a second draw added on top of the first
                z = draw(k) + draw(k)
            elif kind == "split_per_layer":  # the "budget" split over the L tensors: sd / sqrt(L) each
                z = draw(k, std / math.sqrt(len(self.params)))
            elif kind == "bias_forgotten":  # noise on weight matrices only
                z = draw(k) if p.dim() > 1 else torch.zeros(k, dtype=torch.float64)
            elif kind == "shared_draw":  # one draw reused (prefix) for every tensor
                z = shared[:k]
            elif kind == "per_example":  # one draw per EXAMPLE (none on an empty batch)
                z = sum((draw(k) for _ in range(x.shape[0])), torch.zeros(k, dtype=torch.float64))
            elif kind == "uniform":  # right variance, wrong law
                z = (torch.rand(k, generator=gen, dtype=torch.float64) * 2 - 1) * std * math.sqrt(3)
            else:
                raise ValueError(kind)
            p.grad = p.grad + z.view_as(p.grad).to(p.grad.dtype)
        return st

    return call


def _realised_batch_mutant():
    """GradientEngine.__call__ that divides sum and noise by the REALISED batch size."""
    orig = GradientEngine.__call__

    def call(self, x, y):
        b = self.expected_batch_size
        self.expected_batch_size = float(max(x.shape[0], 1))
        try:
            return orig(self, x, y)
        finally:
            self.expected_batch_size = b

    return call


def _fast_sq_norms(*, bias_in_norm: bool):
    """FastLinearEngine.per_example_sq_norms, re-implemented (every fast path -- logit closed
    form, buffered stack, autograd -- takes its per-example norms from it; a vector g is a
    width-1 layer's output gradient); with
    ``bias_in_norm=False`` the bias part ||g_i||^2 is left out of each per-example norm."""

    def per_example_sq_norms(self, inputs, out_grads, has_bias):
        sq = torch.zeros(inputs[0].shape[0], dtype=inputs[0].dtype)
        for a, g, bias in zip(inputs, out_grads, has_bias):
            extra = 1.0 if (bias_in_norm and bias) else 0.0
            g2 = g.pow(2) if g.dim() == 1 else g.pow(2).sum(1)
            sq = sq + g2 * (a.pow(2).sum(1) + extra)
        return sq

    return per_example_sq_norms


def _sampler_mutant(kind: str):
    """PoissonSampler.sample, broken; the sampler still REPORTS its configured sample_rate."""
    orig = PoissonSampler.sample

    def sample(self):
        n, q = self.num_rows, self.sample_rate
        if kind == "rate_1.1x":
            self.sample_rate = min(1.0, 1.1 * q)
            try:
                return orig(self)
            finally:
                self.sample_rate = q
        if kind == "last_row_never":  # off by one: rows 0..N-2 only
            self.num_rows = n - 1
            try:
                return orig(self)
            finally:
                self.num_rows = n
        k = round(n * q)
        if kind == "fixed_size":  # a shuffled batch of exactly B rows
            idx = np.sort(self.rng.choice(n, size=k, replace=False))
        elif kind == "shuffled_epochs":  # consecutive B-row slices of a permutation, reshuffled per epoch
            perm, pos = getattr(self, "_perm", None), getattr(self, "_pos", n)
            if perm is None or pos + k > n:
                perm, pos = self.rng.permutation(n), 0
            idx = np.sort(perm[pos : pos + k])
            self._perm, self._pos = perm, pos + k
        else:
            raise ValueError(kind)
        return torch.from_numpy(idx.astype(np.int64))

    return sample


def _accountant_step_mutant(*, sigma_factor: float = 1.0, q_factor: float = 1.0, every: int = 1):
    """PrivacyLedger.record that records sigma * sigma_factor, q * q_factor, and only one
    call in ``every`` (the training loop records the mechanism's event once per step)."""
    orig = PrivacyLedger.record

    def record(self, event, num_steps=1):
        self._mutant_calls = getattr(self, "_mutant_calls", 0) + 1
        if (self._mutant_calls - 1) % every:
            return None
        q, sigma = event.params
        return orig(self, poisson_gaussian(sample_rate=q * q_factor, noise_multiplier=sigma * sigma_factor),
                    num_steps)

    return record


def _stale_sigma_make_engine(factor: float):
    """dptrain.privacy.dpsgd.engine.make_engine (what the mechanism builds its engine with) that builds
    the engine with sigma * factor, while the accountant and report keep the (calibrated) sigma."""
    orig = dptrain.privacy.dpsgd.engine.make_engine

    def build(model, *, noise_multiplier, **kwargs):
        return orig(model, noise_multiplier=noise_multiplier * factor, **kwargs)

    return build


# ============================================================================ training runs

_RUNS = {
    "sigma": ["privacy.noise_multiplier=2.0"],  # sigma >= 2 keeps the PLD evaluations cheap (~0.2 s)
    "calibrated": ["privacy.target_epsilon=0.5"],
}
_SETUP_CACHE: dict[str, tuple] = {}


def _setup(kind: str):
    if kind not in _SETUP_CACHE:
        from hydra import compose, initialize_config_module
        from omegaconf import OmegaConf

        import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
        from dptrain.data import load_dataset
        from dptrain.settings.train import validate_against_size
        from dptrain.tasks.registry import validate

        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
                "experiment=logit", "data=synthetic", "data.n_rows=2000", "trainer.progress=false",
                "trainer.baseline=false", "trainer.batch_size=50", "trainer.epochs=1", *_RUNS[kind]]))
        validate(cfg)
        data = load_dataset(cfg.data, seed=cfg.seed)
        _SETUP_CACHE[kind] = (cfg, data, validate_against_size(cfg, data.n_train))
    return _SETUP_CACHE[kind]


def _trainer(kind: str, tmp_path):
    from dptrain.runfolder.tracking import Tracker

    cfg, data, delta = _setup(kind)

    def train(on_engine):
        conf = copy.deepcopy(cfg)
        mechanism = dptrain.training.fit.mechanism_for(training_plan(conf), dataset_size=data.n_train, delta=delta)
        return dptrain.training.fit.fit(training_plan(conf), data, mechanism=mechanism,
                                 tracker=Tracker(tmp_path, tensorboard=False), on_engine=on_engine)

    return train, delta


# ============================================================================ the real code passes


@pytest.mark.parametrize("engine", list(ENGINES))
def test_noise_invariant_holds(engine):
    # seen (both engines): variance ratio 1.013 (p 0.059), per tensor 0.90-1.02 (p >= 0.057),
    # mean z -1.27, KS D 0.0039 (p 0.51), lag-1 z 0.53, max cross-tensor |z| 0.90,
    # batch of 30 rows with B = 20: variance ratio 0.991 (p 0.47)
    st = check_noise(ENGINES[engine])
    print(engine, st)


def test_noise_check_passes_the_mutation_wrapper_with_correct_noise(monkeypatch):
    # control: the wrapper used by the noise mutations below is itself faithful
    monkeypatch.setattr(GradientEngine, "__call__", _noise_mutant("correct"))
    check_noise(ENGINES["fast"])


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("engine", list(ENGINES))
def test_clipping_and_reference_invariants_hold(engine, model_name):
    # seen: max contribution norm / C <= 1 - 1e-7, 12 of 24 clipped; errors vs loop <= 2.1e-7
    print(check_clipping(ENGINES[engine], _model(model_name)))
    print(check_matches_reference(ENGINES[engine], _model(model_name)))


@pytest.mark.parametrize("model_name", list(MODELS))
def test_fast_and_opacus_agree(model_name):
    # seen: relative difference 1.0e-7 (logit), 5.0e-8 (mlp)
    print(check_engines_agree(FastLinearEngine, OpacusEngine, _model(model_name)))


def test_fast_sq_norms_replacement_is_faithful(monkeypatch):
    # control for mutation 7: the replacement with the bias term kept passes
    monkeypatch.setattr(FastLinearEngine, "per_example_sq_norms", _fast_sq_norms(bias_in_norm=True))
    for name in MODELS:
        check_engines_agree(FastLinearEngine, OpacusEngine, _model(name))
        check_matches_reference(FastLinearEngine, _model(name))


@pytest.mark.parametrize("setting", list(SAMPLERS))
def test_sampler_invariant_holds(setting):
    # seen: mean z -0.65 / -0.70, size chi-square p 0.15 / 0.41, max row |z| 3.78 / 2.99
    # (bounds 5.0 / 4.7), row dispersion 1.00 / 0.95 (p 0.97 / 0.49) for sparse / dense
    n, q = SAMPLERS[setting]
    print(check_sampler(num_rows=n, sample_rate=q))


@pytest.mark.parametrize("run", list(_RUNS))
def test_run_accounting_holds(run, tmp_path):
    # seen: T = 30, q = 1/30, sigma 2.0 / 1.922 (calibrated to 0.5): rdp 0.4663 / 0.4999 and pld
    # 0.3977 / 0.4222 equal to dp-accounting's exactly; measured sigma 2.018 / 1.940 (variance
    # ratio 1.018, p 0.18); sampler mean z -0.18, chi-square p 0.15, dispersion p 0.63
    train, delta = _trainer(run, tmp_path)
    print(check_run_accounting(train, delta=delta))


# ============================================================================ mutations are caught

# 1. no noise (sigma > 0 configured and reported, nothing added)


def test_mutation_no_noise(monkeypatch, tmp_path):
    # seen: variance ratio 0 (p = 0); in a run: measured noise multiplier 0 against 2
    monkeypatch.setattr(GradientEngine, "__call__", _noise_mutant("none"))
    with pytest.raises(AssertionError, match="noise variance"):
        check_noise(ENGINES["fast"])
    train, delta = _trainer("sigma", tmp_path)
    with pytest.raises(AssertionError, match="adds noise of multiplier 0"):
        check_run_accounting(train, delta=delta)


# 2. no clipping (C ignored), or clipping to 2C


@pytest.mark.parametrize("kind", ["ignored", "doubled"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_mutation_clipping(monkeypatch, kind, engine):
    # seen: a contribution of norm 1.53 C; update 25% off the loop reference
    def factors(self, sq):
        if kind == "ignored":
            return torch.ones_like(sq)
        return (2 * self.max_grad_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)

    monkeypatch.setattr(GradientEngine, "clip_factors", factors)
    with pytest.raises(AssertionError, match="norm .* C > C"):
        check_clipping(ENGINES[engine], _model("mlp"))
    with pytest.raises(AssertionError, match="per-example loop reference"):
        check_matches_reference(ENGINES[engine], _model("mlp"))


# 3. wrong sampling


@pytest.mark.parametrize("setting", list(SAMPLERS))
@pytest.mark.parametrize("kind,message", [
    ("rate_1.1x", "mean batch size"),
    ("fixed_size", "not Binomial"),
    ("shuffled_epochs", "not Binomial"),
    ("last_row_never", "some row is included"),
])
def test_mutation_sampler(monkeypatch, setting, kind, message):
    # seen (sparse / dense): 1.1x mean z 35 / 70; fixed size and shuffled epochs chi-square
    # 44180 / 65975 (p = 0); last row never sampled: that row's |z| 7.8 / 35.9 (bounds 5.0 / 4.7)
    n, q = SAMPLERS[setting]
    monkeypatch.setattr(PoissonSampler, "sample", _sampler_mutant(kind))
    with pytest.raises(AssertionError, match=message):
        check_sampler(num_rows=n, sample_rate=q)


def test_mutation_sampler_rate_in_a_training_run(monkeypatch, tmp_path):
    # seen: the run's sampler has mean batch 55.0 against N q = 50 (z = 32)
    monkeypatch.setattr(PoissonSampler, "sample", _sampler_mutant("rate_1.1x"))
    train, delta = _trainer("sigma", tmp_path)
    with pytest.raises(AssertionError, match="mean batch size"):
        check_run_accounting(train, delta=delta)


# 4. scaling by the realised batch size


def test_mutation_realised_batch_size(monkeypatch):
    # seen: noise variance ratio 405 on empty batches (divided by 1); update 25% off (40 rows, B = 50)
    monkeypatch.setattr(GradientEngine, "__call__", _realised_batch_mutant())
    with pytest.raises(AssertionError, match="noise variance"):
        check_noise(ENGINES["fast"])
    with pytest.raises(AssertionError, match="per-example loop reference"):
        check_matches_reference(ENGINES["fast"], _model("mlp"))


def test_realised_batch_size_is_caught_on_nonempty_batches_too(monkeypatch):
    # seen: variance ratio 0.44 = (20 / 30)^2, p = 0
    # the same mutation on batches that are never empty: part (b) of check_noise catches it
    orig, mutant = GradientEngine.__call__, _realised_batch_mutant()

    def call(self, x, y):
        return orig(self, x, y) if x.shape[0] == 0 else mutant(self, x, y)

    monkeypatch.setattr(GradientEngine, "__call__", call)
    with pytest.raises(AssertionError, match="on a batch of 30 rows"):
        check_noise(ENGINES["opacus"])


# 5. the reported epsilon is not that of the mechanism run


@pytest.mark.parametrize("mutant", ["sigma_x2", "sigma_half", "q_half", "every_other_step"])
def test_mutation_accountant(monkeypatch, tmp_path, mutant):
    # seen: reported rdp epsilon 0.181 (sigma x2), 2.04 (sigma / 2), 0.275 (q / 2), 0.379 (15 of
    # 30 steps) against 0.466 of the mechanism run
    kwargs = {"sigma_x2": {"sigma_factor": 2.0}, "sigma_half": {"sigma_factor": 0.5},
              "q_half": {"q_factor": 0.5}, "every_other_step": {"every": 2}}[mutant]
    monkeypatch.setattr(PrivacyLedger, "record", _accountant_step_mutant(**kwargs))
    train, delta = _trainer("sigma", tmp_path)
    with pytest.raises(AssertionError, match="epsilon .* of the mechanism run"):
        check_run_accounting(train, delta=delta)


def test_mutation_engine_built_with_stale_sigma(monkeypatch, tmp_path):
    # seen: reported 0.4999 (calibrated sigma 1.922) against 0.766 of the engine's sigma 1.538
    monkeypatch.setattr(dptrain.privacy.dpsgd.engine, "make_engine", _stale_sigma_make_engine(0.8))
    train, delta = _trainer("calibrated", tmp_path)
    with pytest.raises(AssertionError, match="epsilon .* of the mechanism run"):
        check_run_accounting(train, delta=delta)


# 6. noise of the wrong shape


@pytest.mark.parametrize("kind,message", [
    ("twice", "noise variance"),
    ("split_per_layer", "noise variance"),
    ("bias_forgotten", "noise variance|parameter tensor"),
    ("shared_draw", "different parameter tensors"),
    ("same_every_step", "consecutive steps"),
    ("per_example", "noise variance"),
    ("uniform", "not N"),
])
def test_mutation_noise_shape(monkeypatch, kind, message):
    # seen: variance ratio 1.98 (twice), 0.253 (split), 0.921 (p 8e-34, bias forgotten), 0
    # (per example, empty batch); cross-tensor |z| 56.6 (shared draw); lag-1 z 212 (same
    # every step); KS D 0.060, p 3e-143 (uniform)
    monkeypatch.setattr(GradientEngine, "__call__", _noise_mutant(kind))
    with pytest.raises(AssertionError, match=message):
        check_noise(ENGINES["fast"])


# 7. the fast engine disagrees with Opacus


@pytest.mark.parametrize("model_name", list(MODELS))
def test_mutation_fast_engine_drops_bias_from_norm(monkeypatch, model_name):
    # seen (logit / mlp): engines differ by 0.0096 / 0.029, loop reference by 0.0145 / 0.112,
    # a contribution of norm 1.037 C / 1.133 C
    monkeypatch.setattr(FastLinearEngine, "per_example_sq_norms", _fast_sq_norms(bias_in_norm=False))
    with pytest.raises(AssertionError, match="engines' updates differ"):
        check_engines_agree(FastLinearEngine, OpacusEngine, _model(model_name))
    with pytest.raises(AssertionError, match="per-example loop reference"):
        check_matches_reference(FastLinearEngine, _model(model_name))
    with pytest.raises(AssertionError, match="C > C"):
        check_clipping(FastLinearEngine, _model(model_name))


def test_mutation_fast_engine_underestimates_norms(monkeypatch):
    # seen: engines differ by 0.061
    monkeypatch.setattr(FastLinearEngine, "clip_factors",
                        lambda self, sq: GradientEngine.clip_factors(self, sq / 4))
    with pytest.raises(AssertionError, match="engines' updates differ"):
        check_engines_agree(FastLinearEngine, OpacusEngine, _model("mlp"))
