"""Models (and losses) that DP-SGD can protect: each example's output, and its loss, must
depend on that example alone.

Per-example clipping bounds one example's influence on a step only if the loss of example i
is a function of example i (and the parameters) alone. A layer that mixes the examples of a
batch (BatchNorm normalises each example with the batch's mean and variance) lets one example
move every other example's gradient: removing one example changed the clipped sum by more than
C in a run that still claimed its epsilon. A layer that updates buffers from data (BatchNorm's
running mean and variance, any custom module with buffers) writes statistics of private batches,
without noise, into the model that is published.

:func:`check_model` refuses such models by name, before any private row is read and again when
an engine is built (every engine: the fast one, Opacus, and any other). Three independent checks:

1. by type: batch normalisation of any kind (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, lazy
   variants, with or without ``affine`` / ``track_running_stats``) and instance normalisation
   that tracks running statistics;
2. by state: any module holding buffers (tensors that are not parameters), whatever its class;
3. by behaviour: the model is run (on a copy, in training mode, on random inputs of the public
   width) on a batch, then on the same batch with one row changed; every other row's output must
   be unchanged (catches custom modules that mix rows without buffers, e.g. ``x - x.mean(0)``).

Opacus' ``ModuleValidator`` is consulted as well (its errors are added to the message), but not
relied on: it accepts ``BatchNorm1d(affine=False)``, which mixes examples.

A user's loss (``dptrain.training.private.make_private(loss=...)``) is probed the same way
(:func:`check_loss`): evaluated on the model's outputs for random inputs and targets, then with
one example's input and target changed; it must return one value per example (reduction
'none'), and no other example's loss value or output gradient may move. A loss that uses a
batch statistic (``out - out.mean()``, a mean reduction) is refused by name before training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dptrain.core.errors import DPTrainError
from dptrain.privacy.dpsgd.layers import Squeeze

ADVICE = ("use a layer that treats every example on its own instead: nn.LayerNorm or nn.GroupNorm, or "
          "no normalisation (the features are already scaled by their public bounds)")


class ModelCheckError(DPTrainError):
    """The model cannot be trained with a per-example DP guarantee; the message says why."""


def _mixing_by_type(name: str, module: nn.Module) -> str | None:
    where = f"module {name!r}" if name else "the model itself"
    if (isinstance(module, nn.modules.batchnorm._NormBase)
            and not isinstance(module, nn.modules.instancenorm._InstanceNorm)):
        return (f"{where}: {type(module).__name__} normalises each example with statistics of the whole batch, so "
                "one example changes every other example's gradient")
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        return (f"{where}: {type(module).__name__}(track_running_stats=True) "
                "updates running statistics from private batches")
    return None


#: layer types that treat every example on its own and hold no buffers: Opacus' validator
#: (a second opinion, imported only for other models) accepts every model made of these alone
_PLAIN = frozenset({nn.Sequential, nn.Linear, nn.ReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid,
                    nn.Identity, Squeeze})


def static_problems(model: nn.Module) -> list[str]:
    """Problems found without running the model: types that mix a batch, buffers, Opacus'
    validator. Empty when none is found."""
    problems: list[str] = []
    for name, module in model.named_modules():
        reason = _mixing_by_type(name, module)
        if reason is not None:
            problems.append(reason)
            continue
        buffers = [b for b, _ in module.named_buffers(recurse=False)]
        if buffers:
            problems.append(f"{f'module {name!r}' if name else 'the model itself'}: "
                            f"{type(module).__name__} holds buffers "
                            f"({', '.join(buffers)}), state that may be updated from private batches without noise "
                            "and is saved with the model")
    if all(type(m) in _PLAIN for m in model.modules()):
        return problems  # only layers Opacus' validator has nothing to say about (and no import of opacus)
    try:
        from opacus.validators import ModuleValidator

        for err in ModuleValidator.validate(model, strict=False):
            text = f"Opacus: {err}"
            if not any(str(err) in p for p in problems):
                problems.append(text)
    except Exception:  # noqa: BLE001 - the validator is a second opinion only
        pass
    return problems


@torch.no_grad()
def mixing_probe(model: nn.Module, *, in_features: int, rows: int = 8) -> str | None:
    """Run a copy of the model in training mode on random inputs of the public width, then on
    the same inputs with row 0 changed; a description of the problem if any other row's output
    moved (the data is random: no private row is used). Dropout and other random layers see the
    same random numbers in both passes."""
    probe = copy.deepcopy(model).to("cpu").train()  # a CPU copy, wherever the model lives
    gen = torch.Generator().manual_seed(0)
    dtype = next((p.dtype for p in probe.parameters()), torch.get_default_dtype())
    x = torch.rand(rows, in_features, generator=gen, dtype=dtype, device="cpu") * 2 - 1
    x2 = x.clone()
    x2[0] = torch.rand(in_features, generator=gen, dtype=dtype, device="cpu") * 2 - 1
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            out = probe(x)
            torch.manual_seed(1)
            out2 = probe(x2)
    except Exception as err:  # noqa: BLE001
        return (f"the model cannot be run on a batch of {rows} examples with {in_features} features "
                f"({type(err).__name__}: {err})")
    if not isinstance(out, torch.Tensor) or out.shape[:1] != (rows,):
        return f"the model's output for a batch of {rows} examples is not one row per example"
    if not torch.equal(out[1:], out2[1:]):
        return ("changing one example changed the outputs of the OTHER examples of the batch: a layer mixes the "
                "examples of a batch (e.g. normalisation with batch statistics)")
    return None


def check_model(model: nn.Module, *, in_features: int | None = None) -> None:
    """Raise :class:`ModelCheckError` unless every example's output depends on that example
    alone and no module holds buffers. ``in_features``: the public feature width, for the
    behavioural probe (skipped when None)."""
    problems = static_problems(model)
    if not problems and in_features is not None:
        moved = mixing_probe(model, in_features=in_features)
        if moved is not None:
            problems.append(moved)
    if problems:
        raise ModelCheckError(
            "model is not allowed for DP training: per-example clipping protects an example only if no other "
            "example's output depends on it and the model keeps no state updated from data. Found: "
            + "; ".join(problems) + ". Allowed: " + ADVICE + "."
        )


# ------------------------------------------------------------------------------ the loss

LOSS_ADVICE = ("a per-example loss: loss(outputs, y) returning one value per example, shape (n,), each computed "
               "from that example's output and target alone (e.g. F.cross_entropy(outputs, y, reduction='none')); "
               "no batch mean, sum or other statistic of the batch inside it")


def loss_name(loss: object) -> str:
    """How a message names a user's loss: its qualified name, else its type."""
    return str(getattr(loss, "__qualname__", None) or getattr(loss, "__name__", None) or type(loss).__name__)


