"""A release run (task=release): listed cells -> estimates -> the chosen method -> release.csv and
release.json (publishable), and, for simulated data by default, a private evaluation of every
method against exact values in ``<run>/private/evaluation/``.

What a run publishes and why (docs/release.md):

* the cells come from a public declaration or a DP selection (:mod:`dptrain.release.cell_domain`),
  decided before any row is read; rows of unlisted cells are left out one by one;
* release.csv holds the chosen method's output only; release.json holds that method's own facts
  (:mod:`dptrain.release.report`); MOS's chi appears only in a MOS release, and MOS (NOT
  differentially private) and suppression (exact values) say so in words;
* every noise draw comes from the run's :class:`~dptrain.privacy.randomness.Randomness`, one
  stream per method ("release-<method>"); no output holds a seed;
* logs and errors name settings, never a private count (rows, rows per cell, released cells).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dptrain.config import Config
from dptrain.privacy.randomness import Randomness
from dptrain.release import baselines as bl
from dptrain.release import report
from dptrain.release.cell_domain import (
    CellDomain,
    chi_group_labels,
    from_table,
    from_values,
    read_keys_file,
    select_cells,
)
from dptrain.release.cells import Cells, Domain, ReleaseError, make_cells, xy_values
from dptrain.release.mos import NOT_DP, release_mos
from dptrain.release.sensitivity import local_sensitivity, se_local_sensitivity
from dptrain.tracking import atomic_write_text, private_dir, write_json, write_manifest

log = logging.getLogger(__name__)

EVALUATION_DIR = "evaluation"


def private_evaluation_enabled(conf: Config) -> bool:
    """release.private_evaluation: auto (only for simulated data, data=atlas) | true | false."""
    mode = str(conf.release.private_evaluation).strip().lower()
    return mode == "true" or (mode == "auto" and conf.data.name == "atlas")


def load_rows(conf: Config) -> tuple[pd.DataFrame, pd.DataFrame | None, str, pd.DataFrame | None]:
    """(rows, per-cell truth or None, one-line description of the source, the simulator's PUBLIC
    cell design or None)."""
    d = conf.data
    if d.name == "atlas":
        from dptrain.data.atlas import design_cells, simulate_atlas, simulate_figure2

        if d.generator == "figure2":
            rows, truth = simulate_figure2(seed=conf.seed)
        else:
            rows, truth = simulate_atlas(seed=conf.seed, n_cells=d.n_cells)
        return rows, truth, f"simulated Atlas-like cells (generator={d.generator}, seed={conf.seed})", design_cells(truth)
    from dptrain.data import read_table

    return read_table(d.path, fmt=d.format), None, f"table {d.path}", None


def declared_cells(conf: Config) -> CellDomain | None:
    """The user's declaration (read before any row), or None (simulator design / private selection)."""
    r = conf.release
    cells = list(r.cells)
    if r.cell_values is not None:
        return from_values(dict(r.cell_values), cells)
    if r.cell_keys_file is not None:
        return from_table(read_keys_file(r.cell_keys_file, cells), cells, origin="declared",
                          description=f"declared: release.cell_keys_file={r.cell_keys_file!r}",
                          setting=f"release.cell_keys_file={r.cell_keys_file!r}")
    return None


def list_cells(conf: Config, df: pd.DataFrame, design: pd.DataFrame | None, declared: CellDomain | None,
               randomness: Randomness) -> CellDomain:
    r = conf.release
    cells = list(r.cells)
    if declared is not None:
        return declared
    if r.cell_selection == "private":
        return select_cells(df, cells, epsilon=r.selection_epsilon, delta=r.selection_delta,
                            rng=randomness.numpy("release-cell-selection"))
    if design is not None:
        missing = [c for c in cells if c not in design.columns]
        if missing:
            raise ReleaseError(f"release.cells={cells!r}: the simulator declares cells by {list(design.columns)}; "
                               "allowed: those columns, or declare the cells with release.cell_values")
        return from_table(design, cells, origin="simulator", setting="release.cells", collapse=True,
                          description="declared by the simulator's public design (every simulated cell)")
    raise ReleaseError("release.cell_values / release.cell_keys_file: no cells declared; allowed: declare them, "
                       "or release.cell_selection=private")


def build_cells(conf: Config, df: pd.DataFrame, listed: CellDomain) -> Cells:
    """Rows of listed cells only (each other row left out on its own), clipped to the domain."""
    r, dom = conf.release, conf.release.domain
    domain = Domain(dom.x_lo, dom.x_hi, dom.y_lo, dom.y_hi)
    for setting, col in (("release.x", r.x), ("release.y", r.y)):
        if col not in df.columns:
            raise ReleaseError(f"{setting}: column {col!r} is not in the data; allowed: a column of the table")
    codes = listed.row_codes(df)
    keep = codes >= 0
    if not keep.all():
        log.warning("release: rows whose cell is not listed (or has a missing cell value) are left out")
    sub = df.loc[keep]
    drop = getattr(conf.data, "nonfinite", "error") == "drop"
    xv, yv = xy_values(sub, x=r.x, y=r.y, domain=domain, clip=r.clip, drop_nonfinite=drop)
    codes = codes[keep]
    finite = np.isfinite(xv) & np.isfinite(yv)
    if not finite.all():
        log.warning("release: rows with missing, non-numeric or infinite x or y are left out (data.nonfinite=drop)")
        xv, yv, codes = xv[finite], yv[finite], codes[finite]
    return make_cells(xv, yv, codes, keys=listed.keys, domain=domain)


