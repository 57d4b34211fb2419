"""The step a training run takes (dptrain.privacy.dpsgd.graph.BatchStep), and the padded step a GPU run
replays as a CUDA graph, checked on the CPU: the padded step over ``capacity`` rows, the batch's k
rows weighted 1 and the padding 0, gives the same noisy gradient as the step on the k rows alone
(float64, the same noise draw), for every fused path of the fast engine and both buffer layouts.
The capture and replay themselves need a GPU (tests/test_cuda.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dptrain.models.objectives import BINARY, build_objective
from dptrain.privacy.dpsgd.engine import make_engine
from dptrain.privacy.dpsgd.graph import BatchStep, graph_blocker, graph_capacity
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.sampling import DevicePoissonSampler, PinnedPoissonSampler, PoissonSampler

B = 40.0


def _mlp(width_in: int, hidden: int, out: int, act=nn.ReLU) -> nn.Sequential:
    layers = [nn.Linear(width_in, hidden), act(), nn.Linear(hidden, hidden), act(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers, Squeeze()) if out == 1 else nn.Sequential(*layers)


#: name: (model builder, objective, input width); every one runs a fused path (engine.fused)
FUSED = {
    "closed-form logistic": (lambda: nn.Sequential(nn.Linear(6, 1), Squeeze()), "binary", 6),
    "closed-form multinomial head": (lambda: nn.Sequential(nn.Linear(6, 3)), "multinomial", 6),
    "closed-form linear": (lambda: nn.Sequential(nn.Linear(6, 1), Squeeze()), "linear", 6),
    "buffered MLP, narrow input": (lambda: _mlp(6, 16, 1), "binary", 6),
    "buffered MLP, wide input, 3 classes": (lambda: _mlp(20, 4, 3), "multinomial", 20),
    "buffered MLP, GELU": (lambda: _mlp(6, 12, 1, act=nn.GELU), "binary", 6),
}


def _setup(case: str, n: int = 300, seed: int = 0):
    build, objective_name, width = FUSED[case]
    torch.manual_seed(seed)
    model = build().double()
    x = torch.rand(n, width, dtype=torch.float64)
    x[7] *= 1e3  # the padding reads row 7: large values must still add nothing
    if objective_name == "multinomial":
        y = torch.randint(0, 3, (n,))
    elif objective_name == "linear":
        y = torch.rand(n, dtype=torch.float64)
    else:
        y = (torch.rand(n) > 0.5).double()
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.3, expected_batch_size=B,
                         generator=torch.Generator().manual_seed(11), objective=build_objective(objective_name))
    assert engine.fused, case
    engine.collect_stats = False
    return engine, x, y


@pytest.mark.parametrize("layout", ["cpu layout", "gpu layout"])
@pytest.mark.parametrize("case", list(FUSED))
def test_the_padded_step_gives_the_batch_steps_noisy_gradient(case, layout):
    engine, x, y = _setup(case)
    engine.ones_column = layout == "cpu layout"
    cap = graph_capacity(B)
    assert cap == int(np.ceil(B + 3 * np.sqrt(B))) + 8 == 67
    step = BatchStep(engine, None, x, y)
    rows = torch.arange(cap)
    rng = np.random.default_rng(3)
    for k in (0, 1, 25, cap):
        idx = torch.from_numpy(np.sort(rng.choice(x.shape[0], size=k, replace=False)))
        meta = torch.full((cap + 1,), 7, dtype=torch.int64)  # padding: row 7
        meta[:k], meta[cap] = idx, k
        state = engine.generator.get_state()
        padded = [g.clone() for g in step.padded_grads(meta, rows)]
        engine.generator.set_state(state)
        noise = engine.noise.draw()
        if k == 0:  # an empty Poisson batch: the step is the noise alone (GradientEngine.__call__)
            exact = [z.view_as(p) * engine.noise_std for p, z in zip(engine.params, noise.split(engine._sizes))]
        else:
            exact, _ = engine.noisy_grads(x[idx], y[idx], noise=noise, noise_scale=engine.noise_std,
                                          sum_scale=1.0 / B)
        for p, a, b in zip(engine.params, padded, exact):
            assert a.shape == p.shape
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
        # the noise is there: the step without noise differs by sigma C / B * z
        assert engine.noise_std > 0
    # without noise (sigma = 0) the padded sums equal the clipped sums exactly as well
    engine.noise_multiplier = 0.0
    k = 30
    idx = torch.arange(0, 2 * k, 2)
    meta = torch.full((cap + 1,), 7, dtype=torch.int64)
    meta[:k], meta[cap] = idx, k
    padded = step.padded_grads(meta, rows)
    exact, _ = engine.noisy_grads(x[idx], y[idx], noise=None, noise_scale=0.0, sum_scale=1.0 / B)
    for a, b in zip(padded, exact):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
        assert a.abs().sum() > 0


def test_off_a_gpu_the_step_is_the_engine_on_the_sampled_rows():
    """On the CPU BatchStep is exactly sampler.sample() then engine(x[idx], y[idx]): the same
    gradients bit for bit and the same stats as the loop before it, from the same streams."""
    results = []
    for use_batch_step in (True, False):
        engine, x, y = _setup("buffered MLP, narrow input", seed=1)
        sampler = PoissonSampler(num_rows=x.shape[0], sample_rate=B / x.shape[0], rng=np.random.default_rng(5))
        step = BatchStep(engine, sampler, x, y) if use_batch_step else None
        if step is not None:
            assert "not a CUDA device" in step.graph_reason and not step.graphed
        out = []
        for i in range(6):
            engine.collect_stats = i % 3 == 0
            if step is not None:
                stats = step()
            else:
                idx = sampler.sample()
                stats = engine(x.index_select(0, idx), y.index_select(0, idx))
            out.append((stats, [p.grad.clone() for p in engine.params]))
        results.append(out)
    for (s1, g1), (s2, g2) in zip(*results):
        assert s1.batch_size == s2.batch_size and s1.correct == s2.correct and s1.clipped == s2.clipped
        assert (np.isnan(s1.loss_sum) and np.isnan(s2.loss_sum)) or s1.loss_sum == s2.loss_sum
        assert all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_which_steps_can_be_replayed_as_a_cuda_graph(monkeypatch):
    """Only the fused fast step, not distributed, with the batch drawn on the host, on a CUDA
    device, and not switched off (no GPU needed: the engine's device is set by hand)."""
    engine, x, y = _setup("buffered MLP, narrow input")
    cuda = torch.device("cuda")
    on_host = PinnedPoissonSampler(num_rows=300, sample_rate=0.1, rng=np.random.default_rng(0), device=cuda)
    assert "not a CUDA device" in graph_blocker(engine, on_host)
    monkeypatch.setattr(engine, "device", cuda)
    assert graph_blocker(engine, on_host) is None
    assert graph_blocker(engine, on_host, enabled=False) == "switched off (trainer.cuda_graph=false)"
    on_gpu = DevicePoissonSampler(num_rows=300, sample_rate=0.3, generator=torch.Generator())
    assert "drawn on the GPU (q > 0.1)" in graph_blocker(engine, on_gpu)
    monkeypatch.setattr(engine, "dist", object())
    assert "distributed" in graph_blocker(engine, on_host)
    for name, build in [("opacus", lambda: _mlp(6, 16, 1)),
                        ("fast", lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Tanh(), nn.Linear(8, 1),
                                                       Squeeze()))]:
        other = make_engine(build().double(), engine=name, max_grad_norm=1.0, noise_multiplier=1.0,
                            expected_batch_size=B, generator=torch.Generator(), objective=BINARY)
        monkeypatch.setattr(other, "device", cuda)
        assert "has no fused step" in graph_blocker(other, on_host), name
    # the autograd path takes no row weights (only the fused paths pad)
    with pytest.raises(ValueError, match="row_weights need the fused fast path"):
        other.noisy_grads(x[:5], y[:5], noise=None, noise_scale=0.0, sum_scale=1.0, row_weights=torch.ones(5))


