"""dptrain.models.optimizers: torch.optim classes without torch._dynamo's import. The updates, states and
checkpoints must be torch's own, bit for bit; only the import goes."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dptrain.models.optimizers import build_optimizer, eager_class, eager_factory

REPO = Path(__file__).resolve().parents[1]

CASES = [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    (torch.optim.Adam, {"lr": 0.01}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.05}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}),
    (torch.optim.Adagrad, {"lr": 0.1}),
]


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def _grads(step: int, params: list[torch.nn.Parameter]) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize(("cls", "kwargs"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_updates_and_states_are_the_torch_classs_bit_for_bit(cls, kwargs):
    """Eight steps with the same gradients: the parameters after every step and the final
    state_dict are identical; a state saved from one and loaded into the other (both ways)
    continues identically (checkpoints are interchangeable)."""
    plain_p, eager_p = _params(0), _params(0)
    plain, eager = cls(plain_p, **kwargs), eager_class(cls)(eager_p, **kwargs)
    assert type(eager) is not cls and isinstance(eager, cls) and repr(eager) == repr(plain)
    for step in range(8):
        _grads(step, plain_p)
        _grads(step, eager_p)
        plain.step()
        eager.step()
        for a, b in zip(plain_p, eager_p):
            assert torch.equal(a, b), (cls.__name__, step)
    assert str(plain.state_dict()) == str(eager.state_dict())
    # resume each from the other's state, with fresh copies of the parameters
    for source, target_cls in ((plain, eager_class(cls)), (eager, cls)):
        p1 = [torch.nn.Parameter(p.detach().clone()) for p in plain_p]
        p2 = [torch.nn.Parameter(p.detach().clone()) for p in plain_p]
        first = target_cls(p1, **kwargs)
        first.load_state_dict(copy.deepcopy(source.state_dict()))  # torch shares the state's tensors
        second = cls(p2, **kwargs)
        second.load_state_dict(copy.deepcopy(plain.state_dict()))
        for step in range(8, 11):
            _grads(step, p1)
            _grads(step, p2)
            first.step()
            second.step()
        for a, b in zip(p1, p2):
            assert torch.equal(a, b)


def test_step_runs_without_autograd_and_restores_the_grad_mode():
    """The in-place update of a leaf that requires grad needs grad mode off (torch's wrapper
    turns it off); after the step the caller's mode is back, also when the step raises."""
    params = _params(1)
    opt = eager_class(torch.optim.SGD)(params, lr=0.1, momentum=0.9)
    _grads(0, params)
    with torch.enable_grad():
        opt.step()
        assert torch.is_grad_enabled()
        assert all(p.grad_fn is None for p in params)
    with torch.no_grad():
        opt.step()
        assert not torch.is_grad_enabled()

    def closure():
        raise RuntimeError("from the closure")

    with torch.enable_grad(), pytest.raises(RuntimeError, match="from the closure"):
        opt.step(closure)
    assert torch.is_grad_enabled()


def test_zero_grad_hooks_and_closure_behave_as_torchs():
    params = _params(2)
    opt = eager_class(torch.optim.SGD)(params, lr=0.5)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kw: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kw: seen.append("post"))
    _grads(0, params)

    def closure():
        return torch.tensor(3.0)

    assert float(opt.step(closure)) == 3.0
    assert seen == ["pre", "post"]
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    _grads(1, params)
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)


def test_classes_it_cannot_bypass_safely_are_left_as_they_are():
    class OwnStateDict(torch.optim.SGD):
        def state_dict(self):
            return {"own": True}

    assert eager_class(int) is int
    own = eager_class(OwnStateDict)
    assert own.state_dict is OwnStateDict.state_dict  # the override is kept
    assert own([torch.nn.Parameter(torch.zeros(1))], lr=0.1).state_dict() == {"own": True}
    assert eager_class(torch.optim.SGD) is eager_class(torch.optim.SGD)  # one class per torch class


def test_the_factory_and_the_settings_build_the_eager_class():
    part = functools.partial(torch.optim.Adam, lr=0.02)
    made = eager_factory(part)(params=_params(3))
    assert isinstance(made, torch.optim.Adam) and type(made) is eager_class(torch.optim.Adam)
    assert made.defaults["lr"] == 0.02
    assert eager_factory("not a factory") == "not a factory"
    opt = build_optimizer({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.3, "momentum": 0.1},
                          _params(4))
    assert type(opt) is eager_class(torch.optim.SGD) and opt.defaults["momentum"] == 0.1


def test_the_eager_classes_never_import_torchs_compiler():
    """In a fresh interpreter: building SGD and Adam from settings, stepping, saving, loading and
    zeroing them imports no torch._dynamo; a plain torch.optim.SGD then does (so the check can
    fail). A whole command-line run is checked in tests/test_startup.py (slow)."""
    code = (
        "import json, sys, torch\n"
        "from dptrain.models.optimizers import build_optimizer\n"
        "seen = []\n"
        "for target in ('torch.optim.SGD', 'torch.optim.Adam'):\n"
        "    p = torch.nn.Parameter(torch.ones(3))\n"
        "    opt = build_optimizer({'_target_': target, '_partial_': True, 'lr': 0.1}, [p])\n"
        "    p.grad = torch.ones(3); opt.step(); opt.load_state_dict(opt.state_dict()); opt.zero_grad()\n"
        "seen.append('torch._dynamo' in sys.modules)\n"
        "torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)\n"
        "seen.append('torch._dynamo' in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [False, True]
