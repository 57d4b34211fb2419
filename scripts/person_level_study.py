"""Person-level against example-level DP-SGD on a generated panel (issue 47's study).

1. Utility. On data=panel (persons with 1-20 rows each, P(m) proportional to m^-1.2, a known
   logistic truth), test accuracy and the coefficients' relative error against the truth, at a
   PERSON-level epsilon E in {0.5, 1, 2, 4} (delta 1e-6 per person), for
   * person-level DP-SGD (experiment=panel_sim: data.privacy_unit=person_id, k rows per person,
     mean combine, sigma calibrated to E), k in {1, 5, 20};
   * example-level DP-SGD (data.privacy_unit=null) whose GROUP-privacy level for k rows
     (dptrain.privacy.group.group_level: the tighter of (k e, k e^((k-1) e) d) and Mironov's RDP
     group rule) is (E, 1e-6): the run's per-row (e, d) are chosen here so that its group level
     at k is E at a group delta of at most 1e-6. k = 20 covers every person of the panel; k = 5
     only the persons with at most 5 rows;
   * for reference, example-level DP-SGD at per-ROW epsilon E (what a per-row run reports; no
     person guarantee) and a non-private run.
   Every run is the command line's own (``python -m dptrain experiment=panel_sim ...``, run
   in-process), trainer.dp_curves=false so that the run's events are its DP-SGD steps alone.
2. The attack. A membership test for ONE person with 20 rows (all in or all out) of a small panel,
   against an example-level and a person-level run at the same nominal epsilon (per row, resp. per
   person), each trained many times (in and out) by dptrain's fast engine and samplers in-process.
   The person: 20 rows with a rare indicator feature (1 only for them) and features far on one side
   of the truth, all labelled against it. Statistics: the trained model's (published) coefficient of
   the indicator, and its mean loss on the person's rows. Power (TPR) at FPR 0.01-0.2 against the
   DP bound TPR <= e^eps FPR + delta at the PERSON level of each run (for the example-level run:
   its group level at 20 rows, and, to show how little it says, its per-row level). The check
   (printed, and asserted by tests/test_person_level_study.py): the Clopper-Pearson 99% lower bound
   of the person-level run's TPR is at most e^eps times the 99% upper bound of its FPR plus delta.

    python scripts/person_level_study.py --out experiments/person_level
    python scripts/person_level_study.py --quick --out /tmp/person_level   # a small version (tests)

The utility runs' folders go to a temporary folder (removed at the end) unless ``--runs DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402
from scipy import stats  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dptrain.data import data_source, load_dataset  # noqa: E402
from dptrain.data.synthetic import make_panel, panel_rows_law, true_weights  # noqa: E402
from dptrain.models.networks import logit  # noqa: E402
from dptrain.models.objectives import build_objective  # noqa: E402
from dptrain.privacy.accounting import calibrate_noise_multiplier, rdp_curve, rdp_to_epsilon  # noqa: E402
from dptrain.privacy.calibration import smallest_noise  # noqa: E402
from dptrain.privacy.dpsgd.engine import FastLinearEngine  # noqa: E402
from dptrain.privacy.dpsgd.mechanism import planned_steps  # noqa: E402
from dptrain.privacy.dpsgd.sampling import PoissonSampler  # noqa: E402
from dptrain.privacy.dpsgd.units import UnitPoissonSampler, rows_by_unit  # noqa: E402
from dptrain.privacy.events import poisson_gaussian  # noqa: E402
from dptrain.privacy.group import group_level  # noqa: E402
from dptrain.settings.data import PanelDataConfig  # noqa: E402
from dptrain.tasks import cli  # noqa: E402

PERSON_DELTA = 1e-6
FPRS = (0.01, 0.02, 0.05, 0.1, 0.2)
N_FEATURES = 10


@dataclass(frozen=True)
class Plan:
    """The study's sizes (``--quick``: a small version for the tests)."""

    n_units: int = 5_000
    epsilons: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    ks: tuple[int, ...] = (1, 5, 20)
    group_ks: tuple[int, ...] = (5, 20)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    batch_units: int = 100
    epochs: float = 10.0
    attack_epsilons: tuple[float, ...] = (1.0, 4.0)
    attack_trials: int = 300
    attack_persons: int = 400
    attack_steps: int = 50


