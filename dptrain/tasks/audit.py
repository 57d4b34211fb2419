"""Empirical privacy audit in one training run (Steinke, Nasr, Jagielski 2023, "Privacy
Auditing with One (1) Training Run", NeurIPS 2023).

``python -m dptrain experiment=audit_logit`` (or ``audit_mlp``) trains the configured DP-SGD
model once, with m canary records each added to the training set independently with
probability 1/2, scores every canary after training, guesses which ones were trained on, and
turns the number of correct guesses into an epsilon LOWER BOUND at the stated confidence. It
reports the bound beside the epsilon the run CLAIMS (its accountant's epsilon at its delta).

What the bound means. If the training run really is (epsilon, delta)-DP for every canary as a
record (add/remove), then with probability >= ``confidence`` over the canaries' coin flips and
the training randomness, the reported bound is <= epsilon. A bound ABOVE the claimed epsilon is
therefore evidence (at that confidence) that the claim is false: a bug, or a broken run. A bound
below it proves nothing about privacy: it is a lower bound for this configuration, these
canaries and this scoring rule, usually far below the claim (one run, final model only).

Design choices
--------------

Canaries. Each canary j gets its own feature column: m columns are appended to the public
schema, 0 in every real row (train and test); canary j is the row with 1 in column j, 0
elsewhere, label 1. Only canary j (if it was sampled) and the noise move the first layer's
weights of column j, so its gradient is "Dirac-like" (the ideal canary of the paper's
white-box experiments) while going through the ordinary data path: Poisson sampling, flat
clipping, noise, the optimiser. Nothing in the mechanism changes, so the run's DP guarantee
applies to each canary as a record. The real data (e.g. UCI Adult) stays in, so the audited run
is the configured run plus about m/2 rows. The public N from which q = B/N, the planned steps and
the default delta are computed is the real training rows plus ALL m canaries: nothing the run
reports depends on how many canaries won their coin flip (which would otherwise show in q).

Scores. ``logit_delta`` (default): the model's logit on canary j's input minus the logit of the
same final model with column j of the first layer put back to its initial value. For logistic
regression this is exactly w_j(final) - w_j(init); for an MLP it is the effect of column j's
change on the canary's own prediction. It is sign-aware (training on a label-1 canary raises its
logit; noise moves it either way) and removes the random initial weight, which is independent of
the data and may be published with the final model without touching the guarantee (DP-SGD's
analysis covers every iterate, the initial one included). The norm of the column change is not
used: noise adds to it whatever the sign, so it separates worse. ``logit`` (black-box): the
final model's logit on the canary's input, i.e. the canary's loss, with the initial weight as
extra noise.

Guesses and the union bound. The scores are sorted (ties broken by canary index, which is
independent of the coin flips); for a fixed k the auditor guesses "in" for the k highest, "out"
for the k lowest and abstains on the rest: r = 2k guesses, v correct. k = floor(f m / 2) for each
f in ``audit.guess_fractions``, all fixed before training. The reported bound is the largest
over the list, each computed at confidence 1 - (1 - confidence) / K for the K distinct k (a union
bound), so choosing the best k after seeing the scores is paid for and the reported bound holds
at ``confidence``.

The bound. For eps-DP the number of correct guesses is stochastically dominated by
Binomial(r, e^eps / (1 + e^eps)) (the paper's Theorem 3.1); for (eps, delta)-DP the tail gains
2 m delta max_i (f(v - i) - f(v)) / i with f(v) = P[Binomial(r, e^eps/(1+e^eps)) >= v] (their
Theorem 5.2). :func:`p_value` is that tail; :func:`epsilon_lower_bound` is the end of the
interval [0, eps) of epsilons it rejects at level 1 - confidence (the first eps whose p-value
reaches that level, so a non-monotone delta term can only make the bound smaller). With
delta = 0 it is the exact binomial (Clopper-Pearson) bound.

``audit.mutation=no_noise`` runs the mechanism's ``without_noise()`` copy: its engine adds no
noise while the accountant still records the configured sigma: the run then claims an epsilon it does
not have, and the audit must report a bound above that claim. Its report says so loudly.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from dptrain.core.validation import ConfigError
from dptrain.data import Dataset, load_dataset, write_data_diagnostics
from dptrain.inference.audit_bound import (  # noqa: F401  (the audit's statistics, re-exported)
    Guesses,
    audit_scores,
    count_correct,
    epsilon_lower_bound,
    guess_counts,
    p_value,
)
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.runfolder.tracking import Tracker, finite_epsilon, private_dir
from dptrain.settings.audit import validate_audit
from dptrain.settings.train import Config, validate_against_size
from dptrain.tasks.outputs import randomness_for
from dptrain.tasks.plan import training_plan
from dptrain.training.fit import (
    LaunchConfig,
    bound_to_rows,
    build_model,
    final_epsilons,
    fit,
    mechanism_for,
)

log = logging.getLogger(__name__)

CANARY_DESIGN = (
    "dedicated-column canaries: m extra feature columns, 0 in every real row; canary j has 1 in "
    "column j (other features 0) and label 1, included independently with probability 1/2"
)
SCORE_DESCRIPTION = {
    "logit_delta": "logit on canary j's input minus the same model's logit with first-layer column j "
                   "reset to its initial value (white-box; = w_j(final) - w_j(init) for logistic regression)",
    "logit": "the final model's logit on canary j's input (black-box)",
}
BROKEN_WARNING = (
    "DELIBERATELY BROKEN RUN (audit.mutation=no_noise): the noise was switched off while the "
    "accountant still claims sigma; this model has NO privacy guarantee and its claimed epsilon is false"
)



# --------------------------------------------------------------------------------------------
# Canaries and scores
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Canaries:
    data: Dataset  # the real rows plus the included canaries, m extra (canary) feature columns
    inputs: torch.Tensor  # (m, d + m): canary j's feature row
    included: np.ndarray  # (m,) bool: canary j is in the training set
    columns: torch.Tensor  # (m,) the feature column of canary j


def add_canaries(data: Dataset, *, m: int, rng: np.random.Generator) -> Canaries:
    """Append m canary columns (0 in every real row) and the canaries that win their coin flip
    (probability 1/2 each) as extra training rows; the test rows get the zero columns too."""
    included = rng.random(m) < 0.5
    d = data.n_features
    columns = torch.arange(d, d + m)
    inputs = torch.zeros(m, d + m)
    inputs[torch.arange(m), columns] = 1.0
    keep = torch.from_numpy(np.flatnonzero(included))
    x_train = torch.cat([torch.cat([data.x_train, torch.zeros(data.n_train, m)], 1), inputs[keep]])
    y_train = torch.cat([data.y_train, torch.ones(len(keep))])
    x_test = torch.cat([data.x_test, torch.zeros(data.n_test, m)], 1)
    audited = Dataset(
        x_train=x_train.contiguous(), y_train=y_train.contiguous(), x_test=x_test.contiguous(),
        y_test=data.y_test, feature_names=(*data.feature_names, *(f"canary_{j}" for j in range(m))),
        source=f"{data.source}; plus {len(keep)} of {m} audit canaries",
    )
    return Canaries(data=audited, inputs=inputs, included=included, columns=columns)


def first_linear(model: nn.Module) -> nn.Linear:
    """The layer that reads the features (the canary columns): the model's first module."""
    first = next(iter(model.children()), None)
    if not isinstance(first, nn.Linear):
        raise ConfigError(
            f"model={type(model).__name__} is not allowed for task=audit: the audit needs a model whose "
            "first layer is nn.Linear (dptrain.models.networks.logit or dptrain.models.networks.mlp)"
        )
    return first