def min_n_rule(sens, cells: Cells, min_n: int):
    """MOS: cells with N < min_n get an infinite LS (so they are neither released nor in chi)."""
    small = (cells.n < min_n) & np.isfinite(sens.ls)
    if not small.any():
        return sens
    reason = sens.reason.copy()
    reason[small] = f"N < release.min_n = {min_n}"
    return dataclasses.replace(sens, ls=np.where(small, np.inf, sens.ls), reason=reason)


@dataclasses.dataclass
class MosInputs:
    """Local sensitivities of theta and its SE (with the min_n rule), computed once."""

    cells: Cells
    conf: Config
    groups: np.ndarray | None
    sens: Any = None
    se_sens: Any = None

    def __post_init__(self) -> None:
        r = self.conf.release
        self.sens = min_n_rule(local_sensitivity(self.cells, statistic=r.statistic, neighbors=r.neighbors),
                               self.cells, r.min_n)
        self.se_sens = min_n_rule(se_local_sensitivity(self.cells, statistic=r.statistic, neighbors=r.neighbors),
                                  self.cells, r.min_n)

    def release(self, epsilon: float, rng: np.random.Generator):
        r = self.conf.release
        return release_mos(self.cells, statistic=r.statistic, epsilon=epsilon, neighbors=r.neighbors, noise=r.noise,
                           chi_groups=self.groups, rng=rng, sensitivity=self.sens, se_sensitivity=self.se_sens)


def method_runner(name: str, cells: Cells, conf: Config,
                  rng: np.random.Generator) -> Callable[[float], tuple[pd.DataFrame, dict]]:
    """A baseline as a function of the (add/remove) epsilon it is compared at. Replace-one methods
    run at 2 epsilon replace-one, the replace-one guarantee every add/remove epsilon-DP method also
    has (a replacement = one removal + one addition); their release.json states the 2 epsilon."""
    r = conf.release
    s = r.statistic
    if name.startswith("suppression_"):
        k = int(name.removeprefix("suppression_"))
        return lambda e: bl.suppression(cells, statistic=s, k=k, rate_outcome=r.rate_outcome)
    ts = {"variant": r.theil_sen_variant, "k": r.theil_sen_k}
    runs: dict[str, Callable[[float], tuple]] = {
        "ss_laplace": lambda e: bl.sufficient_stats_laplace(cells, statistic=s, epsilon=e, rng=rng),
        "noisy_stats": lambda e: bl.noisy_stats(cells, statistic=s, epsilon=2 * e, rng=rng),
        "theil_sen": lambda e: bl.dp_theil_sen(cells, statistic=s, epsilon=2 * e, rng=rng, **ts),
        "theil_sen_wide": lambda e: bl.dp_theil_sen(cells, statistic=s, epsilon=2 * e, rng=rng, wide=True, **ts),
        "dp_gd": lambda e: bl.dp_gradient_descent(cells, statistic=s, epsilon=e, delta=r.delta, rng=rng),
        "dp_sgd": lambda e: bl.dp_sgd_engine(cells, statistic=s, epsilon=e, delta=r.delta, rng=rng),
    }
    if name not in runs:
        raise ReleaseError(f"release.method={name!r} is not allowed: mos, suppression_K, {', '.join(runs)}")
    return runs[name]


BASELINES = ("ss_laplace", "noisy_stats", "theil_sen", "theil_sen_wide", "dp_gd", "dp_sgd")


