"""DP-SGD for your own PyTorch model and loop, with dptrain's guarantees (what Opacus'
``make_private`` does).

::

    from dptrain.training.private import make_private

    dp = make_private(model, optimizer, x, y, target_epsilon=1.0, delta=1e-5, max_grad_norm=1.0,
                      batch_size=256, epochs=5)
    for xb, yb in dp.batches():        # Poisson batches: every row joins with probability q = B/N
        stats = dp.step(xb, yb)        # clipped noisy gradient -> optimizer.step() -> accountant
    print(dp.epsilon(), dp.report()["guarantee"])

What it builds, all from dptrain itself: the model check (:mod:`dptrain.privacy.dpsgd.model_check`:
batch normalisation, buffers and models that mix the examples of a batch are refused by name),
the mechanism (:class:`dptrain.privacy.dpsgd.mechanism.DPSGDMechanism`: sigma given or calibrated to
``target_epsilon``, C, B, the public N and q = B/N, the planned steps, delta), the gradient
engine it builds (so the noise applied is the noise accounted), a Poisson sampler and the noise
generator seeded from the OS CSPRNG (:class:`dptrain.privacy.randomness.Randomness`; nothing
you hold can regenerate them), and the :class:`dptrain.privacy.accounting.PrivacyLedger`.
:meth:`PrivateTraining.report` is the privacy report a command-line run writes (privacy.json).

Your loop keeps its shape; only the gradient is dptrain's: :meth:`PrivateTraining.step` takes the
batch :meth:`PrivateTraining.batches` has just yielded (any other batch is refused: a batch that
was not Poisson-sampled is not what the accountant describes), computes the sum of per-example
gradients clipped to C plus N(0, sigma^2 C^2) noise, divided by the expected batch size B, into
every trainable parameter's ``.grad``, calls ``optimizer.step()`` and records the step. Do not
call ``loss.backward()`` on private rows yourself between the steps: such gradients are not
clipped or noised.

The loss is the objective's per-example loss: ``loss="binary"`` (default: binary cross-entropy
on one logit per example, the model ending in :class:`dptrain.privacy.dpsgd.layers.Squeeze`), the name of any
registered objective, or a callable ``loss(outputs, y)`` returning ONE LOSS PER EXAMPLE (shape
(n,), e.g. ``torch.nn.functional.cross_entropy(..., reduction="none")``); each example's loss
must depend on that example alone. A callable is probed before training like the model
(:func:`dptrain.privacy.dpsgd.model_check.check_loss`): a reduced loss, or one whose value or gradient
for one example moves when another example changes (a batch mean inside it), is refused by name.

``randomness``: fresh OS entropy by default; a :meth:`Randomness.from_seed_file` source is bound
to the rows (:meth:`Randomness.for_data` of :func:`~dptrain.privacy.randomness.data_digest` of
``x`` and ``y`` as the mechanism reads them), so the same key on a table with one row more draws
independent noise, and the same key on the same rows reproduces the run.

Not covered: the data's preprocessing (scale with PUBLIC bounds, never with statistics of the
rows), what you compute on the training rows outside :meth:`PrivateTraining.step` (the step's
``stats`` are non-private diagnostics), tuning across runs, and the model only sees what you
give it: tensors in memory, on the CPU.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import ConfigError, bad, integer, one_of, real
from dptrain.models.objectives import build_objective
from dptrain.privacy.accounting import ACCOUNTANTS, DEFAULT, REPORTED, SIGMA_RANGE, PrivacyLedger
from dptrain.privacy.budget import Budget
from dptrain.privacy.dpsgd.engine import ENGINES
from dptrain.privacy.dpsgd.loop import PrivateStep
from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism
from dptrain.privacy.dpsgd.model_check import check_loss, check_model
from dptrain.privacy.dpsgd.sampling import make_sampler
from dptrain.privacy.randomness import Randomness, data_digest
from dptrain.privacy.report import build_report
from dptrain.settings.train import GRAD_NORM_RANGE, MAX_STEPS, MAX_TARGET_EPSILON, default_delta

__all__ = ["DPConfig", "PrivateTraining", "make_private"]


@dataclass(frozen=True)
class DPConfig:
    """The DP-SGD settings of :class:`PrivateTraining` (each also a keyword argument).

    Exactly one of ``noise_multiplier`` (sigma) and ``target_epsilon`` (sigma calibrated by the
    ``accountant`` for the planned steps). ``batch_size`` is the EXPECTED batch size B of
    Poisson sampling (q = B/N); ``epochs`` may be fractional (steps = round(epochs N / B));
    ``delta: None`` picks the largest power of ten <= 1/(10 N)."""

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    batch_size: int = 256
    epochs: float = 1.0
    delta: float | None = None
    accountant: str = DEFAULT.name
    engine: str = "auto"  # auto (fast book-keeping when the model allows, else Opacus) | fast | opacus
    calibration_rtol: float = 1e-3


def dp_config(config: DPConfig | None = None, **settings: Any) -> DPConfig:
    """``config`` (default: DPConfig()) with ``settings`` replaced; an unknown name is refused
    with the closest valid one."""
    names = [f.name for f in fields(DPConfig)]
    for name in settings:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{name}={settings[name]!r} is not a DP-SGD setting{hint}; allowed: {', '.join(names)}")
    return replace(config if config is not None else DPConfig(), **settings)


def check_dp_config(c: DPConfig, n: int, *, names: dict[str, str] | None = None) -> float:
    """The settings' ranges (those of the command line's privacy and trainer sections) for N
    training rows; returns delta. ``names`` renames settings in messages (an estimator's own
    parameter names)."""
    nm = (names or {}).get
    s, e = c.noise_multiplier, c.target_epsilon
    if (s is None) == (e is None):
        raise ConfigError(f"{nm('noise_multiplier', 'noise_multiplier')}={s!r} and "
                          f"{nm('target_epsilon', 'target_epsilon')}={e!r}: set exactly one of them")
    if s is not None:
        lo, hi = SIGMA_RANGE
        real(nm("noise_multiplier", "noise_multiplier"), s, f"must be a number in [{lo:g}, {hi:g}] (0 is not "
             "allowed here: no noise, no guarantee)", lo=lo, hi=hi)
    else:
        real(nm("target_epsilon", "target_epsilon"), e, f"must be a number in (0, {MAX_TARGET_EPSILON:g}]",
             lo=0, hi=MAX_TARGET_EPSILON, lo_open=True)
    real(nm("max_grad_norm", "max_grad_norm"), c.max_grad_norm,
         f"must be a number in [{GRAD_NORM_RANGE[0]:g}, {GRAD_NORM_RANGE[1]:g}] (the clipping norm C)",
         lo=GRAD_NORM_RANGE[0], hi=GRAD_NORM_RANGE[1])
    integer(nm("batch_size", "batch_size"), c.batch_size, 1, f"must be an integer in [1, N = {n}] (the expected "
            "batch size B)")
    if c.batch_size > n:
        raise bad(nm("batch_size", "batch_size"), c.batch_size, f"must be <= N = {n} (the training rows)")
    real(nm("epochs", "epochs"), c.epochs, f"must be a number > 0 giving at most {MAX_STEPS:,} steps (epochs N / B)",
         lo=0, hi=MAX_STEPS * c.batch_size / n, lo_open=True)
    ACCOUNTANTS.get(c.accountant)
    if c.engine != "auto":
        one_of(nm("engine", "engine"), c.engine, ("auto", *ENGINES.names()))
    real("calibration_rtol", c.calibration_rtol, "must be in (0, 0.1)", lo=0, hi=0.1, lo_open=True, hi_open=True)
    delta = c.delta if c.delta is not None else default_delta(n)
    real(nm("delta", "delta"), delta, f"must be in (0, 1/N = {1 / n:.3g}) (or None for the default)",
         lo=0, hi=1 / n, lo_open=True, hi_open=True)
    return float(delta)


class LossObjective:
    """A user's per-example loss as an objective for the engine: the loss, and its gradient with
    respect to each example's outputs by autograd (what the fast engine's closed forms need)."""

    name = "custom"
    primary_metric = "loss"
    greater_is_better = False

    def __init__(self, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.loss = loss

    def per_example_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = self.loss(outputs, y)
        if not isinstance(losses, torch.Tensor) or losses.shape != outputs.shape[:1]:
            shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise DPTrainError(f"loss returned {shape} for a batch of {outputs.shape[0]} examples; allowed: one loss "
                               "per example, shape (n,) (e.g. reduction='none'): a mean or sum cannot be clipped "
                               "per example")
        return losses

    def output_gradient(self, outputs: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        with torch.enable_grad():
            z = outputs.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.per_example_loss(z, y).sum(), z)
        return out.copy_(g) if out is not None else g

    def correct(self, outputs: torch.Tensor, y: torch.Tensor) -> int:
        return 0  # no notion of a correct prediction for an arbitrary loss


def _objective(loss: Any) -> Any:
    if loss is None or isinstance(loss, str):
        return build_objective(loss or "binary")
    if callable(loss):
        return LossObjective(loss)
    raise bad("loss", loss, "must be None (binary), the name of a registered objective, or a callable "
              "loss(outputs, y) returning one loss per example")


def _tensor(value: Any, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``value`` as a contiguous tensor; a NumPy array's floats in the model's precision."""
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    if t.dim() == 0 or t.shape[0] == 0:
        raise DPTrainError(f"{name} must hold one entry per training row (at least one row)")
    if dtype is not None and t.is_floating_point() and not isinstance(value, torch.Tensor):
        t = t.to(dtype)
    return t.contiguous()


