"""ONE DP-SGD step (dptrain.privacy.dpsgd.loop.PrivateStep) for the three private loops: the training
loop (dptrain.training.fit), make_private (dptrain.training.private) and the dp_sgd release
(dptrain.release.methods.dp_sgd). None of them steps the optimiser, runs the engine, draws a batch or
records an event itself; the step gives the numbers the hand-written loops gave, bit for bit."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from torch import nn

import dptrain.release.methods.dp_sgd as dp_sgd
import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
import dptrain.training.fit as fit_mod
import dptrain.training.private as private_mod
from dptrain.data import load_dataset
from dptrain.models.objectives import build_objective
from dptrain.models.optimizers import eager_class
from dptrain.privacy.accounting import PrivacyLedger
from dptrain.privacy.dpsgd.engine import StepStats, make_engine
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.loop import PrivateStep
from dptrain.privacy.dpsgd.sampling import PoissonSampler
from dptrain.privacy.events import poisson_gaussian
from dptrain.privacy.randomness import Randomness, new_seed_file, seeded_mt19937
from dptrain.release.methods.common import BOX_A, BOX_B
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import validate_against_size
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.private import make_private

REPO = Path(__file__).resolve().parents[1]
EVENT = poisson_gaussian(sample_rate=0.1, noise_multiplier=1.0)


# ------------------------------------------------------------------------------ (a) the callers


def _calls(tree: ast.AST) -> list[str]:
    """Every call in ``tree`` as dotted text (``self.optimizer.step``, ``engine``, ...)."""
    return [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]


@pytest.mark.parametrize("module", [fit_mod, private_mod, dp_sgd], ids=lambda m: m.__name__)
def test_each_caller_uses_the_one_step_and_does_no_step_of_its_own(module):
    """The callers construct PrivateStep; no code of theirs (docstrings aside) steps an optimiser,
    records an event, runs the engine on a batch or draws one from the sampler."""
    source = Path(module.__file__).read_text(encoding="utf-8")
    calls = _calls(ast.parse(source))
    assert "PrivateStep" in calls
    own = [c for c in calls if c.endswith(("optimizer.step", "opt.step", ".record", "sampler.sample",
                                           "sampler.draw", "batch_step"))
           or c in ("engine", "run.engine", "self.engine")]
    assert own == [], own
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "dptrain.privacy.dpsgd.loop" and [a.name for a in n.names] == ["PrivateStep"]
               for n in imports)


def test_the_loops_call_the_step_where_they_step():
    """fit's per-step loop, PrivateTraining's batches()/step() and the release's cell loop call it."""
    assert "private_step" in _calls(ast.parse(inspect.getsource(fit_mod._steps)))
    assert "PrivateStep" in _calls(ast.parse(inspect.getsource(fit_mod._loop)))
    klass = ast.parse(inspect.getsource(private_mod.PrivateTraining))
    assert {"PrivateStep", "self.private_step.draw", "self.private_step.apply"} <= set(_calls(klass))
    cell = _calls(ast.parse(inspect.getsource(dp_sgd._sgd_cell)))
    assert "PrivateStep" in cell and "private_step" in cell


def test_the_step_lives_in_the_privacy_layer_and_says_what_it_is():
    src = (REPO / "dptrain/privacy/dpsgd/loop.py").read_text(encoding="utf-8")
    imported = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    assert all(m == "__future__" or m.startswith(("dptrain.privacy", "dptrain.core", "collections", "typing",
                                                   "torch")) for m in imported), imported
    doc = PrivateStep.__doc__
    assert "THE DP-SGD step of dptrain" in doc
    module_doc = inspect.getmodule(PrivateStep).__doc__
    for caller in ("dptrain.training.fit", "dptrain.training.private", "dptrain.release.methods.dp_sgd"):
        assert caller in module_doc


# ------------------------------------------------------------------------------ (b) the step itself


class _Counting:
    """An optimiser / accountant stand-in counting its calls."""

    def __init__(self) -> None:
        self.calls: list = []

    def step(self) -> None:
        self.calls.append("step")

    def record(self, event) -> None:
        self.calls.append(event)


def _linear(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 1), Squeeze()).double()
    x = torch.randn(200, 4, dtype=torch.float64)
    y = (torch.rand(200) > 0.5).double()
    return model, x, y


def _engine(model: nn.Module, seed: int):
    return make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=20,
                       objective=build_objective("binary"), generator=torch.Generator().manual_seed(seed))


