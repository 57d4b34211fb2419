"""Models that mix examples or keep data-updated state are refused, by name, on every engine,
before any private row is read; the noise is drawn in the model's precision; a run without
noise does not claim privacy."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_module
from torch import nn

from dptrain.models.networks import Squeeze, logit, mlp
from dptrain.models.objectives import BINARY
from dptrain.privacy.dpsgd.engine import (
    FastLinearEngine,
    NonPrivateEngine,
    OpacusEngine,
    make_engine,
)
from dptrain.privacy.dpsgd.model_check import ModelCheckError, check_model
from dptrain.tasks import cli

per_example_loss = BINARY.per_example_loss  # binary cross-entropy with logits, one per example


class Center(nn.Module):
    """Mixes the batch without holding any buffer: x - mean over the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


class Scaled(nn.Module):
    """A custom module with a (constant-looking) buffer."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def bn_model(**bn) -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4, **bn), nn.ReLU(), nn.Linear(4, 1), Squeeze())


def test_batchnorm_lets_one_example_move_the_clipped_sum_by_more_than_C():
    """The finding, reproduced on per-example gradients computed outside the engines: with
    BatchNorm1d(affine=False) (no buffers, no parameters) removing one example changes the sum of
    the OTHER examples' clipped gradients, so the clipped sum moves by more than C."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4, affine=False, track_running_stats=False),
                          nn.Linear(4, 1), Squeeze())
    x = torch.randn(32, 6)
    x[0] *= 40  # the target: an outlier, which moves the batch statistics
    y = (torch.rand(32) < 0.5).float()
    params = list(model.parameters())
    C = 0.1

    def clipped_sum(xb, yb):
        losses = per_example_loss(model(xb), yb)
        total = [torch.zeros_like(p) for p in params]
        for i in range(len(yb)):
            g = torch.autograd.grad(losses[i], params, retain_graph=True)
            nrm = torch.sqrt(sum(t.pow(2).sum() for t in g))
            for acc, t in zip(total, g):
                acc += t * min(1.0, C / (float(nrm) + 1e-6))
        return torch.cat([t.flatten() for t in total])

    moved = float((clipped_sum(x, y) - clipped_sum(x[1:], y[1:])).norm())
    assert moved > 2 * C  # the sensitivity the accountant assumes (C) does not hold


@pytest.mark.parametrize("model, needle", [
    (bn_model(affine=False, track_running_stats=False), "BatchNorm1d normalises each example"),
    (bn_model(), "BatchNorm1d normalises each example"),
    (nn.Sequential(nn.Linear(6, 4), nn.InstanceNorm1d(4, track_running_stats=True), nn.Linear(4, 1), Squeeze()),
     "track_running_stats"),
    (nn.Sequential(nn.Linear(6, 4), Scaled(4), nn.Linear(4, 1), Squeeze()), "holds buffers (scale)"),
    (nn.Sequential(nn.Linear(6, 4), Center(), nn.Linear(4, 1), Squeeze()), "changed the outputs of the OTHER"),
])
def test_models_that_mix_examples_or_keep_state_are_refused_by_name(model, needle):
    with pytest.raises(ModelCheckError) as err:
        check_model(model, in_features=6)
    text = str(err.value)
    assert needle in text and "LayerNorm" in text and "GroupNorm" in text


@pytest.mark.parametrize("model", [
    mlp(in_features=6), logit(in_features=6),
    nn.Sequential(nn.Linear(6, 4), nn.LayerNorm(4), nn.Dropout(0.3), nn.Linear(4, 1), Squeeze()),
    nn.Sequential(nn.Linear(6, 4), nn.GroupNorm(2, 4), nn.Tanh(), nn.Linear(4, 1), Squeeze()),
])
def test_per_example_models_pass(model):
    check_model(model, in_features=6)


@pytest.mark.parametrize("engine", ["auto", "fast", "opacus"])
def test_every_private_engine_refuses_batchnorm(engine):
    for model in (bn_model(), bn_model(affine=False, track_running_stats=False)):
        with pytest.raises(ModelCheckError, match="BatchNorm1d"):
            make_engine(model, engine=engine, max_grad_norm=1.0, noise_multiplier=1.0,
                        expected_batch_size=8, generator=torch.Generator(), objective=BINARY)
    for cls in (FastLinearEngine, OpacusEngine):
        with pytest.raises(ModelCheckError):
            cls(bn_model(), max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=8, generator=torch.Generator())
    # a non-private run claims nothing and may use it
    NonPrivateEngine(bn_model(), expected_batch_size=8, generator=torch.Generator(), objective=BINARY)


def _compose(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_cli_refuses_a_batchnorm_model_before_reading_data(tmp_path, capsys):
    """A user model with BatchNorm (model._target_=...) is refused with the reason and what to
    use instead, before the (here: missing) data file is opened; nothing is written."""
    overrides = ["experiment=logit", "data=table", f"data.path={tmp_path / 'absent.csv'}", "data.target=y",
                 "++data.numeric={a: {lower: 0, upper: 1}, b: {lower: 0, upper: 1}}",
                 "model._target_=test_model_check.user_model_with_batchnorm"]
    with pytest.raises(SystemExit) as exc:
        cli.run(_compose(overrides), run_dir=tmp_path / "run")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "BatchNorm1d" in err and "LayerNorm" in err and "absent.csv" not in err
    assert not (tmp_path / "run" / "privacy.json").exists()


def user_model_with_batchnorm(*, in_features: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, 8), nn.BatchNorm1d(8, affine=False), nn.ReLU(),
                         nn.Linear(8, 1), Squeeze())


# ------------------------------------------------------------------------------ noise precision


def test_noise_is_drawn_in_the_models_precision():
    """Found in review: the dp_sgd baseline (a float64 model) got float32 noise, which leaves the
    low-order bits of the float64 sum unprotected. The noise now has the parameters' dtype."""
    torch.manual_seed(0)
    model = logit(in_features=5).double()
    eng = FastLinearEngine(model, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0,
                           generator=torch.Generator().manual_seed(1), objective=BINARY)
    assert eng.noise_dtype == torch.float64
    eng(torch.zeros(0, 5, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))  # pure noise
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert g.dtype == torch.float64
    # float32 values widened to float64 have 29 zero low-order mantissa bits: these do not
    assert not torch.equal(g, g.float().double())
    assert FastLinearEngine(logit(in_features=5), max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=1.0,
                            generator=torch.Generator(), objective=BINARY).noise_dtype == torch.float32


# ------------------------------------------------------------------------------ sigma = 0


def test_a_run_without_noise_does_not_claim_privacy(tmp_path):
    """Found in review: privacy.noise_multiplier=0 reported private: true and an "(inf, delta)-DP"
    guarantee. It is now reported as not private."""
    cli.run(_compose(["experiment=logit", "data=synthetic", "data.n_rows=1000", "trainer.epochs=1",
                      "trainer.batch_size=100", "trainer.progress=false", "trainer.baseline=false",
                      "privacy.noise_multiplier=0"]), run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    assert report["private"] is False and report["guarantee"].startswith("none")
    assert report["epsilon"] == "inf" and "-DP" not in report["guarantee"]
    text = (tmp_path / "privacy.txt").read_text()
    assert "NOT differentially private" in text and "inf, " not in text