class PrivateTraining:
    """Your model, optimiser and in-memory rows (``x``: one row per example, ``y``: their
    targets) wrapped with dptrain's DP-SGD (module docstring). Settings: a :class:`DPConfig`
    and/or its fields as keyword arguments. ``randomness``: the source of the secret streams
    (default: fresh from the OS CSPRNG; :meth:`Randomness.from_seed_file` to opt into
    reproducible noise). ``names``: the caller's names of the settings, for messages."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, x: Any, y: Any, *, loss: Any = None,
                 randomness: Any = None, names: dict[str, str] | None = None, config: DPConfig | None = None,
                 **settings: Any) -> None:
        self.config = dp_config(config, **settings)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        #: the model's device: the rows, the sampler's stream and the noise generator go there
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.x, self.y = _tensor(x, "x", dtype).to(self.device), _tensor(y, "y", dtype).to(self.device)
        n = int(self.x.shape[0])
        if self.y.shape[0] != n:
            raise DPTrainError("x and y must have the same number of rows")
        delta = check_dp_config(self.config, n, names=names)
        self.objective = _objective(loss)
        check_model(model, in_features=int(self.x.shape[1]) if self.x.dim() == 2 else None)
        if isinstance(self.objective, LossObjective):
            check_loss(self.objective.loss, model, self.x, self.y)  # a loss mixing examples: refused by name
        if randomness is not None and not isinstance(randomness, Randomness):
            raise bad("randomness", randomness, "must be None (fresh from the OS CSPRNG) or a "
                      "dptrain.privacy.randomness.Randomness")
        # a reused noise key on other rows (one row more) must draw independent noise: bound to the rows
        self.randomness = (randomness if randomness is not None else Randomness.fresh()).for_data(
            data_digest(self.x, self.y))
        self.mechanism = _mechanism(self.config, n=n, delta=delta)
        self.model, self.optimizer = model, optimizer
        self.engine = self.mechanism.build_engine(model, engine=self.config.engine, objective=self.objective,
                                                  generator=self.randomness.torch("gaussian-noise",
                                                                                  device=self.device))
        self.sampler = make_sampler(num_rows=n, sample_rate=self.mechanism.sample_rate, randomness=self.randomness,
                                    index=0, device=self.device)
        self.accountant = PrivacyLedger()
        #: THE DP-SGD step (dptrain.privacy.dpsgd.loop): batches() draws from it, step() applies it
        self.private_step = PrivateStep(self.engine, self.sampler, optimizer, self.x, self.y,
                                        accountant=self.accountant)
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------ the loop
    @property
    def steps(self) -> int:
        """The planned number of steps (epochs / q, rounded)."""
        return self.mechanism.planned_steps

    @property
    def steps_done(self) -> int:
        """DP-SGD steps taken (a release recorded after them, e.g. an estimator's intervals, is an
        event of the accountant, not a step)."""
        return self.accountant.count(self.mechanism.event)

    def __len__(self) -> int:
        return self.steps

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The remaining planned steps' Poisson batches (x rows, y rows); each must be passed to
        :meth:`step` before the next is drawn. A batch may be empty (a noise-only step)."""
        while self.steps_done < self.steps:
            self._batch = self.private_step.draw()
            yield self._batch
            if self._batch is not None:
                self._batch = None
                raise DPTrainError("batches(): the batch just yielded was not passed to step(xb, yb); every Poisson "
                                   "batch must be used by exactly one step")

    __iter__ = batches

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> Any:
        """One DP-SGD step on the batch :meth:`batches` has just yielded: the clipped noisy
        gradient into ``.grad``, ``optimizer.step()``, the step recorded. Returns the step's
        non-private diagnostics (:class:`dptrain.privacy.dpsgd.engine.StepStats`)."""
        if self._batch is None or xb is not self._batch[0] or yb is not self._batch[1]:
            raise DPTrainError("step(xb, yb) takes the batch that batches() has just yielded, unchanged: another "
                               "batch is not Poisson-sampled and is not what the accountant records")
        self._batch = None
        return self.private_step.apply(xb, yb, self.mechanism.event)

    # ------------------------------------------------------------------ privacy
    def epsilon(self, *, accountant: str | None = None) -> float:
        """Epsilon of the steps taken so far at the mechanism's delta."""
        return self.accountant.get_epsilon(delta=self.mechanism.delta, accountant=accountant or self.config.accountant)

    def report(self, *, data_source: str = "in-memory tensors passed to dptrain.training.private.PrivateTraining",
               seed: int | None = None) -> dict[str, Any]:
        """The privacy report of the steps taken so far: the dict a command-line run writes to
        privacy.json (without its list of run-folder files)."""
        return training_report(self, data_source=data_source, seed=seed)


