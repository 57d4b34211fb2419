"""The privacy report of a training run (privacy.json + privacy.txt).

Follows Ponomareva et al. 2023 ("How to DP-fy ML"): unit of privacy and neighbour relation,
N, sampling scheme and q, B, C, sigma, steps, epochs, epsilon from every accountant at the
stated delta, what is and is not covered, the randomness used, library versions, and a tier.
"""

from __future__ import annotations

import importlib.metadata
import math
from typing import Any

from dptrain.privacy.accounting import ACCOUNTANTS
from dptrain.privacy.noise_law import box_muller_law, delta_total, tail_mass
from dptrain.privacy.report_units import (
    group_lines,
    group_of_example_level,
    n_unit,
    unit_fields,
    unit_guarantee,
    unit_not_covered,
    who,
)

#: what a run that reads a table does not cover about its log, console and refusals (issue 44)
LOG_AND_REFUSALS = (
    "the log (private/dptrain.log), the console, timings and error messages: for the data holder only. Errors "
    "quote no private value and no count; ONE console line marked PRIVATE (kept in the log too) counts the rows the "
    "declared rules left out, lumped, relabelled or clipped (private/data_diagnostics.json). Refusals read declared, "
    "public facts only, except three that depend on the rows: a read that leaves no training row (the one outcome "
    "of the rows themselves), data.nonfinite=error (the user's choice) and a file that is no table (ragged rows, "
    "bytes that are not UTF-8); a refused run publishes nothing, but that it was refused tells such a table from "
    "its neighbours")

NOT_COVERED = [
    "hyperparameter tuning and the choice among runs of a sweep: each run's epsilon covers only that run; "
    "picking the best run by its test metrics uses the data again",
    "training-data diagnostics (private/tb: diagnostics_nonprivate/*, the progress bar's loss/acc; "
    "private/metrics.json): train loss, train accuracy, realised batch size, clip fraction",
    "the training-set size N (treated as public, as the accountant's q = B/N requires)",
    "the public schema (numeric bounds, category lists, target label): assumed public, declared in the "
    "config, not fitted on the rows",
    "the test split and its metrics (test/*): computed on held-out rows that are not in the training set, "
    "so the guarantee does not protect them; they are publishable only when the test rows are public "
    "(data.test_public=true)",
    "the non-private baseline (baseline/*, private/metrics.json) is fitted on the training rows WITHOUT privacy",
    LOG_AND_REFUSALS,
    "floating-point side channels beyond the sampler's tail: the gradient noise is Box-Muller, drawn in float64 "
    "on 53-bit uniforms or by the refined float32 sampler (24-bit uniforms refined with 53 more bits in the far "
    "tail), |z| <= z_max; the Gaussian mass beyond z_max is added to delta (see 'noise sampler'); inside z_max "
    "the sampler is treated as the exact Gaussian: its uniforms' grid and the rounding to the model's dtype "
    "are not analysed. The dp/ curve's noise is numpy's float64 ziggurat (PCG64, |z| < "
    "12.23), not from a discretised Gaussian; the noise generator is torch's MT19937 (a statistical generator) "
    "seeded with 19,968 bits from the source described under 'randomness'",
]


