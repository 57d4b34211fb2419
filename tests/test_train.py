"""The training loop: empty batches count, seeds reproduce, q is the sampler's q."""

from __future__ import annotations

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
from dptrain.data import load_dataset
from dptrain.privacy.accounting import rdp_epsilon
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import validate_against_size
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.fit import LaunchConfig, fit, mechanism_for


def _setup(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "experiment=logit", "data=synthetic", "data.n_rows=2000", "trainer.progress=false",
            "trainer.baseline=false", *overrides]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    return cfg, data, validate_against_size(cfg, data.n_train)


def _fit(cfg, data, delta, tmp_path, *, randomness=None, on_engine=None):
    plan = training_plan(cfg)
    return fit(plan, data, mechanism=mechanism_for(plan, dataset_size=data.n_train, delta=delta),
               tracker=Tracker(tmp_path, tensorboard=False), launch=LaunchConfig(randomness=randomness),
               on_engine=on_engine)


def test_empty_batches_are_counted_steps(tmp_path):
    # N = 1500, B = 1 -> q = 1/1500: most Poisson batches are empty, each is still a step (the
    # gradient mechanism alone: tests/test_dp_curves.py counts the dp/ curve's steps)
    cfg, data, delta = _setup(["trainer.batch_size=1", "trainer.epochs=0.2", "privacy.noise_multiplier=5",
                               "trainer.dp_curves=false"])
    res = _fit(cfg, data, delta, tmp_path)
    steps = round(0.2 * data.n_train)
    assert res.privacy["steps"] == steps == res.accountant.steps == res.metrics["train/steps"]
    assert res.privacy["sample_rate"] == 1 / data.n_train
    assert res.accountant.history == ((5.0, 1 / data.n_train, steps),)
    eps = res.accountant.get_epsilon(delta=delta, accountant="rdp")
    assert eps == rdp_epsilon(sample_rate=1 / data.n_train, noise_multiplier=5.0, steps=steps, delta=delta)


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_seed_fixes_the_initialisation_not_the_noise(tmp_path):
    """`seed` reproduces the initial weights (and the split); the DP noise and the sampler are
    secret: two runs with the same seed end with different models. With the same secret seed
    file (opt-in) and the same settings they are identical; another seed changes the start."""
    from dptrain.privacy.randomness import Randomness, new_seed_file

    key = new_seed_file(tmp_path / "secret.key")
    inits, finals, keyed = [], [], []
    for seed in (0, 0, 1):
        cfg, data, delta = _setup([f"seed={seed}", "trainer.epochs=1", "trainer.batch_size=100"])
        res = _fit(cfg, data, delta, tmp_path, on_engine=lambda e: inits.append(_params(e.model).clone()))
        finals.append(_params(res.model))
        res = _fit(cfg, data, delta, tmp_path, randomness=Randomness.from_seed_file(key, run_label="same settings"))
        keyed.append(_params(res.model))
    assert torch.equal(inits[0], inits[1]) and not torch.equal(inits[0], inits[2])
    assert not torch.allclose(finals[0], finals[1])  # same seed, fresh noise
    assert torch.equal(keyed[0], keyed[1]) and not torch.allclose(keyed[0], keyed[2])


def test_noise_changes_the_model_and_privacy_off_has_no_accountant(tmp_path):
    cfg, data, delta = _setup(["trainer.epochs=5", "trainer.batch_size=100", "privacy=none", "optim.lr=2"])
    res = _fit(cfg, data, delta, tmp_path)
    assert res.privacy["enabled"] is False and res.accountant.steps == 0
    assert res.privacy["engine"] == "nonprivate"
    assert res.metrics["test/acc"] > 0.7  # the synthetic logistic model is learnable


def test_mlp_preset_trains_on_the_buffered_fast_path(tmp_path):
    """`experiment=mlp` picks the fast engine's autograd-free path (no per-example gradients)
    and its time/train_seconds is the time spent in those steps."""
    from dptrain.privacy.dpsgd.engine import FastLinearEngine

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "experiment=mlp", "data=synthetic", "data.n_rows=3000", "trainer.progress=false",
            "trainer.baseline=false", "trainer.epochs=2", "trainer.batch_size=100"]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    delta = validate_against_size(cfg, data.n_train)
    seen = []
    res = _fit(cfg, data, delta, tmp_path, on_engine=seen.append)
    (engine,) = seen
    assert type(engine) is FastLinearEngine and engine.fused and engine.plan is not None
    assert engine._ws is not None and engine._ws.capacity >= 100  # the workspace was used
    assert res.privacy["engine"] == "fast"
    assert 0 < res.metrics["time/train_seconds"] <= res.metrics["time/loop_seconds"]
    assert res.metrics["train/steps"] == res.privacy["steps"] > 0