def test_the_setting_is_in_the_config_and_the_settings_reference():
    from pathlib import Path

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
    from dptrain.tasks.registry import validate

    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        assert OmegaConf.to_object(compose(config_name="config")).trainer.cuda_graph is True
        off = OmegaConf.to_object(compose(config_name="config", overrides=["trainer.cuda_graph=false"]))
        assert off.trainer.cuda_graph is False
        validate(off)
        with pytest.raises(Exception, match="cuda_graph"):
            validate(OmegaConf.to_object(compose(config_name="config", overrides=["trainer.cuda_graph=sometimes"])))
    text = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    assert "`trainer.cuda_graph`" in text


def step_beside(step: BatchStep, engine, sampler, x, y, opts, *, steps: int = 40) -> list[int]:
    """``steps`` steps of ``step`` and, from twin streams, of ``engine`` on ``sampler``'s batches
    (the unreplayed step), every 10th one logged; each step's batch size, which must agree. A
    step that is not logged and fits the capacity (a replay) computes no diagnostics."""
    sizes = []
    for i in range(steps):
        for e in (step.engine, engine):
            e.collect_stats = i % 10 == 9
        s1 = step()
        idx = sampler.sample()
        s2 = engine(x.index_select(0, idx), y.index_select(0, idx))
        assert s1.batch_size == s2.batch_size
        if step.graphed and not step.engine.collect_stats and s1.batch_size <= step.capacity:
            assert np.isnan(s1.loss_sum) and s1.correct == 0 and s1.clipped == 0
        sizes.append(s1.batch_size)
        for o in opts:
            o.step()
    return sizes


