"""The buffered path of the fast engine (dptrain.privacy.dpsgd.fast): a plain stack (Linear, one
activation, ..., Linear) run forward and backward without autograd, on buffers reused from step to
step (docs/engine.md, "The buffered path").

* :func:`buffered_plan`: ``[(Linear, activation or None), ...]`` for a model the path can run;
* :class:`Activation`: an elementwise activation's forward and backward on those buffers;
* :class:`Workspace`: the buffers themselves, for a capacity of rows.
"""

from __future__ import annotations

import torch
from torch import nn

from dptrain.privacy.dpsgd.layers import Squeeze

__all__ = ["ELEMENTWISE", "Activation", "Workspace", "buffered_plan"]

ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid, nn.Identity)


class Activation:
    """Forward and backward of one elementwise activation on reusable buffers (no autograd).

    ``in_place``: the output overwrites the pre-activation z and the derivative is computed
    from the output h alone (ReLU, Tanh, Sigmoid, LeakyReLU / ELU with a non-negative slope /
    alpha: the same formulas autograd uses). Otherwise (GELU, SiLU, ...) h goes to its own
    buffer and the derivative is computed from z, which is kept, as autograd keeps it.
    """

    def __init__(self, module: nn.Module) -> None:
        aten = torch.ops.aten
        self.module = module
        if isinstance(module, nn.ReLU):
            self.in_place = True
            self.fwd = lambda z, h: torch.relu_(z)
            self.bwd = lambda d, z, h: aten.threshold_backward.grad_input(d, h, 0, grad_input=d)
        elif isinstance(module, nn.Tanh):
            self.in_place = True
            self.fwd = lambda z, h: torch.tanh_(z)
            self.bwd = lambda d, z, h: aten.tanh_backward.grad_input(d, h, grad_input=d)
        elif isinstance(module, nn.Sigmoid):
            self.in_place = True
            self.fwd = lambda z, h: torch.sigmoid_(z)
            self.bwd = lambda d, z, h: aten.sigmoid_backward.grad_input(d, h, grad_input=d)
        elif isinstance(module, nn.LeakyReLU):
            s = float(module.negative_slope)
            self.in_place = s >= 0  # then sign(h) = sign(z)
            if self.in_place:
                self.fwd = lambda z, h: aten.leaky_relu_(z, s)
                self.bwd = lambda d, z, h: aten.leaky_relu_backward.grad_input(d, h, s, True, grad_input=d)
            else:
                self.fwd = lambda z, h: aten.leaky_relu.out(z, s, out=h)
                self.bwd = lambda d, z, h: aten.leaky_relu_backward.grad_input(d, z, s, False, grad_input=d)
        elif isinstance(module, nn.ELU):
            a = float(module.alpha)
            self.in_place = a >= 0  # then z <= 0 <=> h <= 0 and dh/dz = h + alpha there
            if self.in_place:
                self.fwd = lambda z, h: aten.elu_(z, a, 1, 1)
                self.bwd = lambda d, z, h: aten.elu_backward.grad_input(d, a, 1, 1, True, h, grad_input=d)
            else:
                self.fwd = lambda z, h: aten.elu.out(z, a, 1, 1, out=h)
                self.bwd = lambda d, z, h: aten.elu_backward.grad_input(d, a, 1, 1, False, z, grad_input=d)
        elif isinstance(module, nn.GELU):
            approx = module.approximate
            self.in_place = False
            # (gelu.out ignores a non-contiguous ``out`` in torch 2.13: copy, then in place)
            self.fwd = lambda z, h: aten.gelu_(h.copy_(z), approximate=approx)
            self.bwd = lambda d, z, h: aten.gelu_backward.grad_input(d, z, approximate=approx, grad_input=d)
        elif isinstance(module, nn.SiLU):
            self.in_place = False
            self.fwd = lambda z, h: aten.silu.out(z, out=h)
            self.bwd = lambda d, z, h: aten.silu_backward.grad_input(d, z, grad_input=d)
        else:
            raise TypeError(f"no buffered forward/backward for {type(module).__name__}")


