"""The one-run privacy audit: the lower-bound math, the guessing, and end-to-end audits of a
correct run (bound below the claim) and a deliberately broken one (noise off: bound above it)."""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from scipy import stats

from dptrain.core.validation import ConfigError
from dptrain.data import Dataset
from dptrain.settings.train import Config
from dptrain.tasks import cli
from dptrain.tasks.audit import (
    add_canaries,
    audit_scores,
    count_correct,
    epsilon_lower_bound,
    guess_counts,
    p_value,
)
from dptrain.tasks.registry import validate

# ---------------------------------------------------------------------------- the bound


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_perfect_guessing_with_delta_zero_is_the_closed_form():
    # P[Binomial(r, p) >= r] = p^r = 0.05  ->  p = 0.05^(1/r)
    for r in (5, 10, 100, 1000, 100000):
        p = 0.05 ** (1 / r)
        assert epsilon_lower_bound(m=r, r=r, v=r, delta=0) == pytest.approx(_logit(p), rel=1e-9)
    for r in (1, 2, 3, 4):  # 0.05^(1/r) <= 1/2: even r right guesses out of r prove nothing at 95%
        assert epsilon_lower_bound(m=r, r=r, v=r, delta=0) == 0
    assert epsilon_lower_bound(m=1000, r=1000, v=1000, delta=0) == pytest.approx(5.809068, abs=1e-5)


@pytest.mark.parametrize("r,v", [(10, 9), (100, 70), (100, 95), (1000, 600), (1000, 990), (37, 30)])
def test_delta_zero_equals_the_binomial_tail(r, v):
    eps = epsilon_lower_bound(m=r, r=r, v=v, delta=0, confidence=0.95)
    assert eps > 0
    # the bound is where the binomial tail crosses 0.05 ...
    q = 1 / (1 + math.exp(-eps))
    assert stats.binom.sf(v - 1, r, q) == pytest.approx(0.05, rel=1e-6)
    # ... and p_value (delta = 0) is that tail
    assert p_value(m=r, r=r, v=v, epsilon=eps, delta=0) == pytest.approx(0.05, rel=1e-6)
    assert p_value(m=r, r=r, v=v, epsilon=eps * 0.99, delta=0) < 0.05 < p_value(m=r, r=r, v=v, epsilon=eps * 1.01,
                                                                                    delta=0)


