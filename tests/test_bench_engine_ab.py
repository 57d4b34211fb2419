"""scripts/bench_engine_ab.py (issue 45): the variants it times are the ones it names (no timing
is asserted): ``normal`` is the engine's own step with torch's float32 normal_ as its draw, ``new``
the same engine with its own draw back, an older checkout loads beside this one, and the report's
ratios are the medians' ratios."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_engine_ab_under_test", REPO / "scripts" / "bench_engine_ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ab = _load()


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(ab, "N", 3000)
    monkeypatch.setattr(ab, "B", 64)
    g = torch.Generator().manual_seed(0)
    return torch.randn(3000, 112, generator=g), (torch.rand(3000, generator=g) < 0.5).float()


def test_normal_and_new_are_one_engine_with_its_draw_switched(small):
    x, y = small
    steps = ab.make_steps("preset-mlp", x, y)
    assert set(steps) == {"new", "normal", "new-again"}
    shared = steps["normal"].engine
    assert steps["new"].engine is shared and steps["new-again"].engine is not shared
    assert shared.noise.refined32 and shared.noise.coordinates == 112 * 64 + 64 + 64 * 64 + 64 + 65
    steps["normal"]()
    state = shared.generator.get_state()
    z = shared.noise.draw()  # the switched draw: torch's float32 normal_ on the step's coordinates
    twin = torch.Generator()
    twin.set_state(state)
    assert torch.equal(z, torch.empty(z.numel()).normal_(0.0, 1.0, generator=twin))
    steps["new"]()
    assert "draw" not in shared.noise.__dict__  # the class's own (refined) draw again
    state = shared.generator.get_state()
    twin.set_state(state)
    assert torch.equal(shared.noise.draw(), ab.noise.standard_normal32_refined(z.numel(), generator=twin,
                                                                                device=torch.device("cpu")))


@pytest.fixture
def clean_imports(monkeypatch):
    """Give back sys.path and forget the dptrain_old modules a test loaded."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [m for m in sys.modules if m == "dptrain_old" or m.startswith("dptrain_old.")]:
        del sys.modules[name]


def test_an_older_checkout_loads_beside_this_one_and_steps(small, tmp_path, clean_imports):
    x, y = small
    old = ab.load_old(REPO, into=tmp_path)  # this checkout, loaded as dptrain_old
    assert old.__name__ == "dptrain_old.privacy.dpsgd.engine" and old.make_engine is not ab.new.make_engine
    step = ab.make_step("old", "preset-mlp", x, y, old)
    step()
    assert type(step.engine).__module__.startswith("dptrain_old.") and step.engine.params[0].grad is not None
    with pytest.raises(ImportError, match="has none of"):
        ab._first_module("no.such.module")


def test_the_report_gives_the_ratio_of_the_medians_and_the_block_quartiles():
    times = {clock: {"new": [2.0, 2.2, 2.1, 2.0, 2.0], "normal": [2.0, 2.0, 2.0, 2.0, 2.0],
                     "new-again": [1.0, 1.0, 1.0, 1.0, 1.0]} for clock in ("wall", "cpu")}
    lines = ab.report(times, 1, "0.1", "0.2")
    assert lines[0] == "threads=1  load before 0.1  after 0.2"
    assert any(ln.startswith("  [wall] new / normal = 1.000  (block ratios: median 1.000, quartiles 1.000-1.075")
               for ln in lines), lines
    assert any(ln.startswith("  [cpu] new-again / new = 0.500") for ln in lines)
    assert not any("old" in ln for ln in lines)
