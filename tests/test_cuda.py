"""On a GPU as on a CPU (issue 17): the same runs with ``trainer.device=cuda``. Skipped where
torch sees no CUDA device (CI's CPU machines); run by scripts/gpu_check.sh on a GPU machine.
The CPU-side checks of the same plumbing are in tests/test_device.py."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from scipy import stats
from torch import nn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from dp_invariants import check_sampler_law  # noqa: E402
from test_device import CASES, DeviceAudit  # noqa: E402
from test_graph_step import step_beside  # noqa: E402

import dptrain.training.checkpoint as ckpt  # noqa: E402
from dptrain.models.objectives import BINARY, build_objective  # noqa: E402
from dptrain.privacy.dpsgd.engine import make_engine  # noqa: E402
from dptrain.privacy.dpsgd.graph import BatchStep  # noqa: E402
from dptrain.privacy.dpsgd.layers import Squeeze  # noqa: E402
from dptrain.privacy.dpsgd.sampling import DevicePoissonSampler, PinnedPoissonSampler, make_sampler  # noqa: E402
from dptrain.privacy.randomness import Randomness, new_seed_file  # noqa: E402
from dptrain.tasks import cli  # noqa: E402

GPU = torch.device("cuda", 0)
SMALL = ["data=synthetic", "data.n_rows=3000", "trainer.epochs=2", "trainer.batch_size=100", "trainer.progress=false",
         "trainer.baseline=false", "trainer.checkpoint_every=5"]


def _run(run_dir: Path, overrides: list[str]) -> dict:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cli.run(cfg, run_dir=run_dir)
    return json.loads((run_dir / "privacy.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_every_engine_steps_on_the_gpu_with_every_tensor_there(case):
    build, objective_name, engine_name = CASES[case]
    torch.manual_seed(0)
    model = build().to(GPU)
    n = 400
    x = torch.rand(n, 6, device=GPU)
    y = (torch.randint(0, 3, (n,), device=GPU) if objective_name == "multinomial"
         else (torch.rand(n, device=GPU) > 0.5).float())
    secret = Randomness.fresh()
    engine = make_engine(model, engine=engine_name, max_grad_norm=1.0, noise_multiplier=1.3, expected_batch_size=40.0,
                         generator=secret.torch("gaussian-noise", device=GPU),
                         objective=build_objective(objective_name))
    sampler = make_sampler(num_rows=n, sample_rate=0.1, randomness=secret, index=0, device=GPU)
    assert isinstance(sampler, PinnedPoissonSampler)  # q <= 0.1: drawn on the host, copied without waiting
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    audit = DeviceAudit(GPU)
    for _ in range(3):
        idx = sampler.sample()  # the indices are drawn on the host by design (PinnedPoissonSampler)
        assert idx.device == GPU
        with audit:
            engine(x.index_select(0, idx), y.index_select(0, idx))
            opt.step()
    # StepStats' Python numbers come back to the host; every tensor stayed on the GPU
    assert audit.wrong == [], audit.wrong
    assert all(p.grad.device == GPU and torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("widths", [(6, 16, 8, 1), (20, 4, 12, 3), (5, 7, 1)], ids=["narrow-input", "wide-input",
                                                                                   "one-hidden"])
def test_the_buffered_path_on_the_gpu_equals_the_cpu(widths):
    """The buffered MLP path lays its buffers out differently on a GPU (no ones column: the bias
    added by addmm, its gradient a column sum or a matrix-vector product) than on the CPU: in
    float64, without noise, the clipped sums agree to rounding, over steps of different sizes."""
    torch.manual_seed(1)
    layers = []
    for k, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [torch.nn.Linear(a, b, bias=k != 1 or len(widths) == 3), torch.nn.Tanh()]
    head = widths[-1]
    cpu_model = torch.nn.Sequential(*layers[:-1], *([Squeeze()] if head == 1 else [])).double()
    gpu_model = copy.deepcopy(cpu_model).to(GPU)
    objective = "binary" if head == 1 else "multinomial"
    engines = [make_engine(m, engine="fast", max_grad_norm=0.3, noise_multiplier=0.0, expected_batch_size=50.0,
                           generator=Randomness.fresh().torch("gaussian-noise", device=d),
                           objective=build_objective(objective))
               for m, d in ((cpu_model, "cpu"), (gpu_model, GPU))]
    assert engines[0].fused and engines[0].ones_column and not engines[1].ones_column
    rng = np.random.default_rng(2)
    for n in (40, 70, 25):
        x = torch.from_numpy(rng.normal(size=(n, widths[0])))
        y = torch.from_numpy(rng.integers(0, max(head, 2), n).astype("float64" if head == 1 else "int64"))
        st_cpu = engines[0](x, y)
        st_gpu = engines[1](x.to(GPU), y.to(GPU))
        assert st_cpu.clipped == st_gpu.clipped > 0
        for a, b in zip(cpu_model.parameters(), gpu_model.parameters()):
            torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-10, atol=1e-12)


def test_gpu_noise_has_sd_sigma_c_over_b_and_fresh_streams_differ():
    model = torch.nn.Sequential(torch.nn.Linear(50, 20), torch.nn.ReLU(), torch.nn.Linear(20, 1)).to(GPU)
    sigma, c, b = 1.7, 0.9, 64.0
    engine = make_engine(model, engine="fast", max_grad_norm=c, noise_multiplier=sigma, expected_batch_size=b,
                         generator=Randomness.fresh().torch("gaussian-noise", device=GPU), objective=BINARY)
    engine.collect_stats = False
    empty_x, empty_y = torch.zeros(0, 50, device=GPU), torch.zeros(0, device=GPU)
    draws = []
    for _ in range(200):
        engine(empty_x, empty_y)
        draws.append(torch.cat([p.grad.reshape(-1) for p in engine.params]).double().cpu())
    z = torch.stack(draws).numpy().ravel()
    expected = sigma * c / b
    n = z.size
    lo, hi = (stats.chi2.ppf([0.0005, 0.9995], n - 1) / (n - 1)) ** 0.5 * expected
    assert lo < z.std() < hi
    assert abs(z.mean()) < 5 * expected / math.sqrt(n)
    a = torch.randn(1000, generator=Randomness.fresh().torch("gaussian-noise", device=GPU), device=GPU)
    b2 = torch.randn(1000, generator=Randomness.fresh().torch("gaussian-noise", device=GPU), device=GPU)
    assert not torch.equal(a, b2)


def test_gpu_streams_reproduce_from_a_seed_file_and_use_the_offset(tmp_path):
    key = tmp_path / "noise.key"
    new_seed_file(key)
    r = Randomness.from_seed_file(key, run_label="x").for_data("rows")
    g1, g2 = r.torch("gaussian-noise", device=GPU), r.torch("gaussian-noise", device=GPU)
    assert torch.equal(torch.randn(100, generator=g1, device=GPU), torch.randn(100, generator=g2, device=GPU))
    g3 = r.torch("gaussian-noise", device=GPU)
    seed_only = torch.Generator(device=GPU)
    seed_only.manual_seed(g3.initial_seed())  # the key without the secret offset: another stream
    assert not torch.equal(torch.randn(100, generator=g3, device=GPU), torch.randn(100, generator=seed_only,
                                                                                    device=GPU))


class _OnHost:
    """A GPU sampler whose batches are read on the host (for tests/dp_invariants.py)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def sample(self):
        return self.sampler.sample().cpu()


