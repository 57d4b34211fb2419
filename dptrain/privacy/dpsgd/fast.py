"""The fast engine (``trainer.engine=fast``): book-keeping DP-SGD for ``nn.Linear`` stacks.

Per-example gradient norms from ``||g_i||^2 (||a_i||^2 + 1)`` per layer and the clipped sum as one
matrix product per layer (book-keeping; Goodfellow 2015, Li et al. 2022, Bu et al. 2023;
docs/engine.md). Never materialises per-example gradients. A plain stack (Linear, activation, ...,
Linear(., 1) + Squeeze, or a Linear(., K) head with K > 1 for multi-output objectives) runs
without autograd on buffers reused from step to step (dptrain.privacy.dpsgd.buffered), with the
bias gradients and 1/B folded into the same matrix products, then the step's noise added.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dptrain.privacy.dpsgd.base import GradientEngine, StepStats, refuse_mixing_models
from dptrain.privacy.dpsgd.buffered import ELEMENTWISE, Workspace, buffered_plan
from dptrain.privacy.dpsgd.layers import Squeeze
from dptrain.privacy.dpsgd.units import fast_unit_sums

__all__ = ["FastLinearEngine", "fast_path_blocker"]


def _row_sq_norms(m: torch.Tensor) -> torch.Tensor:
    """||m_i||^2 per row, without materialising m * m."""
    return torch.linalg.vector_norm(m, dim=1).square()


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
        elif not isinstance(m, (*ELEMENTWISE, Squeeze)):
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
    ||grad_b,i||^2 = ||g_i||^2, and sum_i c_i grad_W,i = (c * g)^T a (docs/engine.md).

    Three implementations of the same arithmetic:

    * one Linear to one output: closed form, g_i = the objective's output gradient (for binary
      logistic sigmoid(z_i) - y_i); one Linear to K > 1 outputs likewise, with g_i a K-vector
      (multinomial: softmax(z_i) - onehot(y_i)) and ||grad_i||^2 = ||g_i||^2 (||x_i||^2 + 1);
    * a plain stack (Linear, one activation, ..., Linear(., 1), Squeeze, or ending in a
      Linear(., K) head with K > 1 and no Squeeze): forward and backward
      written out on reusable buffers (:class:`Workspace`), without autograd, and the step's
      ``.grad`` formed by one ``addmm`` per weight that folds in the clip factors and 1/B, then
      one float64 add of the noise over all parameters:
      ``grad_W = round((1 / B) (c * g)^T a + (sigma C / B) z_W)`` (``fused``);
    * any other Sequential of Linear layers and elementwise activations: autograd with a hook
      on each Linear output that captures its output gradient.
    """

    name = "fast"

    def __init__(self, model: nn.Module, **kwargs) -> None:
        refuse_mixing_models(model, type(self).__name__)  # the reason that matters, first
        reason = fast_path_blocker(model)
        if reason is not None:
            raise ValueError(f"trainer.engine=fast cannot run this model: {reason}")
        super().__init__(model, **kwargs)
        self.layers = list(model)
        linears = [m for m in self.layers if isinstance(m, nn.Linear)]
        self.closed_form = (
            len(linears) == 1 and linears[0].out_features == 1 and isinstance(self.layers[0], nn.Linear)
            and all(isinstance(m, Squeeze) for m in self.layers[1:])
        ) or (len(self.layers) == 1 and isinstance(self.layers[0], nn.Linear) and linears[0].out_features > 1)
        #: the model's output is a vector (n,) (a width-1 head and a Squeeze), else (n, K)
        self._squeeze = isinstance(self.layers[-1], Squeeze)
        self.linears = linears
        self._has_bias = [lin.bias is not None for lin in linears]
        first = linears[0]
        self._backward_target = [first.bias if first.bias is not None else first.weight]
        self.plan = None if self.closed_form else buffered_plan(model)
        self.fused = self.closed_form or self.plan is not None
        #: the buffered path's layout (:class:`Workspace`): a ones column beside each hidden
        #: layer's output on the CPU, none on a GPU (the same arithmetic; tests flip it)
        self.ones_column = self.device.type == "cpu"
        self._ws: Workspace | None = None

    # ------------------------------------------------------------------ shared pieces
    def per_example_sq_norms(self, inputs: list[torch.Tensor], out_grads: list[torch.Tensor],
                             has_bias: list[bool]) -> torch.Tensor:
        """||grad_i||^2 over all layers: sum_l ||g_l,i||^2 (||a_l,i||^2 + [layer l has a bias]).
        An output gradient given as a vector (n,) is a width-1 layer's."""
        sq = None
        for a, g, bias in zip(inputs, out_grads, has_bias):
            term = _row_sq_norms(a)
            if bias:
                term.add_(1.0)
            term.mul_(g.square() if g.dim() == 1 else _row_sq_norms(g))
            sq = term if sq is None else sq.add_(term)
        return sq

    def _grad_views(self, dtype: torch.dtype) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Where this step's ``.grad`` tensors are written: one fresh flat zero buffer of the rows'
        dtype and its views by parameter id (the clipped sums are written into them, then
        :meth:`_add_noise` adds the noise to the whole buffer)."""
        flat = torch.zeros(sum(self._sizes), dtype=dtype, device=self.device)
        return flat, {id(p): v.view_as(p) for p, v in zip(self.params, flat.split(self._sizes))}

    @staticmethod
    def _add_noise(flat: torch.Tensor, noise: torch.Tensor | None, noise_scale: float) -> None:
        """``flat += noise_scale * noise``: computed in the noise's dtype (float64, or float32 for the
        refined float32 draw) and rounded once into ``flat``'s dtype, so the noise keeps its tail
        (dptrain.privacy.noise_law)."""
        if noise is not None:
            flat.add_(noise, alpha=noise_scale)

    @torch.no_grad()
    def _logistic_noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                              noise_scale: float, sum_scale: float,
                              row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """One Linear to one output in closed form: g_i = dL_i/dz_i (the objective's output
        gradient; sigmoid(z_i) - y_i for binary logistic), so example i's
        gradient is g_i (x_i, 1), of squared norm g_i^2 (||x_i||^2 + 1) (docs/engine.md). The
        weight gradient is one matrix-vector product x^T (c * g), then the float64 noise is added."""
        lin = self.layers[0]
        bias = lin.bias is not None
        z = torch.addmv(lin.bias, x, lin.weight[0]) if bias else torch.mv(x, lin.weight[0])
        g = self.objective.output_gradient(z, y)
        if row_weights is not None:
            g.mul_(row_weights)
        sq = self.per_example_sq_norms([x], [g], [bias])
        stats = self.step_stats(z, y, None, sq)
        g.mul_(self.clip_factors(sq))
        flat, views = self._grad_views(x.dtype)
        views[id(lin.weight)].view(-1).addmv_(x.t(), g, beta=0.0, alpha=sum_scale)
        if bias:
            views[id(lin.bias)].add_(g.sum(), alpha=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    @torch.no_grad()
    def _linear_head_noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                                 noise_scale: float, sum_scale: float,
                                 row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """One Linear to K > 1 outputs in closed form: g_i = dL_i/dz_i, a K-vector (the
        objective's output gradient; softmax(z_i) - onehot(y_i) for multinomial), so example i's
        gradient is the outer product g_i (x_i, 1)^T, of squared norm ||g_i||^2 (||x_i||^2 + 1).
        The weight gradient is one matrix product (c * g)^T x, then the float64 noise is added."""
        lin = self.layers[0]
        bias = lin.bias is not None
        z = torch.addmm(lin.bias, x, lin.weight.t()) if bias else torch.mm(x, lin.weight.t())
        g = self.objective.output_gradient(z, y)
        if row_weights is not None:
            g.mul_(row_weights[:, None])
        sq = self.per_example_sq_norms([x], [g], [bias])
        stats = self.step_stats(z, y, None, sq)
        g.mul_(self.clip_factors(sq)[:, None])
        flat, views = self._grad_views(x.dtype)
        views[id(lin.weight)].addmm_(g.t(), x, beta=0.0, alpha=sum_scale)
        if bias:
            views[id(lin.bias)].add_(g.sum(0), alpha=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    def unit_clipped_sum(self, x: torch.Tensor, y: torch.Tensor, units) -> tuple[list[torch.Tensor], StepStats]:
        """Person-level clipping by book-keeping (:func:`dptrain.privacy.dpsgd.units.fast_unit_sums`)."""
        return fast_unit_sums(self, x, y, units)

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
        if self.closed_form or self.plan is not None:
            return self.noisy_grads(x, y, noise=None, noise_scale=0.0, sum_scale=1.0)
        return self._autograd_clipped_sum(x, y)

    # ------------------------------------------------------------------ buffered path
    def workspace(self, n: int, dtype: torch.dtype) -> Workspace:
        """The buffered path's buffers for at least ``n`` rows of ``dtype``, reused while they fit
        (a CUDA-graph step allocates them once, outside the graph: dptrain.privacy.dpsgd.graph)."""
        ws = self._ws
        if ws is None or ws.capacity < n or ws.d[0].dtype != dtype or ws.ones_column != self.ones_column:
            # room for the batch-size fluctuations of Poisson sampling (sd ~ sqrt(B))
            cap = n + 3 * math.isqrt(n) + 8
            self._ws = None  # free the old buffers first
            self._ws = ws = Workspace(self.plan, cap, dtype, self.params[0].device, ones_column=self.ones_column)
        return ws

    @torch.no_grad()
    def noisy_grads(self, x: torch.Tensor, y: torch.Tensor, *, noise: torch.Tensor | None,
                    noise_scale: float, sum_scale: float,
                    row_weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], StepStats]:
        """As :meth:`GradientEngine.noisy_grads`; ``row_weights`` (n,), 0 or 1 per row, multiplies
        each example's output gradient: a row of weight 0 has a zero gradient, so it adds nothing
        to the sums (the padding rows of a CUDA-graph step, dptrain.privacy.dpsgd.graph). Its other
        diagnostics are not masked: a caller that passes weights computes no step_stats."""
        if self.closed_form:
            head = self._logistic_noisy_grads if self._squeeze or self.linears[0].out_features == 1 \
                else self._linear_head_noisy_grads
            return head(x, y, noise=noise, noise_scale=noise_scale, sum_scale=sum_scale, row_weights=row_weights)
        if self.plan is None:
            if row_weights is not None:
                raise ValueError("row_weights need the fused fast path (a closed-form head or the buffered MLP path)")
            return super().noisy_grads(x, y, noise=noise, noise_scale=noise_scale, sum_scale=sum_scale)
        n = x.shape[0]
        ws = self.workspace(n, x.dtype)
        inputs, aug_inputs, pre, post, logits = self._buffered_forward(x, ws)
        losses = self.objective.per_example_loss(logits, y) if self.collect_stats else None
        out_grads = self._buffered_backward(logits, y, ws, pre, post, row_weights)
        sq = self.per_example_sq_norms(inputs, out_grads, self._has_bias)
        stats = self.step_stats(logits, y, losses, sq)
        flat, views = self._grad_views(x.dtype)
        self._buffered_products(ws, self.clip_factors(sq), (inputs, aug_inputs, out_grads), views=views,
                                sum_scale=sum_scale)
        self._add_noise(flat, noise, noise_scale)
        return [views[id(p)] for p in self.params], stats

    def _buffered_forward(self, x: torch.Tensor, ws: Workspace) -> tuple:
        """z_k = a_k W_k^T + b_k, h_k = act(z_k) (in place where the derivative needs only h);
        h_k is written into the first columns of [h_k | 1]. Returns (inputs a_k, [a_k | 1] for
        k >= 1, pre-activations, outputs, logits)."""
        n, plan, last = x.shape[0], self.plan, len(self.plan) - 1
        inputs, aug_inputs, pre, post = [], [], [], []
        a, a_aug = x, None
        width_end = -1 if ws.ones_column else None  # the hidden outputs' columns in ws.aug[k]
        for k, (lin, act) in enumerate(plan):
            inputs.append(a)
            aug_inputs.append(a_aug)
            out = ws.aug[k][:n, :width_end] if k < last else (ws.last_h[:n] if ws.last_h is not None else ws.z[k][:n])
            z = ws.z[k][:n] if ws.z[k] is not None else out
            if lin.bias is None:
                torch.mm(a, lin.weight.t(), out=z)
            elif a_aug is not None:
                wb = ws.waug[k]
                wb[:, :-1].copy_(lin.weight)
                wb[:, -1].copy_(lin.bias)
                torch.mm(a_aug, wb.t(), out=z)
            else:
                torch.addmm(lin.bias, a, lin.weight.t(), out=z)
            if act is not None:
                act.fwd(z, out)
            pre.append(z)
            post.append(out)
            a, a_aug = out, None
            if k < last and ws.ones_column:
                a_aug = ws.aug[k][:n]
                a_aug[:, -1].fill_(1.0)  # the ones column (the last step may have scaled it by c)
        return inputs, aug_inputs, pre, post, (a.view(n) if self._squeeze else a)

    def _buffered_backward(self, logits: torch.Tensor, y: torch.Tensor, ws: Workspace, pre: list,
                           post: list, row_weights: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Backward of the SUM of per-example losses: output gradients g_k (n, out_k); a row of
        weight 0 (``row_weights``) gets g = 0 at the output, hence at every layer."""
        n, plan, last = logits.shape[0], self.plan, len(self.plan) - 1
        out_grads: list[torch.Tensor] = [None] * len(plan)  # type: ignore[list-item]
        g = ws.d[last][:n]
        self.objective.output_gradient(logits, y, out=g.view(n) if self._squeeze else g)  # d loss_i / d z_i
        if row_weights is not None:
            g.mul_(row_weights[:, None])
        for k in range(last, -1, -1):
            act = plan[k][1]
            if act is not None:
                act.bwd(g, pre[k], post[k])
            out_grads[k] = g
            if k > 0:
                torch.mm(g, plan[k][0].weight, out=ws.d[k - 1][:n])
                g = ws.d[k - 1][:n]
        return out_grads

    def _buffered_products(self, ws: Workspace, factors: torch.Tensor, trace: tuple, *, views: dict,
                           sum_scale: float) -> None:
        """``views`` (zeros) = sum_scale * sum_i c_i grad_i, per layer: scale the narrower operand
        by the clip factors c, one matrix product written into the layer's views (the noise is
        added afterwards, in float64: :meth:`_add_noise`). ``trace``: the forward's inputs a_k
        and [a_k | 1] and the backward's output gradients."""
        n, col = factors.shape[0], factors[:, None]
        inputs, aug_inputs, out_grads = trace
        for k, ((lin, _), a, a_aug, g) in enumerate(zip(self.plan, inputs, aug_inputs, out_grads)):
            gw = views[id(lin.weight)]
            if lin.bias is None or not ws.ones_column:  # the weight alone; a bias (GPU layout) apart
                gb = views[id(lin.bias)] if lin.bias is not None else None
                if a.shape[1] < g.shape[1]:  # scale a (the input x into a buffer): bias = g^T c
                    a = torch.mul(a, col, out=ws.x_aug[:n, :a.shape[1]]) if k == 0 else a.mul_(col)
                    if gb is not None:
                        gb.addmv_(g.t(), factors, beta=0.0, alpha=sum_scale)
                else:
                    g.mul_(col)
                    if gb is not None:
                        gb.add_(g.sum(0), alpha=sum_scale)
                gw.addmm_(g.t(), a, beta=0.0, alpha=sum_scale)
                continue
            gb, t = views[id(lin.bias)], ws.wt[k]
            if k == 0 and ws.x_aug is not None:  # [c * x | c]
                a_aug = ws.x_aug[:n]
                torch.mul(a, col, out=a_aug[:, :-1])
                a_aug[:, -1].copy_(factors)
            elif k == 0:  # the input is wider than the layer: scale g, bias from a column sum
                g.mul_(col)
                torch.addmm(t[:, :-1], g.t(), a, beta=0.0, alpha=sum_scale, out=t[:, :-1])
                torch.sum(g, 0, out=t[:, -1]).mul_(sum_scale)
                a_aug = None
            elif g.shape[1] <= a_aug.shape[1]:
                g.mul_(col)
            else:
                a_aug.mul_(col)  # also turns the ones column into c
            if a_aug is not None:
                torch.addmm(t, g.t(), a_aug, beta=0.0, alpha=sum_scale, out=t)
            gw.copy_(t[:, :-1])
            gb.copy_(t[:, -1])

    # ------------------------------------------------------------------ autograd path
    def _autograd_clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list[torch.Tensor], StepStats]:
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
        losses = self.objective.per_example_loss(h, y)
        # Backward only as far as the first layer's output gradient: ask for the cheapest leaf
        # on that path (the first bias: a column sum), so no weight gradient is ever formed.
        torch.autograd.grad(losses.sum(), self._backward_target)
        with torch.no_grad():
            sq = self.per_example_sq_norms(inputs, out_grads, self._has_bias)
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


#: the DP engines by name (``trainer.engine``; ``auto`` picks "fast" when it can run the model,
