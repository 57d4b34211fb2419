"""task=tune: private hyperparameter search with a random number of candidates (docs/tuning.md).

Papernot & Steinke (2022, "Hyperparameter tuning with Renyi differential privacy"): draw the
number of candidates K from a known law (truncated negative binomial with shape eta >= 0, whose
special cases are the logarithmic (eta = 0) and geometric (eta = 1) laws, or Poisson), run the
base mechanism K times and release ONLY the best candidate. If the base mechanism is
(lambda, eps(lambda))-RDP at every order, the whole search is RDP with the bound of their
Theorem 2 (Theorem 6 for Poisson), which dp-accounting implements for
``RepeatAndSelectDpEvent(base, mean, shape)``.

The base mechanism here, run once per candidate:

1. draw one value per searched setting uniformly from its list (``tune.space``; SECRET
   randomness: the draws are data-independent, but the list of all draws would reveal K);
2. train DP-SGD on the FIT part of the training rows with the search's one noise multiplier
   sigma (every candidate has the same q = B / N_fit and the same steps: settings that change the
   mechanism, such as epochs or the batch size, are not searchable, so the base event is one);
3. score the model on the VALIDATION part: the sum over its rows of a per-row score in [0, 1]
   (1 if correct for a classifier; 1 - min((z - y)^2, 1) on the [0, 1]-scaled target for
   regression) plus Gaussian noise N(0, ``tune.score_noise``^2) (sensitivity 1), divided by the
   validation part's size.

Its event (``private_search`` in dptrain.privacy.events) is
``ComposedDpEvent([SelfComposed(PoissonSampled(q, Gaussian(sigma)), T), Gaussian(score_noise)])``:
composing the two parts is conservative (the fit and validation parts are disjoint, so each row
takes part in only one of them). The validation part is a keyed hash
of each row's own content (``tune.validation_fraction`` of the rows; key from the public seed,
personalisation ``dptrain-valid``), so adding or removing one row moves no other.

sigma is the smallest whose epsilon of the WHOLE search (RDP accountant, dp-accounting) is
within ``privacy.target_epsilon``. K, the other candidates' settings and scores, and their
models are private (``private/candidates.jsonl``): publishing K would undo the analysis, which
assumes an adversary who sees only the selected candidate.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from dptrain.core.errors import DPTrainError
from dptrain.core.validation import bad
from dptrain.data import load_dataset, write_data_diagnostics
from dptrain.inference.run import coefficient_section
from dptrain.inference.subsample import row_uniform
from dptrain.models.objectives import build_objective
from dptrain.privacy.accounting import RDP, history_epsilon
from dptrain.privacy.calibration import Unreachable, smallest_noise
from dptrain.privacy.dpsgd.mechanism import DPSGDMechanism, planned_steps
from dptrain.privacy.events import private_search
from dptrain.privacy.report import NOT_COVERED, build_report, format_report, noise_sampler_section, summary_lines
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.runfolder.tracking import finite_epsilon
from dptrain.settings.command_line import check_known_keys
from dptrain.settings.train import validate_against_size
from dptrain.settings.tune import LAWS, TuneRunConfig, check_tune, flatten_space, validate_tune
from dptrain.tasks.outputs import (
    publishable_metrics,
    randomness_for,
    training_files,
    write_metrics,
    write_model_files,
)
from dptrain.tasks.plan import training_plan
from dptrain.training.fit import LaunchConfig, bound_to_rows, build_model, fit

__all__ = ["LAWS", "CandidateLaw", "calibrate_search", "console_withheld", "draw_settings",
           "flatten_space", "row_scores", "run_task", "search_epsilon", "select_best", "selection_key",
           "validation_mask"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ the law of K


def _tnb_mean(shape: float, gamma: float) -> float:
    """Mean of the truncated negative binomial TNB(shape, gamma) (logarithmic at shape 0)."""
    if shape == 0:
        return (1 - gamma) / (gamma * math.log(1 / gamma))
    return shape * (1 - gamma) / (gamma * (1 - gamma**shape))


@dataclass(frozen=True)
class CandidateLaw:
    """The law of the number of candidates K: ``truncated_negative_binomial`` (K >= 1; shape 0
    logarithmic, 1 geometric) or ``poisson`` (K >= 0; K = 0 releases no model), with mean ``mean``."""

    distribution: str
    mean: float
    shape: float = 1.0

    @property
    def dp_shape(self) -> float:
        """dp-accounting's ``shape``: infinity means Poisson."""
        return math.inf if self.distribution == "poisson" else float(self.shape)

    def gamma(self) -> float:
        """The TNB parameter gamma in (0, 1) with E[K] = mean (solved numerically)."""
        from scipy.optimize import brentq

        if self.mean <= 1.0:
            return 1.0
        return float(brentq(lambda g: _tnb_mean(self.shape, g) - self.mean, 1e-15, 1 - 1e-12, xtol=1e-15,
                            rtol=1e-13))

    def pmf(self, k: int) -> float:
        """P(K = k)."""
        if self.distribution == "poisson":
            return math.exp(k * math.log(self.mean) - self.mean - math.lgamma(k + 1))
        if k < 1:
            return 0.0
        g = self.gamma()
        if g >= 1.0:
            return 1.0 if k == 1 else 0.0
        if self.shape == 0:
            return (1 - g) ** k / (k * math.log(1 / g))
        eta = self.shape
        return math.exp(math.lgamma(k + eta) - math.lgamma(eta) - math.lgamma(k + 1) + eta * math.log(g)
                        + k * math.log1p(-g)) / (1 - g**eta)

    def sample(self, rng: np.random.Generator) -> int:
        """One K drawn with ``rng`` (the run's SECRET stream)."""
        if self.distribution == "poisson":
            return int(rng.poisson(self.mean))
        g = self.gamma()
        if g >= 1.0:
            return 1
        if self.shape == 0:
            return int(rng.logseries(1 - g))
        while True:  # negative binomial conditioned on K >= 1
            k = int(rng.negative_binomial(self.shape, g))
            if k >= 1:
                return k


