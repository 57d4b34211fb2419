"""The run folder of a training run: publishable files at the top, private ones under private/.

Publishable (FILES.txt lists them): the privacy report (privacy.json, privacy.txt), the model
(model.pt: weights, the model config and the public feature encoder), metrics.json with the
metrics that may be published (steps, epochs, epsilon; test metrics only when the test rows are
public) and .hydra/. Private: private/metrics.json (every metric, including those on private
rows), private/tb/ (TensorBoard), private/checkpoint.pt and private/dptrain.log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dptrain.data import write_data_diagnostics
from dptrain.inference.coefficients import linear_layer
from dptrain.inference.run import coefficient_section, estimator_report
from dptrain.privacy.accounting import PLD
from dptrain.privacy.randomness import Randomness, settings_digest
from dptrain.privacy.report import build_report, format_report
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.runfolder.tracking import finite_epsilon
from dptrain.settings.train import Config
from dptrain.training.checkpoint import MODEL_FILENAME, save_model
from dptrain.training.fit import final_epsilons
from dptrain.training.plan import TrainingPlan

#: metrics that never depend on private rows beyond what the guarantee covers
PUBLIC_METRICS = ("train/steps", "train/planned_steps", "train/epochs")


def randomness_for(conf: Config, cfg: Any, *, run_dir: Path) -> Any:
    """The run's secret randomness: fresh from the OS CSPRNG, or (opt-in) derived from the
    secret in ``privacy.noise_seed_file`` and a digest of this run's settings."""
    if conf.privacy.noise_seed_file is None:
        return Randomness.fresh()
    label = settings_digest(OmegaConf.to_container(cfg, resolve=True))
    return Randomness.from_seed_file(conf.privacy.noise_seed_file, run_label=label, run_dir=run_dir)


def publishable_metrics(plan: TrainingPlan, metrics: dict[str, float], report: dict[str, Any]) -> dict[str, float]:
    """The subset of a run's metrics that may be published (module docstring)."""
    public = {k: metrics[k] for k in PUBLIC_METRICS if k in metrics}
    if "epsilon" in report:
        public.update({"privacy/epsilon": report["epsilon"], "privacy/delta": report["delta"]})
    if plan.test_public:
        public.update({k: v for k, v in metrics.items() if k.startswith("test/") or k == "baseline/majority_acc"})
    return public


def training_files(*, test_public: bool, covered: bool) -> dict[str, str]:
    """What each file of a training run folder is (FILES.txt and the report's file list), by its
    listed name. ``covered`` False (privacy off, or no noise): the files at the top are described
    as what they are, computed from private rows with no guarantee (FILES.txt then lists them as
    NOT publishable: :meth:`dptrain.runfolder.folder.RunFolder.finish`)."""
    if covered:
        top = {"privacy.json, privacy.txt": "this report (no private value; N is public)",
               "model.pt": "final weights + the public feature encoder (covered by the guarantee)",
               "metrics.json": "publishable metrics only: steps, epochs, epsilon"
               + (", and test/* (the test rows are declared public)" if test_public else
                  " (test metrics are private here: data.test_public=false)"),
               "coefficients.csv": "the coefficient table on the original scale (estimates; standard errors, "
               "intervals and whether the run claims them): a function of the released model(s) or noisy "
               "statistics only (covered by the guarantee)"}
    else:
        top = {"privacy.json, privacy.txt": "this report: it says there is no guarantee, and holds the model's "
               "coefficient table and settings",
               "model.pt": "final weights + the public feature encoder, trained WITHOUT a privacy guarantee",
               "metrics.json": "steps, epochs (test/* when the test rows are public) of a model without a guarantee",
               "coefficients.csv": "the coefficient table of a model without a guarantee"}
    return {**top,
            "private/checkpoint.pt": "resumable state (model, optimizer, accountant; generator states only "
            "when privacy.noise_seed_file is set)",
            "private/metrics.json": "every metric, incl. those on private rows (baseline, timings"
            + ("" if test_public else ", test/*") + ")",
            "private/tb/": "TensorBoard curves: diagnostics on training rows and test curves (its dp/* curves alone "
            "are covered by the guarantee)"}


