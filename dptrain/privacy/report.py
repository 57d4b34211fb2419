"""The privacy report of a training run (privacy.json + privacy.txt).

Follows Ponomareva et al. 2023 ("How to DP-fy ML"): unit of privacy and neighbour relation,
N, sampling scheme and q, B, C, sigma, steps, epochs, epsilon from every accountant at the
stated delta, what is and is not covered, the randomness used, library versions, and a tier.
"""

from __future__ import annotations

import importlib.metadata
import math
from typing import Any

NOT_COVERED = [
    "hyperparameter tuning and the choice among runs of a sweep: each run's epsilon covers only that run",
    "training-data diagnostics (tags diagnostics_nonprivate/* in TensorBoard and the progress bar's "
    "loss/acc: train loss, train accuracy, realised batch size, clip fraction)",
    "the training-set size N (treated as public, as the accountant's q = B/N requires)",
    "the public schema (numeric bounds, category lists, target label) is assumed public and was "
    "declared in config, not fitted on the rows",
    "the test split and its metrics (test/*) are computed on held-out rows outside the training set; "
    "they are not protected by this guarantee",
    "the non-private baseline (baseline/nonprivate_acc) is fitted on the training rows WITHOUT privacy",
    "noise comes from a seeded pseudo-random generator (torch.Generator), not a cryptographic source; "
    "floating-point side channels of the Gaussian sampler are not addressed",
]


def tier(epsilon: float) -> str:
    """PRIVACY.md: epsilon <= 1 strong, <= 10 reasonable, > 10 weak protection."""
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


def build_report(
    *, mechanism: dict[str, Any], epsilons: dict[str, float] | None, accountant: str, seed: int,
    data_source: str,
) -> dict[str, Any]:
    """Assemble the privacy report. ``epsilons`` maps accountant name -> epsilon (None when
    privacy is off)."""
    base = {
        "data": data_source,
        "seed": seed,
        "randomness": "seeded pseudo-random (torch.Generator); not cryptographically secure",
        "engine": mechanism["engine"],
        "dataset_size": mechanism["dataset_size"],
        "expected_batch_size": mechanism["expected_batch_size"],
        "sample_rate": mechanism["sample_rate"],
        "steps": mechanism["steps"],
        "epochs": mechanism["epochs"],
        "planned_steps": mechanism.get("planned_steps", mechanism["steps"]),
        "stopped_early": mechanism.get("stopped_early", False),
        "stop_reason": mechanism.get("stop_reason", "completed the planned steps"),
        "max_epsilon": mechanism.get("max_epsilon"),
        "resumed_from_step": mechanism.get("resumed_from_step", 0),
        "resumed_from": mechanism.get("resumed_from"),
        "distributed": mechanism.get("distributed"),
        "versions": _versions(),
    }
    if not mechanism["enabled"]:
        return {
            "private": False,
            "guarantee": "none: privacy was switched off (privacy.enabled=false); this model is NOT "
            "differentially private and may reveal any training record",
            **base,
        }
    eps = epsilons[accountant]
    return {
        "private": True,
        "guarantee": f"({eps:.4g}, {mechanism['delta']:.3g})-DP, example-level, add/remove-one-record "
        "neighbours, for the final model and every intermediate iterate",
        "epsilon": eps,
        "delta": mechanism["delta"],
        "delta_source": mechanism["delta_source"],
        "delta_vs_1_over_n": f"delta = {mechanism['delta']:.3g} < 1/N = {1 / mechanism['dataset_size']:.3g}",
        "accountant": accountant,
        "epsilons": dict(epsilons),
        "accountant_notes": {
            "rdp": "Renyi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019), "
            "dp-accounting RdpAccountant, orders up to >= 1024, improved conversion (Balle et al. 2020)",
            "pld": "privacy loss distribution, dp-accounting PLDAccountant (tight up to discretisation)",
        },
        "tier": tier(eps),
        "unit_of_privacy": "one example (one row of the training table)",
        "neighbours": "add/remove",
        "sampling": "poisson",
        "noise_multiplier": mechanism["noise_multiplier"],
        "noise_multiplier_source": mechanism["noise_multiplier_source"],
        "target_epsilon": mechanism["target_epsilon"],
        "max_grad_norm": mechanism["max_grad_norm"],
        "clipping": "flat per-example L2 clipping over all parameters",
        "noise": "Gaussian N(0, sigma^2 C^2) added once per step to the clipped sum, divided by the "
        "expected batch size",
        **base,
        "not_covered": list(NOT_COVERED),
    }


def format_report(report: dict[str, Any]) -> str:
    """Human-readable privacy.txt."""
    lines = ["dptrain privacy report", "=" * 22]
    if not report["private"]:
        lines += [f"GUARANTEE: {report['guarantee']}", ""]
        lines += [f"{k}: {report[k]}" for k in ("data", "dataset_size", "steps", "epochs", "seed")]
        return "\n".join(lines) + "\n"
    lines += [
        f"GUARANTEE: {report['guarantee']}",
        f"epsilon = {report['epsilon']:.6g} at delta = {report['delta']:.3g} "
        f"(headline accountant: {report['accountant']})",
        f"delta: {report['delta_source']}; {report['delta_vs_1_over_n']}",
        f"protection tier: {report['tier']}",
        "",
        "epsilon by accountant (same delta):",
    ]
    for name, value in report["epsilons"].items():
        shown = "inf" if math.isinf(value) else f"{value:.6g}"
        lines.append(f"  {name:4s} {shown:>12s}   {report['accountant_notes'].get(name, '')}")
    lines += [
        "",
        f"unit of privacy: {report['unit_of_privacy']}; neighbours: {report['neighbours']}",
        f"data: {report['data']}",
        f"N = {report['dataset_size']}, sampling = {report['sampling']}, q = {report['sample_rate']:.6g}, "
        f"expected batch size B = {report['expected_batch_size']}",
        f"noise multiplier sigma = {report['noise_multiplier']:.6g} ({report['noise_multiplier_source']}"
        + (f", target epsilon {report['target_epsilon']}" if report["target_epsilon"] is not None else "")
        + f"), clipping norm C = {report['max_grad_norm']}",
        f"steps = {report['steps']}, epochs = {report['epochs']:.4g}, engine = {report['engine']}",
        f"stopped: {report['stop_reason']}"
        + (f" (privacy.max_epsilon = {report['max_epsilon']:g}, headline accountant)"
           if report["max_epsilon"] is not None else ""),
        *([f"resumed from a checkpoint at step {report['resumed_from_step']} ({report['resumed_from']}); "
           "the accountant's full history was restored, so epsilon covers the whole run"]
          if report["resumed_from"] else []),
        *([f"distributed: {report['distributed']['world_size']} processes ({report['distributed']['backend']}); "
           f"{report['distributed']['sharding']}; {report['distributed']['reduction']}"]
          if report.get("distributed") else []),
        f"randomness: {report['randomness']}, seed = {report['seed']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "NOT covered by this guarantee:",
        *[f"  - {item}" for item in report["not_covered"]],
    ]
    return "\n".join(lines) + "\n"
