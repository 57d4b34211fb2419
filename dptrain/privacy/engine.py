"""The DP-SGD step: Poisson sampling, per-example clipping, Gaussian noise (PRIVACY.md).

One small interface, :class:`GradientEngine`: ``engine(x, y)`` takes the examples of one
Poisson batch and leaves in every trainable parameter's ``.grad``

    (sum_i clip_C(grad_i) + N(0, sigma^2 C^2 I)) / B

where ``clip_C(v) = v * min(1, C / (||v|| + 1e-6))`` over ALL parameters (flat clipping), the
noise is drawn ONCE per step for the whole sum, and B is the EXPECTED batch size (the realised
batch size is private and is never used to scale). Any optimiser can then consume ``.grad``
(post-processing).

Engines:

* :class:`FastLinearEngine` ("fast"): models made of ``nn.Linear`` layers and elementwise
  activations. Per-example gradient norms from ``||g_i||^2 (||a_i||^2 + 1)`` per layer and the
  clipped sum as one matrix product per layer (book-keeping; Goodfellow 2015, Li et al. 2022,
  Bu et al. 2023; ENGINE.md). Never materialises per-example gradients.
* :class:`OpacusEngine` ("opacus"): any model Opacus' ``GradSampleModule`` supports; per-example
  gradients are materialised by Opacus' hooks, clipping and noise are done here.
* :class:`NonPrivateEngine`: the same pipeline with no clipping and no noise (sum / B).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

_CLIP_EPS = 1e-6  # as Opacus: factor = C / (norm + 1e-6), capped at 1


class PoissonSampler:
    """Poisson subsampling over in-memory rows: each of the N rows joins a batch independently
    with probability q. Batches vary in size and may be empty (a noise-only step).

    Two exact implementations of the same law: for q > 0.1 a Bernoulli mask over all rows
    (O(N)); otherwise the batch size k ~ Binomial(N, q), then a uniform k-subset without
    replacement (numpy's ``Generator.choice``, O(k), so a step does not cost O(N) when N is in
    the millions). Given its size a Poisson batch is a uniform subset, so both are the same law.
    Drawn with numpy (single-threaded: no OpenMP wake-ups on tiny steps); indices are returned
    sorted ascending as an int64 tensor.
    """

    DENSE_ABOVE = 0.1

    def __init__(self, *, num_rows: int, sample_rate: float, rng: np.random.Generator) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate={sample_rate!r} is not allowed: must be in [0, 1]")
        self.num_rows = int(num_rows)
        self.sample_rate = float(sample_rate)
        self.rng = rng

    def sample(self) -> torch.Tensor:
        """Indices (int64, sorted ascending, distinct) of one Poisson batch."""
        n, rng = self.num_rows, self.rng
        if self.sample_rate > self.DENSE_ABOVE:
            idx = np.flatnonzero(rng.random(n) < self.sample_rate)
        else:
            idx = np.sort(rng.choice(n, size=rng.binomial(n, self.sample_rate), replace=False))
        return torch.from_numpy(idx.astype(np.int64, copy=False))


@dataclass(frozen=True)
class StepStats:
    """Diagnostics of one step, computed on PRIVATE training rows: not covered by the guarantee."""

    batch_size: int
    loss_sum: float
    correct: int
    clipped: int  # examples whose gradient norm exceeded C


def _row_sq_norms(m: torch.Tensor) -> torch.Tensor:
    """||m_i||^2 per row, without materialising m * m."""
    return torch.linalg.vector_norm(m, dim=1).square()


def per_example_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits, one value per example."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="none")


class GradientEngine:
    """Base: holds the model, C, sigma, B and the noise generator."""

    name = "base"
    PREFETCH_MIN_PARAMS = 1 << 15

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        expected_batch_size: float,
        generator: torch.Generator,
    ) -> None:
        self.model = model
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._sizes = [p.numel() for p in self.params]
        #: compute the non-private diagnostics (loss, accuracy, clipped count) of each step;
        #: the training loop switches it on only for the steps it logs.
        self.collect_stats = True
        #: a :class:`dptrain.distributed.DistContext` when one job runs across processes
        self.dist = None
        #: draw the next step's standard-normal vector in a background thread while this step
        #: computes (the draw is data-independent; the stream of draws is the same as drawing
        #: each step in turn). Only worth it when a draw costs more than handing it to a thread
        #: (~0.1 ms for 2^15 numbers here): on for the MLP (91k parameters), off for the logit.
        self.prefetch_noise = sum(self._sizes) >= self.PREFETCH_MIN_PARAMS
        self._pending = None  # (future of the next N(0, I) draw, generator state before it)
        self._executor = None

    # ------------------------------------------------------------------ noise
    def _draw(self) -> torch.Tensor:
        return torch.empty(sum(self._sizes)).normal_(0.0, 1.0, generator=self.generator)

    def _standard_normal(self) -> torch.Tensor:
        """This step's N(0, I) vector (one per step, whole model), and the next one queued."""
        if not self.prefetch_noise:
            self.discard_prefetched_noise()
            return self._draw()
        if self._pending is None:
            z = self._draw()
        else:
            z = self._pending[0].result()
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dptrain-noise")
        state = self.generator.get_state()
        self._pending = (self._executor.submit(self._draw), state)
        return z

    def discard_prefetched_noise(self) -> None:
        """Forget a queued draw and rewind the generator to before it (as if never drawn)."""
        if self._pending is not None:
            future, state = self._pending
            future.result()
            self.generator.set_state(state)
            self._pending = None

    def noise_generator_state(self) -> torch.Tensor:
        """The noise generator's state as a sequential run would have it now (for checkpoints):
        a queued, not yet used draw does not count."""
        if self._pending is not None:
            self._pending[0].result()
            return self._pending[1].clone()
        return self.generator.get_state()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        if x.shape[0] == 0:
            sums = [torch.zeros_like(p) for p in self.params]
            stats = StepStats(0, 0.0, 0, 0)
        else:
            sums, stats = self.clipped_sum(x, y)
        if self.dist is not None:
            return self._distributed_finish(sums, stats)
        inv_b = 1.0 / self.expected_batch_size
        std = self.noise_multiplier * self.max_grad_norm * inv_b
        # one Gaussian draw per coordinate per step, for the whole sum: N(0, sigma^2 C^2) / B
        noise = self._standard_normal() if std > 0 else None
        chunks = noise.split(self._sizes) if noise is not None else [None] * len(sums)
        for p, total, z in zip(self.params, sums, chunks):
            total.mul_(inv_b)  # sums are fresh tensors: in place is safe
            if z is not None:
                total.add_(z.view_as(total), alpha=std)
            p.grad = total
        return stats

    def _distributed_finish(self, sums: list[torch.Tensor], stats: StepStats) -> StepStats:
        """Across processes: rank 0 adds the step's ONE noise draw N(0, sigma^2 C^2) to its local
        clipped sum, one all_reduce adds every rank's sum, then all ranks divide by the GLOBAL
        expected batch size B (dptrain.distributed)."""
        flat = torch.cat([s.reshape(-1) for s in sums])
        std = self.noise_multiplier * self.max_grad_norm
        if self.dist.is_main and std > 0:
            flat.add_(self._standard_normal(), alpha=std)
        self.dist.all_reduce_sum(flat)
        flat.mul_(1.0 / self.expected_batch_size)
        for p, chunk in zip(self.params, flat.split(self._sizes)):
            p.grad = chunk.view_as(p).clone()
        if self.collect_stats:  # job-wide diagnostics on logged steps (non-private)
            t = torch.tensor([stats.batch_size, stats.loss_sum, stats.correct, stats.clipped], dtype=torch.float64)
            self.dist.all_reduce_sum(t)
            return StepStats(int(t[0]), float(t[1]), int(t[2]), int(t[3]))
        return stats

    def step_stats(self, logits: torch.Tensor, y: torch.Tensor, losses: torch.Tensor | None = None,
                   sq_norms: torch.Tensor | None = None) -> StepStats:
        """Diagnostics of a step (computed on private rows: NOT covered by the guarantee), or
        only the realised batch size when ``collect_stats`` is off."""
        n = int(y.shape[0])
        if not self.collect_stats:
            return StepStats(n, float("nan"), 0, 0)
        with torch.no_grad():
            losses = per_example_loss(logits, y) if losses is None else losses
            correct = int(((logits > 0).to(y.dtype) == y).sum())
            clipped = 0 if sq_norms is None else self.count_clipped(sq_norms)
            return StepStats(n, float(losses.sum()), correct, clipped)

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        """Sum over the batch of per-example gradients clipped to C, one tensor per parameter."""
        raise NotImplementedError

    def clip_factors(self, sq_norms: torch.Tensor) -> torch.Tensor:
        """c_i = min(1, C / (||g_i|| + 1e-6)) from squared per-example norms."""
        return (self.max_grad_norm / (sq_norms.sqrt() + _CLIP_EPS)).clamp(max=1.0)

    def count_clipped(self, sq_norms: torch.Tensor) -> int:
        """Examples whose gradient norm exceeds C (a non-private diagnostic)."""
        return int((sq_norms > self.max_grad_norm**2).sum())