def write_model_files(folder: RunFolder, plan: TrainingPlan, cfg: Any, *, model: Any, model_config: dict, data: Any,
                      report: dict) -> None:
    """The model of a run that released one (task=train, task=tune), placed in ``folder``: the
    resolved settings and model.pt (``model``, built from ``model_config``)."""
    # Hydra saves the composed config with interpolations; keep the resolved values beside it
    # (written only once training has succeeded: a refused resume must not overwrite the record).
    folder.write_text(".hydra/resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    why = training_files(test_public=bool(plan.test_public), covered=bool(report["private"]))
    save_model(folder.publishable(MODEL_FILENAME, why["model.pt"]), model=model, model_config=model_config,
               feature_names=list(data.feature_names),
               schema=plan.schema, objective=plan.objective_name, report=report)


def write_metrics(folder: RunFolder, metrics: dict[str, float], public: dict[str, float], why: dict[str, str]) -> None:
    """metrics.json (``public``: what may be published) and private/metrics.json (every metric)."""
    folder.write_json("metrics.json", public, why["metrics.json"])
    folder.write_json("metrics.json", {**metrics, **public}, why["private/metrics.json"], private=True)


def write_training_outputs(plan: TrainingPlan, cfg: Any, result: Any, *, data: Any, tracker: Any,
                           run_dir: Path) -> dict:
    """Write the run folder (module docstring) and close the tracker; returns the report."""
    folder = RunFolder.of(run_dir)
    delta = result.mechanism.delta
    epsilons = final_epsilons(result, delta=delta, headline=plan.budget.accountant) if plan.private else None
    report = build_report(mechanism=result.privacy, epsilons=epsilons, accountant=plan.budget.accountant,
                          seed=plan.seed, data_source=data.source,
                          history=result.accountant.totals if plan.private else None)
    why = training_files(test_public=bool(plan.test_public), covered=bool(report["private"]))
    table = _coefficients(plan, result, report)
    _log_to_tracker(tracker, plan, result, report, epsilons)
    if (folder.path / "private" / "checkpoint.pt").is_file():  # not written by subsample_aggregate and ssp
        folder.private("checkpoint.pt", why["private/checkpoint.pt"])
    write_model_files(folder, plan, cfg, model=result.model, data=data, report=report,
                      model_config=OmegaConf.to_container(cfg.model, resolve=True))
    write_metrics(folder, result.metrics, publishable_metrics(plan, result.metrics, report), why)
    folder.private("tb/", why["private/tb/"])
    if table is not None:
        folder.write_text("coefficients.csv", table["frame"].to_csv(index=False, float_format="%.10g"),
                          why["coefficients.csv"])
    folder.record(write_data_diagnostics(folder.path, data))
    folder.finish(guarantee=report["guarantee"], finite_guarantee=report["private"] and finite_epsilon(
        report.get("epsilon")), report=Report("privacy.json", report, why["privacy.json, privacy.txt"],
                                              text=format_report, listing=True))
    return report


def _coefficients(plan: TrainingPlan, result: Any, report: dict) -> dict | None:
    """The coefficient table (coefficients.csv: publishable, a function of the released model or
    statistics only) and the estimator's section of the report (dptrain.inference); None for a
    model that is not linear."""
    table = coefficient_section(plan, result, report)
    if table is None and linear_layer(result.model) is not None:  # an MLP cannot have one: nothing to say
        logging.getLogger(__name__).info("no coefficient table: objective=%s has no coefficient interpretation",
                                         plan.objective_name, extra={"console": False})
    report["estimator"] = estimator_report(plan, result, report, table)
    if table is not None:  # the same table inside model.pt and privacy.json: load_model(run).coefficients()
        frame = table["frame"].astype(object).where(table["frame"].notna(), None)
        report["estimator"]["coefficients_table"] = frame.to_dict(orient="list")
    if "epsilon" in report:
        report["guarantee"] = report["estimator"]["guarantee"]
    if plan.estimator.name == "ssp" and plan.private:
        report.update(sampling="none: one release over all rows", clipping="rows clipped into the PUBLIC bounds "
                      "(features and target); L2 sensitivity of Z'Z given as max_grad_norm", noise=(
                          "Gaussian N(0, (sigma x sensitivity)^2) on each entry of the upper triangle of Z'Z"))
    return table


def _log_to_tracker(tracker: Any, plan: TrainingPlan, result: Any, report: dict, epsilons: dict | None) -> None:
    """The report, the final PLD epsilon and an HParams trial in TensorBoard, then close it."""
    if epsilons is not None:
        tracker.scalars({f"privacy/epsilon_{PLD.name}": epsilons[PLD.name]}, step=result.privacy["steps"])
    tracker.text("privacy/report", "```\n" + format_report(report) + "```")
    m = result.metrics
    trial = {f"hparams/{k.replace('/', '_')}": v for k, v in m.items() if k.startswith("test/")}
    trial["hparams/epsilon"] = report.get("epsilon", float("nan"))
    tracker.hparams(run_hparams(plan, report), trial)
    tracker.close()


def run_hparams(plan: TrainingPlan, report: dict) -> dict:
    """The settings that make runs of a sweep comparable trials in TensorBoard's HParams view."""
    model, optim = dict(plan.model), dict(plan.optim)
    return {
        "model": str(model.get("_target_", "")).rsplit(".", 1)[-1],
        "hidden": str(list(model.get("hidden", []))),
        "private": bool(plan.private),
        "noise_multiplier": float(report.get("noise_multiplier", 0.0)),
        "target_epsilon": plan.budget.target,
        "max_grad_norm": float(plan.max_grad_norm),
        "delta": report.get("delta"),
        "accountant": plan.budget.accountant,
        "batch_size": int(plan.loop.batch_size),
        "epochs": float(plan.loop.epochs),
        "optimizer": str(optim.get("_target_", "")).rsplit(".", 1)[-1],
        "lr": float(optim.get("lr", float("nan"))),
        "seed": int(plan.seed),
    }