@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_monotone_in_v_and_zero_up_to_half(delta):
    r = m = 200
    bounds = [epsilon_lower_bound(m=m, r=r, v=v, delta=delta) for v in range(r + 1)]
    assert all(b == 0 for b in bounds[: r // 2 + 1])  # v <= r/2: nothing is learnt
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(bounds))
    assert bounds[-1] > 2
    perfect = epsilon_lower_bound(m=m, r=r, v=r, delta=0)
    assert max(bounds) <= perfect + 1e-12  # never beyond what perfect guessing with delta = 0 allows


def test_delta_and_confidence_only_lower_the_bound():
    for v in (120, 160, 199, 200):
        b0 = epsilon_lower_bound(m=200, r=200, v=v, delta=0)
        b1 = epsilon_lower_bound(m=200, r=200, v=v, delta=1e-4)
        b2 = epsilon_lower_bound(m=2000, r=200, v=v, delta=1e-4)  # more canaries: more delta slack
        assert b0 >= b1 >= b2 >= 0
        assert epsilon_lower_bound(m=200, r=200, v=v, delta=0, confidence=0.99) < b0


def test_bound_is_valid_for_randomised_response():
    # eps-DP randomised response on each canary: P[correct] = e^eps / (1 + e^eps). The bound at
    # 95% must exceed eps in at most ~5% of repetitions (here: 400 repetitions, expect ~<=20).
    rng = np.random.default_rng(0)
    eps, r = 1.0, 300
    correct = rng.binomial(r, 1 / (1 + math.exp(-eps)), size=400)
    bounds = [epsilon_lower_bound(m=r, r=r, v=int(v), delta=0) for v in correct]
    exceed = sum(b > eps for b in bounds)
    assert exceed <= 0.05 * 400 + 3 * math.sqrt(0.05 * 0.95 * 400)
    assert np.mean(bounds) > 0.3  # and it is not vacuous


def test_bad_counts_refused():
    with pytest.raises(ValueError):
        epsilon_lower_bound(m=10, r=20, v=5, delta=0)
    with pytest.raises(ValueError):
        epsilon_lower_bound(m=10, r=10, v=11, delta=0)
    with pytest.raises(ValueError):
        epsilon_lower_bound(m=10, r=10, v=5, delta=0, confidence=1.0)


# ---------------------------------------------------------------------------- guessing, canaries


def test_guessing_counts_and_union_bound():
    included = np.array([True, False, True, False, True, False])
    scores = np.array([5.0, -1.0, 4.0, 0.0, -2.0, 1.0])  # order: 0, 2, 5, 3, 1, 4
    assert count_correct(scores, included, 1) == (2, 1)  # in: 0 (right); out: 4 (wrong, it is in)
    assert count_correct(scores, included, 2) == (4, 3)  # in: 0, 2 (right); out: 1 (right), 4 (wrong)
    assert count_correct(scores, included, 3) == (6, 4)  # + in: 5 (wrong), out: 3 (right)
    assert guess_counts(1000, [0.1, 0.2, 0.5, 1.0]) == [50, 100, 250, 500]
    assert guess_counts(10, [0.01, 0.1]) == [1]
    # a perfect separation: the reported bound is the best k's, each at 1 - 0.05 / K
    m = 400
    inc = np.arange(m) % 2 == 0
    best, rows = audit_scores(inc.astype(float), inc, fractions=[0.25, 1.0], delta=0, confidence=0.95)
    assert [g.k for g in rows] == [50, 200] and all(g.v == g.r for g in rows)
    assert best.k == 200 and best.lower_bound == pytest.approx(
        epsilon_lower_bound(m=m, r=400, v=400, delta=0, confidence=1 - 0.05 / 2))


def test_canaries_have_their_own_columns():
    n, d, m = 50, 3, 8
    data = Dataset(x_train=torch.rand(n, d), y_train=torch.zeros(n), x_test=torch.rand(7, d), y_test=torch.ones(7),
                   feature_names=("a", "b", "c"), source="test")
    can = add_canaries(data, m=m, rng=np.random.default_rng(1))
    k = int(can.included.sum())
    x = can.data.x_train
    assert x.shape == (n + k, d + m) and can.data.x_test.shape == (7, d + m)
    assert torch.equal(x[:n, :d], data.x_train) and not x[:n, d:].any() and not can.data.x_test[:, d:].any()
    assert torch.equal(x[n:], can.inputs[torch.from_numpy(np.flatnonzero(can.included))])
    assert torch.equal(can.inputs[:, d:], torch.eye(m)) and not can.inputs[:, :d].any()
    assert can.data.y_train[n:].eq(1).all() and len(can.data.feature_names) == d + m


# ---------------------------------------------------------------------------- end to end

# Small enough for CI (~1-3 s a run on 2 cores): real Adult, the presets' sigma 2.6 and 10 epochs
# (claimed epsilon ~0.95 at delta 1e-5: an audit releases no dp/ curve), 200 canaries.
SMALL = ["audit.canaries=200", "trainer.progress=false", "logger.tensorboard=false"]


def _audit(tmp_path: Path, overrides: list[str]) -> dict:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, *SMALL])
    bound = cli.run(cfg, run_dir=tmp_path)
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["epsilon_lower_bound"] == bound
    lines = (tmp_path / "audit_canaries.csv").read_text().splitlines()
    assert lines[0] == "canary,included,score" and len(lines) == 1 + report["m"]
    return report


