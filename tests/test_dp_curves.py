"""DP curves (docs/privacy.md, "DP curves"): dp/train_loss is released with noise on the logged
steps, and its privacy cost is composed into every epsilon of the run.

Each logged step releases (sum over its Poisson batch of min(loss_i, L) + N(0, (sigma_c L)^2)) / B
on the gradient's batch, so the step is ONE Gaussian mechanism of noise multiplier
(sigma^-2 + sigma_c^-2)^(-1/2) (dptrain/privacy/curves.py); the epsilons here are recomputed
independently with dp-accounting from the report's sigma, sigma_c and q and the number of logged
steps counted one by one.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_invariants import curve_steps, make_batch, reference_epsilons
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from scipy import stats

import dptrain.training.fit
from dptrain.core.dataspec import DataSpec
from dptrain.core.validation import ConfigError
from dptrain.data import load_dataset
from dptrain.models.networks import logit, mlp
from dptrain.models.objectives import BINARY, build_objective
from dptrain.privacy.accounting import calibrate_noise_multiplier, rdp_epsilon
from dptrain.privacy.curves import TAG, bounded_loss_sum, joint_noise_multiplier
from dptrain.privacy.dpsgd.engine import make_engine
from dptrain.privacy.randomness import Randomness, settings_digest
from dptrain.runfolder.tracking import Tracker
from dptrain.settings.train import validate_against_size
from dptrain.tasks import cli
from dptrain.tasks.plan import training_plan
from dptrain.tasks.registry import validate

SMALL = ["experiment=logit", "estimator.interval_share=0",
         "data=synthetic", "data.n_rows=3000", "trainer.epochs=2", "trainer.batch_size=100",
         "trainer.progress=false", "trainer.baseline=false", "trainer.eval_every=1000"]


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _run(tmp_path: Path, overrides: list[str]) -> dict:
    cli.run(_compose(overrides), run_dir=tmp_path)
    return json.loads((tmp_path / "privacy.json").read_text())


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "private" / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _setup(overrides: list[str]):
    cfg = OmegaConf.to_object(_compose([*SMALL, *overrides]))
    validate(cfg)
    data = load_dataset(cfg.data, seed=cfg.seed)
    return cfg, data, validate_against_size(cfg, data.n_train)


# ----------------------------------------------------------------------------- (1) the accounting


def test_report_epsilon_composes_the_gradient_and_the_curve_steps(tmp_path):
    rep = _run(tmp_path, [*SMALL, "privacy.noise_multiplier=1.5", "trainer.log_every=7"])
    q, sigma, T, delta = rep["sample_rate"], rep["noise_multiplier"], rep["steps"], rep["delta"]
    c = rep["dp_curves"]
    K = curve_steps(T, 7)
    assert c["covered"] and c["tags"] == [TAG] and c["log_every"] == 7
    assert c["releases"] == c["planned_releases"] == K == math.ceil(T / 7)
    assert c["loss_bound"] == 2.0 and c["loss_bound_source"] == "objective default (binary)"
    sigma_c = c["noise_multiplier"]
    assert c["joint_noise_multiplier"] == pytest.approx(1 / math.sqrt(sigma**-2 + sigma_c**-2), rel=1e-12)
    assert c["noise_std"] == pytest.approx(sigma_c * 2.0 / 100, rel=1e-12)
    # an independent dp-accounting RdpAccountant: T - K gradient steps, K steps of gradient + curve
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T - K)
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(
        1 / math.sqrt(sigma**-2 + sigma_c**-2))), K)
    assert rep["epsilon"] == rep["epsilons"]["rdp"] == pytest.approx(ref.get_epsilon(delta), rel=1e-9)
    pld = reference_epsilons(noise_multiplier=sigma, sample_rate=q, steps=T, delta=delta, accountants=("pld",),
                             curve_noise_multiplier=sigma_c, curve_releases=K)["pld"]
    assert rep["epsilons"]["pld"] == pytest.approx(pld, rel=1e-6)
    # the curve takes its share (5%) of the RDP epsilon, on top of the gradients' (explicit sigma)
    gradients = rdp_epsilon(sample_rate=q, noise_multiplier=sigma, steps=T, delta=delta)
    assert 0.94 <= gradients / rep["epsilon"] <= 0.951
    # the curve was logged on exactly those steps; privacy/epsilon includes each release so far
    scalars = _scalars(tmp_path)
    assert [s for s, _ in scalars[TAG]] == [s for s in range(1, T + 1) if s % 7 == 0 or s == T]
    assert scalars["privacy/epsilon"][-1][1] == pytest.approx(rep["epsilons"]["rdp"], rel=1e-6)
    text = (tmp_path / "privacy.txt").read_text()
    assert "COVERED curves: dp/train_loss" in text and f"{K} values" in text and "NOT covered" in text
    assert any("diagnostics_nonprivate" in item for item in rep["not_covered"])


def test_recording_the_curve_as_a_separate_event_would_undercount_the_shared_batch():
    """Why a logged step is ONE event: the curve and the gradient use the same Poisson batch.
    Composing them as two independently subsampled events (as if each drew its own batch)
    reports less than the exact shared-batch mechanism (q = 0.01, sigma = 1, 1000 steps, 20
    releases at sigma_c = 0.62: RDP epsilon 3.91 against 5.64)."""
    q, sigma, sigma_c, T, K, delta = 0.01, 1.0, 0.62, 1000, 20, 1e-5

    def eps(parts):
        acc = dp_accounting.rdp.RdpAccountant()
        for s, n in parts:
            acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), n)
        return acc.get_epsilon(delta)

    separate = eps([(sigma, T), (sigma_c, K)])
    shared = eps([(sigma, T - K), (joint_noise_multiplier(sigma, sigma_c), K)])
    assert shared > 1.3 * separate
    assert shared == pytest.approx(reference_epsilons(noise_multiplier=sigma, sample_rate=q, steps=T, delta=delta,
                                                      accountants=("rdp",), curve_noise_multiplier=sigma_c,
                                                      curve_releases=K)["rdp"], rel=1e-12)


def test_the_run_accounting_invariant_observes_the_curve(tmp_path):
    """tests/dp_invariants.py's run check on a default run: K curve releases observed, their
    noise measured, and the reported epsilons equal dp-accounting's for the observed mechanism."""
    from dp_invariants import check_run_accounting

    cfg, data, delta = _setup(["privacy.noise_multiplier=2.0", "trainer.epochs=1", "trainer.batch_size=50"])

    def train(on_engine):
        conf = copy.deepcopy(cfg)
        mechanism = dptrain.training.fit.mechanism_for(training_plan(conf), dataset_size=data.n_train, delta=delta)
        return dptrain.training.fit.fit(training_plan(conf), data, mechanism=mechanism,
                                 tracker=Tracker(tmp_path, tensorboard=False), on_engine=on_engine)

    out = check_run_accounting(train, delta=delta, accountants=("rdp",))
    assert out["curve_releases"] == curve_steps(out["steps"], 10) > 0