def run_release(conf: Config, run_dir: Path, *, randomness: Randomness) -> float:
    """Run one release. Returns the released method's RMSE against the reference (truth, else
    OLS) when the private evaluation ran, else NaN (nothing exact leaves the evaluation)."""
    r = conf.release
    run_dir = Path(run_dir)
    evaluate = private_evaluation_enabled(conf)
    declared = declared_cells(conf)  # before any row is read
    df, truth, source, design = load_rows(conf)
    listed = list_cells(conf, df, design, declared, randomness)
    if listed.n_cells == 0:
        raise ReleaseError("release.cell_selection=private listed no cell (a DP outcome); allowed: a larger "
                           "release.selection_epsilon or release.selection_delta, or declare the cells")
    cells = build_cells(conf, df, listed)
    groups = chi_group_labels(listed, list(r.chi_by))
    if r.statistic == "custom":
        return run_custom(cells, conf, run_dir, source, listed, randomness)
    log.info("release: method=%s, statistic=%s, epsilon=%g; cells: %s", r.method, r.statistic, r.epsilon,
             listed.description)
    if r.method == "mos":
        log.warning("release.method=mos: %s", NOT_DP)
    elif r.method.startswith("suppression_"):
        log.warning("release.method=%s releases the EXACT estimate of every cell with N >= k: no noise, NOT "
                    "differentially private", r.method)

    mos_in = MosInputs(cells, conf, groups) if (r.method == "mos" or evaluate) else None
    results: dict[str, pd.DataFrame] = {}
    metas: dict[str, dict] = {}
    mos = None
    if mos_in is not None:
        mos = mos_in.release(r.epsilon, randomness.numpy("release-mos"))
        results["mos"] = mos.frame[["released", "theta_released", "se_released"]]
    names = [r.method] if r.method != "mos" else []
    if evaluate:
        names += [n for n in [f"suppression_{k}" for k in r.suppression_k] + list(BASELINES) if n not in names]
    for name in names:
        frame, meta = method_runner(name, cells, conf, randomness.numpy(f"release-{name}"))(r.epsilon)
        results[name], metas[name] = frame.reset_index(drop=True), meta

    run_dir.mkdir(parents=True, exist_ok=True)
    desc = randomness.describe()
    if r.method == "mos":
        released, facts = mos.to_frame(), report.mos_json(mos, conf=conf, source=source, listed=listed,
                                                          randomness=desc)
    else:
        released = pd.concat([cells.keys.reset_index(drop=True), results[r.method]], axis=1)
        facts = report.baseline_json(r.method, results[r.method], metas[r.method], statistic=r.statistic,
                                     source=source, listed=listed, randomness=desc)
    atomic_write_text(run_dir / "release.csv", released.to_csv(index=False))
    write_json(run_dir / "release.json", facts)
    private_files = {"private/dptrain.log": "the run's log (settings, warnings, timings)"}
    rmse = float("nan")
    if evaluate:
        from dptrain.release.evaluation import write_evaluation

        eval_dir = private_dir(run_dir) / EVALUATION_DIR
        files, rmse = write_evaluation(eval_dir, df=df, cells=cells, conf=conf, truth=truth, listed=listed,
                                       results=results, metas=metas, mos=mos, mos_in=mos_in, source=source,
                                       randomness=randomness)
        private_files.update({f"private/{EVALUATION_DIR}/{p.name}": why for p, why in files.items()})
        log.warning("private evaluation (exact values, every method) written to %s: never publish it", eval_dir)
    publishable = {"release.csv": f"the released cells of method {r.method} (one row per listed cell)",
                   "release.json": "the facts of that release: method, neighbours, epsilon, delta, guarantee",
                   "FILES.txt": "this list"}
    if (run_dir / ".hydra").is_dir():
        publishable[".hydra/"] = "the run's settings (no data values; check file paths before publishing)"
    write_manifest(run_dir, publishable=publishable, private=private_files, guarantee=report.guarantee_line(facts))
    log.info("release written: release.csv, release.json (%s)", facts["guarantee"])
    return rmse


def load_stat_fn(spec: str) -> Callable:
    """Import ``package.module:function``."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ReleaseError(f"release.stat_fn={spec!r} cannot be imported ({err}); allowed: "
                           "'package.module:function' importable from the working directory") from None


def run_custom(cells: Cells, conf: Config, run_dir: Path, source: str, listed: CellDomain,
               randomness: Randomness) -> float:
    """MOS for a user statistic by brute-force refits (no closed form, so no baselines)."""
    from dptrain.release.api import release_custom

    r = conf.release
    if r.chi_by:
        raise ReleaseError("release.chi_by is not supported with release.statistic=custom; allowed: []")
    if r.method != "mos":
        raise ReleaseError(f"release.method={r.method!r} is not allowed with release.statistic=custom: mos")
    log.warning("release.statistic=custom (MOS): %s", NOT_DP)
    rel = release_custom(cells, load_stat_fn(r.stat_fn), epsilon=r.epsilon, neighbors=r.neighbors,
                         rng=randomness.numpy("release-mos-custom"))
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "release.csv", rel.to_frame().to_csv(index=False))
    facts = report.custom_json(rel, stat_fn=r.stat_fn, source=source, listed=listed, randomness=randomness.describe())
    write_json(run_dir / "release.json", facts)
    publishable = {"release.csv": "the released cells (MOS, custom statistic)", "release.json": "its facts",
                   "FILES.txt": "this list"}
    if (run_dir / ".hydra").is_dir():
        publishable[".hydra/"] = "the run's settings (no data values; check file paths before publishing)"
    write_manifest(run_dir, publishable=publishable, guarantee=NOT_DP,
                   private={"private/dptrain.log": "the run's log (settings, warnings, timings)"})
    log.info("release written: release.csv, release.json (MOS, custom statistic %s)", r.stat_fn)
    return float("nan")