def _check_report(report: dict, *, broken: bool) -> None:
    assert report["m"] == 200 and report["delta"] == 1e-5 and report["confidence"] == 0.95
    assert 0 <= report["v"] <= report["r"] <= report["m"] and report["r"] == 2 * report["k_plus"]
    assert report["claimed_epsilon"] == pytest.approx(0.95, abs=0.02)
    assert report["broken"] is broken and report["mutation"] == ("no_noise" if broken else "none")
    assert (report["warning"] is not None) is broken
    assert report["epsilon_lower_bound"] == pytest.approx(epsilon_lower_bound(
        m=report["m"], r=report["r"], v=report["v"], delta=report["delta"],
        confidence=1 - 0.05 / len(report["k_tried"])))
    if broken:
        assert report["epsilon_lower_bound"] > report["claimed_epsilon"] + 1.5 and report["claim_refuted"]
        assert "NO privacy guarantee" in report["warning"]
    else:
        assert report["epsilon_lower_bound"] < report["claimed_epsilon"] and not report["claim_refuted"]
    assert report["mechanism"]["noise_multiplier"] == 2.6  # what the accountant was told, broken or not


@pytest.mark.parametrize("experiment", ["audit_logit", "audit_mlp"])
def test_audit_of_a_correct_run_stays_below_the_claim(experiment, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dptrain")
    report = _audit(tmp_path, [f"experiment={experiment}"])
    _check_report(report, broken=False)
    metrics = json.loads((tmp_path / "private" / "metrics.json").read_text())
    assert metrics["test/acc"] > 0.8  # the canaries do not spoil the model
    assert "test" not in report  # metrics on rows of the data stay in private/
    assert "consistent with the claim" in caplog.text


@pytest.mark.parametrize("experiment", ["audit_logit", "audit_mlp"])
def test_audit_catches_a_run_without_noise(experiment, tmp_path, caplog):
    report = _audit(tmp_path, [f"experiment={experiment}", "audit.mutation=no_noise"])
    _check_report(report, broken=True)
    assert "DELIBERATELY BROKEN RUN" in caplog.text and "CLAIM REFUTED" in caplog.text


def test_audit_mechanism_does_not_depend_on_the_drawn_canaries(tmp_path):
    """Found in review: the audit's q, steps and default delta were computed from N = real rows
    + the canaries that won their coin flip, so the report leaked how many were drawn in. N is
    now the real rows plus ALL m canaries, whatever the coin flips."""
    reports = [_audit(tmp_path / str(s), ["experiment=audit_logit", f"audit.seed={s}", "privacy.delta=null"])
               for s in (1, 2)]
    assert reports[0]["canaries_included"] != reports[1]["canaries_included"]
    for key in ("sample_rate", "steps", "dataset_size", "planned_steps", "delta"):
        assert reports[0]["mechanism"][key] == reports[1]["mechanism"][key], key
    assert reports[0]["mechanism"]["dataset_size"] == 32561 + 200  # Adult's training rows + m
    assert reports[0]["delta"] == reports[1]["delta"]


def test_black_box_score_runs(tmp_path):
    report = _audit(tmp_path, ["experiment=audit_logit", "audit.score=logit", "audit.mutation=no_noise"])
    assert report["score"] == "logit" and report["epsilon_lower_bound"] > report["claimed_epsilon"]


# ---------------------------------------------------------------------------- settings


def _conf(overrides: list[str]) -> Config:
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=["experiment=audit_logit", *overrides]))


@pytest.mark.parametrize("override,needle", [
    ("audit.canaries=1", "audit.canaries"),
    ("audit.canaries=1000000", "audit.canaries"),
    ("audit.guess_fractions=[]", "audit.guess_fractions"),
    ("audit.guess_fractions=[0.5,1.5]", "audit.guess_fractions"),
    ("audit.guess_fractions=[0.001]", "gives no guess"),
    ("audit.confidence=0.4", "audit.confidence"),
    ("audit.confidence=1", "audit.confidence"),
    ("audit.mutation=no_clip", "audit.mutation"),
    ("audit.score=loss_norm", "audit.score"),
    ("privacy=none", "privacy.enabled"),
])
def test_bad_audit_settings_refused_by_name(override, needle):
    conf = _conf([override])
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(conf)


def test_presets_validate():
    for name in ("audit_logit", "audit_mlp"):
        with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
            conf = OmegaConf.to_object(compose(config_name="config", overrides=[f"experiment={name}"]))
        validate(conf)
        assert conf.task == "audit" and conf.audit.mutation == "none" and conf.privacy.noise_multiplier == 2.6
