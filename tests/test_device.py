"""trainer.device (issue 17): the device plumbing runs through the same code on the CPU as on a
GPU, and no tensor of a step is created on a device other than the run's.

How a CPU-only machine can tell: every step below runs with torch's DEFAULT device set to
"meta" (``with torch.device("meta")``), and a TorchFunctionMode records the device of every
tensor an operation returns. Code that creates a tensor without naming the run's device (the
bug that made the engine fail on CUDA: ``torch.empty(n)`` with a CUDA generator) then creates a
meta tensor, which the audit reports (or the next operation refuses). Code that passes the
device through never notices the default.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_invariants import check_sampler_law
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from torch import nn
from torch.overrides import TorchFunctionMode

import dptrain.core.device as device_mod
import dptrain.privacy.randomness as rnd
import dptrain.tasks.cli  # noqa: F401  (registers the config schema)
from dptrain.core.device import DeviceError, resolve_device
from dptrain.data import load_dataset
from dptrain.models.objectives import BINARY, build_objective
from dptrain.privacy.dpsgd.engine import make_engine
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.sampling import (
    DevicePoissonSampler,
    PinnedPoissonSampler,
    PoissonSampler,
    make_sampler,
)
from dptrain.privacy.randomness import Randomness, philox_state, seeded_philox
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import validate_against_size
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate
from dptrain.training.checkpoint import CheckpointError, restore
from dptrain.training.fit import LaunchConfig, fit, mechanism_for

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


class DeviceAudit(TorchFunctionMode):
    """Records every tensor an operation returns whose device is not ``expected``."""

    def __init__(self, expected: torch.device) -> None:
        super().__init__()
        self.expected, self.wrong = expected, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device != self.expected:
                self.wrong.append((getattr(func, "__name__", str(func)), str(t.device)))
        return out


def _audited(fn):
    """Run ``fn()`` with the default device "meta" and the audit; returns (result, wrong)."""
    audit = DeviceAudit(CPU)
    with torch.device("meta"), audit:
        result = fn()
    return result, audit.wrong


# ------------------------------------------------------------------------------ the setting


def test_device_setting_is_resolved_or_refused_naming_setting_value_and_allowed(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_count", lambda: 0)
    assert resolve_device("auto") == CPU and resolve_device("cpu") == CPU
    for bad in ("cuda", "cuda:0"):
        with pytest.raises(DeviceError, match=rf"trainer.device='{bad}' is not allowed here: torch sees no CUDA "
                                              r"device .*allowed: cpu or auto"):
            resolve_device(bad)
    for bad in ("gpu", "CUDA", "cuda:", "cuda:x", 1, None):
        with pytest.raises(DeviceError, match=r"is not allowed: allowed: auto .* \| cpu \| cuda \| cuda:N"):
            resolve_device(bad)


def test_cuda_indices_on_a_machine_with_two_gpus(monkeypatch):
    """The resolution rules with CUDA present (simulated: no GPU touched)."""
    monkeypatch.setattr(device_mod, "cuda_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == CPU
    with pytest.raises(DeviceError, match=r"cuda:2 does not exist \(this machine has 2 CUDA devices: cuda:0..cuda:1"):
        resolve_device("cuda:2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # a distributed run: each process takes cuda:LOCAL_RANK
    assert resolve_device("auto", distributed=True) == torch.device("cuda", 1)
    assert resolve_device("cuda", distributed=True) == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match="not allowed with trainer.distributed=true: each process uses "
                                          "cuda:LOCAL_RANK"):
        resolve_device("cuda:0", distributed=True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(DeviceError, match="cuda:3 does not exist"):
        resolve_device("auto", distributed=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_refuses_a_missing_gpu_before_reading_data(tmp_path):
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "dptrain", "experiment=logit", "trainer.device=cuda",
                          f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "trainer.device='cuda' is not allowed here" in res.stderr and "allowed: cpu or auto" in res.stderr
    assert not (run / "privacy.json").exists() and not (run / "private" / "checkpoint.pt").exists()


# ------------------------------------------------------------------------------ one step, every engine


def _mlp(width_in: int, out: int = 1, act=nn.ReLU) -> nn.Sequential:
    layers = [nn.Linear(width_in, 16), act(), nn.Linear(16, out)]
    return nn.Sequential(*layers, Squeeze()) if out == 1 else nn.Sequential(*layers)


CASES = {
    "closed-form logistic": (lambda: nn.Sequential(nn.Linear(6, 1), Squeeze()), "binary", "fast"),
    "closed-form multinomial head": (lambda: nn.Sequential(nn.Linear(6, 3)), "multinomial", "fast"),
    "buffered MLP": (lambda: _mlp(6), "binary", "fast"),
    "buffered MLP, GELU": (lambda: _mlp(6, act=nn.GELU), "binary", "fast"),
    "autograd path": (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Tanh(), nn.Linear(16, 1), Squeeze()),
                      "binary", "fast"),
    "opacus hooks": (lambda: _mlp(6), "binary", "opacus"),
    "non-private": (lambda: _mlp(6), "binary", "nonprivate"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_step_creates_every_tensor_on_the_run_device(case):
    build, objective_name, engine_name = CASES[case]
    torch.manual_seed(0)
    model = build()
    objective = build_objective(objective_name)
    n = 400
    x = torch.rand(n, 6)
    y = torch.randint(0, 3, (n,)) if objective_name == "multinomial" else (torch.rand(n) > 0.5).float()
    secret = Randomness.fresh()
    kwargs = dict(expected_batch_size=40.0, generator=secret.torch("gaussian-noise", device=CPU), objective=objective,
                  max_grad_norm=1.0, noise_multiplier=1.3)
    engine = make_engine(model, engine=engine_name, **kwargs)
    if engine_name == "fast" and case != "autograd path":
        assert engine.fused, case  # the case exercises the path its name says
    sampler = make_sampler(num_rows=n, sample_rate=0.1, randomness=secret, index=0, device=CPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]

    def steps():
        for _ in range(3):
            idx = sampler.sample()
            engine(x.index_select(0, idx), y.index_select(0, idx))
            opt.step()
        engine.collect_stats = True
        idx = sampler.sample()
        return engine(x.index_select(0, idx), y.index_select(0, idx))

    stats, wrong = _audited(steps)
    assert wrong == [], wrong
    assert stats.batch_size > 0
    for p, p0 in zip(model.parameters(), before):
        assert p.device == CPU and p.grad.device == CPU and torch.isfinite(p).all()
        assert not torch.equal(p.detach(), p0)  # the steps did update the model


def test_the_audit_catches_a_tensor_created_without_the_device():
    """The check can fail: the engine's noise draw as it was before device support (no device
    argument) creates a meta tensor under the meta default."""
    model = _mlp(6)
    engine = make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=10.0,
                         generator=torch.Generator(), objective=BINARY)
    sizes = sum(engine._sizes)
    _, wrong = _audited(lambda: torch.empty(sizes, dtype=engine.noise_dtype).normal_(0.0, 1.0,
                                                                                       generator=engine.generator))
    assert wrong and all(dev == "meta" for _, dev in wrong)
    _, right = _audited(engine.noise.draw)
    assert right == []


def _setup(overrides):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=[
            "data=synthetic", "data.n_rows=1500", "trainer.progress=false", "trainer.baseline=false",
            "trainer.device=cpu", *overrides]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    return cfg, data, validate_against_size(cfg, data.n_train)


@pytest.mark.parametrize("preset", ["logit", "mlp"])
def test_a_whole_fit_keeps_every_tensor_on_the_run_device(tmp_path, preset):
    """fit() end to end (model built, moved, rows moved, sampler, noise, optimiser, evaluation,
    the dp/ curve, checkpoint) under the meta default device and the audit."""
    cfg, data, delta = _setup([f"experiment={preset}", "trainer.epochs=1", "trainer.batch_size=100",
                               "trainer.log_every=3", "trainer.eval_every=5"])
    mech = mechanism_for(training_plan(cfg), dataset_size=data.n_train, delta=delta)
    plan = training_plan(cfg)
    result, wrong = _audited(lambda: fit(plan, data, mechanism=mech, tracker=Tracker(tmp_path, tensorboard=False),
                                         launch=LaunchConfig(run_dir=tmp_path)))
    assert wrong == [], wrong[:10]
    assert result.privacy["device"] == "cpu" and result.metrics["train/steps"] == mech.planned_steps
    assert all(p.device == CPU for p in result.model.parameters())
    assert 0.0 <= result.metrics["test/acc"] <= 1.0


def test_the_engine_refuses_a_noise_generator_on_another_device():
    model = _mlp(6).to("meta")
    with pytest.raises(ValueError, match="noise generator is on cpu but the model is on meta"):
        make_engine(model, engine="fast", max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=10.0,
                    generator=torch.Generator(), objective=BINARY)


# ------------------------------------------------------------------------------ the device's streams


class _FakeCudaGenerator:
    """Stands in for torch.Generator(device="cuda") on a machine without CUDA."""

    def __init__(self, device):
        self.device, self.state = device, None

    def set_state(self, state):
        self.state = state.clone()


def _philox_of(r: Randomness, name: str, index: int = 0, monkeypatch=None) -> tuple[int, int]:
    monkeypatch.setattr(rnd, "seeded_philox",
                        lambda words, dev: seeded_philox(words, dev, make=_FakeCudaGenerator))
    gen = r.torch(name, index, device="cuda:0")
    raw = bytes(gen.state.numpy())
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


def test_gpu_streams_take_a_64_bit_key_and_a_secret_offset_from_the_secret(monkeypatch, tmp_path):
    keys, offsets = set(), set()
    for _ in range(40):
        key, offset = _philox_of(Randomness.fresh(), "gaussian-noise", monkeypatch=monkeypatch)
        keys.add(key)
        offsets.add(offset)
        assert offset % 4 == 0 and 0 <= offset < 2**63
    assert len(keys) == 40 and len(offsets) == 40
    assert max(keys) >= 2**48 and max(offsets) >= 2**48  # all 64 / 62 bits used, not a 32-bit seed
    # opt-in reproducible noise: the same file and label give the same GPU stream; names and
    # ranks give different ones; the CPU stream of the same name is not derived from the same words
    key_file = tmp_path / "noise.key"
    rnd.new_seed_file(key_file)
    a = Randomness.from_seed_file(key_file, run_label="run-a").for_data("rows")
    b = Randomness.from_seed_file(key_file, run_label="run-a").for_data("rows")
    assert _philox_of(a, "gaussian-noise", monkeypatch=monkeypatch) == _philox_of(b, "gaussian-noise",
                                                                                 monkeypatch=monkeypatch)
    distinct = {_philox_of(a, "gaussian-noise", monkeypatch=monkeypatch),
                _philox_of(a, "poisson-sampler", monkeypatch=monkeypatch),
                _philox_of(a, "poisson-sampler", 1, monkeypatch=monkeypatch)}
    assert len(distinct) == 3
    mt_words = a._sequence("gaussian-noise", 0).generate_state(4, dtype=np.uint32)
    assert _philox_of(a, "gaussian-noise", monkeypatch=monkeypatch)[0] != int(mt_words[0]) | int(mt_words[1]) << 32


def test_philox_state_layout():
    state = philox_state(np.array([1, 2, 0xFFFFFFFF, 0xFFFFFFFF], dtype=np.uint32))
    raw = bytes(state.numpy())
    assert len(raw) == 16 and state.dtype == torch.uint8
    assert int.from_bytes(raw[:8], "little") == 1 | 2 << 32
    offset = int.from_bytes(raw[8:], "little")
    assert offset % 4 == 0 and offset < 2**63


def test_device_sampler_has_the_poisson_law():
    """The sampler used on GPUs (a torch generator; here the CPU's) draws independent
    Bernoulli(q) memberships: inclusion rate, batch-size law and per-row counts
    (tests/dp_invariants.py)."""
    n, q = 500, 0.07
    sampler = DevicePoissonSampler(num_rows=n, sample_rate=q, generator=Randomness.fresh().torch("s"))
    out = check_sampler_law(sampler, num_rows=n, sample_rate=q, draws=3000)  # asserts the law itself
    assert abs(out["mean_z"]) < 4 and out["max_row_z"] < 6
    idx = sampler.sample()
    assert idx.dtype == torch.int64 and bool((idx[1:] > idx[:-1]).all())


def test_a_gpu_sampler_with_q_at_most_a_tenth_draws_the_cpu_stream_and_copies_without_waiting(monkeypatch):
    """On a GPU, q <= 0.1: the CPU sampler's numpy draws (the same secret stream, so the same
    batches as on the CPU), copied from page-locked memory with non_blocking=True, so that the host
    never waits for the GPU. Here on a "meta" device, with pin_memory recorded (a CPU-only torch
    cannot page-lock memory)."""
    secret = Randomness.fresh()
    meta = torch.device("meta")
    on_dev = make_sampler(num_rows=2000, sample_rate=0.05, randomness=secret, index=0, device=meta)
    on_cpu = make_sampler(num_rows=2000, sample_rate=0.05, randomness=secret, index=0, device=CPU)
    assert isinstance(on_dev, PinnedPoissonSampler) and on_dev.device == meta
    assert type(on_cpu) is PoissonSampler
    calls = []
    real_to = torch.Tensor.to

    def pin_memory(self, *args, **kwargs):
        calls.append(("pin_memory", self.device))
        return self

    def to(self, *args, **kwargs):
        calls.append(("to", args, kwargs))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    sizes = []
    for _ in range(20):
        calls.clear()
        idx, ref = on_dev.sample(), on_cpu.sample()
        assert idx.device == meta and idx.dtype == torch.int64 and idx.shape == ref.shape
        assert calls == [("pin_memory", CPU), ("to", (meta,), {"non_blocking": True})]
        sizes.append(ref.numel())
    assert len(set(sizes)) > 3 and on_dev.get_state() == on_cpu.get_state()  # the same stream, step for step
    # the law is PoissonSampler's (tests/dp_invariants.py) on the host-side draws
    host = PinnedPoissonSampler(num_rows=500, sample_rate=0.07, rng=np.random.default_rng(3), device=CPU)
    check_sampler_law(host, num_rows=500, sample_rate=0.07, draws=3000)


def test_sampler_states_do_not_cross_generator_kinds():
    cpu = PoissonSampler(num_rows=10, sample_rate=0.5, rng=np.random.default_rng(0))
    dev = DevicePoissonSampler(num_rows=10, sample_rate=0.5, generator=torch.Generator())
    with pytest.raises(ValueError, match="another device"):
        cpu.set_state(dev.get_state())
    with pytest.raises(ValueError, match="another device"):
        dev.set_state(cpu.get_state())
    state = dev.get_state()
    first = dev.sample()
    dev.set_state(state)
    assert torch.equal(dev.sample(), first)


def test_reproducible_streams_of_a_gpu_checkpoint_are_not_resumed_on_the_cpu(tmp_path):
    model = _mlp(6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "rng": {"sampler": None, "samplers": None, "noise": torch.zeros(16, dtype=torch.uint8),
                     "torch_global": torch.get_rng_state(), "streams_device": "cuda"}}
    sampler = PoissonSampler(num_rows=10, sample_rate=0.5, rng=np.random.default_rng(0))
    with pytest.raises(CheckpointError, match=r"secret streams of a run on cuda .* allowed: resume with "
                                              r"trainer.device=cuda"):
        restore(state, model=model, optimizer=opt, sampler=sampler, noise_gen=torch.Generator(),
                path=tmp_path / "c.pt")
    # without stored streams (the default) a checkpoint from any device resumes: the model and
    # optimizer states load onto this run's device
    state["rng"].update(noise=None, streams_device=None)
    restore(state, model=model, optimizer=opt, sampler=sampler, noise_gen=torch.Generator(), path=tmp_path / "c.pt")


def test_make_private_follows_the_models_device():
    from dptrain.training.private import make_private

    model = _mlp(4)
    x, y = torch.rand(300, 4), (torch.rand(300) > 0.5).float()
    dp = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, noise_multiplier=1.0,
                      max_grad_norm=1.0, batch_size=30, epochs=0.5, delta=1e-5)
    assert dp.device == CPU and dp.engine.device == CPU and dp.sampler.device == CPU
    assert dp.report()["device"] == "cpu"


def test_device_sampler_draws_float64_uniforms():
    """P(u < q) must be q for the accountant: float32 uniforms lie on a 2^-24 grid, which would
    include every row slightly more often than q."""
    dtypes = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.rand:
                dtypes.append((kwargs or {}).get("dtype"))
            return func(*args, **(kwargs or {}))

    sampler = DevicePoissonSampler(num_rows=100, sample_rate=0.3, generator=torch.Generator())
    with Record():
        sampler.sample()
    assert dtypes == [torch.float64]