# ----------------------------------------------------------------------------- (2) a target epsilon


@pytest.mark.parametrize("accountant", ["rdp", pytest.param("pld", marks=pytest.mark.slow)])  # pld: 33 s (CI: -m slow)
def test_a_calibrated_run_meets_its_target_including_the_curve(tmp_path, accountant):
    extra = ["trainer.epochs=1"] if accountant == "pld" else []  # PLD: fewer steps, fewer seconds
    rep = _run(tmp_path, [*SMALL, *extra, "privacy.noise_multiplier=null", "privacy.target_epsilon=1.5",
                          f"privacy.accountant={accountant}"])
    q, sigma, T, delta = rep["sample_rate"], rep["noise_multiplier"], rep["steps"], rep["delta"]
    c = rep["dp_curves"]
    K = curve_steps(T, 10)
    assert rep["noise_multiplier_source"] == "calibrated" and c["releases"] == K
    ref = reference_epsilons(noise_multiplier=sigma, sample_rate=q, steps=T, delta=delta, accountants=(accountant,),
                             curve_noise_multiplier=c["noise_multiplier"], curve_releases=K)[accountant]
    assert rep["epsilon"] == pytest.approx(ref, rel=1e-6)
    assert 0.99 * 1.5 <= rep["epsilon"] <= 1.5 and ref <= 1.5 * (1 + 1e-6)
    # the gradients were calibrated to (1 - 0.05) of the target: more noise than without the curve
    assert sigma == calibrate_noise_multiplier(target_epsilon=1.5 * 0.95, sample_rate=q, steps=T, delta=delta,
                                               accountant=accountant)
    assert sigma > calibrate_noise_multiplier(target_epsilon=1.5, sample_rate=q, steps=T, delta=delta,
                                              accountant=accountant)