def buffered_plan(model: nn.Sequential) -> list[tuple[nn.Linear, Activation | None]] | None:
    """``[(Linear, activation or None), ...]`` when the model is Linear, [activation], Linear,
    [activation], ..., ending in a width-1 Linear [activation] and a Squeeze, or in a Linear
    [activation] of width K > 1 (a multi-output head, no Squeeze); else None."""
    layers = list(model)
    squeeze = bool(layers) and isinstance(layers[-1], Squeeze)
    plan: list[tuple[nn.Linear, Activation | None]] = []
    for m in layers[:-1] if squeeze else layers:
        if isinstance(m, nn.Linear):
            plan.append((m, None))
        elif isinstance(m, nn.Identity):
            continue
        elif plan and plan[-1][1] is None and isinstance(m, ELEMENTWISE):
            try:
                plan[-1] = (plan[-1][0], Activation(m))
            except TypeError:
                return None
        else:  # an activation before the first Linear, two in a row, a Squeeze inside
            return None
    if not plan or (plan[-1][0].out_features != 1) == squeeze:
        return None
    return plan


class Workspace:
    """Buffers of ``capacity`` rows, reused from step to step (the Poisson batch size varies:
    rows [:n] are used). Reusing them keeps a step free of fresh allocations, which on this
    CPU cost page faults comparable to the arithmetic.

    On the CPU (``ones_column``) each hidden layer's output lives in ``aug[k]``, a
    (capacity, width + 1) buffer whose last column is 1: the next layer's input with a ones
    column, so that one matrix product gives its weight AND bias gradient,
    ``g^T [a | 1] = [grad_W | grad_b]``, and its forward pass ``[a | 1] [W | b]^T`` needs no
    broadcast of the bias. On a GPU the odd width (width + 1) misaligns the rows of the matrix
    products, and a bias costs the GPU's matrix product nothing: there ``aug[k]`` is (capacity,
    width), the forward adds the bias in ``addmm`` and the bias gradient is a column sum or a
    matrix-vector product (``ones_column`` False; the same sums, in another order).
    """

    def __init__(self, plan, capacity: int, dtype: torch.dtype, device: torch.device, *, ones_column: bool) -> None:
        def buf(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=device)

        last = len(plan) - 1
        self.capacity = capacity
        self.ones_column = ones_column
        extra = 1 if ones_column else 0  # the ones column's width
        self.aug: list[torch.Tensor | None] = []  # [h_k | 1] (GPU: h_k) for hidden layers k < last
        self.z: list[torch.Tensor | None] = []  # pre-activations, where h is not computed in place
        for k, (lin, act) in enumerate(plan):
            if k < last:
                a = buf(capacity, lin.out_features + extra)
                if extra:
                    a[:, -1] = 1.0
                self.aug.append(a)
                self.z.append(buf(capacity, lin.out_features) if act is not None and not act.in_place else None)
            else:
                self.aug.append(None)
                self.z.append(buf(capacity, lin.out_features))
        act = plan[last][1]
        width = plan[last][0].out_features
        self.last_h = buf(capacity, width) if act is not None and not act.in_place else None
        self.d = [buf(capacity, lin.out_features) for lin, _ in plan]  # output gradients g_k
        # [grad_W | grad_b] of each layer with a bias; [W | b] for the forward of layers k >= 1
        # (the ones-column layout only)
        self.wt = [buf(lin.out_features, lin.in_features + 1) if extra and lin.bias is not None else None
                   for lin, _ in plan]
        self.waug = [buf(lin.out_features, lin.in_features + 1) if extra and k > 0 and lin.bias is not None else None
                     for k, (lin, _) in enumerate(plan)]
        first = plan[0][0]
        # [c * x | c] (GPU: c * x): the first layer's input scaled by the clip factors (when narrower than g)
        self.x_aug = buf(capacity, first.in_features + extra) if first.in_features < first.out_features else None
