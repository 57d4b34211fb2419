"""task=synthesize: a synthetic file with the input's declared schema, from DP marginals
(:mod:`dptrain.release.synthesis`: MST by default, MWEM), one report (privacy.json, privacy.txt)
and FILES.txt. Settings checked, THEN the rows read."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from dptrain.core.validation import field_of
from dptrain.data import declaration, load_dataset, write_data_diagnostics
from dptrain.data import schema_from_config as data_schema
from dptrain.privacy.events import zcdp_event
from dptrain.privacy.randomness import Randomness
from dptrain.privacy.report import LOG_AND_REFUSALS
from dptrain.release.oneshot import ONE_SHOT, Guarantee
from dptrain.release.tables.domain import decode_rows, domain_columns, row_codes
from dptrain.release.units import ZCDP_GROUP_RULE, UnitBound, capped, dataset_units, write_unit_facts, zcdp_row_rho
from dptrain.release.zcdp import gaussian_rho
from dptrain.runfolder.folder import Report, RunFolder
from dptrain.settings.synthesize import SynthesizeRunConfig, synthesis_settings, unit_bound, validate_synthesize

log = logging.getLogger("dptrain.synthesize")

NEIGHBOURS = "add/remove one row (one person's record)"
NOT_COVERED = [
    "the declared domain (columns, category lists, numeric bounds and bins): assumed public, declared in the "
    "config, not fitted on the rows",
    LOG_AND_REFUSALS,
    "private/evaluation.json (data=adult or synthetic only): the synthetic file's marginal error against the "
    "real rows",
]


def run_task(cfg: Any, *, run_dir: Path) -> float:
    """task=synthesize (module docstring). Returns the synthetic file's average L1 distance over
    every 2- and 3-way marginal against the real rows for public or simulated data, else NaN."""
    conf: SynthesizeRunConfig = OmegaConf.to_object(cfg)
    validate_synthesize(conf)
    schema = data_schema(conf.data)
    s = conf.synthesize
    columns = domain_columns(schema, bins=s.bins)
    sizes = [c.size for c in columns]
    rho, bound = gaussian_rho(conf.privacy.epsilon, conf.privacy.delta), unit_bound(conf)
    folder = RunFolder.of(run_dir)
    data = load_dataset(conf.data, seed=conf.seed)
    codes = row_codes(np.concatenate([data.x_train.numpy(), data.x_test.numpy()]),
                      np.concatenate([data.y_train.numpy(), data.y_test.numpy()]), schema, bins=s.bins)
    secret, mechanism = Randomness.fresh(), ONE_SHOT.get(s.method)
    if not bound.per_row:  # each unit's rows capped at k (a secret choice), then every sensitivity is k
        keep, dropped = capped(dataset_units(data), bound, secret.numpy("synthesize-unit-cap"))
        codes = codes[keep]
        write_unit_facts(folder, bound, dropped)
    fitted = mechanism.fit(codes, sizes, synthesis_settings(s), rho=zcdp_row_rho(rho, bound),
                           rng=secret.numpy("synthesize-select"))
    n = int(max(fitted.total, 0))
    synth_codes = fitted.sample(n, secret.numpy("synthesize-sample"))
    frame = decode_rows(synth_codes, schema, bins=s.bins, rng=secret.numpy("synthesize-decode"))
    folder.write_text("synthetic.csv", frame.to_csv(index=False, float_format="%.6g"),
                      "the synthetic rows (covered by the guarantee)")
    _write_data_config(conf, folder)
    error = _evaluate(conf, folder, codes, synth_codes, sizes)
    spent = mechanism.guarantee(zcdp_event(bound.k**2 * fitted.total_rho), delta=conf.privacy.delta)
    report = _report(conf, spent, rho, fitted, n, columns, bound)
    folder.record(write_data_diagnostics(run_dir, data))
    folder.finish(guarantee=report["guarantee"], finite_guarantee=True, report=Report(
        "privacy.json", report, "this report (the guarantee, the budget split; no count)", text=_text))
    log.info("privacy: %s", report["guarantee"])
    log.info("synthetic: %d rows (a noisy count), %d columns (%s) -> %s/synthetic.csv", n, len(columns), s.method,
             run_dir)
    log.info("train on it: python -m dptrain --config-dir %s/conf experiment=logit data=synthetic_release", run_dir)
    return float("nan") if error is None else error


#: the data config a training run reads the synthetic file with (``--config-dir RUN/conf data=synthetic_release``)
DATA_CONFIG = "conf/data/synthetic_release.yaml"


def _write_data_config(conf: SynthesizeRunConfig, folder: RunFolder) -> None:
    """RUN/conf/data/synthetic_release.yaml: data=table on synthetic.csv with the input's declared
    schema (public), so that any dptrain model trains on it:
    ``python -m dptrain --config-dir RUN/conf experiment=logit data=synthetic_release``. Its
    split is a hash split of the synthetic rows (no real test row is in the file)."""
    d = declaration(conf.data)
    body = {"defaults": ["/schema/data/table@_here_", "_self_"], "name": "table",
            "path": str((folder.path / "synthetic.csv").resolve()), "target": d["target"], "positive": d["positive"],
            "negative": d["negative"],
            "classes": d["classes"], "numeric": d["numeric"], "categorical": d["categorical"]}
    if d["target_bounds"] is not None:
        bounds = d["target_bounds"]
        body["target_bounds"] = {"lower": field_of(bounds, "lower"), "upper": field_of(bounds, "upper")}
    header = ("# data=table on this run's synthetic.csv, with the declared schema of the data it was made from:\n"
              "# python -m dptrain --config-dir <this run>/conf experiment=logit data=synthetic_release\n")
    folder.write_text(DATA_CONFIG, header + OmegaConf.to_yaml(OmegaConf.create(body)),
                      "a data config to train on synthetic.csv (the declared schema: public)")


def marginal_l1(a: np.ndarray, b: np.ndarray, cols: tuple[int, ...], sizes: list[int]) -> float:
    """The L1 distance between the ``cols`` marginals of two sets of rows, as distributions."""
    shape = [sizes[c] for c in cols]
    ca = np.bincount(np.ravel_multi_index(a[:, list(cols)].T, shape), minlength=int(np.prod(shape)))
    cb = np.bincount(np.ravel_multi_index(b[:, list(cols)].T, shape), minlength=int(np.prod(shape)))
    return float(np.abs(ca / max(ca.sum(), 1) - cb / max(cb.sum(), 1)).sum())


def _evaluate(conf: SynthesizeRunConfig, folder: RunFolder, real: np.ndarray, synth: np.ndarray,
              sizes: list[int]) -> float | None:
    """private/evaluation.json for public or simulated data (data=adult, synthetic) only: the
    average L1 distance over every 2-way and every 3-way marginal."""
    if conf.data.name not in ("adult", "synthetic"):
        return None
    out = {}
    for k in (2, 3):
        errs = [marginal_l1(real, synth, c, sizes) for c in itertools.combinations(range(len(sizes)), k)]
        out[f"mean_l1_{k}way"] = float(np.mean(errs))
    folder.write_json("evaluation.json", {**out, "note": "against the real rows: private"},
                      "the synthetic file's marginal error against the real rows", private=True)
    return float((out["mean_l1_2way"] + out["mean_l1_3way"]) / 2.0)


def _report(conf: SynthesizeRunConfig, spent: Guarantee, rho: float, fitted: Any, n: int,
            columns: list, bound: UnitBound) -> dict[str, Any]:
    p, eps, neighbours = conf.privacy, spent.epsilon, bound.neighbours(NEIGHBOURS)
    unit_rho = bound.k**2 * fitted.total_rho
    per_unit = "" if bound.per_row else (f" per {bound.column} ({fitted.total_rho:.6g}-zCDP per row times k^2 = "
                                         f"{bound.k**2}: every sensitivity is k)")
    guarantee = (f"({eps:.4g}, {p.delta:.3g})-DP, neighbours: {neighbours}; {conf.synthesize.method}: "
                 f"{unit_rho:.6g}-zCDP in all{per_unit} (its stages' rho summed), converted by the RDP accountant; "
                 "for synthetic.csv and everything computed from it")
    unit = bound.describe(measurement_l2_sensitivity=float(bound.k), selection_score_sensitivity=float(bound.k),
                          rho_per_row=fitted.total_rho, **({} if bound.per_row else {"rule": ZCDP_GROUP_RULE}))
    return {"task": "synthesize", "private": True, "guarantee": guarantee, "epsilon": eps, "delta": p.delta,
            "accountant": spent.accounting, "rho": unit_rho, "rho_budget": rho,
            "method": conf.synthesize.method, "unit_of_privacy": unit,
            "stages": fitted.spent, "stages_note": "each stage's rho is per row; per unit it is k^2 times it",
            "rows": n, "neighbours": neighbours,
            "sampler": "OpenDP's exact discrete Gaussian for the measurements; the selections and the sampling "
                       "from the operating system's CSPRNG",
            "domain": {c.name: list(c.levels) for c in columns}, "not_covered": NOT_COVERED}


def _text(report: dict[str, Any]) -> str:
    lines = ["task=synthesize: synthetic microdata", "", f"guarantee: {report['guarantee']}", "",
             f"method: {report['method']}; stages (zCDP rho):"]
    lines += [f"  {s.get('stage', s.get('kind', ''))}: rho {s['rho']:.6g}" for s in report["stages"]]
    lines += ["", f"rows: {report['rows']} (a noisy count)", "", "not covered:",
              *[f"  - {x}" for x in report["not_covered"]]]
    return "\n".join(lines) + "\n"