# ----------------------------------------------------------------------------- (3) the released value


@pytest.mark.parametrize("engine,model", [("fast", "logit"), ("fast", "mlp"), ("opacus", "mlp")])
def test_engines_sum_the_losses_clipped_at_the_bound(engine, model):
    torch.manual_seed(0)
    net = logit(in_features=12) if model == "logit" else mlp(in_features=12, hidden=[16, 8], activation="tanh")
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(4.0)  # large weights: some losses far above L, some below
    x, y = make_batch(64)
    eng = make_engine(net, engine=engine, max_grad_norm=1.0, noise_multiplier=1.0, expected_batch_size=50,
                      generator=torch.Generator().manual_seed(0), objective=BINARY)
    eng.curve_loss_bound = 1.0
    with torch.no_grad():
        losses = build_objective("binary").per_example_loss(net(x), y).double()
    assert 0 < int((losses > 1.0).sum()) < 64
    stats_ = eng(x, y)
    assert stats_.bounded_loss_sum == pytest.approx(float(losses.clamp(max=1.0).sum()), rel=1e-6)
    assert stats_.loss_sum == pytest.approx(float(losses.sum()), rel=1e-5)  # the diagnostic is unclipped
    eng.curve_loss_bound = None
    assert math.isnan(eng(x, y).bounded_loss_sum)  # no curve: not computed
    eng.curve_loss_bound = 1.0
    assert eng(x[:0], y[:0]).bounded_loss_sum == 0.0  # an empty Poisson batch releases noise only


def test_bounded_loss_sum_keeps_each_example_in_zero_to_l():
    losses = torch.tensor([0.5, 3.0, -1.0, float("nan"), float("inf"), float("-inf")])
    assert bounded_loss_sum(losses, 2.0) == 0.5 + 2.0 + 0.0 + 2.0 + 2.0 + 0.0


def test_released_value_is_unbiased_for_the_clipped_mean_with_the_stated_sd():
    """The loop's release (dptrain.training.fit.release_curve: the mechanism's formula, one draw from the
    run's secret stream "curve-noise" per step) on one fixed batch, 20,000 times: mean = the sum of
    the clipped losses / B, SD = sigma_c L / B; draws of different steps are uncorrelated."""
    cfg, data, delta = _setup(["privacy.noise_multiplier=1.0"])
    mech = dptrain.training.fit.mechanism_for(training_plan(cfg), dataset_size=data.n_train, delta=delta)
    torch.manual_seed(0)
    net = logit(in_features=data.x_train.shape[1])
    eng = mech.build_engine(net, engine="fast", generator=torch.Generator().manual_seed(0), objective=BINARY)
    x, y = data.x_train[:100], data.y_train[:100]
    st = eng(x, y)
    with torch.no_grad():
        want = float(build_objective("binary").per_example_loss(net(x), y).double().clamp(max=2.0).sum())
    assert st.bounded_loss_sum == pytest.approx(want, rel=1e-6)

    class _Run:  # what release_curve reads from the loop's run
        mechanism, randomness = mech, Randomness.fresh()

    n = 20_000
    values = np.array([dptrain.training.fit.release_curve(_Run, st, step) for step in range(1, n + 1)])
    sd = mech.curve.noise_multiplier * mech.curve.loss_bound / mech.expected_batch_size
    assert sd == mech.curve_noise_std > 0
    mean_z = (values.mean() - want / 100) / (sd / math.sqrt(n))
    assert abs(mean_z) < 4.42, mean_z
    dev = values - want / 100
    chi = float(np.sum(dev**2)) / sd**2
    assert 2 * min(stats.chi2.cdf(chi, n), stats.chi2.sf(chi, n)) > 1e-5, chi / n
    lag = float(np.mean(dev[1:] * dev[:-1])) / sd**2 * math.sqrt(n - 1)
    assert abs(lag) < 4.42, lag


