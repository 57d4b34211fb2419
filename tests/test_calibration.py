"""The one noise-calibration routine (dptrain.privacy.calibration.smallest_noise) and its callers.

Behaviour: the returned sigma meets the target AS EVALUATED and sigma / (1 + rtol) does not (for
closed forms, for random monotone curves, for the real RDP epsilon of a Poisson-subsampled
Gaussian), the floor and the unreachable cases, every sigma evaluated once. Structure: the four
calibrations of the project (DP-SGD's sigma, the dp/ curve, task=tune, ssp) call it and keep no
search loop of their own."""

from __future__ import annotations

import ast
import math
import random
import re
from pathlib import Path

import pytest

from dptrain.core.errors import DPTrainError
from dptrain.privacy import calibration
from dptrain.privacy.accounting import SIGMA_RANGE, rdp_epsilon
from dptrain.privacy.calibration import Unreachable, smallest_noise

REPO = Path(__file__).resolve().parents[1]


class Recorder:
    """epsilon_of that records every sigma it is asked about."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, sigma: float) -> float:
        self.calls.append(sigma)
        return self.fn(sigma)


def _check(eps, sigma: float, target: float, rtol: float) -> None:
    assert eps(sigma) <= target
    assert eps(sigma / (1 + rtol)) > target


# ------------------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("c", [1e-3, 0.7, 3.0, 250.0])
@pytest.mark.parametrize("target", [0.05, 1.0, 8.0])
@pytest.mark.parametrize("rtol", [1e-4, 1e-3, 1e-2])
def test_c_over_sigma_is_solved_to_relative_tolerance(c, target, rtol):
    eps = Recorder(lambda s: c / s)
    sigma = smallest_noise(eps, target=target, rtol=rtol, lower=1e-6, upper=1e6)
    assert sigma in eps.calls  # the value returned was evaluated
    _check(lambda s: c / s, sigma, target, rtol)
    exact = c / target
    assert exact * (1 - 1e-12) <= sigma <= exact * (1 + rtol) * (1 + 1e-12)
    assert len(eps.calls) == len(set(eps.calls))  # each sigma evaluated once


def test_false_position_needs_fewer_evaluations_than_bisection():
    """eps = c / sigma^2 is a straight line in log-log: a few evaluations after the bracket, where
    bisection of one factor-4 bracket to 1e-4 takes log2(log 4 / log1p(1e-4)) ~ 14."""
    for c in (0.3, 5.0, 40.0):
        eps = Recorder(lambda s, c=c: c / s**2)
        sigma = smallest_noise(eps, target=1.0, rtol=1e-4, lower=1e-3, upper=1e4)
        _check(lambda s, c=c: c / s**2, sigma, 1.0, 1e-4)
        assert len(eps.calls) <= 9, eps.calls


def test_random_monotone_curves_statistically():
    """300 random decreasing curves a * sigma^-b + f (f below the target), random targets, starts,
    factors and tolerances: every answer meets the target as evaluated, sigma / (1 + rtol) does
    not, and the evaluations stay within bisection's budget (bracket walk plus twice its halvings)."""
    rng = random.Random(20240601)
    for _ in range(300):
        a, b = math.exp(rng.uniform(-5, 5)), rng.uniform(0.3, 3.0)
        target = math.exp(rng.uniform(-4, 3))
        f = target * rng.uniform(0.0, 0.9)
        rtol, factor, start = 10 ** rng.uniform(-5, -1), rng.uniform(1.1, 8.0), math.exp(rng.uniform(-8, 8))
        fn = lambda s, a=a, b=b, f=f: a * s**-b + f  # noqa: E731
        eps = Recorder(fn)
        lower, upper = 1e-4, 1e5
        try:
            sigma = smallest_noise(eps, target=target, rtol=rtol, lower=lower, upper=upper, start=start,
                                   factor=factor)
        except Unreachable as err:
            assert fn(upper) > target and err.upper == upper and err.epsilon == fn(upper)
            continue
        assert sigma in eps.calls and fn(sigma) <= target
        if sigma == lower:
            continue
        assert fn(sigma / (1 + rtol)) > target
        walk = math.log(upper / lower) / math.log(factor) + 2
        assert len(eps.calls) <= walk + 2 * math.log2(math.log(factor) / math.log1p(rtol)) + 4


