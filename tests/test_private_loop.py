"""Your own PyTorch model and loop with dptrain's DP-SGD (dptrain.training.private, a make_private-style
wrapper): Poisson batches, the engine's clipped noisy gradient, the accountant, the report; models
that mix examples and batches that were not Poisson-sampled are refused."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dptrain.core.errors import DPTrainError
from dptrain.privacy.accounting import compute_epsilon
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.model_check import ModelCheckError
from dptrain.privacy.randomness import Randomness, new_seed_file
from dptrain.training.private import DPConfig, PrivateTraining, make_private


def _data(n: int = 2000, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, d)).astype(np.float32)
    w = rng.normal(0, 2, size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ w))).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def _net(d: int = 8, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, 1), Squeeze())


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_own_model_and_loop_epsilon_is_the_accountants(tmp_path):
    x, y = _data()
    model = _net()
    start = _params(model).clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    dp = make_private(model, opt, x, y, noise_multiplier=1.3, max_grad_norm=1.0, batch_size=100, epochs=0.5,
                      delta=1e-5)
    q, steps = 100 / 2000, round(0.5 / (100 / 2000))
    assert dp.steps == len(dp) == steps and dp.mechanism.sample_rate == q
    sizes = []
    for xb, yb in dp.batches():  # the user's loop: anything around the step is theirs
        sizes.append(xb.shape[0])
        stats = dp.step(xb, yb)
        assert stats.batch_size == xb.shape[0]
    assert dp.steps_done == steps and len(sizes) == steps and len(set(sizes)) > 1  # Poisson: sizes vary
    assert not torch.equal(_params(model), start)
    eps = dp.epsilon()
    assert eps == compute_epsilon(accountant="rdp", sample_rate=q, noise_multiplier=1.3, steps=steps, delta=1e-5)
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.3)), steps)
    assert eps == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)
    report = dp.report()
    assert report["epsilon"] == eps and report["private"] and report["sampling"] == "poisson"
    assert report["steps"] == steps and report["noise_multiplier"] == 1.3 and report["dataset_size"] == 2000
    assert report["epsilons"]["pld"] < eps and "operating system's CSPRNG" in report["randomness"]
    assert dp.engine.name == "fast"  # Linear + Tanh: the book-keeping engine


def test_target_epsilon_is_calibrated_and_met():
    x, y = _data()
    model = _net()
    dp = PrivateTraining(model, torch.optim.SGD(model.parameters(), lr=0.5), x, y,
                         config=DPConfig(target_epsilon=2.0, batch_size=200, epochs=1.0), delta=1e-5)
    for xb, yb in dp:
        dp.step(xb, yb)
    assert dp.mechanism.noise_multiplier_source == "calibrated"
    assert 2.0 * (1 - 5e-3) <= dp.epsilon() <= 2.0


def test_batch_norm_is_refused():
    x, y = _data()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1), Squeeze())
    with pytest.raises(ModelCheckError, match="BatchNorm1d"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, noise_multiplier=1.0,
                     batch_size=100, epochs=1)


def test_only_the_yielded_poisson_batch_can_be_stepped():
    x, y = _data()
    model = _net()
    dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, noise_multiplier=1.0,
                      batch_size=100, epochs=1)
    with pytest.raises(DPTrainError, match="batches"):
        dp.step(x[:100], y[:100])  # not a Poisson batch
    it = dp.batches()
    xb, yb = next(it)
    with pytest.raises(DPTrainError, match="unchanged"):
        dp.step(xb.clone(), yb)
    with pytest.raises(DPTrainError, match="not passed to step"):
        next(it)  # the yielded batch was skipped
    assert dp.steps_done == 0


@pytest.mark.parametrize("settings,needle", [
    ({"noise_multipler": 1.0, "batch_size": 100}, "did you mean 'noise_multiplier'"),
    ({"batch_size": 100}, "set exactly one"),
    ({"noise_multiplier": 1.0, "target_epsilon": 1.0, "batch_size": 100}, "set exactly one"),
    ({"noise_multiplier": 1.0, "batch_size": 5000}, "batch_size=5000"),
    ({"noise_multiplier": 1.0, "batch_size": 100, "delta": 0.01}, "delta=0.01"),
    ({"noise_multiplier": 1.0, "batch_size": 100, "max_grad_norm": 0}, "max_grad_norm=0"),
    ({"noise_multiplier": 1.0, "batch_size": 100, "engine": "magic"}, "engine='magic'"),
])
def test_bad_settings_are_refused_by_name(settings, needle):
    x, y = _data()
    model = _net()
    with pytest.raises(DPTrainError) as err:
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, **settings)
    assert needle in str(err.value)


def test_custom_per_example_loss_equals_the_builtin_objective(tmp_path):
    """A callable loss (autograd for its output gradient) gives the same training as the built-in
    binary objective (closed form) on the same secret streams (an opt-in seed file); a loss that
    is reduced over the batch is refused before training: it cannot be clipped per example."""
    x, y = _data()
    key = new_seed_file(tmp_path / "noise.key")
    finals = []
    for loss in (None, lambda out, t: F.binary_cross_entropy_with_logits(out, t, reduction="none")):
        model = _net()
        dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), x, y, loss=loss,
                          randomness=Randomness.from_seed_file(key, run_label="same"), noise_multiplier=1.0,
                          batch_size=100, epochs=0.5)
        for xb, yb in dp.batches():
            dp.step(xb, yb)
        finals.append(_params(model))
    assert torch.allclose(finals[0], finals[1], atol=1e-5)
    model = _net()
    mean_loss = lambda out, t: F.binary_cross_entropy_with_logits(out, t)  # noqa: E731
    with pytest.raises(ModelCheckError, match="not one value per example"):  # refused before training
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), x, y, loss=mean_loss,
                     noise_multiplier=1.0, batch_size=100, epochs=0.5)


def test_a_model_opacus_runs_trains_too():
    """A model outside the fast engine's reach (a residual block) runs on the Opacus engine."""

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)) + x).squeeze(-1)

    x, y = _data()
    torch.manual_seed(0)
    model = Residual()
    dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), x, y, noise_multiplier=1.0,
                      batch_size=200, epochs=0.5)
    for xb, yb in dp.batches():
        dp.step(xb, yb)
    assert dp.engine.name == "opacus" and dp.steps_done == 5
