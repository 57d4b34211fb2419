"""``task=lodes``: employer-employee job counts under ER-EE privacy (docs/employer_employee.md)."""

from __future__ import annotations

from dptrain.core.validation import bad, integer, one_of, real
from dptrain.release.oneshot import mechanism_for
from dptrain.release.oneshot.er_ee import ErEeSettings
from dptrain.settings.common import (
    check_budget,
    check_common,
)
from dptrain.settings.schemas.tables import (  # the schemas: no torch, no pandas
    LodesConfig,
    LodesRunConfig,
)


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

