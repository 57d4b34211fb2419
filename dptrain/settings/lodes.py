"""``task=lodes``: employer-employee job counts under ER-EE privacy (docs/employer_employee.md)."""

from __future__ import annotations

from dataclasses import dataclass

from dptrain.core.validation import bad, integer, one_of, real, setting
from dptrain.release.oneshot import mechanism_for, names
from dptrain.release.oneshot.er_ee import ErEeSettings
from dptrain.settings.common import (
    TASKS_ALLOWED,
    ReleaseBudget,
    RunBase,
    check_budget,
    check_common,
)


@dataclass
class LodesConfig:
    """The simulated jobs, the mechanisms' settings and which table is published."""

    establishments: int = setting(25_000, help="establishments of the simulated state (527000: the national scale)",
                                  allowed="an integer >= 100")
    alpha: float = setting(0.1, help="ER-EE: an establishment's size is protected up to a factor 1 + alpha",
                           allowed="a number in (0, 1]")
    employer_cap: int = setting(1000, help="employer_laplace: the PUBLIC size cap (sizes clipped to it)",
                                allowed="an integer >= 1")
    marginals: str = setting("finest", help="the tables released: finest (place x sector x ownership) | all (its 7 "
                             "marginals: each of the three, each pair, and the finest; the epsilon and delta are "
                             "shared evenly among them, sequential composition)", allowed="finest | all")
    median: bool = setting(False, help="also release each NAICS sector's median establishment size by the smooth-"
                           "sensitivity median (Nissim, Raskhodnikova and Smith; replace-one establishment, sizes in "
                           "the public [1, 30000]) at lodes.median_epsilon", allowed="true | false")
    median_epsilon: float = setting(1.0, help="the sector medians' epsilon (it adds to the tables')",
                                    allowed="a number in (0, 100]")
    publish: str = setting("log_laplace", help="the mechanism whose table is written at the top of the run folder; "
                           "the others go under private/ (publishing two tables composes their guarantees)",
                           allowed=" | ".join(names("er_ee")) + " (or a plugin's)")


@dataclass
class LodesPrivacyConfig(ReleaseBudget):
    """The budget of each mechanism's table (delta: smooth_laplace's)."""

    epsilon: float = setting(4.0, help="each table's epsilon", allowed="a number in (0, 100]")


@dataclass
class LodesRunConfig(RunBase):
    """task=lodes: jobs by place x NAICS sector x ownership on the simulated jobs data."""

    task: str = setting("lodes", help="what the run does (a config group)", allowed=TASKS_ALLOWED)
    seed: int = setting(0, help="seeds the jobs simulator (PUBLIC); NEVER the noise", allowed="an integer >= 0")
    privacy: LodesPrivacyConfig = setting(help="the budget", factory=LodesPrivacyConfig)
    lodes: LodesConfig = setting(help="the data and the mechanisms", factory=LodesConfig)


def validate_lodes(cfg: LodesRunConfig) -> None:
    """Every setting of a ``task=lodes`` run. Raises ConfigError."""
    check_common(cfg)
    c, p = cfg.lodes, cfg.privacy
    integer("lodes.establishments", c.establishments, 100)
    real("lodes.alpha", c.alpha, "must be a number in (0, 1]", lo=0, hi=1, lo_open=True)
    integer("lodes.employer_cap", c.employer_cap, 1)
    mechanism = mechanism_for("lodes.publish", c.publish, "er_ee")
    check_budget(p)
    one_of("lodes.marginals", c.marginals, ("finest", "all"))
    if not isinstance(c.median, bool):
        raise bad("lodes.median", c.median, "true | false")
    real("lodes.median_epsilon", c.median_epsilon, "must be a number in (0, 100]", lo=0, hi=100, lo_open=True)
    eps, delta = per_table(p.epsilon, p.delta, c.marginals)
    reason = mechanism.unavailable(er_ee_settings(c), epsilon=eps, delta=delta)
    if reason is not None:
        raise bad("lodes.publish", c.publish, f"{c.publish} {reason} at each table's epsilon {eps:.4g}: a smaller "
                  "lodes.alpha, a larger privacy.epsilon, lodes.marginals=finest or another mechanism")


def er_ee_settings(c: LodesConfig) -> ErEeSettings:
    """The checked ``lodes.*`` section as what the employer-employee mechanisms read."""
    return ErEeSettings(alpha=c.alpha, employer_cap=c.employer_cap)


#: the marginals of place x sector x ownership (lodes.marginals=all), coarsest first
ALL_MARGINALS = (("place",), ("sector",), ("ownership",), ("place", "sector"), ("place", "ownership"),
                 ("sector", "ownership"), ("place", "sector", "ownership"))


def marginal_sets(which: str) -> tuple[tuple[str, ...], ...]:
    return ALL_MARGINALS if which == "all" else (ALL_MARGINALS[-1],)


def per_table(epsilon: float, delta: float, which: str) -> tuple[float, float]:
    """Each table's (epsilon, delta): the run's shared evenly among its tables (sequential composition)."""
    m = len(marginal_sets(which))
    return epsilon / m, delta / m