class _ReplayedBody:
    """A stand-in for a CUDA graph on the CPU: each replay reruns the captured body and writes its
    outputs into the ones the capture returned (what a graph replay does to its static outputs)."""

    def __init__(self, body, outputs):
        self.body, self.outputs, self.replays = body, outputs, 0

    def replay(self):
        for static, fresh in zip(self.outputs, self.body()):
            static.copy_(fresh)
        self.replays += 1


def _cpu_record(body, gen, state):
    outputs = [t.clone() for t in body()]  # the capture (its draws are given back below)
    gen.set_state(state)
    return _ReplayedBody(body, outputs), outputs


@pytest.mark.parametrize("case", ["buffered MLP, narrow input", "buffered MLP, wide input, 3 classes",
                                  "closed-form logistic"])
def test_the_graph_steps_book_keeping_on_the_cpu(case, monkeypatch):
    """BatchStep's capture and replay logic with the graph replaced by a rerun of its body (the
    real graph is tests/test_cuda.py's): against sampler + engine on twin models and streams,
    with capacity = B (about half the batches exceed it and run unreplayed) and every 10th step
    logged, the models agree, the batch sizes agree, and the noise generators end in the same
    state: the capture used up no noise, each replayed step drew once."""
    monkeypatch.setattr(BatchStep, "_record", staticmethod(_cpu_record))
    monkeypatch.setattr(BatchStep, "_host_buffer", staticmethod(lambda size: torch.empty(size, dtype=torch.int64)))
    twins = [_setup(case, n=600, seed=4) for _ in range(2)]
    engines = [e for e, _, _ in twins]
    x, y = twins[0][1], twins[0][2]
    samplers = [PinnedPoissonSampler(num_rows=600, sample_rate=B / 600, rng=np.random.default_rng(9), device="cpu")
                for _ in twins]
    opts = [torch.optim.SGD(e.params, lr=0.5) for e in engines]
    step = BatchStep(engines[0], samplers[0], x, y, capacity=int(B))
    assert "not a CUDA device" in step.graph_reason
    step.graph_reason = None  # as on a GPU (test_which_steps_can_be_replayed_as_a_cuda_graph)
    assert not step.graphed
    sizes = step_beside(step, engines[1], samplers[1], x, y, opts)
    replayed = [k for i, k in enumerate(sizes) if k <= B and i % 10 != 9]
    assert step.graphed and step._graph.replays == len(replayed) >= 5
    assert sum(k > B for k in sizes) >= 5, sizes
    for p, q in zip(engines[0].params, engines[1].params):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    assert torch.equal(engines[0].generator.get_state(), engines[1].generator.get_state())


def test_a_failed_capture_runs_every_step_unreplayed_and_keeps_the_noise_stream(monkeypatch, caplog):
    def broken(body, gen, state):
        body()  # draws noise, then fails as a capture can
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(BatchStep, "_record", staticmethod(broken))
    engine, x, y = _setup("buffered MLP, narrow input")
    sampler = PinnedPoissonSampler(num_rows=300, sample_rate=B / 300, rng=np.random.default_rng(2), device="cpu")
    step = BatchStep(engine, sampler, x, y)
    step.graph_reason = None  # as on a GPU
    before = engine.generator.get_state()
    caplog.set_level("WARNING")
    stats = step()
    assert step.graph_reason == "capture failed (RuntimeError: operation not permitted when stream is capturing)"
    assert "every step runs unreplayed" in caplog.text and not step.graphed
    assert stats.batch_size > 0 and all(p.grad is not None for p in engine.params)
    # the failed capture's draw was given back: the step drew exactly one noise vector
    after = engine.generator.get_state()
    engine.generator.set_state(before)
    engine.noise.draw()
    assert torch.equal(engine.generator.get_state(), after)
    calls = []
    monkeypatch.setattr(BatchStep, "_record", staticmethod(lambda *a: calls.append(a)))
    step()  # later steps go straight to the engine: no second capture
    assert calls == [] and not step.graphed