# ----------------------------------------------------------------------------- (4) dp_curves=false


def test_dp_curves_false_gives_exactly_the_previous_epsilon_and_sigma(tmp_path):
    rep = _run(tmp_path / "sigma", [*SMALL, "privacy.noise_multiplier=1.5", "trainer.dp_curves=false"])
    q, T, delta = rep["sample_rate"], rep["steps"], rep["delta"]
    assert rep["dp_curves"] is None
    assert rep["epsilon"] == rdp_epsilon(sample_rate=q, noise_multiplier=1.5, steps=T, delta=delta)
    assert TAG not in _scalars(tmp_path / "sigma")
    assert "COVERED curves: none" in (tmp_path / "sigma" / "privacy.txt").read_text()
    rep = _run(tmp_path / "target", [*SMALL, "privacy.noise_multiplier=null", "privacy.target_epsilon=1.5",
                                     "trainer.dp_curves=false"])
    assert rep["noise_multiplier"] == calibrate_noise_multiplier(target_epsilon=1.5, sample_rate=q, steps=T,
                                                                 delta=delta)
    assert rep["epsilon"] == rdp_epsilon(sample_rate=q, noise_multiplier=rep["noise_multiplier"], steps=T,
                                         delta=delta)


def test_privacy_off_releases_no_curve(tmp_path):
    rep = _run(tmp_path, [*SMALL, "privacy=none", "trainer.dp_curves=true"])
    assert rep["private"] is False and "dp_curves" not in rep
    assert not [t for t in _scalars(tmp_path) if t.startswith("dp/")]


# ----------------------------------------------------------------------------- (5) TensorBoard


def test_default_private_run_logs_dp_train_loss_beside_the_nonprivate_diagnostics(tmp_path):
    rep = _run(tmp_path, SMALL)  # the defaults: trainer.dp_curves=true, log_every 10
    scalars = _scalars(tmp_path)
    T = rep["steps"]
    assert [s for s, _ in scalars[TAG]] == [s for s in range(1, T + 1) if s % 10 == 0 or s == T]
    assert all(math.isfinite(v) for _, v in scalars[TAG])
    assert scalars[TAG][-1][1] == pytest.approx(scalars["diagnostics_nonprivate/train_loss"][-1][1], abs=0.5)
    for tag in ("diagnostics_nonprivate/train_loss", "diagnostics_nonprivate/train_acc",
                "diagnostics_nonprivate/clip_fraction", "privacy/epsilon"):
        assert tag in scalars
    files = (tmp_path / "FILES.txt").read_text()
    assert "private/tb/" in files and "dp/* curves alone are covered" in files


# ----------------------------------------------------------------------------- budget, resume, randomness


def test_budget_counts_the_curve_released_at_the_stopping_step(tmp_path):
    rep = _run(tmp_path, [*SMALL, "privacy.noise_multiplier=1.0", "privacy.max_epsilon=2.6"])
    q, sigma, delta, k = rep["sample_rate"], rep["noise_multiplier"], rep["delta"], rep["steps"]
    sigma_c = rep["dp_curves"]["noise_multiplier"]
    assert rep["stopped_early"] and k < rep["planned_steps"] and rep["dp_curves"]["releases"] == curve_steps(k, 10)

    def eps(steps):  # a run of `steps` steps: its last step releases the curve too
        return reference_epsilons(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta,
                                  accountants=("rdp",), curve_noise_multiplier=sigma_c,
                                  curve_releases=curve_steps(steps, 10))["rdp"]

    assert k > 20 and rep["epsilon"] == pytest.approx(eps(k), rel=1e-9) and eps(k) <= 2.6 < eps(k + 1)
    assert [s for s, _ in _scalars(tmp_path)[TAG]][-1] == k