# ------------------------------------------------------------------------------ accounting


def search_epsilon(law: CandidateLaw, *, delta: float, sample_rate: float, noise_multiplier: float, steps: int,
                   score_noise: float) -> float:
    """Epsilon of the whole search (RDP; the ``private_search`` event of dptrain.privacy.events)."""
    event = private_search(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                           score_noise=score_noise, mean=law.mean, shape=law.dp_shape)
    return history_epsilon(((event, 1),), delta=delta, accountant=RDP)


def calibrate_search(law: CandidateLaw, *, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                     score_noise: float, rtol: float = 1e-3) -> float:
    """The smallest DP-SGD noise multiplier (to relative tolerance ``rtol``) whose WHOLE search is
    within ``target_epsilon`` (:func:`dptrain.privacy.calibration.smallest_noise` over
    [1e-3, 1e5]); refuses a target that the selection and the score alone exceed."""

    def eps(sigma: float) -> float:
        return search_epsilon(law, delta=delta, sample_rate=sample_rate, noise_multiplier=sigma, steps=steps,
                              score_noise=score_noise)

    try:
        return smallest_noise(eps, target=target_epsilon, rtol=rtol, lower=1e-3, upper=1e5)
    except Unreachable:
        floor = eps(1e7)
        raise bad("privacy.target_epsilon", target_epsilon,
                  f"is below what the search costs without any training noise ({floor:.4g}: the noisy score "
                  f"(tune.score_noise={score_noise:g}) selected among a random number of candidates "
                  f"(mean {law.mean:g})); allowed: a larger privacy.target_epsilon, a smaller tune.mean or a "
                  "larger tune.score_noise") from None


# ------------------------------------------------------------------------------ settings


def candidate_configs(cfg: Any) -> dict[str, list[Any]]:
    """Every value of every searched setting, each checked like a command-line value (the
    setting exists, the value is allowed) BEFORE any row is read; returns the flat space."""
    space = flatten_space(OmegaConf.to_container(cfg.tune.space, resolve=True))
    for key, values in space.items():
        if OmegaConf.select(cfg, key, default="__missing__") == "__missing__" and not key.startswith("model."):
            raise bad(f"tune.space.{key}", values, "names no setting of this run (docs/settings.md lists them)")
        for value in values:
            trial = _with(cfg, key, value)
            try:
                check_known_keys(trial, {"tune": TuneRunConfig})
                validate_tune(OmegaConf.to_object(trial))
            except DPTrainError as e:
                raise bad(f"tune.space.{key}", values, f"value {value!r} is not allowed: {e}") from None
    return space


def _with(cfg: Any, key: str, value: Any) -> Any:
    trial = copy.deepcopy(cfg)
    with open_dict(trial):
        OmegaConf.update(trial, key, value, merge=False, force_add=key.startswith("model."))
    return trial