def test_a_staircase_is_solved_too():
    """Not smooth: epsilon falls in steps (false position stalls there; bisection takes over)."""
    fn = lambda s: math.ceil(20.0 / s) / 10.0  # noqa: E731
    for target in (0.35, 1.0, 2.05):
        sigma = smallest_noise(fn, target=target, rtol=1e-3, lower=1e-2, upper=1e3)
        _check(fn, sigma, target, 1e-3)


def test_infinite_nan_and_zero_epsilons():
    """sigma too small for any guarantee (inf, or NaN from a failed computation) counts as not
    private enough; epsilon 0 (nothing spent) as private enough."""
    fn = lambda s: math.inf if s < 0.5 else (math.nan if s < 0.8 else (0.0 if s > 3.0 else 2.0 / s))  # noqa: E731
    sigma = smallest_noise(fn, target=1.0, rtol=1e-3, lower=1e-2, upper=1e3, start=1e-2, factor=1.5)
    _check(fn, sigma, 1.0, 1e-3)
    sigma = smallest_noise(fn, target=0.1, rtol=1e-3, lower=1e-2, upper=1e3)
    assert fn(sigma) == 0.0 and fn(sigma / 1.001) > 0.1  # the jump to 0 at sigma = 3


def test_the_comparison_decides_not_the_rounded_log_ratio():
    """An epsilon one ulp above the target is not within it; an infinite target takes the floor."""
    target = 0.7
    above = math.nextafter(target, 1.0)
    fn = lambda s: above if s < 2.0 else target  # noqa: E731
    sigma = smallest_noise(fn, target=target, rtol=1e-3, lower=1e-2, upper=1e2)
    assert fn(sigma) <= target and 2.0 <= sigma <= 2.0 * 1.001
    assert smallest_noise(lambda s: 1.0 / s, target=math.inf, rtol=1e-3, lower=1e-2, upper=1e2) == 1e-2
    assert smallest_noise(lambda s: math.inf, target=math.inf, rtol=1e-3, lower=1e-2, upper=1e2) == 1e-2


# ------------------------------------------------------------------------------ the real accountant


@pytest.mark.parametrize("q,steps,target,rtol", [(0.01, 1000, 1.0, 1e-3), (0.1, 300, 8.0, 1e-2),
                                                 (0.03, 300, 0.2, 1e-3), (1.0, 10, 3.0, 1e-4)])
def test_the_rdp_epsilon_of_a_poisson_gaussian(q, steps, target, rtol):
    def eps(sigma):
        return rdp_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5)

    rec = Recorder(eps)
    sigma = smallest_noise(rec, target=target, rtol=rtol, lower=SIGMA_RANGE[0], upper=SIGMA_RANGE[1])
    assert sigma in rec.calls
    _check(eps, sigma, target, rtol)


# ------------------------------------------------------------------------------ the ends of the range


def test_the_floor_is_returned_when_it_meets_the_target():
    eps = Recorder(lambda s: 0.01 / s)
    assert smallest_noise(eps, target=1.0, rtol=1e-3, lower=0.05, upper=100.0) == 0.05
    assert 0.05 in eps.calls  # evaluated at lower exactly, not at exp(log(lower))
    eps = Recorder(lambda s: 0.01 / s)
    assert smallest_noise(eps, target=1.0, rtol=1e-3, lower=0.05, upper=100.0, start=1e-9) == 0.05
    assert eps.calls == [0.05]  # a start below the range starts at its floor


def test_the_top_can_be_the_answer():
    fn = lambda s: 1.0 if s < 100.0 else 0.5  # noqa: E731
    assert smallest_noise(fn, target=0.5, rtol=1e-3, lower=1.0, upper=100.0) == 100.0


def test_unreachable_names_the_top_and_its_epsilon():
    eps = Recorder(lambda s: 2.0 + 1.0 / s)
    with pytest.raises(Unreachable) as err:
        smallest_noise(eps, target=1.0, rtol=1e-3, lower=1e-2, upper=1e4)
    assert err.value.upper == 1e4 and err.value.epsilon == 2.0 + 1e-4 and err.value.target == 1.0
    assert max(eps.calls) == 1e4  # the top itself was evaluated
    assert isinstance(err.value, DPTrainError)
    with pytest.raises(Unreachable):  # a start above the range is the top
        smallest_noise(eps, target=1.0, rtol=1e-3, lower=1e-2, upper=1e4, start=1e9)


@pytest.mark.parametrize("bad", [dict(lower=0.0), dict(lower=10.0, upper=1.0), dict(upper=math.inf),
                                 dict(rtol=0.0), dict(factor=1.0), dict(target=0.0), dict(target=-1.0)])