def test_gpu_sampler_has_the_poisson_law():
    n, q = 500, 0.07
    s = DevicePoissonSampler(num_rows=n, sample_rate=q, generator=Randomness.fresh().torch("s", device=GPU))
    check_sampler_law(_OnHost(s), num_rows=n, sample_rate=q, draws=3000)


def test_the_gpu_sampler_draws_the_cpu_samplers_batches_when_q_is_small():
    """q <= 0.1: the GPU's batches are the CPU sampler's (the same numpy stream of the same
    secret), copied to the device; above 0.1 they are drawn on the GPU."""
    secret = Randomness.fresh()
    n = 5000
    on_gpu = make_sampler(num_rows=n, sample_rate=0.02, randomness=secret, index=0, device=GPU)
    on_cpu = make_sampler(num_rows=n, sample_rate=0.02, randomness=secret, index=0, device="cpu")
    assert isinstance(on_gpu, PinnedPoissonSampler)
    sizes = []
    for _ in range(50):
        a, b = on_gpu.sample(), on_cpu.sample()
        assert a.device == GPU and a.dtype == torch.int64
        assert torch.equal(a.cpu(), b)
        sizes.append(b.numel())
    assert len(set(sizes)) > 5  # batches of varying size: the comparison is not of empty batches
    assert on_gpu.get_state() == on_cpu.get_state()
    dense = make_sampler(num_rows=n, sample_rate=0.3, randomness=secret, index=0, device=GPU)
    assert isinstance(dense, DevicePoissonSampler) and dense.sample().device == GPU