# ------------------------------------------------------------------------------ data


def validation_mask(x: torch.Tensor, y: torch.Tensor, *, fraction: float, seed: int) -> np.ndarray:
    """True for the rows of the validation part: a keyed hash of each row's own content (the
    construction of dptrain.inference.subsample.row_uniform, personalisation ``dptrain-valid``)."""
    return row_uniform(x, y, seed=seed, person=b"dptrain-valid") < fraction


def _split(data: Any, mask: np.ndarray) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    fit_rows = torch.from_numpy(np.flatnonzero(~mask))
    val_rows = torch.from_numpy(np.flatnonzero(mask))
    fit_data = dataclasses.replace(data, x_train=data.x_train.index_select(0, fit_rows).contiguous(),
                                   y_train=data.y_train.index_select(0, fit_rows).contiguous(), diagnostics={})
    return fit_data, (data.x_train.index_select(0, val_rows), data.y_train.index_select(0, val_rows))


@torch.no_grad()
def check_scorable(objective: Any) -> None:
    """task=tune scores each candidate with the objective's own ``row_score`` (one value in
    [0, 1] per validation row, so the score sum's sensitivity is 1): an objective without one is
    refused by name before any row is read, never scored as if it were a binary classifier."""
    if not callable(getattr(objective, "row_score", None)):
        raise bad("objective", getattr(objective, "name", type(objective).__name__),
                  "task=tune needs an objective with row_score(outputs, y): a per-row validation score in [0, 1] "
                  "(the built-in binary, multinomial and linear objectives have one; docs/extending.md)")