def planned_mechanism(config: DPConfig, n: int, *, names: dict[str, str] | None = None) -> Any:
    """The mechanism :class:`PrivateTraining` will run on ``n`` rows with ``config`` (its settings
    checked, sigma given or calibrated): for a caller that plans what follows DP-SGD from public
    numbers before training (the estimators' interval release)."""
    return _mechanism(config, n=n, delta=check_dp_config(config, n, names=names), quiet=True)


def budget_of(c: DPConfig, *, delta: float) -> Budget:
    """The :class:`Budget` of a :class:`DPConfig` (the Python API's door)."""
    return Budget(enabled=True, target=c.target_epsilon, noise_multiplier=c.noise_multiplier, delta=delta,
                  accountant=c.accountant, rtol=c.calibration_rtol)


def _mechanism(c: DPConfig, *, n: int, delta: float, quiet: bool = False) -> Any:
    return DPSGDMechanism.from_budget(budget_of(c, delta=delta), max_grad_norm=c.max_grad_norm, epochs=c.epochs,
                                      expected_batch_size=c.batch_size, dataset_size=n, delta=delta, quiet=quiet)


def training_report(run: PrivateTraining, *, data_source: str, seed: int | None) -> dict[str, Any]:
    """:func:`dptrain.privacy.report.build_report` for the steps ``run`` has taken."""
    m, steps = run.mechanism, run.steps_done
    record = {
        **m.report_fields(), **run.engine.noise_record(), "engine": run.engine.name, "steps": steps,
        "epochs": steps * m.sample_rate,
        "delta_source": "config" if run.config.delta is not None else "default: largest power of ten <= 1/(10 N)",
        "max_epsilon": None, "stopped_early": steps < m.planned_steps,
        "stop_reason": "completed the planned steps" if steps >= m.planned_steps else
        f"stopped by the caller after step {steps} of {m.planned_steps}",
        "resumed_from_step": 0, "resumed_from": None, "checkpoint": None,
        "randomness": run.randomness.describe(), "randomness_mode": run.randomness.mode, "distributed": None,
        "device": str(run.device),
    }
    names = list(dict.fromkeys([*(a.name for a in REPORTED), run.config.accountant]))
    epsilons = {name: run.accountant.get_epsilon(delta=m.delta, accountant=name) for name in names}
    report = build_report(mechanism=record, epsilons=epsilons, accountant=run.config.accountant,
                          seed=seed, data_source=data_source)
    return report


def make_private(model: nn.Module, optimizer: torch.optim.Optimizer, x: Any, y: Any, *, loss: Any = None,
                 randomness: Any = None, config: DPConfig | None = None, **settings: Any) -> PrivateTraining:
    """:class:`PrivateTraining` (Opacus' name for it): wrap ``model``, ``optimizer`` and the rows
    ``x``, ``y`` with dptrain's DP-SGD. Settings as :class:`DPConfig` or keyword arguments."""
    return PrivateTraining(model, optimizer, x, y, loss=loss, randomness=randomness, config=config, **settings)