class NonPrivateEngine(GradientEngine):
    """No clipping, no noise: ``.grad = sum_i grad_i / B``. The comparison pipeline."""

    name = "nonprivate"

    def __init__(self, model: nn.Module, *, expected_batch_size: float, generator: torch.Generator) -> None:
        super().__init__(
            model, max_grad_norm=float("inf"), noise_multiplier=0.0,
            expected_batch_size=expected_batch_size, generator=generator,
        )

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        logits = self.model(x)
        losses = per_example_loss(logits, y)
        grads = torch.autograd.grad(losses.sum(), self.params)
        return list(grads), self.step_stats(logits.detach(), y, losses.detach())


class OpacusEngine(GradientEngine):
    """Per-example gradients from Opacus' GradSampleModule hooks (materialised), flat clipping."""

    name = "opacus"

    def __init__(self, model: nn.Module, **kwargs) -> None:
        from opacus import GradSampleModule

        super().__init__(model, **kwargs)
        self.gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        logits = self.gsm(x)
        losses = per_example_loss(logits, y)
        with warnings.catch_warnings():  # Opacus' hooks fire on outputs when x has no grad: expected
            warnings.simplefilter("ignore", UserWarning)
            losses.sum().backward()
        per_ex = [p.grad_sample.reshape(x.shape[0], -1) for p in self.params]
        sq = torch.stack([g.pow(2).sum(1) for g in per_ex]).sum(0)
        factors = self.clip_factors(sq)
        sums = [torch.einsum("i,i...->...", factors, p.grad_sample) for p in self.params]
        for p in self.params:
            p.grad_sample = None
            p.grad = None
        return sums, self.step_stats(logits.detach(), y, losses.detach(), sq)