QUICK = Plan(n_units=2000, epsilons=(2.0,), ks=(5,), group_ks=(5,), seeds=(0,), batch_units=50, epochs=5.0,
             attack_epsilons=(2.0,), attack_trials=150, attack_steps=25)


# ---------------------------------------------------------------------------- group calibration
def example_history(sigma: float, q: float, steps: int) -> tuple:
    """The events of an example-level run without dp/ curves: ``steps`` Poisson-subsampled Gaussians."""
    return ((poisson_gaussian(sample_rate=q, noise_multiplier=sigma), steps),)


def group_delta_row(sigma: float, q: float, steps: int, k: int, person_delta: float = PERSON_DELTA) -> float:
    """The largest per-row delta d (on a log grid, refined by bisection) whose group delta at k rows,
    k e^((k-1) e(d)) d, is at most ``person_delta`` (e(d) the run's RDP epsilon at d)."""
    rdp = rdp_curve(example_history(sigma, q, steps))

    def excess(log_d: float) -> float:  # > 0: the group delta exceeds person_delta (a margin for rounding)
        e = rdp_to_epsilon(rdp, math.exp(log_d))
        return math.log(k) + (k - 1) * e + log_d - math.log(person_delta) + 1e-12

    hi = math.log(person_delta / k)
    if excess(hi) <= 0:
        return math.exp(hi)
    lo = hi
    while excess(lo) > 0:
        hi, lo = lo, lo - 2.0
        if lo < -700:
            return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) <= 0 else (lo, mid)
    return math.exp(lo)


def group_of_run(sigma: float, q: float, steps: int, k: int, delta: float) -> dict:
    """privacy/group.py's level for k rows of an example-level run (sigma, q, steps) at per-row delta."""
    history = example_history(sigma, q, steps)
    eps = rdp_to_epsilon(rdp_curve(history), delta)
    return {"row_epsilon": eps, "row_delta": delta, **group_level(eps, delta, k, history)}


def calibrate_group(target: float, q: float, steps: int, k: int) -> tuple[float, float]:
    """(sigma, per-row delta) of the example-level run whose group level at k rows is at most
    (``target``, PERSON_DELTA): the smallest such sigma (relative tolerance 1e-3)."""
    def person_eps(sigma: float) -> float:
        d = group_delta_row(sigma, q, steps, k)
        return math.inf if d <= 0 else group_of_run(sigma, q, steps, k, d)["epsilon"]
    sigma = smallest_noise(person_eps, target=target, rtol=1e-3, lower=1e-2, upper=1e6)
    return sigma, group_delta_row(sigma, q, steps, k)