def test_resume_with_other_curve_settings_is_refused_by_name(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _run(run_dir, SMALL)
    for change, field in ((["trainer.dp_curves=false"], "curve_noise_multiplier"),
                          (["trainer.curve_loss_bound=1.0"], "curve_loss_bound"),
                          (["trainer.log_every=5"], "curve_log_every")):
        with pytest.raises(SystemExit):
            cli.run(_compose([*SMALL, "trainer.resume=auto", *change]), run_dir=run_dir)
        err = capsys.readouterr().err
        assert "other privacy settings" in err and f"{field}:" in err and "trainer.dp_curves" in err


def test_seed_file_label_holds_log_every_when_the_curve_is_released():
    def label(overrides):
        return settings_digest(OmegaConf.to_container(_compose([*SMALL, *overrides]), resolve=True))

    assert label(["trainer.log_every=5"]) != label(["trainer.log_every=7"])  # it sets sigma_c (and the draws)
    off = ["trainer.dp_curves=false"]
    assert label([*off, "trainer.log_every=5"]) == label([*off, "trainer.log_every=7"])  # only where to log
    assert label(["privacy=none", "trainer.log_every=5"]) == label(["privacy=none", "trainer.log_every=7"])


def test_subsample_aggregate_parts_release_no_curve():
    from dptrain.inference.subsample import _part_plan, part_mechanism

    cfg = OmegaConf.to_object(_compose([*SMALL, "privacy.noise_multiplier=1.0", "estimator.parts=4",
                                        "trainer.epochs=2", "trainer.batch_size=100"]))
    plan = training_plan(cfg)
    assert plan.loop.dp_curves and not _part_plan(plan).loop.dp_curves
    mech = part_mechanism(plan, dataset_size=2000, delta=1e-5)
    assert mech.curve is None and mech.curve_event is None and mech.report_fields()["dp_curves"] is None


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize("setting,value,rule", [
    ("trainer.curve_budget_share", 0, "(0, 0.5]"), ("trainer.curve_budget_share", 0.6, "(0, 0.5]"),
    ("trainer.curve_budget_share", float("nan"), "(0, 0.5]"), ("trainer.curve_loss_bound", 0, "> 0"),
    ("trainer.curve_loss_bound", -1.0, "> 0"), ("trainer.curve_loss_bound", float("inf"), "> 0"),
    ("trainer.dp_curves", "yes", "true or false"),
])
def test_bad_curve_settings_are_refused_by_name(setting, value, rule):
    cfg = OmegaConf.to_object(_compose(SMALL))
    setattr(cfg.trainer, setting.split(".")[1], value)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert f"{setting}={value!r}" in str(err.value) and rule in str(err.value)


def test_objective_defaults_and_a_plugin_objective_without_one():
    assert build_objective("binary").curve_loss_bound(DataSpec(3)) == 2.0
    spec = DataSpec(3, target_kind="multiclass", class_names=("a", "b", "c", "d"))
    assert build_objective("multinomial").curve_loss_bound(spec) == pytest.approx(math.log(4) + 1)
    assert build_objective("linear").curve_loss_bound(DataSpec(3, "continuous", target_bounds=(0, 1))) == 0.5
    from dptrain.models.objectives import OBJECTIVES, BinaryLogistic

    class NoBound(BinaryLogistic):
        name = "no_bound"
        curve_loss_bound = None

    OBJECTIVES.register("no_bound", NoBound)
    try:
        cfg = OmegaConf.to_object(_compose([*SMALL, "objective.name=no_bound"]))
        with pytest.raises(ConfigError, match=r"trainer.curve_loss_bound=None is not allowed: objective=no_bound"):
            validate(cfg)
        cfg.trainer.curve_loss_bound = 1.5
        validate(cfg)  # an explicit bound, or trainer.dp_curves=false, is fine
        cfg.trainer.curve_loss_bound, cfg.trainer.dp_curves = None, False
        validate(cfg)
    finally:
        OBJECTIVES.unregister("no_bound")


def test_audit_mechanism_releases_no_curve():
    cfg, data, delta = _setup([])
    plan = training_plan(cfg)
    assert dptrain.training.fit.mechanism_for(plan, dataset_size=data.n_train, delta=delta, curves=False).curve is None
    assert dptrain.training.fit.mechanism_for(plan, dataset_size=data.n_train, delta=delta).curve is not None