def test_bad_arguments_are_refused(bad):
    kw = dict(target=1.0, rtol=1e-3, lower=1e-2, upper=1e3, factor=2.0) | bad
    with pytest.raises(ValueError):
        smallest_noise(lambda s: 1.0 / s, **kw)


# ------------------------------------------------------------------------------ the callers


def test_the_ssp_and_tune_callers_meet_their_targets():
    from dptrain.inference.ssp import calibrate
    from dptrain.privacy.accounting import PrivacyLedger
    from dptrain.privacy.events import gaussian_event

    def gaussian(s):
        acc = PrivacyLedger()
        acc.record(gaussian_event(s))
        return acc.get_epsilon(delta=1e-5, accountant="rdp")

    for target in (0.3, 2.0):
        _check(gaussian, calibrate(target_epsilon=target, delta=1e-5, rtol=1e-4), target, 1e-4)
    assert calibrate(target_epsilon=1e9, delta=1e-5) == 1e-3  # the floor
    with pytest.raises(ValueError, match="needs a noise multiplier above 1e7"):
        calibrate(target_epsilon=1e-9, delta=1e-5)


def test_the_curve_share_meets_its_target():
    from dptrain.privacy.accounting import history_epsilon
    from dptrain.privacy.curves import CURVE_RTOL, curve_noise_multiplier, history_between
    from dptrain.privacy.events import poisson_gaussian

    sigma, q, steps, log_every, share = 1.0, 0.01, 1000, 50, 0.05
    sigma_c = curve_noise_multiplier(sigma=sigma, sample_rate=q, steps=steps, log_every=log_every, share=share,
                                     delta=1e-5)
    grads = history_epsilon(((poisson_gaussian(sample_rate=q, noise_multiplier=sigma), steps),), delta=1e-5)

    def eps(x):
        return history_epsilon(history_between(sigma=sigma, sigma_c=x, sample_rate=q, start=0, end=steps,
                                               log_every=log_every), delta=1e-5)

    _check(eps, sigma_c, grads / (1 - share), CURVE_RTOL)


CALLERS = {  # module file: the functions that calibrate there
    "dptrain/privacy/accounting.py": ["calibrate_noise_multiplier"],
    "dptrain/privacy/curves.py": ["curve_noise_multiplier", "fill_target", "_calibrated"],
    "dptrain/tasks/tune.py": ["calibrate_search"],
    "dptrain/inference/ssp.py": ["calibrate"],
}
OLD_HELPERS = ("_bracket", "_solve", "_smallest")


@pytest.mark.parametrize("path", sorted(CALLERS))
def test_every_calibration_uses_the_one_routine_and_keeps_no_loop(path):
    source = (REPO / path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    imports = {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names}
    assert ("dptrain.privacy.calibration", "smallest_noise") in imports, path
    defs = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    for helper in OLD_HELPERS:
        if path.endswith("ssp.py") and helper == "_solve":  # ssp's _solve is the OLS solve, not a search
            assert "sigma" not in ast.unparse(defs[helper]) and helper not in ast.unparse(defs["calibrate"])
            continue
        assert helper not in source, f"{path} still has {helper}"
    calls_routine = False
    for name in CALLERS[path]:
        fn = defs[name]
        loops = [n for n in ast.walk(fn) if isinstance(n, (ast.While, ast.For, ast.AsyncFor))]
        assert not loops, f"{path}:{name} has a loop of its own at line {loops[0].lineno}"
        assert not re.search(r"^\s*while\b", ast.get_source_segment(source, fn), re.M), f"{path}:{name}"
        called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        calls_routine |= "smallest_noise" in called
        assert called & {"smallest_noise", "_calibrated"}, f"{path}:{name} does not calibrate with the routine"
    assert calls_routine


def test_the_routine_lists_its_callers_and_stays_in_the_privacy_layer():
    doc = calibration.__doc__
    assert "ONE" in doc
    for name in ("calibrate_noise_multiplier", "curve_noise_multiplier", "fill_target", "calibrate_search",
                 "ssp.calibrate", "task=tune", "dp/ curve"):
        assert name in doc, name
    tree = ast.parse(Path(calibration.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert all(a.name in ("math",) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.module in ("__future__", "collections.abc") or node.module.startswith(
                ("dptrain.core", "dptrain.privacy")), node.module
    for node in ast.walk(tree):  # no import inside a function body
        if isinstance(node, ast.FunctionDef):
            assert not [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))], node.name