def test_pinned_sampler_has_the_poisson_law_on_the_gpu():
    n, q = 500, 0.07
    s = make_sampler(num_rows=n, sample_rate=q, randomness=Randomness.fresh(), index=0, device=GPU)
    assert isinstance(s, PinnedPoissonSampler)
    check_sampler_law(_OnHost(s), num_rows=n, sample_rate=q, draws=3000)


@pytest.mark.parametrize("width", [1, 3], ids=["binary MLP", "3-class MLP"])
def test_a_cuda_graph_run_takes_the_same_steps_as_an_unreplayed_one(width):
    """Two copies of a float64 MLP on the GPU, the same secret streams: one stepped by BatchStep
    (the training loop's step: unlogged steps replay a CUDA graph over `capacity` rows), one by
    the sampler and the engine directly. The capacity is B, so about half the batches exceed it
    and run unreplayed, and every 10th step is a logged (unreplayed) one. After 40 steps the two
    models agree to float64 rounding, the batch sizes agree, and both noise generators have
    advanced alike: each replay drew fresh noise from the secret generator, none was skipped or
    repeated, and the padding added nothing."""
    secret = Randomness.fresh()
    torch.manual_seed(0)
    layers = [nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, width)]
    base = nn.Sequential(*layers, *([Squeeze()] if width == 1 else [])).double().to(GPU)
    n, b = 2000, 50.0
    x = torch.rand(n, 6, dtype=torch.float64, device=GPU)
    y = (torch.randint(0, 3, (n,), device=GPU) if width == 3 else (torch.rand(n, device=GPU) > 0.5).double())
    objective = build_objective("multinomial" if width == 3 else "binary")
    models = [base, copy.deepcopy(base)]
    engines = [make_engine(m, engine="fast", max_grad_norm=1.0, noise_multiplier=1.3, expected_batch_size=b,
                           generator=secret.torch("gaussian-noise", device=GPU), objective=objective) for m in models]
    samplers = [make_sampler(num_rows=n, sample_rate=b / n, randomness=secret, index=0, device=GPU) for _ in models]
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in models]
    step = BatchStep(engines[0], samplers[0], x, y, capacity=int(b))
    assert step.graph_reason is None
    sizes = step_beside(step, engines[1], samplers[1], x, y, opts)
    assert step.graphed and step.graph_reason is None
    assert sum(k <= b for k in sizes) >= 5 and sum(k > b for k in sizes) >= 5, sizes  # both kinds of steps
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-11)
    assert torch.equal(engines[0].generator.get_state(), engines[1].generator.get_state())


def test_consecutive_replays_draw_fresh_noise():
    secret = Randomness.fresh()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1), Squeeze()).to(GPU)
    n = 1000
    x, y = torch.rand(n, 6, device=GPU), (torch.rand(n, device=GPU) > 0.5).float()
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=20.0,
                         generator=secret.torch("gaussian-noise", device=GPU), objective=BINARY)
    engine.collect_stats = False
    sampler = make_sampler(num_rows=n, sample_rate=0.02, randomness=secret, index=0, device=GPU)
    step = BatchStep(engine, sampler, x, y)
    grads = []
    for _ in range(3):
        step()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    assert step.graphed
    assert not torch.allclose(grads[0], grads[1]) and not torch.allclose(grads[1], grads[2])
    # the parameters were not changed (no optimiser step): the differences are noise of SD sigma C / B
    diff = (grads[1] - grads[2]).std().item()
    assert 0.5 * (2 ** 0.5) / 20 < diff < 2.0 * (2 ** 0.5) / 20