def test_one_event_and_one_optimiser_step_per_step():
    """Fake engine, sampler, optimiser and accountant: each step draws one batch, runs the engine
    once on exactly those rows, steps the optimiser once and records its event once, in this order."""
    order: list = []

    class Sampler:
        def sample(self):
            order.append("sample")
            return torch.tensor([1, 3])

    def engine(xb, yb):
        order.append(("engine", xb.tolist(), yb.tolist()))
        return StepStats(int(xb.shape[0]), 0.0, 0, 0)

    class Opt:
        def step(self):
            order.append("opt")

    class Acc:
        def record(self, event):
            order.append(("record", event))

    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5.0)
    step = PrivateStep(engine, Sampler(), Opt(), x, y, accountant=Acc())
    stats = step(EVENT)
    assert stats.batch_size == 2
    assert order == ["sample", ("engine", [[2.0, 3.0], [6.0, 7.0]], [1.0, 3.0]), "opt", ("record", EVENT)]
    order.clear()
    xb, yb = step.draw()
    step.apply(xb, yb, None)  # no event: nothing recorded
    assert order == ["sample", ("engine", [[2.0, 3.0], [6.0, 7.0]], [1.0, 3.0]), "opt"]
    order.clear()
    PrivateStep(engine, Sampler(), Opt(), x, y, accountant=None)(EVENT)  # no accountant: nothing recorded
    assert "opt" in order and not any(isinstance(o, tuple) and o[0] == "record" for o in order)


def test_a_batch_step_replaces_the_draw_and_the_engine():
    calls: list = []
    stats = StepStats(7, 0.0, 0, 0)
    opt, acc = _Counting(), _Counting()
    step = PrivateStep(None, None, opt, None, None, accountant=acc,
                       batch_step=lambda: calls.append("batch") or stats)
    for _ in range(3):
        assert step(EVENT) is stats
    assert calls == ["batch"] * 3 and opt.calls == ["step"] * 3 and acc.calls == [EVENT] * 3


def test_draw_then_apply_equals_call_and_the_hand_written_loop_bit_for_bit():
    """The same seeded sampler and noise generator: draw() + apply(), __call__ and the loop the
    callers wrote by hand before (sample, engine on x[idx], optimizer.step(), record) leave the
    same parameters and the same accountant, bit for bit."""
    finals, histories = [], []
    for way in ("draw+apply", "call", "by hand"):
        model, x, y = _linear()
        engine = _engine(model, seed=11)
        sampler = PoissonSampler(num_rows=200, sample_rate=0.1, rng=np.random.default_rng(3))
        opt = torch.optim.SGD(model.parameters(), lr=0.3)
        acc = PrivacyLedger()
        step = PrivateStep(engine, sampler, opt, x, y, accountant=acc)
        for _ in range(12):
            if way == "draw+apply":
                step.apply(*step.draw(), EVENT)
            elif way == "call":
                step(EVENT)
            else:
                idx = sampler.sample()
                engine(x[idx], y[idx])
                opt.step()
                acc.record(EVENT)
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        histories.append(acc.state_dict())
    assert torch.equal(finals[0], finals[1]) and torch.equal(finals[0], finals[2])
    assert histories[0] == histories[1] == histories[2] and acc.steps == 12


# ------------------------------------------------------------------------------ (c) the callers' numbers


def _data(n: int = 1000, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, d)).astype(np.float32)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ rng.normal(0, 2, size=d)))).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1), Squeeze())


def test_make_private_trains_as_the_step_driven_by_hand(tmp_path):
    """make_private's batches()/step() (draw + apply), its PrivateStep called whole, and the
    hand-written loop on its engine and sampler: the same secret streams (one seed file) give the
    same model and the same accountant, bit for bit."""
    x, y = _data()
    key = new_seed_file(tmp_path / "noise.key")
    finals, epsilons = [], []
    for way in ("batches", "call", "by hand"):
        model = _net()
        dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), x, y, noise_multiplier=1.1,
                          batch_size=50, epochs=1.0, randomness=Randomness.from_seed_file(key, run_label="one-loop"))
        if way == "batches":
            sizes = [dp.step(xb, yb).batch_size for xb, yb in dp.batches()]
            assert len(sizes) == dp.steps and len(set(sizes)) > 1
        elif way == "call":
            assert dp.private_step.engine is dp.engine and dp.private_step.sampler is dp.sampler
            assert dp.private_step.accountant is dp.accountant and dp.private_step.optimizer is dp.optimizer
            for _ in range(dp.steps):
                dp.private_step(dp.mechanism.event)
        else:
            for _ in range(dp.steps):
                idx = dp.sampler.sample()
                dp.engine(dp.x.index_select(0, idx), dp.y.index_select(0, idx))
                dp.optimizer.step()
                dp.accountant.record(dp.mechanism.event)
        assert dp.steps_done == dp.steps == 20
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        epsilons.append(dp.epsilon())
    assert torch.equal(finals[0], finals[1]) and torch.equal(finals[0], finals[2])
    assert epsilons[0] == epsilons[1] == epsilons[2]