# ---------------------------------------------------------------------------- utility (command-line runs)
def _run(overrides: list[str], run_dir: Path) -> dict:
    cfg = compose(config_name="config", overrides=overrides)
    t0 = time.perf_counter()
    cli.run(cfg, run_dir=run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    report = json.loads((run_dir / "privacy.json").read_text()) if (run_dir / "privacy.json").exists() else {}
    coef = pd.read_csv(run_dir / "coefficients.csv")
    return {"metrics": metrics, "report": report, "coef": coef, "seconds": time.perf_counter() - t0}


def coef_error(coef: pd.DataFrame, seed: int) -> float:
    """||(b, w_hat) - (0, w)|| / ||w||: the estimates against the panel's known truth (no intercept)."""
    w = true_weights(N_FEATURES, seed=seed)
    est = coef.set_index("term")["estimate"]
    diff = np.r_[est["(Intercept)"], est[[f"x{i}" for i in range(N_FEATURES)]].to_numpy() - w]
    return float(np.linalg.norm(diff) / np.linalg.norm(w))


def _base(plan: Plan, seed: int) -> list[str]:
    return ["experiment=panel_sim", f"data.n_units={plan.n_units}", f"trainer.epochs={plan.epochs}",
            "trainer.progress=false", "trainer.dp_curves=false", "logger.tensorboard=false", f"seed={seed}"]


def example_batch_rows(plan: Plan) -> int:
    """The example-level runs' expected batch in ROWS: the person-level batch times the generator's
    (public) mean rows per person, so both take about as many rows per step."""
    law = panel_rows_law(20)
    return int(round(plan.batch_units * float((np.arange(1, 21) * law).sum())))


def _row(kind: str, k: int | None, target: float | None, seed: int, out: dict, person_eps: float,
         person_delta: float, n_units: int) -> dict:
    rep = out["report"]
    return {"guarantee": kind, "k": k, "target_person_epsilon": target, "seed": seed, "n_units": n_units,
            "person_epsilon": person_eps, "person_delta": person_delta,
            "run_epsilon": rep.get("epsilon"), "run_delta": rep.get("delta"),
            "noise_multiplier": rep.get("noise_multiplier"), "steps": rep.get("steps"),
            "N": rep.get("dataset_size"), "B": rep.get("expected_batch_size"),
            "test_acc": out["metrics"]["test/acc"], "test_loss": out["metrics"]["test/loss"],
            "coef_rel_error": coef_error(out["coef"], seed),
            "seconds": out["seconds"]}


def person_runs(plan: Plan, seed: int, work: Path) -> list[dict]:
    rows = []
    for k in plan.ks:
        for e in plan.epsilons:
            out = _run([*_base(plan, seed), f"trainer.batch_size={plan.batch_units}",
                        f"privacy.max_rows_per_unit={k}", f"privacy.target_epsilon={e}"],
                       work / f"person_k{k}_e{e}_s{seed}")
            rep = out["report"]
            rows.append(_row("person-level", k, e, seed, out, rep["epsilon"], rep["delta"], plan.n_units))
    return rows


def example_runs(plan: Plan, seed: int, work: Path, n_rows: int) -> list[dict]:
    """Example-level runs at their group level (E, <= 1e-6) for k in group_ks, and at per-row E."""
    b = example_batch_rows(plan)
    q = b / n_rows
    steps = planned_steps(epochs=plan.epochs, sample_rate=q)
    common = [*_base(plan, seed), "data.privacy_unit=null", "privacy.max_rows_per_unit=null",
              f"trainer.batch_size={b}"]
    rows = []
    for k in plan.group_ks:
        for e in plan.epsilons:
            sigma, d = calibrate_group(e, q, steps, k)
            out = _run([*common, f"privacy.noise_multiplier={sigma!r}", f"privacy.delta={d!r}"],
                       work / f"example_k{k}_e{e}_s{seed}")
            rep = out["report"]
            assert rep["steps"] == steps and rep["dataset_size"] == n_rows, (rep["steps"], steps)
            lv = group_of_run(rep["noise_multiplier"], q, steps, k, rep["delta"])
            rows.append(_row("example-level, group level", k, e, seed, out, lv["epsilon"], lv["delta"], plan.n_units))
    for e in plan.epsilons:
        out = _run([*common, f"privacy.target_epsilon={e}", f"privacy.delta={PERSON_DELTA}"],
                   work / f"example_row_e{e}_s{seed}")
        rep = out["report"]
        lv = group_of_run(rep["noise_multiplier"], q, steps, 20, rep["delta"])
        rows.append(_row("example-level, per-row epsilon", 20, e, seed, out, lv["epsilon"], lv["delta"], plan.n_units))
    return rows


def utility(plan: Plan, work: Path) -> pd.DataFrame:
    rows = []
    with initialize_config_module(config_module="dptrain.conf", version_base="1.3"):
        for seed in plan.seeds:
            n_rows = load_dataset(data_source(PanelDataConfig(n_units=plan.n_units)), seed=seed).n_train
            rows += person_runs(plan, seed, work)
            rows += example_runs(plan, seed, work, n_rows)
            out = _run([*_base(plan, seed), "privacy=none", "data.privacy_unit=null",
                        "privacy.max_rows_per_unit=null", f"trainer.batch_size={example_batch_rows(plan)}"],
                       work / f"nonprivate_s{seed}")
            rows.append(_row("non-private", None, None, seed, out, math.inf, 1.0, plan.n_units))
            print(f"utility: seed {seed} done", flush=True)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- the attack
@dataclass
class AttackData:
    """The small panel without the target (x, y, person) and the target's 20 rows."""

    x: np.ndarray
    y: np.ndarray
    unit: np.ndarray
    x_target: np.ndarray
    y_target: np.ndarray


def attack_data(persons: int, n_features: int = 4, seed: int = 0) -> AttackData:
    """A panel of ``persons`` (make_panel, 1-20 rows each) plus an indicator column that is 0 for all
    of them; the target: 20 rows whose indicator is 1, features near -0.8 sign(w) (the truth says
    y = 0 with high probability) and label 1 on every row (against the truth)."""
    df = make_panel(persons, 20, n_features, seed=seed)
    w = true_weights(n_features, seed=seed)
    x = np.c_[df[[f"x{i}" for i in range(n_features)]].to_numpy(), np.zeros(len(df))]
    rng = np.random.default_rng([seed, 47])
    xt = np.clip(-0.8 * np.sign(w) + 0.2 * rng.uniform(-1, 1, (20, n_features)), -1, 1)
    return AttackData(x.astype(np.float32), df["y"].to_numpy().astype(np.float32), df["person_id"].to_numpy(),
                      np.c_[xt, np.ones(20)].astype(np.float32), np.ones(20, np.float32))


def train_once(x: np.ndarray, y: np.ndarray, unit: np.ndarray | None, *, sigma: float, q: float, steps: int,
               seed: int, lr: float = 1.0) -> torch.nn.Module:
    """DP-SGD logistic regression by dptrain's fast engine: per person (``unit`` given: units sampled
    at rate q, k = 20 so nothing capped, mean combine, the combination clipped to C = 1) or per row
    (``unit`` None: rows sampled at rate q, each row clipped to 1); ``seed`` seeds the trial's noise
    and sampler (a study's trials, not a run's secret randomness)."""
    torch.manual_seed(0)
    model = logit(in_features=x.shape[1])
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    n = len(x) if unit is None else int(unit.max()) + 1
    eng = FastLinearEngine(model, max_grad_norm=1.0, noise_multiplier=sigma, expected_batch_size=q * n,
                           generator=torch.Generator().manual_seed(seed), objective=build_objective("binary"))
    eng.collect_stats = False
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys, rng = torch.from_numpy(x), torch.from_numpy(y), np.random.default_rng(seed)
    if unit is None:
        sampler = PoissonSampler(num_rows=len(x), sample_rate=q, rng=rng)
        for _ in range(steps):
            rows = sampler.sample()
            eng(xs.index_select(0, rows), ys.index_select(0, rows))
            opt.step()
        return model
    order, starts, counts = rows_by_unit(unit)
    xs, ys = xs[order], ys[order]
    units = UnitPoissonSampler(starts=starts, counts=counts, sample_rate=q, rng=rng, combine="mean")
    for _ in range(steps):
        rows, batch = units.sample(xs.dtype)
        eng.unit_step(xs.index_select(0, rows), ys.index_select(0, rows), batch)
        opt.step()
    return model


def scores(model: torch.nn.Module, data: AttackData) -> dict[str, float]:
    """The test statistics of a trained model, each larger when the target looks IN: ``coefficient``,
    the model's (published) coefficient of the rare indicator that only the target has, and
    ``loss``, minus the model's mean loss on the target's 20 rows."""
    with torch.no_grad():
        logits = model(torch.from_numpy(data.x_target)).view(-1)
        loss = float(build_objective("binary").per_example_loss(logits, torch.from_numpy(data.y_target)).mean())
        return {"coefficient": float(model[0].weight[0, -1]), "loss": -loss}


def trial_scores(data: AttackData, level: str, *, sigma: float, q: float, steps: int,
                 trials: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """statistic -> (its values with the target in, with the target out) over ``trials`` trainings each."""
    x_in, y_in = np.r_[data.x, data.x_target], np.r_[data.y, data.y_target]
    u_in = np.r_[data.unit, np.full(20, int(data.unit.max()) + 1)]
    units = (u_in, data.unit) if level == "person" else (None, None)
    s_in = [scores(train_once(x_in, y_in, units[0], sigma=sigma, q=q, steps=steps, seed=10**6 + t), data)
            for t in range(trials)]
    s_out = [scores(train_once(data.x, data.y, units[1], sigma=sigma, q=q, steps=steps, seed=2 * 10**6 + t), data)
             for t in range(trials)]
    return {k: (np.array([s[k] for s in s_in]), np.array([s[k] for s in s_out])) for k in s_in[0]}


def clopper_pearson(hits: int, n: int, level: float = 0.99) -> tuple[float, float]:
    """One-sided ``level`` Clopper-Pearson (lower, upper) bounds of a binomial proportion."""
    a = 1.0 - level
    lo = 0.0 if hits == 0 else float(stats.beta.ppf(a, hits, n - hits + 1))
    hi = 1.0 if hits == n else float(stats.beta.ppf(1 - a, hits + 1, n - hits))
    return lo, hi


def power_rows(s_in: np.ndarray, s_out: np.ndarray, bounds: dict[str, tuple[float, float]]) -> list[dict]:
    """TPR at each FPR of FPRS (threshold: the 1 - FPR quantile of the out values; 'in' when the
    statistic is above it) and each bound min(1, e^eps FPR + delta) at the measured FPR, with the
    Clopper-Pearson check TPR_lower <= e^eps FPR_upper + delta."""
    rows = []
    for a in FPRS:
        thr = np.quantile(s_out, 1.0 - a)
        tp, fp = int((s_in > thr).sum()), int((s_out > thr).sum())
        tpr, fpr = tp / len(s_in), fp / len(s_out)
        tpr_lo, _ = clopper_pearson(tp, len(s_in))
        _, fpr_hi = clopper_pearson(fp, len(s_out))
        for name, (eps, delta) in bounds.items():
            rows.append({"fpr_target": a, "tpr": tpr, "fpr": fpr, "bound_of": name, "epsilon": eps,
                         "delta": delta, "bound": min(1.0, math.exp(eps) * fpr + delta),
                         "within": tpr_lo <= min(1.0, math.exp(eps) * fpr_hi + delta),
                         "tpr_lower_99": tpr_lo, "fpr_upper_99": fpr_hi})
    return rows


def attack(plan: Plan, delta: float = 1e-5) -> pd.DataFrame:
    """The membership test at each nominal epsilon: a person-level and an example-level run (both at
    q = 0.1 per step of persons, resp. rows, ``attack_steps`` steps, sigma calibrated to eps)."""
    data, q = attack_data(plan.attack_persons), 0.1
    rows = []
    for eps in plan.attack_epsilons:
        sigma = calibrate_noise_multiplier(target_epsilon=eps, sample_rate=q, steps=plan.attack_steps, delta=delta)
        for level in ("person", "example"):
            t0 = time.perf_counter()
            values = trial_scores(data, level, sigma=sigma, q=q, steps=plan.attack_steps, trials=plan.attack_trials)
            if level == "person":
                bounds = {"person-level (eps, delta) of the run": (eps, delta)}
            else:
                g = group_of_run(sigma, q, plan.attack_steps, 20, delta)
                bounds = {"group level at 20 rows": (g["epsilon"], g["delta"]),
                          "per-row (eps, delta) (not a person bound)": (eps, delta)}
            for stat, (s_in, s_out) in values.items():
                rows += [{"nominal_epsilon": eps, "run": f"{level}-level", "statistic": stat, "noise_multiplier": sigma,
                          "trials_each": plan.attack_trials, "seconds": time.perf_counter() - t0, **r}
                         for r in power_rows(s_in, s_out, bounds)]
            print(f"attack: eps {eps} {level}-level done", flush=True)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- outputs
def _label(kind: str, k: float | None) -> str:
    if kind == "person-level":
        return f"person-level DP-SGD, k = {int(k)}"
    if kind == "example-level, group level":
        return f"example-level DP-SGD at its group level for {int(k)} rows"
    return "example-level DP-SGD at per-ROW epsilon (no person guarantee)"


def utility_table(res: pd.DataFrame) -> pd.DataFrame:
    """Mean and SD over seeds of accuracy and coefficient error per (guarantee, k, target epsilon)."""
    nonpriv = res[res["guarantee"] == "non-private"].set_index("seed")["test_acc"]
    priv = res[res["guarantee"] != "non-private"].assign(cost=lambda d: d["seed"].map(nonpriv) - d["test_acc"])
    g = priv.groupby(["guarantee", "k", "target_person_epsilon"], dropna=False)
    return g.agg(acc=("test_acc", "mean"), cost=("cost", "mean"), cost_sd=("cost", "std"),
                 coef_err=("coef_rel_error", "mean"), coef_sd=("coef_rel_error", "std"),
                 person_epsilon=("person_epsilon", "mean"), run_epsilon=("run_epsilon", "mean"),
                 sigma=("noise_multiplier", "mean"), seeds=("seed", "count")).reset_index()


def _utility_panels(res: pd.DataFrame, ax: plt.Axes, cx: plt.Axes) -> None:
    tab = utility_table(res)
    for i, ((kind, k), sub) in enumerate(tab.groupby(["guarantee", "k"], dropna=False)):
        ls = "-" if kind == "person-level" else ("--" if "group" in kind else ":")
        x = sub["target_person_epsilon"] * (1.03 ** i)  # a small offset: the error bars apart
        ax.errorbar(x, sub["acc"], yerr=sub["cost_sd"].fillna(0), ls=ls, marker="o", capsize=3,
                    label=_label(kind, k))
        cx.errorbar(x, sub["coef_err"], yerr=sub["coef_sd"].fillna(0), ls=ls, marker="o", capsize=3)
    nonpriv = res[res["guarantee"] == "non-private"]
    mean_acc = nonpriv["test_acc"].mean()
    ax.axhline(mean_acc, color="grey", lw=1, label=f"non-private ({mean_acc:.3f})")
    cx.axhline(nonpriv["coef_rel_error"].mean(), color="grey", lw=1)
    for a, what in ((ax, "test accuracy (mean over seeds; bars: SD of the\nloss against the same seed's "
                         "non-private run)"),
                    (cx, "||estimate - truth|| / ||truth|| (mean; bars: SD)")):
        a.set_xscale("log", base=2)
        a.set_xlabel("epsilon per PERSON, delta 1e-6 (dotted: the run's per-ROW epsilon)")
        a.set_ylabel(what, fontsize=8)
    cx.set_yscale("log")
    ax.set_title(f"Utility: generated panel, {int(res['n_units'].iloc[0]):,} persons, "
                 f"{res['seed'].nunique()} seeds", fontsize=9)
    cx.set_title("Coefficients against the known truth", fontsize=9)
    ax.legend(fontsize=6)


def _attack_panel(att: pd.DataFrame, bx: plt.Axes) -> None:
    att = att[att["statistic"] == "coefficient"]
    for (eps, run), sub in att.groupby(["nominal_epsilon", "run"]):
        first = sub.drop_duplicates("fpr_target")
        bx.plot(first["fpr"], first["tpr"], marker="o", label=f"{run} run, eps {eps:g}: power")
    for eps, sub in att[att["run"] == "person-level"].groupby("nominal_epsilon"):
        bx.plot(sub["fpr"], sub["bound"], ls="--", color="black", lw=1 + 0.5 * math.log2(eps), marker="x",
                label=f"bound e^eps FPR + delta at eps {eps:g} (per person, resp. per row)")
    bx.set_xlabel("false-positive rate")
    bx.set_ylabel("true-positive rate (power)")
    bx.set_ylim(0, 1.02)
    bx.set_title("Membership of one person with 20 rows (statistic: the rare feature's coefficient)\n"
                 "(the example-level run's group bound at 20 rows: 1)",
                 fontsize=9)
    bx.legend(fontsize=6)


def figure(res: pd.DataFrame, att: pd.DataFrame, path: Path) -> None:
    fig, (ax, cx, bx) = plt.subplots(1, 3, figsize=(18, 5.5))
    _utility_panels(res, ax, cx)
    _attack_panel(att, bx)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def checks(res: pd.DataFrame, att: pd.DataFrame) -> list[str]:
    """The study's claims, each a line 'OK ...' or 'FAIL ...'."""
    lines = []
    person = att[att["run"] == "person-level"]
    ok = bool(person["within"].all())
    lines.append(f"{'OK' if ok else 'FAIL'} person-level power within its bound (Clopper-Pearson 99%): "
                 + ", ".join(f"eps {r.nominal_epsilon:g} {r.statistic} FPR {r.fpr:.3f}: TPR {r.tpr:.3f} <= "
                             f"{r.bound:.3f}" for r in person.itertuples()))
    grp = res[res["guarantee"] == "example-level, group level"]
    hit = bool(((grp["person_epsilon"] <= grp["target_person_epsilon"] * (1 + 1e-9))
                & (grp["person_delta"] <= PERSON_DELTA * (1 + 1e-9))).all())
    lines.append(f"{'OK' if hit else 'FAIL'} example-level runs' group level (privacy/group.py) within "
                 f"(E, {PERSON_DELTA:g}) for k in {sorted(grp['k'].unique().tolist())}")
    return lines


def summary(res: pd.DataFrame, att: pd.DataFrame, seconds: float, plan: Plan) -> str:
    tab = utility_table(res)
    out = [f"# Person-level study: {plan.n_units:,} persons, seeds {list(plan.seeds)}, {seconds:.0f} s, "
           f"load {os.getloadavg()[0]:.1f}", "", "| guarantee | k | person eps | per-row eps | sigma | "
           "test acc | loss vs non-private (SD) | coef rel. error (SD) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in tab.itertuples():
        out.append(f"| {r.guarantee} | {int(r.k)} | {r.person_epsilon:.3g} | {r.run_epsilon:.3g} | {r.sigma:.3g} | "
                   f"{r.acc:.4f} | {r.cost:.4f} ({0 if pd.isna(r.cost_sd) else r.cost_sd:.4f}) | "
                   f"{r.coef_err:.3f} ({0 if pd.isna(r.coef_sd) else r.coef_sd:.3f}) |")
    nonpriv = res[res["guarantee"] == "non-private"]
    out += ["", f"non-private: test acc {nonpriv['test_acc'].mean():.4f}, coef rel. error "
            f"{nonpriv['coef_rel_error'].mean():.3f}", "", "| nominal eps | run | statistic | FPR | TPR | "
            "bound of | (eps, delta) | bound | within (CP 99%) |", "|---:|---|---|---:|---:|---|---|---:|---|"]
    for r in att.itertuples():
        out.append(f"| {r.nominal_epsilon:g} | {r.run} | {r.statistic} | {r.fpr:.3f} | {r.tpr:.3f} | {r.bound_of} | "
                   f"({r.epsilon:.3g}, {r.delta:.3g}) | {r.bound:.3f} | {r.within} |")
    return "\n".join([*out, "", *checks(res, att)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="the small version (tests): 3,000 persons, one epsilon")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; --quick 1)")
    ap.add_argument("--runs", type=Path, default=None, help="keep the run folders here (default: a temporary "
                    "folder, removed at the end)")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.seeds is not None:
        plan = Plan(**{**plan.__dict__, "seeds": tuple(range(args.seeds))})
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = utility(plan, args.runs if args.runs is not None else Path(tmp))
    att = attack(plan)
    res.to_csv(args.out / "results.csv", index=False)
    att.to_csv(args.out / "attack.csv", index=False)
    figure(res, att, args.out / "person_level.png")
    text = summary(res, att, time.perf_counter() - t0, plan)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0 if all(line.startswith("OK") for line in checks(res, att)) else 1


if __name__ == "__main__":
    sys.exit(main())