@torch.no_grad()
def canary_scores(model: nn.Module, canaries: Canaries, initial_weight: torch.Tensor, *, method: str) -> np.ndarray:
    """One score per canary, higher = more likely trained on (see the module docstring)."""
    model.eval()
    trained = model(canaries.inputs)
    if method == "logit":
        return trained.double().numpy()
    if method != "logit_delta":
        raise ValueError(f"audit.score={method!r} is not allowed: must be logit_delta or logit")
    reset = copy.deepcopy(model)
    layer = first_linear(reset)
    layer.weight[:, canaries.columns] = initial_weight[:, canaries.columns]
    return (trained.double() - reset(canaries.inputs).double()).numpy()


# --------------------------------------------------------------------------------------------
# The audit run
# --------------------------------------------------------------------------------------------


def _canary_rng(conf: Config) -> np.random.Generator:
    """The canaries' coin flips: from audit.seed, or derived from the run seed (a stream of
    its own, independent of the sampling and noise streams of :func:`dptrain.training.fit.fit`)."""
    seed = conf.audit.seed if conf.audit.seed is not None else conf.seed
    return np.random.default_rng(np.random.SeedSequence([int(seed), 0xA0D17]))


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=audit (experiment=audit_logit / audit_mlp): settings, randomness and the model
    (with the canary columns) checked before the data is read; one training run with canaries,
    then an epsilon lower bound beside the claimed epsilon. Returns the bound."""
    conf: Config = OmegaConf.to_object(cfg)
    validate_audit(conf)
    randomness = randomness_for(conf, cfg, run_dir=run_dir)
    plan = training_plan(conf, extra_features=conf.audit.canaries)
    build_model(plan)
    data = load_dataset(plan.data, seed=plan.seed)
    randomness = bound_to_rows(randomness, data)
    RunFolder.of(run_dir).write_text(".hydra/resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    report = run_audit(conf, data, run_dir=run_dir, randomness=randomness)
    for line in format_audit(report):
        (log.warning if report["broken"] or report["claim_refuted"] else log.info)("%s", line)
    log.info("audit outputs in %s (audit.json, audit_canaries.csv; FILES.txt lists them)", run_dir)
    return float(report["epsilon_lower_bound"])


def _train_with_canaries(conf: Config, canaries: Canaries, *, public_n: int, delta: float, run_dir: Path | None,
                         randomness: Any) -> tuple[Any, torch.Tensor]:
    """One DP-SGD run on the data plus the drawn-in canaries; (result, initial first-layer
    weights). The mechanism's N is ``public_n`` (all m canaries counted), so q, the steps and
    delta do not depend on the coin flips. ``audit.mutation=no_noise``: the mechanism's engine
    adds no noise while its accountant records sigma."""
    plan = training_plan(conf, extra_features=conf.audit.canaries)
    mechanism = mechanism_for(plan, dataset_size=public_n, delta=delta, curves=False)  # audits the model alone
    if conf.audit.mutation == "no_noise":
        log.warning("%s", BROKEN_WARNING)
        mechanism = mechanism.without_noise()
    initial: dict[str, torch.Tensor] = {}
    tracker = Tracker(private_dir(run_dir) if run_dir is not None else Path("."),
                      tensorboard=conf.logger.tensorboard and run_dir is not None)
    try:
        result = fit(plan, canaries.data, mechanism=mechanism, tracker=tracker,
                     launch=LaunchConfig(randomness=randomness),
                     on_engine=lambda e: initial.setdefault("weight", first_linear(e.model).weight.detach().clone()))
    finally:
        tracker.close()
    return result, initial["weight"]


def run_audit(conf: Config, data: Dataset, *, run_dir: Path | None = None, randomness: Any = None) -> dict[str, Any]:
    """Train once with canaries, score them, guess, bound. Writes ``audit.json``,
    ``audit_canaries.csv``, ``FILES.txt`` and ``private/metrics.json`` to ``run_dir`` (when
    given) and returns the report. ``data`` is the real data set; ``conf`` must have passed
    :func:`dptrain.settings.audit.validate_audit`. ``randomness``: the secret streams of the training run
    (default: fresh from the OS CSPRNG)."""
    start, a = time.perf_counter(), conf.audit
    canaries = add_canaries(data, m=a.canaries, rng=_canary_rng(conf))
    public_n = data.n_train + a.canaries  # not the drawn-in count: q, steps and delta must not depend on it
    delta = validate_against_size(conf, public_n)
    result, initial = _train_with_canaries(conf, canaries, public_n=public_n, delta=delta, run_dir=run_dir,
                                           randomness=randomness)
    epsilons = final_epsilons(result, delta=delta, headline=conf.privacy.accountant)
    scores = canary_scores(result.model, canaries, initial, method=a.score)
    best, rows = audit_scores(scores, canaries.included, fractions=list(a.guess_fractions), delta=delta,
                              confidence=a.confidence)
    report = _audit_report(conf, best, rows, epsilons=epsilons, delta=delta, canaries=canaries,
                           mechanism=result.privacy)
    report["seconds"] = time.perf_counter() - start
    if run_dir is not None:
        _write_audit_files(RunFolder.of(run_dir), report, canaries=canaries, scores=scores, metrics=result.metrics,
                           data=data)
    return report


def _audit_report(conf: Config, best: Guesses, rows: list[Guesses], *, epsilons: dict[str, float], delta: float,
                  canaries: Canaries, mechanism: dict[str, Any]) -> dict[str, Any]:
    a, claimed = conf.audit, epsilons[conf.privacy.accountant]
    broken = a.mutation == "no_noise"
    return {
        "claimed_epsilon": claimed, "accountant": conf.privacy.accountant, "epsilons": epsilons, "delta": delta,
        "epsilon_lower_bound": best.lower_bound, "confidence": a.confidence,
        "claim_refuted": best.lower_bound > claimed,
        "m": a.canaries, "canaries_included": int(canaries.included.sum()),
        "r": best.r, "v": best.v, "k_plus": best.k, "k_minus": best.k, "k_tried": [g.k for g in rows],
        "selection": (f"best of {len(rows)} k fixed in advance (audit.guess_fractions), union bound: each at "
                      f"confidence {1 - (1 - a.confidence) / len(rows):.6g}"),
        "per_k": [{"k": g.k, "r": g.r, "v": g.v, "epsilon_lower_bound": g.lower_bound} for g in rows],
        "score": a.score, "score_description": SCORE_DESCRIPTION[a.score], "canary_design": CANARY_DESIGN,
        "mutation": a.mutation, "broken": broken, "warning": BROKEN_WARNING if broken else None,
        "meaning": (
            "a lower bound on the epsilon of THIS configuration with THESE canaries: if the run were "
            f"(epsilon, delta)-DP, a bound above epsilon would appear with probability <= {1 - a.confidence:.3g}. "
            "A bound below the claim is not a proof of privacy."
        ),
        "bound": "Steinke, Nasr, Jagielski 2023 (one training run), Theorems 3.1 / 5.2",
        "mechanism": mechanism, "seed": conf.seed, "audit_seed": a.seed,
    }


def _write_audit_files(folder: RunFolder, report: dict[str, Any], *, canaries: Canaries, scores: np.ndarray,
                       metrics: dict[str, float], data: Dataset) -> None:
    lines = ["canary,included,score"] + [
        f"{j},{int(inc)},{s:.9g}" for j, (inc, s) in enumerate(zip(canaries.included, scores))]
    folder.write_text("audit_canaries.csv", "\n".join(lines) + "\n",
                      "each canary's coin flip and score (synthetic records, not data)")
    folder.write_json("metrics.json", metrics, "test metrics and timings of the audited run (rows of the data)",
                      private=True)
    folder.private("tb/", "TensorBoard curves of the audited run")
    folder.private("checkpoint.pt", "not written: an audit is one fresh run")
    folder.record(write_data_diagnostics(folder.path, data))
    folder.finish(guarantee=f"the audited run claims ({report['claimed_epsilon']:.4g}, {report['delta']:.3g})-DP; "
                  "this audit is a lower bound, not a proof",
                  finite_guarantee=not report["broken"] and finite_epsilon(report["claimed_epsilon"]),
                  report=Report("audit.json", report, "the audit's result: scores of the trained (DP) model on "
                                "synthetic canaries, post-processing"))


def format_audit(report: dict[str, Any]) -> list[str]:
    """The lines an audit run prints."""
    lines = []
    if report["broken"]:
        lines.append("!" * 20 + " " + report["warning"] + " " + "!" * 20)
    verdict = (
        "CLAIM REFUTED: the lower bound exceeds the claimed epsilon"
        if report["claim_refuted"] else "consistent with the claim (a lower bound, not a proof of privacy)"
    )
    lines.append(
        f"audit: epsilon lower bound = {report['epsilon_lower_bound']:.4g} at {report['confidence']:.0%} confidence "
        f"vs claimed epsilon = {report['claimed_epsilon']:.4g} ({report['accountant']}, "
        f"delta = {report['delta']:.3g}): "
        f"{verdict}"
    )
    lines.append(
        f"audit: m = {report['m']} canaries ({report['canaries_included']} included), r = {report['r']} guesses "
        f"(k = {report['k_plus']} in + {report['k_minus']} out, best of k in {report['k_tried']}, union bound), "
        f"v = {report['v']} correct; score = {report['score']}; {report['seconds']:.1f} s"
    )
    return lines