def _old_sgd_cell(u, t, *, sigma, batch, rng, config):
    """The release's cell loop as it was written by hand before PrivateStep."""
    steps = config.steps
    noise_rng, sample_rng = rng.spawn(2)
    gen = seeded_mt19937(noise_rng.integers(0, 2**32, size=624, dtype=np.uint64).astype(np.uint32))
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.fill_(0.5)
    engine = dp_sgd.SquaredLossLinearEngine(model, max_grad_norm=config.max_grad_norm, noise_multiplier=sigma,
                                            expected_batch_size=batch, generator=gen)
    sampler = PoissonSampler(num_rows=u.size, sample_rate=config.sample_rate, rng=sample_rng)
    opt = eager_class(torch.optim.SGD)(model.parameters(), lr=config.lr)
    xs, ys = torch.from_numpy(u).reshape(-1, 1), torch.from_numpy(t)
    acc = np.zeros(2)
    for it in range(steps):
        idx = sampler.sample()
        engine(xs[idx], ys[idx])
        opt.step()
        with torch.no_grad():
            model.bias.clamp_(*BOX_A)
            model.weight.clamp_(*BOX_B)
        if it >= steps // 2:
            acc += (model.bias.detach().item(), model.weight.detach().item())
    return tuple(acc / (steps - steps // 2))


@pytest.mark.parametrize("n", [3, 40, 500])
def test_the_release_cell_is_the_hand_written_loop_bit_for_bit(n):
    rng = np.random.default_rng(n)
    u = rng.uniform(0, 1, n) - 0.5
    t = np.clip(0.3 + 0.5 * u + rng.normal(0, 0.1, n), 0, 1)
    cfg = dp_sgd.DPSGDConfig(steps=30)
    new = dp_sgd._sgd_cell(u, t, sigma=1.3, batch=0.2 * n, rng=np.random.default_rng(9), config=cfg)
    old = _old_sgd_cell(u, t, sigma=1.3, batch=0.2 * n, rng=np.random.default_rng(9), config=cfg)
    assert new == old


def _fit_setup(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "data=synthetic", "data.n_rows=800", "trainer.progress=false", "trainer.baseline=false",
            "trainer.device=cpu", "experiment=logit", "trainer.epochs=1", "trainer.batch_size=80",
            "trainer.log_every=4", "trainer.eval_every=100", *overrides]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    return cfg, data, validate_against_size(cfg, data.n_train)


@pytest.mark.parametrize("private", [True, False])
def test_fit_takes_each_step_through_the_one_step(tmp_path, monkeypatch, private):
    """fit() calls PrivateStep once per step with the step's event (the dp/ curve's on the curve's
    steps), or None without privacy (nothing recorded then)."""
    seen: list = []

    class Recording(PrivateStep):
        def __call__(self, event):
            seen.append((event, self.batch_step is not None))
            return super().__call__(event)

    monkeypatch.setattr(fit_mod, "PrivateStep", Recording)
    cfg, data, delta = _fit_setup([] if private else ["privacy.enabled=false"])
    mech = fit_mod.mechanism_for(training_plan(cfg), dataset_size=data.n_train, delta=delta)
    result = fit_mod.fit(training_plan(cfg), data, mechanism=mech, tracker=Tracker(tmp_path, tensorboard=False))
    steps = result.metrics["train/steps"]
    assert len(seen) == steps == mech.planned_steps > 0 and all(has_batch_step for _, has_batch_step in seen)
    if private:
        assert [e for e, _ in seen] == [mech.event_at(s, last=steps) for s in range(1, steps + 1)]
        assert result.accountant.steps == steps
    else:
        assert all(e is None for e, _ in seen) and result.accountant.steps == 0