def tier(epsilon: float) -> str:
    """docs/privacy.md: epsilon <= 1 strong, <= 10 reasonable, > 10 weak protection."""
    if epsilon <= 1:
        return "strong (epsilon <= 1)"
    if epsilon <= 10:
        return "reasonable (1 < epsilon <= 10)"
    return "weak (epsilon > 10)"


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("dptrain", "torch", "opacus", "dp-accounting", "numpy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _run_fields(mechanism: dict[str, Any], *, data_source: str, seed: int) -> dict[str, Any]:
    """The report's fields that every run has, private or not."""
    return {
        "data": data_source,
        "seed": seed,
        "seed_role": "model initialisation, the train/test split and generated data only; it does not "
        "determine the DP noise or the Poisson sampler",
        "randomness": mechanism.get("randomness", "unknown"),
        "engine": mechanism["engine"],
        "device": mechanism.get("device", "cpu"),
        **{k: mechanism[k] for k in ("dataset_size", "expected_batch_size", "sample_rate", "steps", "epochs")},
        "planned_steps": mechanism.get("planned_steps", mechanism["steps"]),
        "stopped_early": mechanism.get("stopped_early", False),
        "stop_reason": mechanism.get("stop_reason", "completed the planned steps"),
        **{k: mechanism.get(k) for k in ("max_epsilon", "resumed_from", "distributed")},
        "resumed_from_step": mechanism.get("resumed_from_step", 0),
        "versions": _versions(),
    }


def noise_sampler_section(mechanism: dict[str, Any], eps: float) -> dict[str, Any] | None:
    """The report's ``noise_sampler``: what the engine draws, its z_max, and the Gaussian mass it
    cannot draw, added to delta (dptrain.privacy.noise_law). None when no noise is added.
    ``mechanism["noise_coordinates"]`` (d, from ``engine.noise_record()``) is needed for the
    tail mass; without it the mass and delta_total are None."""
    if not (mechanism["noise_multiplier"] > 0 and mechanism.get("noise_applied", True)) or "ssp" in mechanism:
        return None  # no noise, or not the engine's (estimator=ssp draws numpy's ziggurat: docs/privacy.md)
    law = box_muller_law(device=str(mechanism.get("device", "cpu")), dtype=mechanism.get("noise_dtype"),
                         refined32=bool(mechanism.get("noise_refined32", False)))
    d, steps = mechanism.get("noise_coordinates"), int(mechanism["steps"])
    eta = None if d is None else tail_mass(steps=steps, coordinates=int(d), law=law)
    return {
        "sampler": law.sampler, "z_max": law.z_max, "pair_tail": law.pair_tail,
        "coordinate_tail": law.as_dict()["coordinate_tail"], "noise_coordinates": d, "steps": steps,
        "tail_mass": eta,
        "tail_mass_rule": "eta = T d exp(-z_max^2 / 2): a union bound over the at most d Box-Muller pairs of each "
        "of the T steps, each pair's Gaussian radius exceeding z_max with probability exp(-z_max^2 / 2)",
        "delta_total": None if eta is None else delta_total(epsilon=eps, delta=mechanism["delta"], eta=eta),
        "delta_rule": "a mechanism within total variation eta of an (epsilon, delta)-DP one is (epsilon, delta + "
        "(1 + e^epsilon) eta)-DP",
    }


def _noise_lines(report: dict[str, Any]) -> list[str]:
    """privacy.txt's lines on the noise sampler and the tail mass added to delta."""
    ns = report.get("noise_sampler")
    if not ns:
        return []
    lines = [f"noise sampler: {ns['sampler']}; |z| <= z_max = {ns['z_max']:.6g}"]
    if ns["tail_mass"] is None:
        return lines + ["  tail mass: NOT computed (the run record gives no noise_coordinates); the Gaussian mass "
                        f"beyond z_max is {ns['pair_tail']:.3g} per pair of coordinates per step"]
    return lines + [f"  tail mass eta = {ns['tail_mass']:.3g} ({ns['steps']} steps x {ns['noise_coordinates']} "
                    f"coordinates x {ns['pair_tail']:.3g}); delta_total = delta + (1 + e^epsilon) eta = "
                    f"{ns['delta_total']:.12g}: the guarantee holds at (epsilon, delta_total)"]


def _guarantee(mechanism: dict[str, Any], eps: float) -> tuple[bool, str]:
    if not mechanism["noise_multiplier"] > 0:
        return False, ("none: privacy.noise_multiplier=0 adds no noise, so epsilon is infinite; this model is NOT "
                       "differentially private and may reveal any training record")
    if mechanism.get("unit_of_privacy"):
        return True, unit_guarantee(mechanism["unit_of_privacy"], eps, mechanism["delta"])
    return True, (f"({eps:.4g}, {mechanism['delta']:.3g})-DP, example-level, add/remove-one-record "
                  "neighbours, for the final model and every intermediate iterate")


def delta_total_clause(eps: float, delta: float, delta_total: float | None) -> str:
    """What a guarantee sentence adds when the noise sampler's tail mass moves delta (delta_total
    differs from delta): the pair it holds at, with delta_total itself; '' otherwise."""
    if delta_total is None or delta_total == delta:
        return ""
    return (f"; with the noise sampler's tail mass added: ({eps:.4g}, {delta:.3g} + {delta_total - delta:.2g})-DP, "
            f"delta_total = {delta_total:.12g} (see 'noise sampler')")


def build_report(
    *, mechanism: dict[str, Any], epsilons: dict[str, float] | None, accountant: str, seed: int,
    data_source: str, history: Any = None,
) -> dict[str, Any]:
    """Assemble the privacy report. ``epsilons`` maps accountant name -> epsilon (None when
    privacy is off). A run without noise (sigma = 0) is reported as NOT private. ``history``:
    the accountant's events, for the RDP group-privacy bound of an example-level report
    (dptrain.privacy.group; without it the (epsilon, delta) rule alone)."""
    base = _run_fields(mechanism, data_source=data_source, seed=seed)
    if not mechanism["enabled"]:
        return {"private": False, "guarantee": "none: privacy was switched off (privacy.enabled=false); this model "
                "is NOT differentially private and may reveal any training record", **base}
    eps = epsilons[accountant]
    private, guarantee = _guarantee(mechanism, eps)
    sampler = noise_sampler_section(mechanism, eps)
    guarantee += delta_total_clause(eps, mechanism["delta"], sampler and sampler["delta_total"])
    return {
        "private": private,
        "guarantee": guarantee,
        "epsilon": eps,
        "delta": mechanism["delta"],
        "delta_source": mechanism["delta_source"],
        "delta_vs_1_over_n": f"delta = {mechanism['delta']:.3g} < 1/N = {1 / mechanism['dataset_size']:.3g}",
        "accountant": accountant,
        "epsilons": dict(epsilons),
        "accountant_notes": {name: getattr(ACCOUNTANTS.get(name), "note", "") for name in epsilons},
        "tier": tier(eps) if private else "none (no noise)",
        **unit_fields(mechanism),
        "group_privacy": group_of_example_level(mechanism, eps, private, history),
        "sampling": "poisson",
        **{k: mechanism[k] for k in ("noise_multiplier", "noise_multiplier_source", "target_epsilon", "max_grad_norm")},
        "accountant_advice": mechanism.get("accountant_advice"),
        "noise_sampler": sampler,
        "delta_total": None if sampler is None else sampler["delta_total"],
        "dp_curves": mechanism.get("dp_curves"),
        **base,
        "not_covered": _not_covered(mechanism),
    }


def _not_covered(mechanism: dict[str, Any]) -> list[str]:
    unit = mechanism.get("unit_of_privacy")
    if not unit:
        return list(NOT_COVERED)
    return [unit_not_covered(item, unit) for item in NOT_COVERED]


def _curve_lines(report: dict[str, Any]) -> list[str]:
    """What privacy.txt says about the dp/ curves (covered by the epsilons above)."""
    c = report.get("dp_curves")
    if not c:
        return ["COVERED curves: none (this run released no dp/ curve: trainer.dp_curves=false; task=audit, "
                "estimator=subsample_aggregate or ssp and the Python API release none)"]
    return [
        f"COVERED curves: {', '.join(c['tags'])} in private/tb, {c['releases']} values (every {c['log_every']} "
        "steps and the last), included in every epsilon above:",
        f"  {c['statistic']}",
        f"  L = {c['loss_bound']:g} ({c['loss_bound_source']}), curve noise multiplier sigma_c = "
        f"{c['noise_multiplier']:.6g} (noise sd on the value {c['noise_std']:.3g}), budget share "
        f"{c['budget_share']:g}",
        f"  accounting: {c['accounting']} (here {c['joint_noise_multiplier']:.6g})",
    ]


def _files_lines(report: dict[str, Any]) -> list[str]:
    files = report.get("files")
    if not files:
        return []
    heading = ("Files: may be PUBLISHED" if report.get("private") else "Files at the top of the folder: NOT "
               "publishable but for FILES.txt and .hydra/ (no guarantee covers this run; FILES.txt says which)")
    return ["", heading,
            *[f"  {name}: {why}" for name, why in files["publishable"].items()],
            "Files: PRIVATE, keep them with the data",
            *[f"  {name}: {why}" for name, why in files["private"].items()]]


def _estimator_lines(report: dict[str, Any]) -> list[str]:
    """The estimator's guarantee, when its intervals are valid, and the coefficient table."""
    est = report.get("estimator")
    if not est:
        return []
    lines = ["", f"estimator: {est['name']}", f"  guarantee: {est['guarantee']}"]
    if est.get("validity"):
        lines.append(f"  intervals valid when: {est['validity']}")
    if est.get("validity_check"):
        check = est["validity_check"]
        lines.append(f"  this run: {'CLAIMED' if check['claimed'] else 'NOT CLAIMED'}: {check['why']}")
    if est.get("sensitivity_rule"):
        lines.append(f"  sensitivity: {est['sensitivity']:g} ({est['sensitivity_rule']})")
    if est.get("table"):
        lines += ["", est["table"]]
    return lines


def _tuning_lines(report: dict[str, Any]) -> list[str]:
    """task=tune: the search the guarantee covers and the selected candidate."""
    t = report.get("tuning")
    if not t:
        return []
    law = f"{t['candidates_law']}, mean {t['candidates_mean']:g}" + (
        f", shape {t['candidates_shape']:g}" if t.get("candidates_shape") is not None else "")
    return ["", "private search (task=tune):", f"  method: {t['method']}",
            f"  number of candidates: random ({law}); the number drawn is SECRET",
            f"  space: {t['space']}",
            f"  selected: {t['selected']} (noisy {t['score']} {t['selected_score_dp']:.4f}; score noise sd "
            f"{t['score_noise']:g} on the sum over {t['validation_rows']} validation rows)",
            f"  fit rows: {t['fit_rows']}; validation rows: {t['validation_rows']} (keyed hash of each row, fraction "
            f"{t['validation_fraction']:g})",
            f"  event: {t['event']}", f"  accounting: {t['accounting']}", f"  secret: {t['secret']}"]


def _headline_lines(report: dict[str, Any]) -> list[str]:
    """privacy.txt's guarantee, epsilon, tier, the plain words and (per row) the group levels."""
    return [
        f"GUARANTEE: {report['guarantee']}",
        f"epsilon = {report['epsilon']:.6g} at delta = {report['delta']:.3g} "
        f"(headline accountant: {report['accountant']})",
        f"delta: {report['delta_source']}; {report['delta_vs_1_over_n']}",
        f"protection tier: {report['tier']}",
        "",
        f"In plain words: adding or removing {who(report)} in the training data changes the probability "
        "of any output of this run (the model and every file listed as publishable below) by at most a "
        f"factor e^epsilon = {math.exp(min(report['epsilon'], 700)):.3g}, except with probability delta. It "
        "protects the training rows only, and only through the publishable files: the private files below "
        "must stay with the data.",
        *group_lines(report),
        "",
        "epsilon by accountant (same delta):",
    ]


def format_report(report: dict[str, Any]) -> str:
    """Human-readable privacy.txt."""
    lines = ["dptrain privacy report", "=" * 22]
    if not report["private"]:
        lines += [f"GUARANTEE: {report['guarantee']}", ""]
        lines += [f"{k}: {report[k]}" for k in ("data", "dataset_size", "steps", "epochs", "seed")]
        return "\n".join(lines + _estimator_lines(report) + _files_lines(report)) + "\n"
    lines += _headline_lines(report)
    for name, value in report["epsilons"].items():
        shown = "inf" if math.isinf(value) else f"{value:.6g}"
        lines.append(f"  {name:4s} {shown:>12s}   {report['accountant_notes'].get(name, '')}")
    lines += [
        "",
        f"unit of privacy: {report['unit_of_privacy']}; neighbours: {report['neighbours']}",
        f"data: {report['data']}",
        f"N = {report['dataset_size']}{n_unit(report)}, sampling = {report['sampling']}, "
        f"q = {report['sample_rate']:.6g}, expected batch size B = {report['expected_batch_size']}",
        f"noise multiplier sigma = {report['noise_multiplier']:.6g} ({report['noise_multiplier_source']}"
        + (f", target epsilon {report['target_epsilon']}" if report["target_epsilon"] is not None else "")
        + f"), clipping norm C = {report['max_grad_norm']}",
        f"steps = {report['steps']}, epochs = {report['epochs']:.4g}, engine = {report['engine']}, "
        f"device = {report.get('device', 'cpu')}",
        *([f"ADVICE: {report['accountant_advice']}"] if report.get("accountant_advice") else []),
        f"stopped: {report['stop_reason']}"
        + (f" (privacy.max_epsilon = {report['max_epsilon']:g}, headline accountant)"
           if report["max_epsilon"] is not None else ""),
        *([f"resumed from a checkpoint at step {report['resumed_from_step']} ({report['resumed_from']}); "
           "the accountant's full history was restored, so epsilon covers the whole run"]
          if report["resumed_from"] else []),
        *([f"distributed: {report['distributed']['world_size']} processes ({report['distributed']['backend']}); "
           f"{report['distributed']['sharding']}; {report['distributed']['reduction']}"]
          if report.get("distributed") else []),
        f"randomness of the noise and the sampler: {report['randomness']}",
        *_noise_lines(report),
        f"seed = {report['seed']} ({report['seed_role']})",
        "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        *_curve_lines(report),
        "",
        "NOT covered by this guarantee:",
        *[f"  - {item}" for item in report["not_covered"]],
        *_tuning_lines(report),
        *_estimator_lines(report),
        *_files_lines(report),
    ]
    return "\n".join(lines) + "\n"


#: a coefficient table of at most this many terms is shown on the console; a longer one is in
#: coefficients.csv, privacy.txt and the private log only
CONSOLE_TERMS = 4


def coefficient_lines(estimator: dict[str, Any], run_dir: Any) -> list[str]:
    """The console's view of the coefficient table: one line saying where it is, how many terms
    and whether its intervals are claimed, then each term when there are at most
    :data:`CONSOLE_TERMS` (the whole table is in coefficients.csv and privacy.txt)."""
    table = estimator.get("coefficients_table")
    if not table:
        return []
    terms = list(table["term"])
    claimed = [bool(c) for c in table.get("claimed", [])]
    n = sum(claimed)
    if str(estimator.get("intervals", "")).startswith("NON-PRIVATE"):
        intervals = f"non-private classical intervals (NO privacy) for {n} of {len(terms)}" if n < len(terms) else \
            "non-private classical intervals (NO privacy)"
    elif n == len(terms) and n:
        intervals = "intervals CLAIMED"
    elif n:
        intervals = f"intervals CLAIMED for {n}, NOT for {len(terms) - n} (coefficients.csv says why, per term)"
    else:
        intervals = "estimates only: intervals NOT CLAIMED" if estimator.get("validity_check") else "no intervals"
    lines = [f"coefficients: {len(terms)} terms, {intervals} -> {run_dir}/coefficients.csv"]
    if len(terms) > CONSOLE_TERMS:
        return lines
    width = max(len(t) for t in terms)
    for k, term in enumerate(terms):
        lo, hi = table["ci_lower"][k], table["ci_upper"][k]
        interval = f"   [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None and lo == lo else ""
        lines.append(f"  {term:<{width}}  {table['estimate'][k]:.4g}{interval}")
    return lines


def summary_lines(result: Any, report: dict[str, Any], *, dist_ctx: Any, run_dir: Any) -> list[str]:
    """What a finished training run prints (the console: a short summary; the coefficient table
    in full goes to the private log, privacy.txt and coefficients.csv)."""
    m = result.metrics
    lines = ["   ".join(f"test {k.split('/', 1)[1] if k != 'test/acc' else 'accuracy'}: {v:.4f}"
                        .replace("test auc", "test AUC") for k, v in m.items() if k.startswith("test/"))]
    if "baseline/nonprivate_acc" in m:
        rows = m.get("baseline/fit_rows")
        lines.append(f"non-private baseline (sklearn LogisticRegression, same features/split"
                     f"{f', fitted on {int(rows):,} training rows' if rows is not None else ''}): "
                     f"{m['baseline/nonprivate_acc']:.4f}   majority class: {m['baseline/majority_acc']:.4f}")
    # one noisy Z'Z: no sampling, no steps (without privacy, ssp's table is the exact fit after the loop)
    one_release = report.get("estimator", {}).get("name") == "ssp" and "epsilon" in report
    if "epsilon" in report:
        eps = report["epsilon"]
        how = (f"one release of Z'Z, noise multiplier {report['noise_multiplier']:.4g} x sensitivity "
               f"{report['max_grad_norm']:.4g}" if one_release else
               f"sigma = {report['noise_multiplier']:.4g}, C = {report['max_grad_norm']}, "
               f"q = {report['sample_rate']:.4g}, steps = {report['steps']}")
        lines.append(
            f"privacy: epsilon = {eps:.4g}, delta = {report['delta']:.3g} (accountant: {report['accountant']}; "
            + ", ".join(f"{k} {v:.4g}" for k, v in report["epsilons"].items()) + f"), {how}"
            + (f"; per {report['unit_column']} (at most {report['max_rows_per_unit']} rows each)"
               if report.get("unit_column") else "; per row (a person with k rows: privacy.json's group_privacy)"))
        if result.privacy["stopped_early"]:
            lines.append(f"privacy budget: {result.privacy['stop_reason']}")
        if not report["private"]:
            lines.append("WARNING: epsilon is infinite: this run has NO privacy guarantee (sigma = 0)")
    else:
        lines.append("privacy: OFF (privacy.enabled=false): no differential privacy guarantee")
    if result.privacy.get("randomness_mode") == "seed_file":
        lines.append("WARNING: reproducible noise (privacy.noise_seed_file): whoever holds that file and this "
                     "command line can regenerate and remove the noise; keep it secret")
    if dist_ctx is not None:
        lines.append(f"distributed: {dist_ctx.world_size} processes ({dist_ctx.backend}); noise added once per "
                     "step on rank 0; only rank 0 wrote these outputs")
    lines += coefficient_lines(report.get("estimator", {}), run_dir)
    took = (f"ssp: {m['time/train_seconds']:.1f} s (the release and its parametric bootstrap)" if one_release
            else f"train loop: {m['time/train_seconds']:.1f} s for {m['train/steps']} steps")
    if m.get("train/resumed_from_step", 0) and m.get("train/resumed_from_step") >= m.get("train/steps", 0):
        took = f"resumed a finished run: no step taken ({m['train/steps']} steps in all)"
    lines.append(f"{took}; outputs in {run_dir} (FILES.txt says which files may be published)")
    return lines