def _probe_like(t: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """Random CPU entries shaped like ``t``'s rows: floats in [0, 1), integers and booleans 0 / 1
    (a valid class index and a valid binary label)."""
    shape = (rows, *t.shape[1:])
    if t.is_floating_point():
        return torch.rand(shape, generator=gen, dtype=t.dtype)
    return torch.randint(0, 2, shape, generator=gen).to(t.dtype)


class _NotPerExample(Exception):
    """The loss returned something else than one value per example (the message says what)."""


def _loss_and_grad(loss, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.enable_grad():
        z = outputs.detach().clone().requires_grad_(True)
        values = loss(z, targets)
        if not isinstance(values, torch.Tensor) or values.shape != z.shape[:1]:
            shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise _NotPerExample(f"it returned {shape} for a batch of {z.shape[0]} examples, not one value per example "
                             f"(shape ({z.shape[0]},)): a mean or sum over the batch (reduction='mean' / 'sum') "
                             "cannot be clipped per example")
        (grad,) = torch.autograd.grad(values.sum(), z, allow_unused=True)
    return values.detach(), (torch.zeros_like(z) if grad is None else grad)


@torch.no_grad()
def loss_mixing_probe(loss, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, rows: int = 8) -> str | None:
    """Evaluate ``loss`` on the outputs of a CPU copy of the model for random inputs and targets
    shaped like the rows of ``x`` and ``y`` (no private row is used), then with example 0's input
    and target changed: a description of the problem if the loss does not return one value per
    example, or if any OTHER example's loss value or its gradient with respect to that example's
    output moved (a batch statistic inside the loss)."""
    probe = copy.deepcopy(model).to("cpu").train()
    gen = torch.Generator().manual_seed(0)
    xs, ts = _probe_like(x, rows, gen), _probe_like(y, rows, gen)
    xs2, ts2 = xs.clone(), ts.clone()
    xs2[0] = _probe_like(x, 1, gen)[0]
    ts2[0] = _probe_like(y, 1, gen)[0] if y.is_floating_point() else (1 - ts[0].long()).to(ts.dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            results = []
            for inputs, targets in ((xs, ts), (xs2, ts2)):
                torch.manual_seed(1)
                results.append(_loss_and_grad(loss, probe(inputs), targets))
    except _NotPerExample as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - the user's loss (or model) failed on the probe batch
        return f"it cannot be evaluated on a probe batch of {rows} examples ({type(err).__name__}: {err})"
    (v1, g1), (v2, g2) = results
    if not (torch.equal(v1[1:], v2[1:]) and torch.equal(g1[1:], g2[1:])):
        return ("changing one example changed the loss (or its gradient) of the OTHER examples of the batch: the "
                "loss mixes the examples of a batch (e.g. a batch mean inside it), so one example can move every "
                "other example's clipped gradient")
    return None


def check_loss(loss, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Raise :class:`ModelCheckError` naming ``loss`` unless it returns one value per example and
    each example's value (and gradient) depends on that example alone (:func:`loss_mixing_probe`)."""
    problem = loss_mixing_probe(loss, model, x, y)
    if problem is not None:
        raise ModelCheckError(f"loss={loss_name(loss)!r} is not allowed for DP training: per-example clipping "
                              f"bounds one example's influence only if its loss is its own. Found: {problem}. "
                              f"Allowed: {LOSS_ADVICE}.")
