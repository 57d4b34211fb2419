"""Extension points: a toy objective and a toy accountant, defined in this file, registered,
picked from the command line and run end to end (docs/extending.md). A plugin module given with
``plugins=[...]`` registers them for a real ``python -m dptrain`` process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dp_accounting
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore

from dptrain.core.dataspec import DataSpec
from dptrain.models.networks import logit
from dptrain.models.objectives import OBJECTIVES
from dptrain.privacy.accounting import ACCOUNTANTS, calibrate_noise_multiplier
from dptrain.privacy.dpsgd.engine import FastLinearEngine
from dptrain.privacy.events import EVENT_KINDS, poisson_gaussian
from dptrain.tasks import cli

REPO = Path(__file__).resolve().parents[1]
SMALL = ["experiment=logit", "estimator.interval_share=0",
         "data=synthetic", "data.n_rows=2000", "trainer.epochs=1", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false"]


class LinearProbability:
    """Toy objective: squared error of a linear prediction of the 0/1 label."""

    name = "linear_probability"
    primary_metric = "acc"
    metric_names = ("mse", "acc")

    def __init__(self, settings=None) -> None:
        self.settings = settings

    def output_width(self, spec: DataSpec) -> int:
        return 1

    def check_data(self, spec: DataSpec) -> None:
        assert spec.target_kind == "binary"

    def per_example_loss(self, outputs, y):
        return 0.5 * (outputs - y).square()

    def curve_loss_bound(self, spec: DataSpec) -> float:  # L of the dp/ curve (optional: docs/extending.md)
        return 0.5

    def output_gradient(self, outputs, y, out=None):
        return torch.sub(outputs, y, out=out) if out is not None else outputs - y

    def correct(self, outputs, y) -> int:
        return int(((outputs > 0.5).to(y.dtype) == y).sum())

    @torch.no_grad()
    def metrics(self, outputs, y) -> dict[str, float]:
        return {"mse": float((outputs - y).square().mean()),
                "acc": float(((outputs > 0.5).float() == y).float().mean())}

    def baseline(self, data, *, seed: int, fit: bool = True) -> dict[str, float]:
        return {"majority_acc": float(max(data.y_test.mean(), 1 - data.y_test.mean()))}


class CoarseRdp:
    """Toy accountant: RDP at the integer orders 2..64 only (looser than the shipped one)."""

    name = "coarse_rdp"
    note = "RDP at integer orders 2..64 (a toy for the tests)"

    def epsilon(self, history, delta: float) -> float:
        acc = dp_accounting.rdp.RdpAccountant(list(range(2, 65)))
        for event, count in history:
            acc.compose(EVENT_KINDS.get(event.kind).dp_event(event.params), count)
        return float(acc.get_epsilon(delta))


@pytest.fixture
def toys():
    OBJECTIVES.register("linear_probability", LinearProbability)
    ACCOUNTANTS.register("coarse_rdp", CoarseRdp())
    ConfigStore.instance().store(group="objective", name="linear_probability", node={"name": "linear_probability"})
    yield
    OBJECTIVES.unregister("linear_probability")
    ACCOUNTANTS.unregister("coarse_rdp")


def _compose(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_toy_objective_is_picked_from_the_command_line_and_trains_end_to_end(toys, tmp_path):
    cli.run(_compose([*SMALL, "objective=linear_probability", "optim.lr=0.5"]), run_dir=tmp_path)
    metrics = json.loads((tmp_path / "private" / "metrics.json").read_text())
    assert set(k for k in metrics if k.startswith("test/")) == {"test/mse", "test/acc"}
    assert metrics["test/acc"] > metrics["baseline/majority_acc"]  # it learns the synthetic labels
    assert json.loads((tmp_path / "privacy.json").read_text())["engine"] == "fast"


def test_toy_objective_drives_the_fast_engine(toys):
    """The engine's closed form takes the objective's output gradient: with sigma = 0 its
    clipped sum equals a per-example loop over the toy loss."""
    torch.manual_seed(0)
    model, objective = logit(in_features=5), LinearProbability()
    x, y = torch.randn(30, 5), (torch.rand(30) < 0.5).float()
    eng = FastLinearEngine(model, max_grad_norm=0.5, noise_multiplier=0.0, expected_batch_size=1.0,
                           generator=torch.Generator(), objective=objective)
    eng(x, y)
    got = torch.cat([p.grad.flatten() for p in model.parameters()])
    want = torch.zeros_like(got)
    for i in range(30):
        g = torch.autograd.grad(objective.per_example_loss(model(x[i:i + 1]), y[i:i + 1]).sum(),
                                list(model.parameters()))
        g = torch.cat([t.flatten() for t in g])
        want += g * min(1.0, 0.5 / (float(g.norm()) + 1e-6))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_toy_accountant_is_picked_from_the_command_line_and_calibrates(toys, tmp_path):
    cli.run(_compose([*SMALL, "privacy.accountant=coarse_rdp", "privacy.noise_multiplier=null",
                      "privacy.target_epsilon=2"]), run_dir=tmp_path)
    report = json.loads((tmp_path / "privacy.json").read_text())
    assert report["accountant"] == "coarse_rdp" and set(report["epsilons"]) == {"rdp", "pld", "coarse_rdp"}
    q, sigma, steps = report["sample_rate"], report["noise_multiplier"], report["steps"]
    # the steps, K of which also released the dp/ curve (one Gaussian of noise multiplier
    # (sigma^-2 + sigma_c^-2)^(-1/2) on their batch: docs/privacy.md, "DP curves")
    k, sigma_c = report["dp_curves"]["releases"], report["dp_curves"]["noise_multiplier"]
    history = ((poisson_gaussian(sample_rate=q, noise_multiplier=sigma), steps - k),
               (poisson_gaussian(sample_rate=q, noise_multiplier=(sigma**-2 + sigma_c**-2) ** -0.5), k))
    assert k > 0 and report["epsilon"] == pytest.approx(CoarseRdp().epsilon(history, report["delta"]), rel=1e-12)
    assert report["epsilon"] <= 2.0 and "toy" in report["accountant_notes"]["coarse_rdp"]
    # calibration used the toy (the gradients' share of the target, 0.95 x 2): the shipped RDP
    # would have needed less noise
    assert sigma > calibrate_noise_multiplier(target_epsilon=2.0 * 0.95, sample_rate=q, steps=steps,
                                              delta=report["delta"])


def test_unknown_names_are_refused_with_the_registered_ones(tmp_path, capsys):
    for override, needle in (("privacy.accountant=moments", "privacy.accountant='moments'"),
                             ("trainer.engine=turbo", "trainer.engine='turbo'"),
                             ("objective.name=ranking", "objective.name='ranking'")):
        with pytest.raises(SystemExit):
            cli.run(_compose([*SMALL, override]), run_dir=tmp_path / "x")
        err = capsys.readouterr().err
        assert needle in err and "must be one of" in err
    assert not (tmp_path / "x" / "privacy.json").exists()


PLUGIN = textwrap.dedent('''
    """A user's plugin module: registers a toy accountant and a toy objective."""
    import math
    from dptrain.models.objectives import OBJECTIVES, BinaryLogistic
    from dptrain.privacy.accounting import ACCOUNTANTS, RdpAccountant


    class LooseRdp(RdpAccountant):
        name = "loose_rdp"
        note = "twice the shipped RDP epsilon (a plugin toy)"

        def epsilon(self, history, delta):
            return 2 * super().epsilon(history, delta)


    class Renamed(BinaryLogistic):
        name = "binary_again"


    ACCOUNTANTS.register("loose_rdp", LooseRdp())
    OBJECTIVES.register("binary_again", Renamed)
''')


def test_plugins_setting_registers_extensions_for_a_real_process(tmp_path):
    (tmp_path / "my_dp_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "dptrain", *SMALL, "plugins=[my_dp_plugin]",
                          "privacy.accountant=loose_rdp", "objective.name=binary_again",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["accountant"] == "loose_rdp"
    assert report["epsilon"] == pytest.approx(2 * report["epsilons"]["rdp"], rel=1e-12)
    assert math.isfinite(report["epsilon"])