@torch.no_grad()
def row_scores(objective: Any, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per validation row, a score in [0, 1]: correct (classifiers) or 1 - min((z - y)^2, 1)
    on the [0, 1]-scaled target (regression). A row whose output is not finite (a diverged
    candidate) scores 0, the lowest score: each row's score stays in [0, 1] whatever the model,
    so the score sum's sensitivity stays 1."""
    out = model(x).reshape(len(y), -1).double()
    score = objective.row_score(out, y).double()
    finite = torch.isfinite(out).all(1) & torch.isfinite(score)
    return torch.where(finite, score.clamp(0.0, 1.0), torch.zeros_like(score))


def selection_key(score: float) -> float:
    """What the selection compares: a candidate's noisy score, or minus infinity when it is not
    finite (NaN would compare False against everything)."""
    return score if math.isfinite(score) else -math.inf


def select_best(scores: list[float]) -> int | None:
    """The index of the highest noisy score (:func:`selection_key`); ties go to the earliest
    candidate (a fixed order); None for no candidate. The rule the accounting theorem analyses."""
    best = None
    for i, score in enumerate(scores):
        if best is None or selection_key(score) > selection_key(scores[best]):
            best = i
    return best


def draw_settings(secret: np.random.Generator, space: dict[str, list[Any]]) -> dict[str, Any]:
    """One candidate's settings: one value per searched key, uniformly from its list (secret)."""
    return {key: values[int(secret.integers(len(values)))] for key, values in space.items()}


# ------------------------------------------------------------------------------ the task


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Search:
    """The search's public numbers: the law, the split's sizes, the shared mechanism and its epsilon."""

    law: CandidateLaw
    space: dict[str, list[Any]]
    n_fit: int
    n_val: int
    sample_rate: float
    steps: int
    sigma: float
    score_noise: float
    delta: float
    epsilon: float


def plan_search(conf: Any, space: dict[str, list[Any]], *, n_fit: int, n_val: int, delta: float) -> Search:
    """sigma calibrated for the whole search from public numbers only (module docstring)."""
    t = conf.tune
    if n_val == 0 or conf.trainer.batch_size > n_fit:
        raise bad("tune.validation_fraction", t.validation_fraction,
                  f"leaves {n_val} validation rows and {n_fit} fit rows for trainer.batch_size="
                  f"{conf.trainer.batch_size}; allowed: a fraction that leaves both parts non-empty and B <= N_fit")
    law = CandidateLaw(t.candidates, float(t.mean), float(t.shape))
    q = conf.trainer.batch_size / n_fit
    steps = planned_steps(epochs=conf.trainer.epochs, sample_rate=q)
    base = {"sample_rate": q, "steps": steps, "score_noise": float(t.score_noise)}
    sigma = calibrate_search(law, target_epsilon=conf.privacy.target_epsilon, delta=delta,
                             rtol=conf.privacy.calibration_rtol, **base)
    eps = search_epsilon(law, delta=delta, noise_multiplier=sigma, **base)
    log.info("tune: N_fit=%d, N_val=%d (public), q=%.6g, steps=%d, sigma=%.6g calibrated for the whole search "
             "(epsilon %.6g <= %g, delta %g, RDP); candidates ~ %s(mean %g%s)", n_fit, n_val, q, steps, sigma,
             eps, conf.privacy.target_epsilon, delta, t.candidates, t.mean,
             f", shape {t.shape:g}" if t.candidates != "poisson" else "")
    return Search(law, space, n_fit, n_val, q, steps, sigma, float(t.score_noise), delta, eps)


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=tune: settings and every candidate value checked, THEN the data read, the search run,
    and ONE run folder written for the selected candidate. Returns its noisy validation score."""
    conf = OmegaConf.to_object(cfg)
    validate_tune(conf)
    check_tune(conf)
    space = candidate_configs(cfg)
    randomness = randomness_for(conf, cfg, run_dir=run_dir)
    plan = training_plan(conf)
    check_scorable(plan.objective)
    build_model(plan)
    data = load_dataset(plan.data, seed=plan.seed)
    randomness = bound_to_rows(randomness, data)
    delta = validate_against_size(conf, data.n_train)
    mask = validation_mask(data.x_train, data.y_train, fraction=conf.tune.validation_fraction, seed=conf.seed)
    fit_data, validation = _split(data, mask)
    search = plan_search(conf, space, n_fit=fit_data.n_train, n_val=len(validation[1]), delta=delta)
    best, records = _run_candidates(cfg, conf, search, fit_data, validation, randomness)
    return _write(conf, cfg, run_dir=run_dir, data=data, best=best, records=records, search=search)


def _run_candidates(cfg: Any, conf: Any, search: Search, fit_data: Any, validation: tuple, randomness: Any,
                    ) -> tuple[dict | None, list[dict]]:
    """K candidates (K from the law, secret): each trained, scored with noise; the best kept
    (:func:`select_best`). Nothing is printed per candidate (:func:`console_withheld`)."""
    objective = build_objective(conf.objective.name)
    secret = randomness.numpy("tune-search")
    k = search.law.sample(secret)
    score_noise = randomness.torch("tune-score")
    best: dict[str, Any] | None = None
    records = []
    with console_withheld():
        for i in range(k):
            draws = draw_settings(secret, search.space)
            trial = cfg
            for key, value in draws.items():
                trial = _with(trial, key, value)
            result = _fit_candidate(trial, search, fit_data, randomness.child(f"candidate {i}"))
            total = float(row_scores(objective, result.model, *validation).sum())
            noise = float(torch.randn((), dtype=torch.float64, generator=score_noise)) * search.score_noise
            score = (total + noise) / search.n_val
            records.append({"candidate": i, "settings": draws, "score_dp": score,
                            "model_sha256": _digest(result.model), "nonprivate_validation_score": total / search.n_val})
            if select_best([r["score_dp"] for r in records]) == i:  # the best so far: keep its model
                best = {"score": score, "index": i, "settings": draws, "result": result, "cfg": trial}
    return best, records


def _fit_candidate(trial: Any, search: Search, fit_data: Any, randomness: Any) -> Any:
    """One candidate's DP-SGD fit with the search's mechanism; no progress bar, checkpoint,
    evaluation, baseline or set-up line (their number would show K)."""
    conf_i = OmegaConf.to_object(trial)
    conf_i.trainer = dataclasses.replace(conf_i.trainer, progress=False, checkpoint_every=0, eval_every=10**9,
                                         baseline=False)
    mech = DPSGDMechanism(enabled=True, noise_multiplier=search.sigma,
                          max_grad_norm=float(conf_i.privacy.max_grad_norm),
                          expected_batch_size=conf_i.trainer.batch_size, dataset_size=search.n_fit,
                          planned_steps=search.steps, delta=search.delta, accountant=RDP.name,
                          noise_multiplier_source="calibrated (task=tune: the whole search)",
                          target_epsilon=conf_i.privacy.target_epsilon)
    return fit(training_plan(conf_i), fit_data, mechanism=mech, launch=LaunchConfig(randomness=randomness, quiet=True))


def _not_on_console(record: logging.LogRecord) -> bool:
    return False


@contextlib.contextmanager
def console_withheld() -> Iterator[None]:
    """While the candidates run, log records reach the log FILES only (private/dptrain.log), not
    the console (a stream handler of the root or the dptrain logger): a line per candidate, or a
    warning each candidate repeats, would show their number K on a screen."""
    handlers = [h for name in ("", "dptrain") for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    for handler in handlers:
        handler.addFilter(_not_on_console)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_not_on_console)


TUNE_NOT_COVERED = [
    "the wall-clock time of the search and the log (private/dptrain.log): they grow with the number of candidates "
    "K, which must stay secret (publishing K would undo the analysis): keep them with the data. Every file and "
    "folder of the run folder carries the search's START time as its modification time, so the folder shows no "
    "duration; the console shows no line per candidate. Copy the folder without its times (cp -r "
    "--no-preserve=timestamps: each file gets the copy's time; tar --mtime=@0, or find DIR -exec touch -h -d @0 {} +: "
    "every time set to 1970-01-01) or with them (cp -a, rsync -t keep the one start time)",
    "the sizes of the fit and validation parts (privacy.json: fit_rows, validation_rows): treated as public, "
    "like N, although each row's side is decided by a keyed hash of its content",
]


def _tuning_section(conf: Any, search: Search, best: dict | None) -> dict[str, Any]:
    """The report's ``tuning`` section: what was searched, how, and what was selected."""
    t = conf.tune
    return {
        "method": "private hyperparameter search with a random number of candidates (Papernot & Steinke 2022): "
                  "each candidate trains DP-SGD on the fit part and is scored on the validation part with Gaussian "
                  "noise; ONLY the best candidate (highest noisy score) is released",
        "candidates_law": t.candidates, "candidates_mean": t.mean,
        "candidates_shape": None if t.candidates == "poisson" else t.shape,
        "space": search.space, "selected": None if best is None else best["settings"],
        "selected_score_dp": None if best is None else best["score"],
        "score": "validation accuracy" if conf.objective.name != "linear" else
                 "validation 1 - min(squared error, 1) on the [0, 1]-scaled target",
        "score_noise": t.score_noise, "validation_fraction": t.validation_fraction,
        "fit_rows": search.n_fit, "validation_rows": search.n_val,
        "event": (f"RepeatAndSelectDpEvent(ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent("
                  f"{search.sample_rate:.6g}, GaussianDpEvent({search.sigma:.6g})), {search.steps}), "
                  f"GaussianDpEvent({t.score_noise:g})]), mean={t.mean:g}, shape={search.law.dp_shape:g})"),
        "accounting": "dp-accounting RdpAccountant (Papernot & Steinke Theorem 2; Theorem 6 for Poisson); the PLD "
                      "accountant has no repeat-and-select bound, so only RDP is reported",
        "secret": "the number of candidates, the other candidates' settings, scores and models "
                  "(private/candidates.jsonl)",
    }


def _report(conf: Any, data: Any, search: Search, best: dict) -> dict[str, Any]:
    """privacy.json of a search: the selected candidate's mechanism, the search's epsilon."""
    result, eps = best["result"], search.epsilon
    record = {**result.privacy, "steps": search.steps, "epochs": search.steps * search.sample_rate,
              "delta_source": "config" if conf.privacy.delta is not None else "default: largest power of ten <= "
              "1/(10 N)"}
    report = build_report(mechanism=record, epsilons={RDP.name: eps}, accountant=RDP.name, seed=conf.seed,
                          data_source=data.source)
    report.update(guarantee=_guarantee(search), tuning=_tuning_section(conf, search, best),
                  target_epsilon=conf.privacy.target_epsilon,
                  accountant_notes={RDP.name: "Renyi DP of the repeat-and-select search (Papernot & Steinke 2022) over "
                                    "one candidate's composed RDP (its Poisson-subsampled Gaussian steps and the "
                                    "Gaussian score), dp-accounting RdpAccountant, improved conversion; PLD: no "
                                    "repeat-and-select bound, not reported"},
                  noise_multiplier_source="calibrated for the whole search (task=tune)",
                  not_covered=[*TUNE_NOT_COVERED, *NOT_COVERED[1:]])
    # the sampler's tail over the whole search: a union bound over E[K] candidates' steps
    sampler = noise_sampler_section({**record, "steps": math.ceil(search.law.mean * search.steps)}, eps)
    if sampler is not None:
        sampler["steps_rule"] = "E[K] x T: the expected number of candidates times each candidate's steps"
        report.update(noise_sampler=sampler, delta_total=sampler["delta_total"],
                      guarantee=_guarantee(search, sampler["delta_total"]))
    return report


def _guarantee(search: Search, delta_total: float | None = None) -> str:
    delta = f"{search.delta:.3g}" + ("" if delta_total is None else
                                     f" + {delta_total - search.delta:.2g} (delta_total, see 'noise sampler')")
    return (f"({search.epsilon:.4g}, {delta})-DP, example-level, add/remove-one-record neighbours, for "
            "the WHOLE search: every candidate's training and noisy score, the selection and the released model "
            "(RDP accountant, dp-accounting RepeatAndSelectDpEvent)")


#: coefficients.csv's method column for task=tune (the budget pays for the search, none is left for intervals)
TUNE_COEFFICIENTS = ("task=tune: the selected model's estimates only (the whole epsilon pays for the search; "
                     "for intervals, train the selected settings with task=train)")


def _write(conf: Any, cfg: Any, *, run_dir: Path, data: Any, best: dict | None, records: list[dict],
           search: Search) -> float:
    """One run folder: the selected model and ONE report covering the search (module docstring)."""
    folder = RunFolder.of(run_dir)
    if best is None:  # Poisson drew K = 0: nothing trained, nothing to release (part of the analysed law)
        folder.write_text(".hydra/resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        report = {"private": True, "guarantee": _guarantee(search), "epsilon": search.epsilon,
                  "delta": search.delta, "accountant": RDP.name, "epsilons": {RDP.name: search.epsilon},
                  "tuning": _tuning_section(conf, search, None), "released": "no model: the law drew no candidate"}
        folder.finish(guarantee=report["guarantee"], finite_guarantee=finite_epsilon(search.epsilon), report=Report(
            "privacy.json", report, "this report (no model: the law drew no candidate)",
            text=lambda body: json.dumps(body, indent=2) + "\n"))
        return float("nan")
    report = _report(conf, data, search, best)
    plan = training_plan(conf)
    why = training_files(test_public=bool(plan.test_public), covered=True)
    table = coefficient_section(plan, best["result"], report)  # a linear model: its estimates (no interval)
    if table is not None:
        table["frame"]["method"] = TUNE_COEFFICIENTS
    m = best["result"].metrics
    kept = {k: v for k, v in m.items() if not k.startswith(("time/", "baseline/"))}
    public = publishable_metrics(plan, kept, report)
    public["tune/selected_score_dp"] = best["score"]
    write_model_files(folder, plan, cfg, model=best["result"].model, data=data, report=report,
                      model_config=OmegaConf.to_container(best["cfg"].model, resolve=True))
    write_metrics(folder, m, public, why)
    folder.private("tb/", why["private/tb/"])
    if table is not None:
        folder.write_text("coefficients.csv", table["frame"].to_csv(index=False, float_format="%.10g"),
                          "the selected model's coefficients on the original scale (estimates only): a function of "
                          "the released model (covered by the guarantee)")
    folder.write_text("candidates.jsonl", "".join(json.dumps({**r, "selected": r["candidate"] == best["index"]})
                                                  + "\n" for r in records),
                      "every candidate's settings, noisy and non-private validation scores and model digest: "
                      "reveals the number of candidates", private=True)
    folder.record(write_data_diagnostics(folder.path, data))
    folder.finish(guarantee=report["guarantee"], finite_guarantee=finite_epsilon(search.epsilon), report=Report(
        "privacy.json", report, why["privacy.json, privacy.txt"], text=format_report, listing=True))
    log.info("tune: selected %s (noisy validation score %.4f); epsilon %.6g for the whole search",
             best["settings"], best["score"], search.epsilon)
    lines = summary_lines(best["result"], {**report, "estimator": {} if table is None else {
        "coefficients_table": table["frame"].astype(object).where(table["frame"].notna(), None).to_dict(
            orient="list")}}, dist_ctx=None, run_dir=run_dir)
    for line in lines:  # the selected model's test metrics, the privacy line, the coefficients, where
        if not line.startswith(("train loop:", "privacy:")):
            log.info("%s", line)
    log.info("outputs in %s (FILES.txt says which files may be published)", run_dir)
    return float(best["score"])