@pytest.mark.parametrize("preset", ["logit", "mlp"])
def test_a_gpu_run_has_the_cpu_runs_epsilon(tmp_path, preset, caplog):
    caplog.set_level("INFO")
    gpu = _run(tmp_path / "gpu", [f"experiment={preset}", *SMALL, "trainer.device=cuda"])
    assert "CUDA graph: the unlogged steps replay one graph" in caplog.text
    cpu = _run(tmp_path / "cpu", [f"experiment={preset}", *SMALL, "trainer.device=cpu"])
    assert gpu["device"].startswith("cuda:0") and cpu["device"] == "cpu"
    for key in ("epsilon", "epsilons", "steps", "sample_rate", "noise_multiplier", "dataset_size"):
        assert gpu[key] == cpu[key], key
    assert "noise stream is torch's Philox generator" in gpu["randomness"]
    assert "Poisson sampler's stream is the numpy one" in gpu["randomness"]  # q = 100 / 2,400 <= 0.1
    m = json.loads((tmp_path / "gpu" / "private" / "metrics.json").read_text())
    assert 0.0 <= m["test/acc"] <= 1.0


def test_a_gpu_checkpoint_resumes_on_the_cpu_and_reproducible_streams_are_refused(tmp_path, capsys):
    ref = _run(tmp_path / "ref", ["experiment=mlp", *SMALL, "trainer.device=cpu"])
    # 3/4 of the full run's epsilon stops it after 20 of its 45 steps (a checkpoint every 5):
    # the resume continues from the middle of the run, not from step 0
    budget = f"privacy.max_epsilon={0.75 * ref['epsilon']}"
    mid = tmp_path / "mid"
    first = _run(mid, ["experiment=mlp", *SMALL, "trainer.device=cuda", budget])
    assert first["stopped_early"] and 0 < first["steps"] < ref["steps"]
    state = ckpt.load_checkpoint(ckpt.checkpoint_path_in(mid))
    assert state["rng"]["noise"] is None  # default: no stream state stored
    assert state["step"] == first["steps"]
    got = _run(mid, ["experiment=mlp", *SMALL, "trainer.device=cpu", "trainer.resume=auto"])
    assert got["resumed_from_step"] == first["steps"] and got["epsilon"] == ref["epsilon"]
    assert got["device"] == "cpu"
    # reproducible noise: the streams of a GPU run do not continue on the CPU; the command-line
    # entry point turns the CheckpointError into exit status 2 and one line on stderr
    key = tmp_path / "noise.key"
    new_seed_file(key)
    keyed = tmp_path / "keyed"
    _run(keyed, ["experiment=mlp", *SMALL, "trainer.device=cuda", f"privacy.noise_seed_file={key}", budget])
    before = ckpt.checkpoint_path_in(keyed).read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        _run(keyed, ["experiment=mlp", *SMALL, "trainer.device=cpu", f"privacy.noise_seed_file={key}",
                     "trainer.resume=auto"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds the secret streams of a run on cuda" in err and "trainer.device=cuda" in err
    assert ckpt.checkpoint_path_in(keyed).read_bytes() == before  # nothing written is lost


def test_make_private_on_the_gpu():
    from dptrain.training.private import make_private

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1), Squeeze()).to(GPU)
    x, y = np.random.default_rng(0).random((300, 4)).astype("float32"), (np.arange(300) % 2).astype("float32")
    dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, noise_multiplier=1.0,
                      max_grad_norm=1.0, batch_size=30, epochs=0.5, delta=1e-5)
    for xb, yb in dp.batches():
        assert xb.device == GPU
        dp.step(xb, yb)
    assert dp.report()["device"].startswith("cuda")
