"""``task=lodes``: employer-employee job counts under ER-EE privacy (docs/employer_employee.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dptrain.core.validation import bad, integer, one_of, real, setting
from dptrain.settings.common import OVERWRITE_HELP, PLUGINS_HELP, check_common

#: the mechanisms a run releases a table with (one of them is published: lodes.publish)
MECHANISMS = ("log_laplace", "smooth_gamma", "smooth_laplace", "laplace_worker", "employer_laplace")


@dataclass
class LodesConfig:
    """The simulated jobs, the mechanisms' settings and which table is published."""

    establishments: int = setting(25_000, help="establishments of the simulated state (527000: the national scale)",
                                  allowed="an integer >= 100")
    alpha: float = setting(0.1, help="ER-EE: an establishment's size is protected up to a factor 1 + alpha",
                           allowed="a number in (0, 1]")
    employer_cap: int = setting(1000, help="employer_laplace: the PUBLIC size cap (sizes clipped to it)",
                                allowed="an integer >= 1")
    publish: str = setting("log_laplace", help="the mechanism whose table is written at the top of the run folder; "
                           "the others go under private/ (publishing two tables composes their guarantees)",
                           allowed=" | ".join(MECHANISMS))


@dataclass
class LodesPrivacyConfig:
    """The budget of each mechanism's table."""

    epsilon: float = setting(4.0, help="each table's epsilon", allowed="a number in (0, 100]")
    delta: float = setting(1e-6, help="smooth_laplace's delta", allowed="a number in (0, 1e-3]")


@dataclass
class LodesRunConfig:
    """task=lodes: jobs by place x NAICS sector x ownership on the simulated jobs data."""

    task: str = setting("lodes", help="what the run does (a config group)",
                        allowed="train | audit | release | predict | tune | tabulate | synthesize | topdown | lodes")
    seed: int = setting(0, help="seeds the jobs simulator (PUBLIC); NEVER the noise", allowed="an integer >= 0")
    plugins: list[str] = setting(help=PLUGINS_HELP, allowed="a list of importable module names", factory=list)
    overwrite: bool = setting(False, help=OVERWRITE_HELP, allowed="true | false")
    privacy: LodesPrivacyConfig = setting(help="the budget", factory=LodesPrivacyConfig)
    lodes: LodesConfig = setting(help="the data and the mechanisms", factory=LodesConfig)


def validate_lodes(cfg: LodesRunConfig) -> None:
    """Every setting of a ``task=lodes`` run. Raises ConfigError."""
    check_common(cfg)
    c, p = cfg.lodes, cfg.privacy
    integer("lodes.establishments", c.establishments, 100)
    real("lodes.alpha", c.alpha, "must be a number in (0, 1]", lo=0, hi=1, lo_open=True)
    integer("lodes.employer_cap", c.employer_cap, 1)
    one_of("lodes.publish", c.publish, MECHANISMS)
    real("privacy.epsilon", p.epsilon, "must be a number in (0, 100]", lo=0, hi=100, lo_open=True)
    real("privacy.delta", p.delta, "must be a number in (0, 1e-3]", lo=0, hi=1e-3, lo_open=True)
    if p.epsilon / 10.0 <= math.log1p(c.alpha):
        raise bad("lodes.alpha", c.alpha, f"smooth_gamma needs epsilon / 10 > ln(1 + alpha) (epsilon "
                  f"{p.epsilon:g}): a smaller alpha or a larger privacy.epsilon")
    if p.epsilon / (2.0 * math.log(2.0 / p.delta)) <= math.log1p(c.alpha):
        raise bad("lodes.alpha", c.alpha, f"smooth_laplace needs epsilon / (2 ln(2 / delta)) > ln(1 + alpha) "
                  f"(epsilon {p.epsilon:g}, delta {p.delta:g}): a smaller alpha, a larger epsilon or delta")
