"""torch.optim optimisers, built so that a run does not import torch's compiler.

Every ``torch.optim.Optimizer`` wraps ``add_param_group`` (called by ``__init__``),
``zero_grad``, ``state_dict`` and ``load_state_dict`` in ``torch._disable_dynamo``, and the
built-in optimisers' ``step`` in ``_use_grad_for_differentiable``; both import ``torch._dynamo``
(TorchDynamo, torch.compile's tracer) on their first call, only to mark the functions as not to
be traced. dptrain never compiles, yet that import is the largest single cost of a short run
after ``import torch`` itself (1.7-3.0 s of the ``experiment=logit`` run on a 2-core machine:
docs/performance.md).

:func:`eager_class` returns a subclass of a torch.optim class whose wrapped methods call the
functions torch wraps directly, with the same grad mode ``step`` would set. The update
arithmetic, the state, ``state_dict`` and the hooks are torch's own (the subclass adds no
arithmetic), so parameters and states are bit-identical to the class's
(tests/test_optimizers.py checks SGD, Adam, AdamW, RMSprop and Adagrad step by step). Where torch's
wrappers do not have the expected shape (another torch version, a class that overrides a
method), the method is left as it is: slower to start, never different. The instance is still
an instance of the class the settings name (``isinstance(opt, torch.optim.SGD)`` holds) and
its ``repr`` is the class's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.optim import Optimizer

#: Optimizer methods torch wraps in ``torch._disable_dynamo`` (its wrapper is called ``inner``)
_DISABLED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _unwrapped(function: Any, wrapper_name: str) -> Any:
    """The function torch's decorator ``wrapper_name`` wrapped, found along the ``__wrapped__``
    chain (torch's profiling hook wraps ``step`` once an instance exists), or None."""
    for _ in range(4):
        code = getattr(function, "__code__", None)
        inner = getattr(function, "__wrapped__", None)
        if code is None or not callable(inner):
            return None
        if code.co_name == wrapper_name:
            return inner
        function = inner
    return None


@functools.cache
def eager_class(cls: type) -> type:
    """``cls`` (a torch.optim.Optimizer subclass) with its dynamo-disabling wrappers bypassed;
    ``cls`` itself when it is not an Optimizer or nothing can be bypassed safely."""
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        return cls
    namespace: dict[str, Any] = {}
    for name in _DISABLED:
        raw = _unwrapped(getattr(Optimizer, name), "inner")
        if raw is not None and getattr(cls, name) is getattr(Optimizer, name):  # not overridden by cls
            namespace[name] = raw
    raw_step = _unwrapped(cls.step, "_use_grad")
    if raw_step is not None:
        def step(self: Optimizer, closure: Any = None, _raw: Any = raw_step) -> Any:
            # what _use_grad_for_differentiable does, minus its graph breaks (no-ops outside torch.compile)
            previous = torch.is_grad_enabled()
            try:
                torch.set_grad_enabled(self.defaults["differentiable"])
                return _raw(self, closure)
            finally:
                torch.set_grad_enabled(previous)

        functools.update_wrapper(step, raw_step)
        namespace["step"] = step
    if not namespace:
        return cls
    namespace.update(__doc__=cls.__doc__, __module__=__name__, __qualname__=cls.__qualname__)
    return type(cls.__name__, (cls,), namespace)


def eager_factory(factory: Any) -> Any:
    """A Hydra ``_partial_`` optimiser factory (``functools.partial(cls, lr=...)``) that builds
    :func:`eager_class` ``(cls)``; anything else is returned unchanged."""
    if isinstance(factory, functools.partial) and isinstance(factory.func, type):
        return functools.partial(eager_class(factory.func), *factory.args, **factory.keywords)
    return factory


def build_optimizer(optim_settings: Any, params: Any) -> Optimizer:
    """The optimiser that the ``optim`` settings (a Hydra ``_target_`` mapping with ``_partial_:
    true``) describe, over ``params``, through :func:`eager_factory`."""
    node = optim_settings if isinstance(optim_settings, DictConfig) else OmegaConf.create(dict(optim_settings))
    return eager_factory(instantiate(node))(params=params)