_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid, nn.Identity)


def fast_path_blocker(model: nn.Module) -> str | None:
    """Why the fast engine cannot run this model, or None if it can.

    Supported: ``nn.Sequential`` of ``nn.Linear`` (each parameter used once), elementwise
    activations and a final squeeze, inputs without a sequence dimension.
    """
    if not isinstance(model, nn.Sequential):
        return f"model is {type(model).__name__}, not nn.Sequential"
    seen: set[int] = set()
    for m in model:
        if isinstance(m, nn.Linear):
            for p in m.parameters():
                if id(p) in seen:
                    return "a parameter is shared between layers"
                seen.add(id(p))
        elif not isinstance(m, _ELEMENTWISE) and type(m).__name__ != "Squeeze":
            return f"layer {type(m).__name__} is not Linear or an elementwise activation"
    if any(p.requires_grad and id(p) not in seen for p in model.parameters()):
        return "a trainable parameter is not in a Linear layer"
    if any(not p.requires_grad for m in model if isinstance(m, nn.Linear) for p in m.parameters()):
        return "a Linear layer has frozen parameters"
    return None


class FastLinearEngine(GradientEngine):
    """Book-keeping DP-SGD for Sequential(Linear, activation, ..., Linear): no per-example
    gradients. For a Linear layer z = a W^T + b and output gradients g (one row per example,
    from the SUM of per-example losses): ||grad_W,i||^2 = ||g_i||^2 ||a_i||^2,
    ||grad_b,i||^2 = ||g_i||^2, and sum_i c_i grad_W,i = (c * g)^T a (ENGINE.md)."""

    name = "fast"

    def __init__(self, model: nn.Module, **kwargs) -> None:
        reason = fast_path_blocker(model)
        if reason is not None:
            raise ValueError(f"trainer.engine=fast cannot run this model: {reason}")
        super().__init__(model, **kwargs)
        self.layers = list(model)
        linears = [m for m in self.layers if isinstance(m, nn.Linear)]
        self.closed_form = (
            len(linears) == 1 and linears[0].out_features == 1 and isinstance(self.layers[0], nn.Linear)
            and all(type(m).__name__ == "Squeeze" for m in self.layers[1:])
        )
        self.linears = linears
        first = linears[0]
        self._backward_target = [first.bias if first.bias is not None else first.weight]

    @torch.no_grad()
    def _logistic_clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        """Logistic regression in closed form: dL_i/dz_i = sigmoid(z_i) - y_i, so example i's
        gradient is g_i (x_i, 1), of squared norm g_i^2 (||x_i||^2 + 1) (ENGINE.md)."""
        lin = self.layers[0]
        z = F.linear(x, lin.weight, lin.bias).squeeze(-1)
        g = torch.sigmoid(z) - y
        sq = g.square() * (_row_sq_norms(x) + (1.0 if lin.bias is not None else 0.0))
        cg = g * self.clip_factors(sq)
        grad_of = {id(lin.weight): (cg @ x).unsqueeze(0)}
        if lin.bias is not None:
            grad_of[id(lin.bias)] = cg.sum().reshape(1)
        return [grad_of[id(p)] for p in self.params], self.step_stats(z, y, None, sq)

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        if self.closed_form:
            return self._logistic_clipped_sum(x, y)
        # Forward pass keeping each Linear layer's input a_l (the activations autograd saves
        # anyway) and a hook on its output z_l that captures the output gradient g_l during the
        # backward pass. The pre-activations z_l themselves are NOT kept (holding them for
        # autograd.grad(outputs=z) cost one extra (B, width) tensor per layer).
        inputs: list[torch.Tensor] = []
        out_grads: list[torch.Tensor | None] = [None] * len(self.linears)
        h = x
        for m in self.layers:
            if isinstance(m, nn.Linear):
                inputs.append(h.detach())
                h = m(h)
                h.register_hook(self._capture(out_grads, len(inputs) - 1))
            else:
                h = m(h)
        losses = per_example_loss(h, y)
        # Backward only as far as the first layer's output gradient: ask for the cheapest leaf
        # on that path (the first bias: a column sum), so no weight gradient is ever formed.
        torch.autograd.grad(losses.sum(), self._backward_target)
        has_bias = [lin.bias is not None for lin in self.linears]
        sq = torch.zeros(x.shape[0], dtype=x.dtype)
        for a, g, bias in zip(inputs, out_grads, has_bias):
            sq += _row_sq_norms(g) * (_row_sq_norms(a) + (1.0 if bias else 0.0))
        factors = self.clip_factors(sq)
        grad_of: dict[int, torch.Tensor] = {}
        for a, g, lin in zip(inputs, out_grads, self.linears):
            # sum_i c_i g_i^T a_i: scale the narrower operand by c (fewer multiplications)
            if a.shape[1] < g.shape[1]:
                grad_of[id(lin.weight)] = g.T @ (a * factors[:, None])
            else:
                grad_of[id(lin.weight)] = g.mul_(factors[:, None]).T @ a  # g is a fresh tensor
                if lin.bias is not None:
                    grad_of[id(lin.bias)] = g.sum(0)
                continue
            if lin.bias is not None:
                grad_of[id(lin.bias)] = factors @ g
        sums = [grad_of[id(p)] for p in self.params]
        return sums, self.step_stats(h.detach(), y, losses.detach(), sq)

    @staticmethod
    def _capture(store: list, k: int):
        def hook(grad: torch.Tensor) -> None:
            store[k] = grad
        return hook


def make_engine(
    model: nn.Module,
    *,
    engine: str,
    private: bool,
    max_grad_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
) -> GradientEngine:
    """Pick the engine: ``auto`` takes the fast path when every trainable layer supports it,
    else Opacus (and logs why)."""
    if not private:
        return NonPrivateEngine(model, expected_batch_size=expected_batch_size, generator=generator)
    kwargs = dict(
        max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier,
        expected_batch_size=expected_batch_size, generator=generator,
    )
    if engine == "auto":
        reason = fast_path_blocker(model)
        if reason is None:
            return FastLinearEngine(model, **kwargs)
        log.info("DP engine: falling back to Opacus per-example gradients (%s)", reason)
        return OpacusEngine(model, **kwargs)
    if engine == "fast":
        return FastLinearEngine(model, **kwargs)
    if engine == "opacus":
        return OpacusEngine(model, **kwargs)
    raise ValueError(f"trainer.engine={engine!r} is not allowed: must be auto, fast or opacus")
